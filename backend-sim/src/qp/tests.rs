//! Unit tests of the QP with the whole device around it.

use std::time::{Duration, Instant};

use verbs_api::{
    connect_rc, local_endpoint, poll_n, AccessFlags, Context, Endpoint, MemoryRegion, ProtectionDomain,
    QpCap, QpInitAttr, QpState, QueuePair, RcParams, SendWr, Sge, WcStatus,
};

use crate::SimBackend;

/// One device (`sim0`) with a PD and a CQ, on which tests connect QPs to each other.
struct OneDevice {
    ctx: crate::SimContext,
    pd: crate::SimPd,
    cq: crate::SimCq,
}

impl OneDevice {
    fn open() -> OneDevice {
        use verbs_api::Backend;
        let ctx = SimBackend::default().open("sim0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        OneDevice { ctx, pd, cq }
    }

    /// Two RC QPs connected to each other (default parameters) and, once it is up, the
    /// first one's connection.
    fn connected_pair(&self) -> (crate::SimQp, crate::SimQp, std::sync::Arc<super::Conn>) {
        self.connected_pair_with(&RcParams::default())
    }

    /// [`OneDevice::connected_pair`] with the parameters `p`.
    fn connected_pair_with(&self, p: &RcParams) -> (crate::SimQp, crate::SimQp, std::sync::Arc<super::Conn>) {
        let cap = QpCap::new(8, 8);
        let (qa, qb) = (
            self.pd
                .create_qp(&QpInitAttr::rc(&self.cq, &self.cq, cap))
                .unwrap(),
            self.pd
                .create_qp(&QpInitAttr::rc(&self.cq, &self.cq, cap))
                .unwrap(),
        );
        let ea = local_endpoint(&self.ctx, &qa, p, 1).unwrap();
        let eb = local_endpoint(&self.ctx, &qb, p, 2).unwrap();
        connect_rc(&qa, p, 1, &eb).unwrap();
        connect_rc(&qb, p, 2, &ea).unwrap();
        // The connection comes up in the background.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let conn = qa.qp.inner.lock().conn.clone();
            if let Some(c) = conn {
                return (qa, qb, c);
            }
            assert!(Instant::now() < deadline, "no connection");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// An HCA processes a WQE whether or not anything answers at the other end, so a
/// local protection error completes at once, also on a QP without a connection (its
/// peer unreachable, not yet connected, or gone). Found by the verbs-level model
/// check (tests/model.rs): the sim built WQEs only once a connection existed, so a
/// bad lkey towards a peer in ERR or destroyed ended as RETRY_EXC_ERR after the
/// retries instead of LOC_PROT_ERR.
#[test]
fn local_errors_complete_without_a_connection() {
    use verbs_api::Backend;
    let sim = SimBackend::default();
    let ctx = sim.open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let cap = QpCap::new(4, 4);
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // 67 ms x 8 tries: the old outcome took half a second.
    let p = RcParams {
        timeout: 14,
        retry_cnt: 7,
        ..RcParams::default()
    };
    let me = local_endpoint(&ctx, &qp, &p, 1).unwrap();
    // A peer that does not exist: no connection ever forms.
    let nobody = Endpoint {
        qpn: qp.qp_num() ^ 0x80_0000,
        ..me
    };
    connect_rc(&qp, &p, me.psn, &nobody).unwrap();
    let bad = [Sge::new(mr.addr(), 8, mr.lkey() ^ 0x5a5a_0000)];
    let good = [mr.sge(0, 8).unwrap()];
    let t0 = Instant::now();
    qp.post_send(&[
        SendWr::write(1, &good, mr.remote().at(0)).signaled(),
        SendWr::send(2, &bad),
    ])
    .unwrap();
    let wc = poll_n(&cq, 2, Duration::from_secs(10)).unwrap();
    let took = t0.elapsed();
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::WrFlushErr), "{wc:?}");
    assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::LocProtErr), "{wc:?}");
    assert!(
        took < Duration::from_millis(300),
        "took {took:?}: waited for transport retries"
    );
    assert_eq!(qp.state().unwrap(), QpState::Err);
}

