//! dist-lock: a distributed lock built from RDMA atomics (the atomic pattern of the RDMA
//! communication model), proven by a shared counter.
//!
//! The server registers one small region with REMOTE_ATOMIC | REMOTE_READ | REMOTE_WRITE:
//!
//! ```text
//! offset 0   lock word      0 = free, else the holder's token   (CAS spinlock)
//!        8   next ticket                                        (ticket lock)
//!        16  now serving                                        (ticket lock)
//!        24  counter        incremented inside the critical section
//! ```
//!
//! Clients (threads, each with its own QP, in one or more processes) take the lock and,
//! inside the critical section, increment the counter with an RDMA READ followed by an
//! RDMA WRITE: a read-modify-write that loses increments unless the lock really excludes.
//!
//! - `--mode cas`: spinlock. CMP_AND_SWP(lock, 0 -> token) until it returns 0, with
//!   randomized exponential backoff; release with CMP_AND_SWP(lock, token -> 0) (which
//!   also checks that nobody else held it).
//! - `--mode ticket`: fair queue lock. FETCH_AND_ADD(next ticket, 1) gives my ticket; RDMA
//!   READ now-serving until it equals my ticket (backing off by my distance in the queue);
//!   release with FETCH_AND_ADD(now serving, 1).
//!
//! At the end the server reads its words through its own MR and checks that the counter
//! equals clients x iterations exactly; the demo fails otherwise.
//!
//! Words are host-endian (atomics on the sim and on HCAs of the same architecture), so
//! server and clients must share the byte order.
//!
//! This file holds the verbs calls, the two locks and the demo's invariant; the backoff,
//! the reports and the options are in `examples::lock`.
//!
//! ```text
//! dist-lock demo                          # both modes: server + 2 client processes x 2 threads
//! dist-lock demo --mode ticket --procs 3 --threads 4 --iters 500
//! dist-lock server --listen 0.0.0.0:18517 --clients 4 --expect-counter 800
//! dist-lock client --server 10.0.0.1:18517 --threads 2 --iters 200 --mode cas
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use examples::backend::open_device;
use examples::child::announce_listening;
use examples::cli::CommonArgs;
use examples::conn::{self, QpOpts};
use examples::demo::{start_server, ChildArgs};
use examples::lock::backoff::{backoff, xorshift};
use examples::lock::opts::{ClientArgs, ClientTuning, DemoArgs, DemoMode, Mode, ServerArgs};
use examples::lock::report::{self, ThreadReport, FINAL, READ_BACK};
use examples::stats::Latencies;
use examples::wait::poll_one_ok;
use examples::{side_channel, threads, with_backend, Res};
use verbs_api::cm::Offer;
use verbs_api::{
    AccessFlags, Backend, Context, MemoryRegion, ProtectionDomain, QueuePair, RemoteMr, SendWr,
    WorkCompletion,
};

const LOCK: u64 = 0;
const NEXT_TICKET: u64 = 8;
const NOW_SERVING: u64 = 16;
const COUNTER: u64 = 24;
const REGION: usize = 64;

/// A lock word and a shared counter driven by RDMA atomics.
#[derive(Parser, Debug)]
#[command(
    name = "dist-lock",
    version,
    after_help = "Examples:\n  dist-lock demo\n  dist-lock demo --mode ticket --procs 3 --threads 4\n  dist-lock server --listen 0.0.0.0:18517 --clients 4 --expect-counter 800\n  dist-lock client --server HOST:18517 --threads 2 --iters 200 --mode cas"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Hold the lock region; start the clients together; check the counter at the end.
    Server(ServerArgs),
    /// Take the lock `--iters` times per thread and increment the counter inside it.
    Client(ClientArgs),
    /// Start a server and `--procs` client processes of `--threads` threads each, and
    /// check that the counter equals procs x threads x iters (in one or both modes).
    Demo(DemoArgs),
}

