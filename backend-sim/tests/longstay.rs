//! An application thread that drives a device can stay inside one connection for as long
//! as that connection's stream does not drain. The device's other connections must not
//! wait for the end of that stay: here a raw TCP peer floods one QP with duplicate
//! requests (cheap SENDs, and every eighth a READ that the device executes again and
//! answers with 512 bytes, so it reads the flood slower than the peer writes it) while
//! READs arrive for another QP of the same device. Each READ must complete, within a
//! second. (The flooded QP itself may end in ERR: when the peer's reader thread is
//! starved on a busy machine, more than 1024 answers wait for it and the device cuts the
//! peer off as one that never reads; that is the hostile-peer guard, tested in
//! `hostile.rs`, not what this test is about.)
//!
//! Without the progress thread's round for the other connections during a long stay
//! (`Progress::long_stay`) the READs starved until their retries ran out
//! (`IBV_WC_RETRY_EXC_ERR`) in 12 of 26 runs; with it, 40 of 40 pass (the slowest READ
//! taking 0.2-10 ms). (Not every run makes the stay long: on two cores the flood's writer is
//! descheduled now and then and the stream drains.)
//!
//! Its own test binary: the flood would slow down other tests running beside it.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use backend_sim_proto::wire::Frame;
use common::{frame, impersonate, read_mrs, Pair};
use verbs_api::*;

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_flood_on_one_qp_does_not_hold_up_reads_on_another() {
    // QP y0 (`a`) on sim0, READ by y1 (`b`) on sim1.
    let cap = QpCap::new(8, 8);
    let p = RcParams::default();
    let pair = Pair::new(&p, cap);
    let (c0, pd0, pd1, cq0, cq1) = (&pair.c0, &pair.pd0, &pair.pd1, &pair.cq0, &pair.cq1);
    let y1 = &pair.b;

    // QP x on sim0, connected to an endpoint the raw peer impersonates (the smallest QPN,
    // so x is the passive side and accepts the peer's hello).
    let x = pd0.create_qp(&QpInitAttr::rc(cq0, cq0, cap)).unwrap();
    let (local, remote) = read_mrs(pd1, pd0);
    let read = |i: u64, bound: Duration| {
        remote.write_u64(0, i).unwrap();
        y1.post_send(&[SendWr::read(i, &[local.sge(0, 8).unwrap()], remote.remote().at(0)).signaled()])
            .unwrap();
        // Polled every 100 us, not in a tight loop: a third spinning thread on a 2-core
        // machine would take turns with the flood's writer and let x's stream drain.
        let t = Instant::now();
        let mut wc = [WorkCompletion::default(); 1];
        while cq1.poll(&mut wc).unwrap() == 0 {
            assert!(t.elapsed() < bound, "READ {i}: no completion after {bound:?}");
            std::thread::sleep(Duration::from_micros(100));
        }
        assert!(wc[0].is_ok(), "READ {i}: {:?}", wc[0]);
        assert_eq!(local.read_u64(0).unwrap(), i);
        t.elapsed()
    };
    // y's connection is up before the flood starts.
    read(0, Duration::from_secs(5));

    let s = impersonate(c0, &x, &p);
    // Duplicates (the PSN just behind x's expected one) of a SEND, acknowledged again and
    // coalesced, and of a 512-byte READ, executed again: every eighth frame costs the device
    // a 512-byte response, so it reads the flood far slower than the writer writes it and
    // x's stream does not drain.
    let target = pd0
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    let mut dup = frame(Frame::Read {
        inflight: 1,
        psn: 0xff_ffff,
        len: 512,
        addr: target.addr(),
        rkey: target.rkey(),
    });
    for _ in 0..7 {
        dup.extend(frame(Frame::Send {
            psn: 0xff_ffff,
            len: 0,
            imm: None,
            solicited: false,
            ack_req: false,
            inv: None,
        }));
    }
    let flood: Vec<u8> = dup.iter().copied().cycle().take(dup.len() * 8192).collect();

    let stop = AtomicBool::new(false);
    let slowest = std::thread::scope(|sc| {
        // However this closure ends (a READ that timed out panics), the threads stop, so
        // the scope ends and a failure is reported instead of hanging.
        let _stop = StopOnDrop(&stop);
        // The application thread of sim0 polls its CQ in a tight loop: it drives sim0,
        // whose progress thread sleeps, and reads x's flood itself.
        sc.spawn(|| {
            let mut wc = [WorkCompletion::default(); 4];
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(cq0.poll(&mut wc).unwrap(), 0, "nothing completes on sim0");
            }
        });
        // The raw peer: floods x, and reads (and drops) the ACKs.
        let mut rx = s.try_clone().unwrap();
        sc.spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while matches!(rx.read(&mut buf), Ok(n) if n > 0) {}
        });
        sc.spawn(|| {
            let mut s = &s;
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(20) {
                // The device may cut the flooder off when more than 1024 responses wait
                // for it (its guard against peers that never read): the flood ends there.
                if s.write_all(&flood).is_err() {
                    break;
                }
            }
            let _ = s.shutdown(std::net::Shutdown::Both);
        });
        std::thread::sleep(Duration::from_millis(200));
        let slowest = (1..=20).map(|i| read(i, Duration::from_secs(1))).max();
        stop.store(true, Ordering::Relaxed);
        slowest
    });
    eprintln!(
        "slowest READ during the flood: {slowest:?}; the flooded QP in {:?}",
        x.state().unwrap()
    );
}