/// The device's count of QPs with WQEs in their send queues (which decides whether a
/// lone WR on an idle connection may wait for the ones posted after it, see
/// `Progress::kick`) follows posts, completions, flushes, RESET and destroy. A
/// count left too high would make the device hold WRs for nothing; too low, never.
#[test]
fn the_busy_send_queue_count_follows_posts_completions_flushes_and_resets() {
    use verbs_api::{Backend, QpAttr, QpAttrMask};
    let sim = SimBackend::default();
    let ctx = sim.open("sim0").unwrap();
    let peer = sim.open("sim1").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ppd = peer.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let pcq = peer.create_cq(64, None).unwrap();
    let cap = QpCap::new(8, 8);
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let pmr = ppd
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let busy = || ctx.dev.progress.busy_send_queues();
    // WQEs towards a peer that does not exist stay outstanding (resent after a
    // timeout of 4.3 s, far beyond this test).
    let p = RcParams {
        timeout: 20,
        ..RcParams::default()
    };
    let lonely = |ctx: &crate::SimContext| {
        let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
        let me = local_endpoint(ctx, &qp, &p, 1).unwrap();
        let nobody = Endpoint {
            qpn: qp.qp_num() ^ 0x80_0000,
            ..me
        };
        connect_rc(&qp, &p, me.psn, &nobody).unwrap();
        qp
    };
    let sge = [mr.sge(0, 8).unwrap()];
    let write = |id| SendWr::write(id, &sge, pmr.remote().at(0)).signaled();
    assert_eq!(busy(), 0);

    // Posts: each QP counts once, however many WQEs it holds.
    let q1 = lonely(&ctx);
    let q2 = lonely(&ctx);
    let q3 = lonely(&ctx);
    q1.post_send(&[write(1), write(2)]).unwrap();
    assert_eq!(busy(), 1);
    q1.post_send(&[write(3)]).unwrap();
    q2.post_send(&[write(4)]).unwrap();
    q3.post_send(&[write(5)]).unwrap();
    assert_eq!(busy(), 3);
    // A flush (the QP to ERR), RESET and destroy each empty a send queue.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    q1.modify(&err, QpAttrMask::STATE).unwrap();
    assert_eq!(busy(), 2);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    q2.modify(&reset, QpAttrMask::STATE).unwrap();
    assert_eq!(busy(), 1);
    drop(q3);
    assert_eq!(busy(), 0);
    let flushed = poll_n(&cq, 3, Duration::from_secs(5)).unwrap();
    assert!(
        flushed.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{flushed:?}"
    );

    // Completions: a connected QP is busy until its WRITEs are acknowledged.
    let qa = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let qb = ppd.create_qp(&QpInitAttr::rc(&pcq, &pcq, cap)).unwrap();
    let p = RcParams::default();
    let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
    let eb = local_endpoint(&peer, &qb, &p, 2).unwrap();
    connect_rc(&qa, &p, 1, &eb).unwrap();
    connect_rc(&qb, &p, 2, &ea).unwrap();
    for round in 0..3 {
        qa.post_send(&[write(10), write(11)]).unwrap();
        let wc = poll_n(&cq, 2, Duration::from_secs(10)).unwrap();
        assert!(wc.iter().all(|w| w.is_ok()), "round {round}: {wc:?}");
        assert_eq!(busy(), 0, "round {round}");
    }
}

