//! Many short round trips between two application threads, each spinning on its own CQ
//! of its own device: the pattern of `perf send_lat` and `read_lat`, in which a post
//! from one thread races with another thread (or the progress thread) that holds the
//! connection while it looks for news. A post lost in that race shows up here as a
//! round trip that never completes (each wait is bounded), not as a slow benchmark.

mod common;

use common::{read_back, read_mrs, Pair, WAIT};
use std::time::Duration;
use verbs_api::*;

const ROUNDS: u64 = 20_000;
/// Round trips after a pause of 0 to 280 us.
const PAUSED_ROUNDS: u64 = 6000;

fn cap() -> QpCap {
    QpCap::new(16, 16).with_inline(64)
}

#[test]
fn send_recv_and_read_round_trips_never_lose_a_post() {
    let p = Pair::new(&RcParams::default(), cap());
    let (cq0, cq1, a, b) = (&p.cq0, &p.cq1, &p.a, &p.b);
    let (mra, mrb) = read_mrs(&p.pd0, &p.pd1);

    // SEND/RECV ping-pong: both sides post and spin; each keeps its next receive posted
    // before it sends, so no SEND meets an empty receive queue.
    a.post_recv(&[RecvWr::new(0, &[mra.sge(0, 8).unwrap()])]).unwrap();
    b.post_recv(&[RecvWr::new(0, &[mrb.sge(0, 8).unwrap()])]).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..ROUNDS {
                let w = poll_n(cq1, 1, WAIT).unwrap_or_else(|e| panic!("pong {i}: ping lost: {e}"));
                assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
                b.post_recv(&[RecvWr::new(i + 1, &[mrb.sge(0, 8).unwrap()])])
                    .unwrap();
                b.post_send(&[SendWr::send(i, &[mrb.sge(8, 8).unwrap()]).signaled()])
                    .unwrap();
                let w = poll_n(cq1, 1, WAIT).unwrap_or_else(|e| panic!("pong {i}: send lost: {e}"));
                assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Send, "{w:?}");
            }
        });
        for i in 0..ROUNDS {
            a.post_send(&[SendWr::send(i, &[mra.sge(8, 8).unwrap()]).signaled()])
                .unwrap();
            let w = poll_n(cq0, 2, WAIT).unwrap_or_else(|e| panic!("ping {i}: lost: {e}"));
            assert!(w.iter().all(|w| w.is_ok()), "{w:?}");
            a.post_recv(&[RecvWr::new(i + 1, &[mra.sge(0, 8).unwrap()])])
                .unwrap();
        }
    });

    // READ round trips: only the requester's thread spins; the target side is the
    // progress thread of sim1 alone.
    for i in 0..ROUNDS {
        read_back(a, cq0, &mra, &mrb, 64, i, &format!("READ {i}"));
    }

    // Round trips after pauses: once an application thread stops polling for a while the
    // progress thread takes over and spins, so the next post races with it.
    for i in 0..PAUSED_ROUNDS {
        std::thread::sleep(Duration::from_micros(40 * (i % 8)));
        read_back(a, cq0, &mra, &mrb, 72, i, &format!("paused READ {i}"));
    }
}

/// A target whose application polled in a tight loop (so its progress thread slept on
/// the doorbell, its connection read directly and kept out of the epoll set) and then
/// stops polling without arming a CQ: its progress thread must take the connection over,
/// back in the epoll set, and answer one-sided requests, also after pauses long enough
/// for it to block.
#[test]
fn a_target_that_stops_polling_is_served_by_its_progress_thread() {
    let p = Pair::new(&RcParams::default(), cap());
    let (cq0, cq1, a) = (&p.cq0, &p.cq1, &p.a);
    let (mra, mrb) = read_mrs(&p.pd0, &p.pd1);
    let mut wc = [WorkCompletion::default(); 4];
    for i in 0..30u64 {
        // The target's application drives its device for 3 ms, then goes away.
        let until = std::time::Instant::now() + Duration::from_millis(3);
        while std::time::Instant::now() < until {
            assert_eq!(cq1.poll(&mut wc).unwrap(), 0);
        }
        std::thread::sleep(Duration::from_millis(i % 4));
        for k in 0..4 {
            read_back(a, cq0, &mra, &mrb, 128, i * 10 + k, &format!("READ {i}.{k}"));
        }
    }
}

/// Posts to a busy connection by a thread that drives progress are left for its next
/// poll, not handed to the progress thread. If the thread then stops polling (without
/// arming a CQ), the progress thread must still send them once the driving window and
/// its grace period are over: the WRITEs reach the target with nobody polling the
/// requester's device.
#[test]
fn posts_left_by_a_driving_thread_that_stops_polling_still_go_out() {
    // No ACK timer (timeout 0 is infinite): its expiry would also send them.
    let p = Pair::new(
        &RcParams {
            timeout: 0,
            ..RcParams::default()
        },
        cap(),
    );
    let (pd0, pd1, cq0, a) = (&p.pd0, &p.pd1, &p.cq0, &p.a);
    let src = pd0.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd1
        .reg_mr(1 << 20, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let mut wc = [WorkCompletion::default(); 16];
    let small = [src.sge(1 << 19, 8).unwrap()];
    for round in 1..=5u64 {
        // Drive for 2 ms: small WRITEs one after the other, polled in a tight loop (the
        // packets also wake a progress thread blocked on the epoll set, which then sees
        // the application driving and sleeps on its doorbell alone).
        let until = std::time::Instant::now() + Duration::from_millis(2);
        let deadline = until + WAIT;
        let mut out = 0;
        while std::time::Instant::now() < until || out > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: a small WRITE never completed"
            );
            if out == 0 {
                a.post_send(&[SendWr::write(99, &small, dst.remote().at(1 << 19)).signaled()])
                    .unwrap();
                out = 1;
            }
            out -= cq0.poll(&mut wc).unwrap();
        }
        // Eight 64 KiB WRITEs, the last one's first word marked; only the first finds
        // the connection idle.
        for k in 0..8u64 {
            src.write_u64(k as usize * 65536, round * 100 + k).unwrap();
            let sge = [src.sge(k as usize * 65536, 65536).unwrap()];
            a.post_send(&[SendWr::write(k, &sge, dst.remote().at(k * 65536)).signaled()])
                .unwrap();
        }
        // Nobody polls sim0 now: wait for the data at the target.
        let deadline = std::time::Instant::now() + WAIT;
        while dst.read_u64(7 * 65536).unwrap() != round * 100 + 7 {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the queued WRITEs never left"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        let w = poll_n(cq0, 8, WAIT).unwrap();
        assert!(w.iter().all(|w| w.is_ok()), "{w:?}");
    }
}
