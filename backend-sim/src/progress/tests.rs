//! Unit tests of the driving window and the hand-over between application threads and
//! the progress thread.

use super::window::{DRIVE_GAP, USER_WINDOW};
use super::*;

/// A thread that polls in a tight loop and then spends a few milliseconds writing a
/// large payload still drives progress afterwards (the progress thread stays off the
/// connection); a thread that was not driving, or armed a CQ to sleep, does not
/// start driving by writing.
#[test]
fn a_driving_thread_busy_in_a_connection_keeps_driving() {
    let window = USER_WINDOW.as_nanos() as u64;
    let until = |p: &Progress| p.window.until.load(Ordering::Relaxed);
    let p = Progress::new().unwrap();
    let t0 = p.clock.nanos(Instant::now()) + 1_000_000_000;
    // One isolated poll, then a write: not driving.
    p.window.active(t0, &p.bell);
    let e = p.window.entered();
    assert_eq!(e, None);
    p.window.left(e, true, || t0 + 1_000);
    assert_eq!(until(&p), 0);
    // Polls 10 us apart: driving, and it stays so while in a connection, however
    // long (the progress thread sees "driving" all along)...
    p.window.active(t0 + 10_000, &p.bell);
    assert_eq!(until(&p), t0 + 10_000 + window);
    let e = p.window.entered();
    assert_eq!(e, Some(t0 + 10_000 + window));
    assert_eq!(until(&p), u64::MAX);
    // ...a write that ends 3 ms later opens the window from there...
    p.window.left(e, true, || t0 + 3_000_000);
    assert_eq!(until(&p), t0 + 3_000_000 + window);
    // ...and the next poll right after counts as a tight loop.
    p.window.active(t0 + 3_010_000, &p.bell);
    assert_eq!(until(&p), t0 + 3_010_000 + window);
    // A visit that moved nothing leaves the window as it was (and reads no clock).
    let e = p.window.entered();
    p.window
        .left(e, false, || unreachable!("no clock read for an empty visit"));
    assert_eq!(until(&p), t0 + 3_010_000 + window);
    // Armed a CQ to sleep on its channel while inside: that stands.
    let e = p.window.entered();
    p.user_idle();
    p.window.left(e, true, || t0 + 3_020_000);
    assert_eq!(until(&p), 0);
    // ...and a write (a post) after that opens no window.
    let e = p.window.entered();
    assert_eq!(e, None);
    p.window.left(e, true, || t0 + 3_030_000);
    assert_eq!(until(&p), 0);
}

/// Posts from a driving thread keep its window open (a loop refilling many QPs between
/// two polls), and the poll after them still counts as a tight loop; posts from a
/// thread that does not drive open no window.
#[test]
fn posts_extend_a_driving_window_but_open_none() {
    let window = USER_WINDOW.as_nanos() as u64;
    let until = |p: &Progress| p.window.until.load(Ordering::Relaxed);
    let p = Progress::new().unwrap();
    let t0 = p.clock.nanos(Instant::now()) + 1_000_000_000;
    // Posts alone, however close together: nobody drives.
    for i in 0..4 {
        assert!(!p.window.posted(t0 + i * 10_000, &p.bell));
    }
    assert_eq!(until(&p), 0);
    // Two polls 10 us apart: driving. A refill loop of 300 us posts every 40 us; each
    // post sees a driving thread and moves the window on.
    p.window.active(t0 + 100_000, &p.bell);
    p.window.active(t0 + 110_000, &p.bell);
    for i in 1..=7 {
        let t = t0 + 110_000 + i * 40_000;
        assert!(p.window.posted(t, &p.bell), "post {i}");
        assert_eq!(until(&p), t + window);
    }
    // The poll right after the loop (20 us after its last post) is a tight loop.
    p.window.active(t0 + 410_000, &p.bell);
    assert_eq!(until(&p), t0 + 410_000 + window);
    // A driving thread inside a connection: its window stays its own.
    let e = p.window.entered();
    assert!(p.window.posted(t0 + 420_000, &p.bell));
    assert_eq!(until(&p), u64::MAX);
    p.window.left(e, true, || t0 + 430_000);
    // A post after the window is over: not driving, and it does not start again.
    assert!(!p.window.posted(t0 + 430_000 + window + 1, &p.bell));
    assert!(!p.window.posted(t0 + 430_000 + window + 10_000, &p.bell));
    assert_eq!(until(&p), t0 + 430_000 + window);
}