/// Every ACK a receiver owes is sent, whether it polls now and then or in a tight
/// loop, and the delayed-ACK list keeps a connection once (no adding and removing per
/// message): a one-way stream of SENDs, each acknowledged before the next, whose
/// receiver only polls (it posts no SEND that could carry the ACK). With an infinite
/// local ACK timeout no resend can complete a SEND whose ACK stayed behind. A receiver
/// polling once a millisecond does not drive progress, and its ACK used to wait for
/// its next call, which here never comes before the sender's completion: the stream
/// hung at its first SEND. A receiver that polls in a tight loop and then stops
/// leaves its ACK to the progress thread. Each device's list holds its one connection
/// at most, and none once the QPs are destroyed.
#[test]
fn each_owed_ack_is_sent_and_the_delayed_ack_list_keeps_a_connection_once() {
    use verbs_api::{Backend, CompletionQueue, RecvWr, WcOpcode, WorkCompletion};
    let sim = SimBackend::default();
    let (ctx, peer) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd, ppd) = (ctx.alloc_pd().unwrap(), peer.alloc_pd().unwrap());
    let (cq, pcq) = (
        ctx.create_cq(16, None).unwrap(),
        peer.create_cq(16, None).unwrap(),
    );
    let cap = QpCap::new(8, 8);
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let pmr = ppd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let qa = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let qb = ppd.create_qp(&QpInitAttr::rc(&pcq, &pcq, cap)).unwrap();
    // Local ACK timeout 0: infinite.
    let p = RcParams {
        timeout: 0,
        ..RcParams::default()
    };
    let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
    let eb = local_endpoint(&peer, &qb, &p, 2).unwrap();
    connect_rc(&qa, &p, 1, &eb).unwrap();
    connect_rc(&qb, &p, 2, &ea).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    // The first 10 received by polling once a millisecond, the rest in a tight loop:
    // 10 by a thread that stops polling then, 20 by this thread, which moves on to the
    // sender's device.
    let nap_poll = || {
        let mut wc = [WorkCompletion::default()];
        let deadline = Instant::now() + Duration::from_secs(10);
        while pcq.poll(&mut wc).unwrap() == 0 {
            assert!(Instant::now() < deadline, "no receive completion");
            std::thread::sleep(Duration::from_millis(1));
        }
        wc.to_vec()
    };
    for i in 0..40u64 {
        qb.post_recv(&[RecvWr::new(i, &[pmr.sge(0, 8).unwrap()])])
            .unwrap();
        let send = || qa.post_send(&[SendWr::send(i, &sge).signaled()]).unwrap();
        let got = match i {
            0..10 => {
                send();
                nap_poll()
            }
            // Polled in a tight loop (it has been polling for a while when the SEND
            // comes) by a thread that then stops polling: it neither polls again nor
            // moves to another device. The progress thread sends the ACK once the
            // driving window and grace period are over.
            10..20 => std::thread::scope(|s| {
                let receiver = s.spawn(|| poll_n(&pcq, 1, Duration::from_secs(10)).unwrap());
                std::thread::sleep(Duration::from_millis(1));
                send();
                receiver.join().unwrap()
            }),
            _ => {
                send();
                poll_n(&pcq, 1, Duration::from_secs(10)).unwrap()
            }
        };
        assert_eq!((got[0].opcode, got[0].wr_id), (WcOpcode::Recv, i), "{got:?}");
        let done = poll_n(&cq, 1, Duration::from_secs(10)).unwrap();
        assert!(done[0].is_ok() && done[0].wr_id == i, "SEND {i}: {done:?}");
        assert!(peer.dev.progress.acks_listed() <= 1, "SEND {i}");
        assert!(peer.dev.progress.acks_owed() <= 1, "SEND {i}");
    }
    assert_eq!(ctx.dev.progress.acks_listed(), 0, "the sender never owed an ACK");
    assert_eq!(ctx.dev.progress.acks_owed(), 0, "the sender never owed an ACK");
    drop((qa, qb));
    // The receiver's connection may be closed by its progress thread (it saw the
    // sender's end close first) rather than by `destroy`: wait for that close.
    let deadline = Instant::now() + Duration::from_secs(10);
    while peer.dev.progress.acks_listed() > 0 {
        assert!(Instant::now() < deadline, "a closed connection leaves the list");
        std::thread::sleep(Duration::from_millis(1));
    }
    // A count left above zero would keep the progress thread from ever sleeping.
    assert_eq!(
        peer.dev.progress.acks_owed(),
        0,
        "a closed connection owes nothing"
    );
}

/// The device's count of owed ACKs ends at zero, and its delayed-ACK list empty,
/// however a connection's close and a round that leaves an ACK for later interleave:
/// a round that finishes after the close (it held the I/O lock while `close` ran)
/// counts and lists the connection, then sees it closed and takes both back. A count
/// stuck above zero would keep the progress thread from sleeping for as long as the
/// device lives; a closed connection kept in the list would keep its socket open.
#[test]
fn a_close_leaves_no_owed_ack_counted_whichever_comes_first() {
    let dev = OneDevice::open();
    let progress = &dev.ctx.dev.progress;
    for close_first in [false, true] {
        let (_qa, _qb, conn) = dev.connected_pair();
        if close_first {
            progress.close(&conn);
            progress.owe_ack(&conn);
        } else {
            // (Not checked in between: the progress thread may service the
            // connection and find nothing owed.)
            progress.owe_ack(&conn);
            progress.owe_ack(&conn);
            progress.close(&conn);
        }
        assert_eq!(progress.acks_owed(), 0, "close_first: {close_first}");
        assert_eq!(progress.acks_listed(), 0, "close_first: {close_first}");
    }
}

