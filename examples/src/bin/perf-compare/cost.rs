//! The CPU cost of one message with no scheduling in it: one thread plays both ends, so
//! each message is a post (with its `send`) and the poll that reads it, back to back,
//! with no wake-up and no hand-off between cores. Set against raw TCP doing the same
//! system calls in the same way, the difference is what the sim itself spends per
//! message. Unlike the two-process latency tests, this figure does not move with where
//! the host happens to run the two processes (plain TCP ping-pong drifts between ~3.9 and
//! ~5.7 us one way on the 2-core VM), so it can show changes of tens of nanoseconds.
//!
//! The sim's side: two RC QPs on one device, connected to each other, 8-byte inline
//! SENDs back and forth; each message is `post_send` on one QP, then `poll_cq` on the
//! other's CQ until its receive completes (the device's poll also looks at the other
//! connection, finding nothing), then `post_recv`. The TCP side mirrors the system
//! calls: a `send` of a 48-byte frame, a `recv` that gets it, a `recv` on the other
//! socket that finds nothing.
//!
//! Then the same setups measure an empty look: `poll_cq` on an empty CQ of the device
//! (one `recv` per connection, both finding nothing), against two `recv`s on the idle
//! sockets. What the sim adds there lengthens each turn of a spinning poller, so a
//! message arriving during a spin waits half of it on average before it is seen.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use examples::wait::Waiter;
use examples::Res;
use verbs_api::*;

/// Messages before the measured ones (connections, caches and branch predictors warm).
const WARMUP: u64 = 5_000;

/// Empty looks measured per message measured.
const LOOKS_PER_MESSAGE: u64 = 2;

/// Nanoseconds of one side of the one-thread measurement (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Cost {
    /// Per one-way message.
    pub message: f64,
    /// Per empty look at the device's (or the sockets') two connections.
    pub empty_look: f64,
}

/// Nanoseconds per call of `f` (passed the call's index), over `n` calls.
fn ns_per(n: u64, mut f: impl FnMut(u64) -> Res<()>) -> Res<f64> {
    let t0 = Instant::now();
    for i in 0..n {
        f(i)?;
    }
    Ok(t0.elapsed().as_nanos() as f64 / n as f64)
}

/// One `recv` on a socket that must have nothing to read.
fn read_nothing(s: &mut TcpStream, buf: &mut [u8]) -> Res<()> {
    match s.read(buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(()),
        other => anyhow::bail!("unexpected bytes on an idle socket: {other:?}"),
    }
}

/// The sim in one thread (see the module docs).
pub fn sim_ns_per_message(messages: u64) -> Res<Cost> {
    // The environment's configuration, as `perf` takes it: `RDMA_SIM_TRANSPORT=tcp`
    // measures the TCP path, the default the same-host one.
    let sim = backend_sim::SimBackend::from_env()?;
    let ctx = sim.open("sim0")?;
    let pd = ctx.alloc_pd()?;
    let cqs = [ctx.create_cq(64, None)?, ctx.create_cq(64, None)?];
    let cap = QpCap::new(16, 16).with_inline(64);
    let qps = [
        pd.create_qp(&QpInitAttr::rc(&cqs[0], &cqs[0], cap))?,
        pd.create_qp(&QpInitAttr::rc(&cqs[1], &cqs[1], cap))?,
    ];
    let p = RcParams::default();
    let ends = [
        local_endpoint(&ctx, &qps[0], &p, 1)?,
        local_endpoint(&ctx, &qps[1], &p, 1)?,
    ];
    connect_rc(&qps[0], &p, ends[0].psn, &ends[1])?;
    connect_rc(&qps[1], &p, ends[1].psn, &ends[0])?;
    let mrs = [
        pd.reg_mr(4096, AccessFlags::ALL)?,
        pd.reg_mr(4096, AccessFlags::ALL)?,
    ];
    for (qp, mr) in qps.iter().zip(&mrs) {
        for _ in 0..8 {
            qp.post_recv(&[RecvWr::new(0, &[mr.sge(0, 64)?])])?;
        }
    }
    let mut wc = [WorkCompletion::default(); 8];
    // One message from side `from` to the other, to its receive completion.
    let mut hop = |from: usize| -> Res<()> {
        let to = 1 - from;
        let sge = [mrs[from].sge(64, 8)?];
        qps[from]
            .post_send(&[SendWr::send(1, &sge).signaled().inline()])
            .context("posting a SEND")?;
        let mut w = Waiter::busy(Duration::from_secs(10));
        loop {
            let n = cqs[to].poll(&mut wc)?;
            if let Some(bad) = wc[..n].iter().find(|w| !w.is_ok()) {
                anyhow::bail!("one-thread ping-pong: {:?} failed: {:?}", bad.opcode, bad.status);
            }
            if wc[..n].iter().any(|c| c.opcode == WcOpcode::Recv) {
                break;
            }
            if n == 0 {
                w.idle(&|| "a SEND of the one-thread ping-pong".to_string())?;
            }
        }
        qps[to].post_recv(&[RecvWr::new(0, &[mrs[to].sge(0, 64)?])])?;
        Ok(())
    };
    for i in 0..WARMUP {
        hop((i % 2) as usize)?;
    }
    let message = ns_per(messages, |i| hop((i % 2) as usize))?;
    let empty_look = ns_per(messages * LOOKS_PER_MESSAGE, |_| {
        if cqs[0].poll(&mut wc)? != 0 {
            anyhow::bail!("a completion on an idle CQ");
        }
        Ok(())
    })?;
    Ok(Cost { message, empty_look })
}

/// Raw TCP over loopback in one thread, with the sim's system calls (see the module
/// docs).
pub fn tcp_ns_per_message(messages: u64) -> Res<Cost> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut c = TcpStream::connect(l.local_addr()?)?;
    let (mut s, _) = l.accept()?;
    for x in [&c, &s] {
        backend_sim::sockopt::tune(x)?;
        x.set_nonblocking(true)?;
    }
    let frame = [7u8; 48];
    let mut buf = [0u8; 4096];
    let mut hop = |a: &mut TcpStream, b: &mut TcpStream| -> Res<()> {
        a.write_all(&frame)?;
        let mut got = 0;
        while got < frame.len() {
            match b.read(&mut buf) {
                Ok(0) => anyhow::bail!("loopback peer closed"),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
        // The look at the device's other connection, which finds nothing.
        read_nothing(a, &mut buf)
    };
    for _ in 0..WARMUP / 2 {
        hop(&mut c, &mut s)?;
        hop(&mut s, &mut c)?;
    }
    // A message each way per call.
    let message = ns_per(messages / 2, |_| {
        hop(&mut c, &mut s)?;
        hop(&mut s, &mut c)
    })? / 2.0;
    let empty_look = ns_per(messages * LOOKS_PER_MESSAGE, |_| {
        read_nothing(&mut c, &mut buf)?;
        read_nothing(&mut s, &mut buf)
    })?;
    Ok(Cost { message, empty_look })
}