/// A driving thread inside one connection for the grace period or longer is a long
/// stay (the progress thread then serves the other connections); a shorter one, a
/// thread that left, or one that polls again in between are not.
#[test]
fn a_stay_longer_than_the_grace_period_is_a_long_stay() {
    let p = Progress::new().unwrap();
    let g = p.window.grace.as_nanos() as u64;
    let t0 = p.clock.nanos(Instant::now()) + 1_000_000_000;
    p.window.active(t0, &p.bell);
    p.window.active(t0 + 10_000, &p.bell);
    // Driving, not inside a connection: nothing to serve beside it.
    assert!(!p.window.long_stay(t0 + 10_000 + 2 * g));
    let e = p.window.entered();
    assert!(e.is_some());
    assert!(!p.window.long_stay(t0 + 10_000 + g / 2));
    assert!(p.window.long_stay(t0 + 10_000 + g));
    // It polls again from another thread meanwhile: that one visits the others.
    p.window.active(t0 + 20_000 + g, &p.bell);
    assert!(!p.window.long_stay(t0 + 30_000 + g));
    // It leaves: no stay at all.
    p.window.left(e, true, || t0 + 40_000 + g);
    assert!(!p.window.long_stay(t0 + 40_000 + 3 * g));
}

/// A thread drives the first device (polls in a tight loop while its progress thread
/// sleeps), then polls the second: the first is told at once, its window closed and
/// its progress thread woken; staying on the second tells nobody anything.
#[test]
fn polling_another_device_hands_the_first_back() {
    let (p0, p1) = (
        Arc::new(Progress::new().unwrap()),
        Arc::new(Progress::new().unwrap()),
    );
    p0.user_polled();
    p0.user_polled();
    assert!(p0.user_driving());
    p0.bell.sleeping.store(true, Ordering::SeqCst);
    p1.user_polled();
    assert_eq!(p0.window.until.load(Ordering::Relaxed), 0);
    assert_eq!(p0.window.last_poll.load(Ordering::Relaxed), 0);
    assert_eq!(p0.bell.take_rings(), 1);
    // A second poll opens p1's window (its progress thread awake: no ring).
    p1.user_polled();
    p1.bell.sleeping.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        p1.user_polled();
    }
    assert!(p1.user_driving());
    assert_eq!(p1.bell.take_rings(), 0);
    assert_eq!(p0.bell.take_rings(), 0);
    // Back to the first: the second is handed back the same way.
    p0.user_polled();
    assert_eq!(p1.window.until.load(Ordering::Relaxed), 0);
    assert_eq!(p1.bell.take_rings(), 1);
}

/// perftest's `-e`: arm the receive CQ, busy-poll the send CQ (a window opens again),
/// then block on the channel. Blocking hands the device back at once (window closed,
/// progress thread rung), else the answer waits out the window and the grace period
/// (about 2 ms at the tail of `ib_send_lat -e` on the sim). A thread blocking on
/// another thread's behalf (none polled here) touches nothing.
#[test]
fn blocking_on_a_channel_hands_progress_back() {
    let p = Arc::new(Progress::new().unwrap());
    std::thread::scope(|s| {
        s.spawn(|| {
            Progress::thread_blocks_on(None);
            assert_eq!(p.bell.take_rings(), 0);
        });
    });
    p.user_polled();
    p.user_polled();
    assert!(p.user_driving());
    p.bell.sleeping.store(true, Ordering::SeqCst);
    Progress::thread_blocks_on(None);
    assert!(!p.user_driving());
    assert_eq!(p.window.until.load(Ordering::Relaxed), 0);
    assert_eq!(p.bell.take_rings(), 1);
    // The next single poll opens no window (it is no tight loop yet).
    p.user_polled();
    assert!(!p.user_driving());
}