/// Work a driving thread leaves for later (an ACK owed, a QP queued to transmit) while
/// the progress thread sleeps without a bound: it went to sleep on the connections
/// having seen the driving window closed, and the driving thread, its clock read before
/// the window's end, extended the window without ringing. The progress thread must be
/// woken to take the work over when the window and grace period end; before, it slept
/// on until a packet or timer came (the last ACK of a UC ping-pong, whose peer waited
/// for it, never went: `perf write_lat -c UC` timed out under load).
#[test]
fn work_left_while_the_progress_thread_sleeps_unbounded_is_taken_over() {
    let dev = OneDevice::open();
    let progress = &dev.ctx.dev.progress;
    let (qa, _qb, conn) = dev.connected_pair();
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // Nothing outstanding, no timer: the progress thread ends up asleep for good.
    wait("the progress thread sleeps unbounded", &|| {
        progress.asleep_unbounded()
    });
    progress.extend_window_unseen(Duration::from_millis(1));
    progress.owe_ack(&conn);
    wait("the owed ACK is taken over", &|| progress.acks_owed() == 0);
    wait("the progress thread sleeps unbounded again", &|| {
        progress.asleep_unbounded()
    });
    progress.extend_window_unseen(Duration::from_millis(1));
    progress.schedule(&qa.qp);
    wait("the queued transmit is taken over", &|| {
        !progress.transmits_queued()
    });
}

/// Two devices (`sim0`, `sim1`), each with a PD and a CQ, between which tests connect
/// RC QPs: each end has its own progress, as two processes would.
struct TwoDevices {
    c0: crate::SimContext,
    c1: crate::SimContext,
    pd0: crate::SimPd,
    pd1: crate::SimPd,
    cq0: crate::SimCq,
    cq1: crate::SimCq,
}

impl TwoDevices {
    fn open() -> TwoDevices {
        use verbs_api::Backend;
        let sim = SimBackend::default();
        let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
        let pd = |c: &crate::SimContext| c.alloc_pd().unwrap();
        let cq = |c: &crate::SimContext| c.create_cq(64, None).unwrap();
        TwoDevices {
            pd0: pd(&c0),
            pd1: pd(&c1),
            cq0: cq(&c0),
            cq1: cq(&c1),
            c0,
            c1,
        }
    }

    /// An RC QP on `sim0` connected to one on `sim1` (parameters `p`).
    fn pair(&self, cap: QpCap, p: &RcParams) -> (crate::SimQp, crate::SimQp) {
        let a = self
            .pd0
            .create_qp(&QpInitAttr::rc(&self.cq0, &self.cq0, cap))
            .unwrap();
        let b = self
            .pd1
            .create_qp(&QpInitAttr::rc(&self.cq1, &self.cq1, cap))
            .unwrap();
        let ea = local_endpoint(&self.c0, &a, p, 1).unwrap();
        let eb = local_endpoint(&self.c1, &b, p, 2).unwrap();
        connect_rc(&a, p, 1, &eb).unwrap();
        connect_rc(&b, p, 2, &ea).unwrap();
        (a, b)
    }
}