fn main() -> ExitCode {
    examples::program::main("dist-lock", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    let common = &cli.common;
    match &cli.cmd {
        Cmd::Server(a) => with_backend!(common, |b| server(b, common, a)),
        Cmd::Client(a) => with_backend!(common, |b| clients(b, common, a)),
        Cmd::Demo(a) => demo(common, a),
    }
}

// ---------------------------------------------------------------------------------------
// server

fn server<B: Backend>(b: &B, common: &CommonArgs, a: &ServerArgs) -> Res<()> {
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let mr = pd
        .reg_mr(
            REGION,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_ATOMIC
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_WRITE,
        )
        .context("registering the lock region")?;
    let cq = ctx.create_cq(16, None)?;
    let acceptor = conn::Acceptor::start(conn::listen(&a.listen)?, common.wait())?;
    announce_listening(acceptor.local_addr());
    println!(
        "server: device {}, lock region {:#x} rkey {:#x}: lock @0, next_ticket @8, now_serving @16, counter @24; waiting for {} client QPs",
        ctx.name(),
        mr.addr(),
        mr.rkey(),
        a.clients
    );
    let params = common.rc_params();
    let timeout = common.wait().max(Duration::from_secs(30));
    let mut qps = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..a.clients.max(1) {
        let (qp, _) = conn::create_qp_on::<B>(&ctx, &pd, &cq, &QpOpts::new(1, 1))?;
        let offer = Offer::new().mr(mr.remote());
        let peer = acceptor.accept(&ctx, &qp, |_| Ok(()), &params, offer, timeout)?;
        qps.push(qp);
        peers.push(peer);
    }
    // Start everybody at once: maximum contention.
    for p in &mut peers {
        side_channel::send_msg(&mut p.stream, b"go")?;
    }
    let start = Instant::now();
    println!("server: {} client QPs connected; started them", peers.len());
    // The lock needs no server CPU: wait until every client QP is done.
    let wait = timeout.max(Duration::from_secs(60));
    side_channel::wait_all_done(&mut peers, Duration::from_millis(1), wait, "the clients")?;
    let el = start.elapsed();
    let word = |o: u64| mr.read_u64(o as usize);
    let (lock, next, serving, counter) = (
        word(LOCK)?,
        word(NEXT_TICKET)?,
        word(NOW_SERVING)?,
        word(COUNTER)?,
    );
    report::print_server(el, lock, next, serving, counter);
    if lock != 0 {
        bail!("the lock word is {lock:#x} after every client finished (should be free: 0)");
    }
    if next != serving {
        bail!("next_ticket {next} != now_serving {serving} after every client finished");
    }
    if let Some(want) = a.expect_counter {
        if counter != want {
            bail!("counter is {counter}, expected {want}: increments were lost, mutual exclusion failed");
        }
        println!("server: counter == {want}: no increment lost, mutual exclusion held");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// client

/// One thread's connection: a QP and an 8-byte-word scratch region.
struct Worker<B: Backend> {
    rc: conn::RcQp<B>,
    local: B::Mr,
    remote: RemoteMr,
    timeout: Duration,
    id: u32,
}

impl<B: Backend> Worker<B> {
    /// Posts one signaled WR and waits for its successful completion.
    fn exec(&self, wr: SendWr<'_>, what: &str) -> Res<WorkCompletion> {
        self.rc
            .qp
            .post_send(&[wr.signaled()])
            .with_context(|| format!("thread {}: posting {what}", self.id))?;
        poll_one_ok(&self.rc.cq, self.timeout, &|| {
            format!("thread {}: {what}", self.id)
        })
    }

    /// CMP_AND_SWP on a lock word; returns the old value.
    fn cas(&self, off: u64, compare: u64, swap: u64) -> Res<u64> {
        let sge = [self.local.sge(0, 8)?];
        self.exec(
            SendWr::cmp_and_swp(1, &sge, self.remote.at(off), compare, swap),
            "CMP_AND_SWP",
        )?;
        Ok(self.local.read_u64(0)?)
    }

    /// FETCH_AND_ADD; returns the old value.
    fn faa(&self, off: u64, add: u64) -> Res<u64> {
        let sge = [self.local.sge(0, 8)?];
        self.exec(
            SendWr::fetch_and_add(2, &sge, self.remote.at(off), add),
            "FETCH_AND_ADD",
        )?;
        Ok(self.local.read_u64(0)?)
    }

    /// RDMA READ of one word.
    fn read(&self, off: u64) -> Res<u64> {
        let sge = [self.local.sge(8, 8)?];
        self.exec(SendWr::read(3, &sge, self.remote.at(off)), "RDMA READ")?;
        Ok(self.local.read_u64(8)?)
    }

    /// RDMA WRITE of one word.
    fn write(&self, off: u64, v: u64) -> Res<()> {
        self.local.write_u64(16, v)?;
        let sge = [self.local.sge(16, 8)?];
        self.exec(SendWr::write(4, &sge, self.remote.at(off)), "RDMA WRITE")?;
        Ok(())
    }
}

fn clients<B: Backend>(b: &B, common: &CommonArgs, a: &ClientArgs) -> Res<()> {
    let t = &a.tuning;
    let addr = conn::parse_addr(&a.server)?;
    let ctx = open_device(b, common.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let reps = threads::on_threads(t.threads.max(1), "client", |i| {
        worker::<B>(&ctx, &pd, common, t, addr, i)
    })?;
    report::print_clients(&reps, t);
    Ok(())
}

fn worker<B: Backend>(
    ctx: &B::Context,
    pd: &B::Pd,
    common: &CommonArgs,
    t: &ClientTuning,
    addr: SocketAddr,
    id: u32,
) -> Res<ThreadReport> {
    let timeout = common.wait();
    let rc = conn::create_rc::<B>(ctx, pd, &QpOpts::new(4, 1))?;
    let local = pd
        .reg_mr(64, AccessFlags::LOCAL_WRITE)
        .context("registering the scratch words")?;
    let mut peer = conn::connect(addr, ctx, &rc.qp, &common.rc_params(), Offer::new(), timeout)?;
    let Some(&remote) = peer.mrs.first() else {
        bail!("the server published no lock region")
    };
    if remote.len < 32 {
        bail!("the server's lock region is {} bytes, need 32", remote.len);
    }
    let w = Worker::<B> {
        rc,
        local,
        remote,
        timeout,
        id,
    };
    // Unique, non-zero token for the CAS lock word: process id and thread.
    let token = ((std::process::id() as u64) << 16) | (id as u64 + 1);
    let mut rng = token.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    // Wait for the server's start signal (all clients connected).
    let go = side_channel::recv_msg(&mut peer.stream, timeout.max(Duration::from_secs(60)))?;
    if go != b"go" {
        bail!("unexpected start message {go:?}");
    }
    let mut rep = ThreadReport {
        lat: Latencies::with_capacity(t.iters as usize),
        ..Default::default()
    };
    let start = Instant::now();
    let mut hold_us = 20u64;
    for _ in 0..t.iters {
        let t0 = Instant::now();
        let ticket = match t.mode {
            Mode::Cas => acquire_cas(&w, t, token, &mut rng, &mut rep)?,
            Mode::Ticket => acquire_ticket(&w, t, hold_us, &mut rep)?,
        };
        let acquired = Instant::now();
        rep.lat.record(acquired - t0);
        // -- critical section: a read-modify-write that only a lock makes safe
        let v = w.read(COUNTER)?;
        w.write(COUNTER, v + 1)?;
        // -- release (the WRITE has completed: it is ordered before this)
        match t.mode {
            Mode::Cas => {
                let old = w.cas(LOCK, token, 0)?;
                if old != token {
                    bail!(
                        "released a lock held by {old:#x}, not by me ({token:#x}): mutual exclusion broken"
                    );
                }
            }
            Mode::Ticket => {
                let old = w.faa(NOW_SERVING, 1)?;
                if old != ticket {
                    bail!("now_serving was {old} at release, my ticket {ticket}: mutual exclusion broken");
                }
            }
        }
        rep.acquisitions += 1;
        // Moving average of how long the lock is held (critical section + release).
        let held = acquired.elapsed().as_micros() as u64;
        hold_us = if rep.acquisitions == 1 {
            held
        } else {
            (hold_us * 7 + held) / 8
        };
    }
    rep.elapsed = start.elapsed();
    rep.counter_after = w.read(COUNTER)?;
    side_channel::send_msg(&mut peer.stream, b"done")?;
    Ok(rep)
}

/// The spinlock: CMP_AND_SWP(lock, 0 -> token) until it returns 0, with randomized
/// exponential backoff. Returns 0 (no ticket).
fn acquire_cas<B: Backend>(
    w: &Worker<B>,
    t: &ClientTuning,
    token: u64,
    rng: &mut u64,
    rep: &mut ThreadReport,
) -> Res<u64> {
    let mut b = 1u64;
    loop {
        let old = w.cas(LOCK, 0, token)?;
        if old == 0 {
            return Ok(0);
        }
        rep.contended += 1;
        backoff(xorshift(rng) % b + 1);
        b = (b * 2).min(t.max_backoff_us.max(1));
    }
}

/// The ticket lock: FETCH_AND_ADD(next ticket, 1) gives my ticket; READ now-serving until
/// it is mine. Returns the ticket.
fn acquire_ticket<B: Backend>(
    w: &Worker<B>,
    t: &ClientTuning,
    hold_us: u64,
    rep: &mut ThreadReport,
) -> Res<u64> {
    let my = w.faa(NEXT_TICKET, 1)?;
    loop {
        let serving = w.read(NOW_SERVING)?;
        if serving == my {
            return Ok(my);
        }
        if serving > my {
            bail!("now_serving {serving} passed my ticket {my}: the ticket lock is broken");
        }
        rep.contended += 1;
        // Back off by my place in the queue times the typical hold time, so each waiter
        // polls about once per hand-over.
        let ahead = my - serving;
        backoff((ahead * hold_us / 2).clamp(1, t.max_backoff_us.max(1)));
    }
}

// ---------------------------------------------------------------------------------------
// demo

fn demo(common: &CommonArgs, a: &DemoArgs) -> Res<()> {
    let modes: &[Mode] = match a.mode {
        DemoMode::Cas => &[Mode::Cas],
        DemoMode::Ticket => &[Mode::Ticket],
        DemoMode::Both => &[Mode::Cas, Mode::Ticket],
    };
    for &mode in modes {
        demo_one(common, a, mode)?;
    }
    Ok(())
}

fn demo_one(common: &CommonArgs, a: &DemoArgs, mode: Mode) -> Res<()> {
    let (procs, threads) = (a.procs.max(1), a.threads.max(1));
    let expect = procs as u64 * threads as u64 * a.iters as u64;
    println!(
        "demo: {} lock: server + {procs} client process(es) x {threads} thread(s) x {} iterations; expecting counter = {expect}",
        mode.as_str(),
        a.iters
    );
    let sargs = ChildArgs::server(common)
        .opt("--clients", procs * threads)
        .opt("--expect-counter", expect);
    let (mut server, addr) = start_server("server", &sargs)?;
    let mut kids = Vec::new();
    for p in 0..procs {
        let cargs = ChildArgs::new(common, "client")
            .opt("--server", addr)
            .opt("--mode", mode.as_str())
            .opt("--threads", threads)
            .opt("--iters", a.iters)
            .opt("--max-backoff-us", a.max_backoff_us);
        kids.push(cargs.spawn(&format!("client{p}"))?);
    }
    let bound = common.wait() + Duration::from_secs(60);
    for k in &mut kids {
        k.wait_success(bound)
            .with_context(|| format!("client process {}", k.name()))?;
    }
    let sres = server.wait(bound)?;
    let Some(line) = server.last_line(FINAL) else {
        bail!("the server exited ({sres}) without its final line");
    };
    let counter = report::final_counter(&line)
        .ok_or_else(|| anyhow::anyhow!("cannot parse the server's final line {line:?}"))?;
    if counter != expect {
        bail!(
            "{} lock: counter = {counter}, expected {expect}: mutual exclusion FAILED",
            mode.as_str()
        );
    }
    if !sres.success() {
        bail!("the server failed ({sres})");
    }
    // The second witness: the last client process to finish read the counter back with
    // RDMA READ after its last release, so the largest read-back is the final value.
    let read_back = kids
        .iter()
        .filter_map(|k| k.last_line(READ_BACK))
        .filter_map(|l| report::read_back(&l))
        .max();
    if read_back != Some(expect) {
        bail!(
            "{} lock: the clients' RDMA READ of the counter gave {read_back:?}, expected {expect}",
            mode.as_str()
        );
    }
    println!(
        "demo: OK: {} lock: counter = {counter} = {procs} x {threads} x {} (server's MR and the clients' RDMA READ agree): every increment survived, mutual exclusion held",
        mode.as_str(),
        a.iters
    );
    Ok(())
}