/// perftest's `-R`: its client spins on a CQ for the server's last handshake message,
/// then resolves the server's address to connect. The connection manager's calls hand
/// the device back at once, so the message's ACK leaves then: else the server's SEND
/// completes only after the progress thread's nap (up to the grace period), and the
/// server, which listens only after that completion, rejects the connection (no
/// listener) in some runs.
#[test]
fn turning_to_the_connection_manager_hands_progress_back() {
    use verbs_api::rdmacm::{CmBackend, CmEventChannel, CmId, PortSpace};
    let p = Arc::new(Progress::new().unwrap());
    let cm = crate::verbs::backend::SimBackend::default();
    let ch = cm.create_event_channel().unwrap();
    let id = ch.create_id(0, PortSpace::Tcp, verbs_api::QpType::Rc).unwrap();
    p.user_polled();
    p.user_polled();
    assert!(p.user_driving());
    p.bell.sleeping.store(true, Ordering::SeqCst);
    // (An address no device has: the call fails, having handed the device back.)
    // (The window closed says so whatever the call took; the window's own end only
    // makes `user_driving` false.)
    let _ = id.bind_addr("192.0.2.1:7174".parse().unwrap());
    assert_eq!(p.window.until.load(Ordering::Relaxed), 0);
    assert_eq!(p.bell.take_rings(), 1);
    // (Awake while the next window opens: opening one rings a sleeping thread.)
    p.bell.sleeping.store(false, Ordering::SeqCst);
    p.user_polled();
    p.user_polled();
    assert!(p.user_driving());
    p.bell.sleeping.store(true, Ordering::SeqCst);
    assert!(ch.get_event(Some(Duration::ZERO)).unwrap().is_none());
    assert_eq!(p.window.until.load(Ordering::Relaxed), 0);
    assert_eq!(p.bell.take_rings(), 1);
}

#[test]
fn arming_a_cq_hands_progress_to_the_progress_thread() {
    let p = Arc::new(Progress::new().unwrap());
    std::thread::sleep(DRIVE_GAP * 4);
    // An application polls in a tight loop: it drives progress for a while.
    let now = p.clock.nanos(Instant::now());
    p.window.last_poll.store(now, Ordering::Relaxed);
    p.window.until.store(now + 1_000_000_000, Ordering::Relaxed);
    // It arms a CQ to sleep on the channel: the window ends at once...
    p.user_idle();
    assert_eq!(p.window.until.load(Ordering::Relaxed), 0);
    assert_eq!(p.window.last_poll.load(Ordering::Relaxed), 0);
    // ...and the poll that drains the CQ once more after arming opens no new one
    // (a poll counts as driving only if the previous one was < DRIVE_GAP before).
    p.user_drive();
    assert_eq!(p.window.until.load(Ordering::Relaxed), 0);
    // The progress thread sleeps on the doorbell for the grace period after a window
    // ends: a CQ armed meanwhile wakes it; one armed after that has nobody to wake.
    p.bell.sleeping.store(true, Ordering::SeqCst);
    p.bell.take_rings();
    // (The engine's clock starts at its creation: let it pass two grace periods.)
    std::thread::sleep(p.window.grace * 3);
    let now = p.clock.nanos(Instant::now());
    p.window
        .until
        .store(now - p.window.grace.as_nanos() as u64 / 2, Ordering::Relaxed);
    p.user_idle();
    assert_eq!(p.bell.take_rings(), 1);
    p.window
        .until
        .store(now - 2 * p.window.grace.as_nanos() as u64, Ordering::Relaxed);
    p.user_idle();
    assert_eq!(p.bell.take_rings(), 0);
}

/// The progress thread's doorbell sleeps past the end of the driving window start with
/// no nap (it looks as soon as an application thread stops polling), double with every
/// sleep that found the thread still driving, and stop growing at the grace period.
#[test]
fn the_nap_after_the_window_doubles_up_to_the_grace_period() {
    let p = Progress::new().unwrap();
    assert_eq!(p.nap(0), Duration::ZERO);
    assert_eq!(p.nap(1), USER_WINDOW);
    assert_eq!(p.nap(2), USER_WINDOW * 2);
    assert_eq!(p.nap(3), USER_WINDOW * 4);
    assert_eq!(p.nap(40), p.window.grace);
    let mut naps = 0;
    while p.nap(naps) < p.window.grace {
        naps += 1;
    }
    assert!(naps < 10, "{naps} sleeps to reach the grace period");
}