/// A lone WR posted to an idle QP while this thread drives progress, after another
/// post, and another QP of the device has work outstanding waits for the WRs posted
/// after it (`Progress::kick`). A thread that posts it and then stops polling (it computes)
/// must still have it executed: the progress thread takes it when the driving window
/// and the grace period end (about 2.1 ms; checked here with a wide margin). Without
/// that hand-over the WRITE would wait for a poll that never comes.
#[test]
fn a_lone_write_that_waits_while_the_thread_drives_is_executed_without_another_poll() {
    use verbs_api::{CompletionQueue, WorkCompletion};
    // A timeout of 1.07 s: the stalled WRITE below is not resent meanwhile.
    let p = RcParams {
        timeout: 18,
        ..RcParams::default()
    };
    let two = TwoDevices::open();
    let (c0, c1, pd0, pd1, cq0) = (&two.c0, &two.c1, &two.pd0, &two.pd1, &two.cq0);
    let pair = || two.pair(QpCap::new(8, 8), &p);
    let (a1, b1) = pair();
    let (a2, _b2) = pair();
    let (a3, _b3) = pair();
    let src = pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd1
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    src.write_u64(0, 0x1111).unwrap();
    src.write_u64(8, 0x2222).unwrap();
    let first = [src.sge(0, 8).unwrap()];
    let lone = [src.sge(8, 8).unwrap()];
    let write = |qp: &crate::SimQp, id, sge, at| {
        qp.post_send(&[SendWr::write(id, sge, dst.remote().at(at)).signaled()])
            .unwrap()
    };
    // All connections up (one WRITE each, completed).
    write(&a1, 1, &first, 0);
    write(&a2, 2, &lone, 8);
    write(&a3, 3, &first, 16);
    let wc = poll_n(cq0, 3, Duration::from_secs(10)).unwrap();
    assert!(wc.iter().all(|w| w.is_ok()), "{wc:?}");

    // a1's next WRITE stays outstanding: its peer processes nothing for 1 s.
    c1.faults()
        .stall_responder(b1.qp_num(), Duration::from_secs(1))
        .unwrap();
    write(&a1, 9, &first, 0);
    let joined = || c0.dev.progress.joined.load(std::sync::atomic::Ordering::Relaxed);
    let mut wcs = [WorkCompletion::default(); 8];
    let mut done = Vec::new();
    // Whether this thread still drives when it posts depends on the scheduler (a
    // thread preempted for longer than the driving window between its last poll and
    // its posts no longer drives, and its WRITE leaves at once): try until one waits.
    for attempt in 0.. {
        assert!(attempt < 50, "no lone WRITE waited in 50 attempts");
        dst.write_u64(8, 0).unwrap();
        // Drive: polls in a tight loop for 2 ms.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(2) {
            let n = cq0.poll(&mut wcs).unwrap();
            done.extend_from_slice(&wcs[..n]);
        }
        let before = joined();
        // The first post after a poll leaves at once (a ping-pong's post)...
        write(&a3, 100 + attempt, &first, 16);
        assert_eq!(joined(), before);
        // ...the next one, to an idle QP while a1 is busy, waits for more.
        write(&a2, 200 + attempt, &lone, 8);
        let waited = joined() == before + 1;
        // Then compute: no more polls until the WRITE has landed.
        let t = Instant::now();
        while dst.read_u64(8).unwrap() != 0x2222 {
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "the lone WRITE never left without a poll (it waited: {waited})"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        if waited {
            break;
        }
    }
    // Everything completes, a1's WRITE once the stall is over.
    let t = Instant::now();
    while !done.iter().any(|w| w.wr_id == 9) {
        assert!(t.elapsed() < Duration::from_secs(10), "{done:?}");
        let n = cq0.poll(&mut wcs).unwrap();
        done.extend_from_slice(&wcs[..n]);
    }
    assert!(done.iter().all(|w| w.is_ok()), "{done:?}");
}

/// One thread ping-pongs SENDs between two QPs of one device (a test with both ends
/// in one process, or `perf-compare`'s one-thread cost row). Each QP looks busy while
/// it owes the other an ACK (delayed until the thread's next call), so "other QPs
/// have work outstanding" holds at every post; the posts must still leave at once,
/// as every one of them is the first after a poll. (Holding them cost about 1 us of
/// CPU per message.)
#[test]
fn a_ping_pong_between_two_qps_of_one_device_never_waits() {
    use verbs_api::{Backend, CompletionQueue, RecvWr, WcOpcode, WorkCompletion};
    let sim = SimBackend::default();
    let ctx = sim.open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cqs = [ctx.create_cq(64, None).unwrap(), ctx.create_cq(64, None).unwrap()];
    let cap = QpCap::new(16, 16).with_inline(64);
    let qps = [
        pd.create_qp(&QpInitAttr::rc(&cqs[0], &cqs[0], cap)).unwrap(),
        pd.create_qp(&QpInitAttr::rc(&cqs[1], &cqs[1], cap)).unwrap(),
    ];
    let p = RcParams::default();
    let ends = [
        local_endpoint(&ctx, &qps[0], &p, 1).unwrap(),
        local_endpoint(&ctx, &qps[1], &p, 1).unwrap(),
    ];
    connect_rc(&qps[0], &p, 1, &ends[1]).unwrap();
    connect_rc(&qps[1], &p, 1, &ends[0]).unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    for qp in &qps {
        for _ in 0..8 {
            qp.post_recv(&[RecvWr::new(0, &[mr.sge(0, 64).unwrap()])])
                .unwrap();
        }
    }
    let mut wc = [WorkCompletion::default(); 8];
    let mut busy_seen = 0;
    for i in 0..400 {
        let (from, to) = (i % 2, 1 - i % 2);
        busy_seen += usize::from(ctx.dev.progress.busy_send_queues() > 0);
        qps[from]
            .post_send(&[SendWr::send(1, &[mr.sge(64, 8).unwrap()]).signaled().inline()])
            .unwrap();
        let t = Instant::now();
        'wait: loop {
            let n = cqs[to].poll(&mut wc).unwrap();
            for w in &wc[..n] {
                assert!(w.is_ok(), "hop {i}: {w:?}");
                if w.opcode == WcOpcode::Recv {
                    break 'wait;
                }
            }
            assert!(t.elapsed() < Duration::from_secs(10), "hop {i}: SEND lost");
        }
        qps[to]
            .post_recv(&[RecvWr::new(0, &[mr.sge(0, 64).unwrap()])])
            .unwrap();
    }
    assert!(busy_seen > 100, "the other QP was busy at only {busy_seen} posts");
    let joined = ctx.dev.progress.joined.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        joined, 0,
        "{joined} of 400 SENDs waited for a post that never came"
    );
}

/// QP state changes and the loss of a connection are debug events, on the thread that
/// causes them: the modify, and here the fault injection that breaks the connection.
#[test]
fn state_changes_and_a_lost_connection_are_logged() {
    use backend_sim_proto::trace_capture::Capture;
    use tracing::Level;
    use verbs_api::Backend;
    let sim = SimBackend::default();
    let ctx = sim.open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let cap = QpCap::new(4, 4);
    let qa = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let qb = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let mr = pd
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let p = RcParams::default();
    let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
    let eb = local_endpoint(&ctx, &qb, &p, 2).unwrap();
    let log = Capture::default();
    log.run(|| {
        connect_rc(&qa, &p, 1, &eb).unwrap();
        connect_rc(&qb, &p, 2, &ea).unwrap();
        // Connected once this WRITE has completed.
        qa.post_send(&[SendWr::write(1, &[mr.sge(0, 8).unwrap()], mr.remote().at(8)).signaled()])
            .unwrap();
        assert!(poll_n(&cq, 1, Duration::from_secs(10)).unwrap()[0].is_ok());
        ctx.faults().drop_connections(qa.qp_num()).unwrap();
    });
    let qpn = qa.qp_num().to_string();
    let changes: Vec<(String, String)> = log
        .find(Level::DEBUG, "QP state change")
        .iter()
        .filter(|e| e.field("qpn") == Some(qpn.as_str()))
        .map(|e| {
            (
                e.field("from").unwrap().to_string(),
                e.field("to").unwrap().to_string(),
            )
        })
        .collect();
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        changes,
        [pair("Reset", "Init"), pair("Init", "Rtr"), pair("Rtr", "Rts")]
    );
    let lost = log.find(Level::DEBUG, "connection lost");
    assert!(
        lost.iter().any(|e| e.field("qpn") == Some(qpn.as_str())
            && e.field("dest_qpn") == Some(qb.qp_num().to_string().as_str())),
        "{:?}",
        log.events()
    );
}