/// A look for news at a connection over rings that has none ends without a round (the
/// spinning poller's turn); one at a connection that has bytes in its ring, or for
/// which a round was asked, still runs one, and the SEND and its ACK arrive as before.
#[test]
fn a_look_at_quiet_rings_ends_without_a_round() {
    use verbs_api::{
        poll_n, AccessFlags, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, SendWr, WcOpcode,
    };
    let (ctx, pd, cq, qa, qb) = connected_pair();
    let conn_of = |q: &crate::SimQp| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = q.qp.inner.lock().conn.clone() {
                if c.ring_peek.get().is_some() {
                    return c;
                }
            }
            assert!(Instant::now() < deadline, "no connection over rings");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let (ca, cb) = (conn_of(&qa), conn_of(&qb));
    // This thread alone looks at the connections from here on (its own looks counted).
    let progress = &ctx.dev.progress;
    progress.shutdown();
    let quiet = Progress::quiet_looks_here;

    let q0 = quiet();
    assert!(!progress.service_inner(&ca, Mode::User, true, None));
    assert_eq!(quiet(), q0 + 1, "a look at rings with nothing new ran a round");
    // A spinning thread's look at the device passes over both.
    assert_eq!(progress.peek_few(Mode::User, None), Some(false));
    assert_eq!(quiet(), q0 + 3, "a spinning look at quiet rings ran a round");

    // A round asked for is run (and the request taken), even with nothing new.
    ca.pending.store(true, Ordering::SeqCst);
    progress.service_inner(&ca, Mode::User, true, None);
    assert_eq!(quiet(), q0 + 3, "a look skipped the round asked for");
    assert!(!ca.pending.load(Ordering::SeqCst));

    let mr = pd.reg_mr(64, AccessFlags::ALL).unwrap();
    qb.post_recv(&[RecvWr::new(7, &[mr.sge(0, 8).unwrap()])]).unwrap();
    qa.post_send(&[SendWr::send(9, &[mr.sge(8, 8).unwrap()]).signaled()])
        .unwrap();
    // The SEND is in the receiver's ring: the look reads and delivers it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !progress.service_inner(&cb, Mode::User, true, None) {
        assert!(
            Instant::now() < deadline,
            "the SEND never reached the receiver's ring"
        );
    }
    let wcs = poll_n(&cq, 2, Duration::from_secs(10)).unwrap();
    assert!(wcs.iter().all(|w| w.is_ok()), "{wcs:?}");
    let mut ops: Vec<_> = wcs.iter().map(|w| w.opcode).collect();
    ops.sort_by_key(|o| *o as u32);
    assert!(
        ops.contains(&WcOpcode::Recv) && ops.contains(&WcOpcode::Send),
        "{ops:?}"
    );
}

/// A break armed after a round chose its gate (the round saw no fault armed, as one that
/// began just before the arming does) still breaks the next request the QP builds, in
/// that round or a later one: the SEND posted after the arming is cut, resent over a new
/// connection, and completes once.
#[test]
fn a_break_armed_while_a_round_runs_without_faults_still_breaks_the_next_request() {
    use crate::fault_state::BreakPoint;
    use verbs_api::{poll_n, AccessFlags, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, SendWr};
    let (ctx, pd, cq, qa, qb) = connected_pair();
    // Armed as `Faults::break_connection` arms it, but every round keeps the gate of a
    // QP without faults (the flag that picks it is left unset).
    qa.qp.inner.lock().faults.break_at = Some(BreakPoint::AfterRequest);
    let mr = pd.reg_mr(64, AccessFlags::ALL).unwrap();
    qb.post_recv(&[RecvWr::new(7, &[mr.sge(0, 8).unwrap()])]).unwrap();
    qa.post_send(&[SendWr::send(9, &[mr.sge(8, 8).unwrap()]).signaled()])
        .unwrap();
    let wcs = poll_n(&cq, 2, Duration::from_secs(10)).unwrap();
    assert!(wcs.iter().all(|w| w.is_ok()), "{wcs:?}");
    assert!(!qa.qp.fault_armed.load(Ordering::Acquire));
    assert_eq!(ctx.dev.progress.counters.breaks.load(Ordering::Relaxed), 1);
    assert_eq!(qa.qp.inner.lock().faults.break_at, None);
}

/// One device with a PD and a CQ, and two RC QPs of it connected to each other.
fn connected_pair() -> (
    crate::SimContext,
    crate::SimPd,
    crate::SimCq,
    crate::SimQp,
    crate::SimQp,
) {
    use verbs_api::{
        connect_rc, local_endpoint, Backend, Context, ProtectionDomain, QpCap, QpInitAttr, RcParams,
    };
    let ctx = crate::SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let cap = QpCap::new(8, 8);
    let qa = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let qb = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let p = RcParams::default();
    let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
    let eb = local_endpoint(&ctx, &qb, &p, 2).unwrap();
    connect_rc(&qa, &p, 1, &eb).unwrap();
    connect_rc(&qb, &p, 2, &ea).unwrap();
    (ctx, pd, cq, qa, qb)
}