/// The device's count of QPs waiting for their connection (while it is above zero,
/// empty polls yield the CPU to the setup threads, see `progress::setup_yield`) rises at
/// RTR, on both sides of a pair, and falls once the pair is connected, at ERR, RESET
/// and destroy. A count left too high would tax every poll for a second; too low, a
/// spinning program would starve the setup threads again on a small machine.
#[test]
fn the_awaited_link_count_follows_rtr_connections_errors_resets_and_destroy() {
    use verbs_api::{Backend, QpAttr, QpAttrMask};
    let sim = SimBackend::default();
    let ctx = sim.open("sim0").unwrap();
    let peer = sim.open("sim1").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ppd = peer.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let pcq = peer.create_cq(16, None).unwrap();
    let cap = QpCap::new(4, 4);
    let here = || ctx.dev.progress.links_awaited();
    let there = || peer.dev.progress.links_awaited();
    let p = RcParams::default();

    // A pair: each side waits from RTR until the connection is set up.
    let qa = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let qb = ppd.create_qp(&QpInitAttr::rc(&pcq, &pcq, cap)).unwrap();
    assert_eq!((here(), there()), (0, 0), "INIT waits for nothing");
    let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
    let eb = local_endpoint(&peer, &qb, &p, 2).unwrap();
    connect_rc(&qa, &p, 1, &eb).unwrap();
    // (The peer is not in RTR yet: the hello is refused and retried meanwhile.)
    assert_eq!(here(), 1);
    connect_rc(&qb, &p, 2, &ea).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while (here(), there()) != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "still waiting: {} and {}",
            here(),
            there()
        );
        std::thread::sleep(Duration::from_millis(1));
    }

    // QPs whose peer never comes wait until ERR, RESET or destroy.
    let lonely = || {
        let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
        let me = local_endpoint(&ctx, &qp, &p, 1).unwrap();
        let nobody = Endpoint {
            qpn: qp.qp_num() ^ 0x80_0000,
            ..me
        };
        connect_rc(&qp, &p, me.psn, &nobody).unwrap();
        qp
    };
    let (q1, q2, q3) = (lonely(), lonely(), lonely());
    assert_eq!(here(), 3);
    let to = |s| QpAttr {
        qp_state: s,
        ..QpAttr::default()
    };
    q1.modify(&to(QpState::Err), QpAttrMask::STATE).unwrap();
    assert_eq!(here(), 2);
    q2.modify(&to(QpState::Reset), QpAttrMask::STATE).unwrap();
    assert_eq!(here(), 1);
    drop(q3);
    assert_eq!(here(), 0);
    // The connected pair is still connected, and counted nowhere.
    assert_eq!((qa.state().unwrap(), there()), (QpState::Rts, 0));
}

/// A connection held by another thread (an application thread inside it, perhaps
/// preempted there) while its socket has news: the progress thread, whose epoll set
/// keeps reporting the socket readable, must not spin on the lock it cannot take (on a
/// machine without an idle CPU that spinning delays the holder itself by milliseconds:
/// perftest's bandwidth runs stalled so at their start). It naps between attempts
/// (`HELD_NAP`), and what arrived is delivered once the holder lets go.
#[test]
fn a_connection_held_by_another_thread_is_not_spun_on() {
    use crate::progress::HELD_NAP;
    let dev = OneDevice::open();
    let progress = &dev.ctx.dev.progress;
    let (qa, qb, conn) = dev.connected_pair();
    let dst = dev
        .pd
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let src = dev.pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_u64(0, 0x5eed).unwrap();
    let hold = Duration::from_millis(60);
    let (seen, taken) = {
        // The test thread holds QP a's connection; b's WRITE arrives on its socket.
        let io = conn.io.lock();
        let before = progress.held_seen();
        qb.post_send(&[SendWr::write(7, &[src.sge(0, 8).unwrap()], dst.remote().at(0)).signaled()])
            .unwrap();
        let start = Instant::now();
        std::thread::sleep(hold);
        let taken = start.elapsed();
        let seen = progress.held_seen() - before;
        drop(io);
        (seen, taken)
    };
    assert!(seen > 0, "the progress thread never tried the held connection");
    // One attempt per nap at most (a nap may last longer, never shorter), plus slack for
    // the turns of the connection's other events.
    let bound = (taken.as_nanos() / HELD_NAP.as_nanos()) as u64 + 20;
    assert!(
        seen <= bound,
        "the progress thread tried the held connection {seen} times in {taken:?} (at most {bound})"
    );
    let wc = poll_n(&dev.cq, 1, Duration::from_secs(5)).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
    assert_eq!(dst.read_u64(0).unwrap(), 0x5eed);
    drop(qa);
}

/// The ACK of a WRITE that arrives while another thread holds the requester's connection
/// (an application thread preempted in the middle of its round, which on a busy machine
/// lasts longer than the local ACK timeout) costs no retry: it waits on this side,
/// unread, where an HCA would have taken it in as it came. `ib_write_lat -a` lost 67 ms
/// and more per such iteration: a timeout, then a resend of the whole message; and
/// with seven in a row, `IBV_WC_RETRY_EXC_ERR`.
#[test]
fn an_ack_waiting_on_a_held_connection_costs_no_retry() {
    let dev = OneDevice::open();
    // 67 ms, held 400 ms: five timeouts and more. (Not shorter: a thread preempted for
    // a timeout's length between the post and the hold would see a true timeout, the
    // ACK not yet sent, on a loaded machine.)
    let p = RcParams {
        timeout: 14,
        retry_cnt: 7,
        ..RcParams::default()
    };
    let (qa, qb, conn) = dev.connected_pair_with(&p);
    let b_conn = qb.qp.inner.lock().conn.clone().expect("b's connection is up");
    let dst = dev
        .pd
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let src = dev.pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_u64(0, 0xacc).unwrap();
    {
        // b takes nothing in until a's connection is held: its ACK arrives then.
        let b_io = b_conn.io.lock();
        qa.post_send(&[SendWr::write(3, &[src.sge(0, 8).unwrap()], dst.remote().at(0)).signaled()])
            .unwrap();
        let a_io = conn.io.lock();
        drop(b_io);
        std::thread::sleep(Duration::from_millis(400));
        drop(a_io);
    }
    let wc = poll_n(&dev.cq, 1, Duration::from_secs(5)).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (3, WcStatus::Success));
    assert_eq!(dst.read_u64(0).unwrap(), 0xacc);
    assert_eq!(
        dev.ctx.counters().local_ack_timeout_err,
        0,
        "the held ACK cost a retry"
    );
}

/// A thread that copies each message into a ring before it posts it (rsockets) posts
/// many large WRs to a busy QP between two polls: it polls only once its ring is full.
/// Once 64 KiB wait (`STREAM_FLUSH`), its post transmits them
/// (`Progress::kick`), so the peer takes the first messages while the thread copies the
/// next; queued for its next poll, the whole ring would leave at once, and the two ends
/// would take turns instead of overlapping. Whether a WR waits is read off the send
/// queue right after each post, so no clock is involved. Without the flush a progress
/// thread that happens to be awake may take a queued WR before the look, but seldom
/// every one of a run of four; with it, a post that finds another thread servicing the
/// connection leaves that thread to send it, hence a majority of attempts, not all.
#[test]
fn large_writes_posted_to_a_busy_qp_leave_without_waiting_for_a_poll() {
    use verbs_api::{CompletionQueue, WorkCompletion};
    const BIG: usize = 64 << 10;
    // Large WRITEs posted one after another per attempt.
    const RUN: u64 = 4;
    let two = TwoDevices::open();
    let (pd0, pd1, cq0) = (&two.pd0, &two.pd1, &two.cq0);
    let (a, _b) = two.pair(QpCap::new(16, 16), &RcParams::default());
    let src = pd0.reg_mr(2 * BIG, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd1
        .reg_mr(2 * BIG, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let small = [src.sge(0, 64).unwrap()];
    let big = [src.sge(BIG, BIG).unwrap()];
    let mut wcs = [WorkCompletion::default(); 8];
    let attempts = 20;
    let mut left_at_once = 0;
    for attempt in 0..attempts {
        // Drive: polls in a tight loop for 1 ms.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1) {
            cq0.poll(&mut wcs).unwrap();
        }
        // The first post after a poll leaves at once; the QP is then busy until this
        // thread reads its ACK (at its next poll)...
        a.post_send(&[SendWr::write(8 * attempt, &small, dst.remote().at(0)).signaled()])
            .unwrap();
        // ...so the large WRITEs after it are posted to a busy QP, one at a time as a
        // ring's messages are.
        let mut all_left = true;
        for k in 1..=RUN {
            let wr = SendWr::write(8 * attempt + k, &big, dst.remote().at(BIG as u64)).signaled();
            a.post_send(&[wr]).unwrap();
            all_left &= !a.qp.inner.lock().qp.has_unsent();
        }
        if all_left {
            left_at_once += 1;
        }
        let wc = poll_n(cq0, 1 + RUN as usize, Duration::from_secs(10)).unwrap();
        assert!(wc.iter().all(|w| w.is_ok()), "{wc:?}");
    }
    assert!(
        left_at_once * 2 > attempts,
        "{RUN} WRITEs of 64 KiB to a busy QP all left at once in {left_at_once} of {attempts} attempts"
    );
}
