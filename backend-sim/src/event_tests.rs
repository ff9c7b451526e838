//! Unit tests of completion events with two devices around them: what the thread that
//! completes a request does for a thread blocked on the completion channel
//! (`ibv_get_cq_event`), and when.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::{
    connect_rc, local_endpoint, poll_n, AccessFlags, Backend, CompletionChannel, CompletionQueue, Context,
    MemoryRegion, ProtectionDomain, QpCap, QpInitAttr, QueuePair, RcParams, RecvWr, SendWr, WcOpcode,
};

use crate::qp::Conn;
use crate::{SimBackend, SimChannel, SimContext, SimCq, SimMr, SimPd, SimQp};

/// How long a test waits for what must come.
const WAIT: Duration = Duration::from_secs(10);

/// QP `a` on `sim0` connected to QP `b` on `sim1`, whose receive CQ reports to a
/// completion channel.
pub(crate) struct Ends {
    pub ctx0: SimContext,
    pub ctx1: SimContext,
    _pds: (SimPd, SimPd),
    pub cq0: SimCq,
    pub cq1: SimCq,
    pub ch1: Arc<SimChannel>,
    pub a: SimQp,
    pub b: SimQp,
    pub mr0: SimMr,
    pub mr1: SimMr,
}

impl Ends {
    pub fn new() -> Ends {
        let sim = SimBackend::default();
        let (ctx0, ctx1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
        let (pd0, pd1) = (ctx0.alloc_pd().unwrap(), ctx1.alloc_pd().unwrap());
        let ch1 = Arc::new(ctx1.create_comp_channel().unwrap());
        // Blocking, as the C ABI makes a channel's descriptor (libibverbs' default).
        let fd = verbs_api::CompletionChannel::fd(&*ch1);
        // SAFETY: fcntl on the channel's descriptor, which it keeps open.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            assert!(flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0);
        }
        let cq0 = ctx0.create_cq(64, None).unwrap();
        let cq1 = ctx1.create_cq(64, Some(&ch1)).unwrap();
        let cap = QpCap::new(16, 16);
        let a = pd0.create_qp(&QpInitAttr::rc(&cq0, &cq0, cap)).unwrap();
        let b = pd1.create_qp(&QpInitAttr::rc(&cq1, &cq1, cap)).unwrap();
        // No ACK timeout: an ACK that never left would otherwise be answered by a resend
        // (a duplicate is acknowledged again), and a test would not see it missing.
        let p = RcParams {
            timeout: 0,
            ..RcParams::default()
        };
        let ea = local_endpoint(&ctx0, &a, &p, 1).unwrap();
        let eb = local_endpoint(&ctx1, &b, &p, 2).unwrap();
        connect_rc(&a, &p, 1, &eb).unwrap();
        connect_rc(&b, &p, 2, &ea).unwrap();
        let mr0 = pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let mr1 = pd1.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let ends = Ends {
            ctx0,
            ctx1,
            _pds: (pd0, pd1),
            cq0,
            cq1,
            ch1,
            a,
            b,
            mr0,
            mr1,
        };
        let deadline = Instant::now() + WAIT;
        while ends.conn(&ends.a).is_none() || ends.conn(&ends.b).is_none() {
            assert!(Instant::now() < deadline, "no connection");
            std::thread::sleep(Duration::from_millis(1));
        }
        ends
    }

    /// A QP's connection, once it is up.
    pub fn conn(&self, qp: &SimQp) -> Option<Arc<Conn>> {
        qp.qp.inner.lock().conn.clone()
    }

    /// `b` takes one SEND of `a`, with a thread blocked on `b`'s channel meanwhile
    /// (armed, then `ibv_get_cq_event` as the C ABI makes it): `check` runs on that
    /// thread as soon as the event is taken, and its answer is returned.
    pub fn send_to_waiter<T: Send>(&self, i: u64, check: impl FnOnce() -> T + Send) -> T {
        self.b
            .post_recv(&[RecvWr::new(i, &[self.mr1.sge(0, 8).unwrap()])])
            .unwrap();
        self.cq1.req_notify(false).unwrap();
        std::thread::scope(|s| {
            let (ready, go) = mpsc::channel();
            let waiter = s.spawn(move || {
                ready.send(()).unwrap();
                let cq = self.ch1.read_cq_event().unwrap();
                let seen = check();
                self.cq1.ack_events(1);
                assert_eq!(cq, self.cq1.handle());
                seen
            });
            go.recv().unwrap();
            // (The waiter may not block yet: it finds the event then, as a C program
            // does.)
            self.a
                .post_send(&[SendWr::send(i, &[self.mr0.sge(0, 8).unwrap()]).signaled()])
                .unwrap();
            let seen = waiter.join().unwrap();
            let w = poll_n(&self.cq1, 1, WAIT).unwrap();
            assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
            let w = poll_n(&self.cq0, 1, WAIT).unwrap();
            assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Send, "{w:?}");
            seen
        })
    }
}

/// A progress thread whose round wakes a thread blocked on a completion channel blocks
/// at once instead of spinning: on a host without an idle CPU a spinner keeps the woken
/// thread from running until its spin window ends (`ib_send_lat -e` took a spin window
/// per event, a few hundred microseconds, where a wake-up costs a few).
#[test]
fn a_progress_thread_that_wakes_a_channel_waiter_does_not_spin() {
    let e = Ends::new();
    let progress = &e.ctx1.dev.progress;
    for i in 0..50 {
        e.send_to_waiter(i, || ());
    }
    assert_eq!(
        progress.spun_after_signal(),
        0,
        "the progress thread spun after waking a channel's waiter"
    );
}

/// A completion's event is signalled once the round that delivered it has let go of
/// the QP and the connection, its ACK written. Signalled from inside the round, the
/// woken thread (placed on the waker's CPU) preempted it there, its first verbs waited
/// for the QP's lock held by the round, and the ACK left after them.
#[test]
fn a_completion_event_is_signalled_after_its_round_lets_go() {
    use std::sync::atomic::Ordering;
    let e = Ends::new();
    // Warm up (the first exchange sets up what the connection keeps).
    e.send_to_waiter(0, || ());
    let conn_b = e.conn(&e.b).unwrap();
    let qp_b = e.b.qp.clone();
    let tx_before = conn_b.last_tx.load(Ordering::Relaxed);
    // What the signalling thread holds as it signals.
    let (seen, seen_rx) = mpsc::channel();
    let seen = std::sync::Mutex::new(seen);
    let watched = conn_b.clone();
    *e.ch1.ch.on_post.lock() = Some(Box::new(move || {
        let state = (
            qp_b.inner.is_locked(),
            watched.io.is_locked(),
            watched.last_tx.load(Ordering::Relaxed) != tx_before,
        );
        seen.lock().unwrap().send(state).unwrap();
    }));
    e.send_to_waiter(1, || ());
    *e.ch1.ch.on_post.lock() = None;
    let (qp_locked, io_locked, acked) = seen_rx.try_recv().expect("no event was posted");
    assert!(!qp_locked, "the event was signalled with the QP locked");
    assert!(!io_locked, "the event was signalled with the connection locked");
    assert!(acked, "the event was signalled before the round's ACK left");
}

/// What the thread sleeping on `b`'s channel does with a request, in the tests of ACKs
/// held for an answer.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    /// Answers it with a SEND of its own.
    Answer,
    /// Sleeps on the channel again without answering, once the ACK waits for an answer
    /// (it starts waiting after the event is signalled: a thread that takes the event
    /// and blocks again before that, having preempted the signalling thread, finds no
    /// ACK waiting, which then waits out its wait).
    BlockAgain,
    /// Goes off until the requester has its SEND's completion, neither answering nor
    /// blocking on the channel.
    Compute,
}

impl Ends {
    /// One request of `a`, served by a thread sleeping on `b`'s channel that then does
    /// `then`. Returns how many completions the delivery that brought `a` its first
    /// ones brought (its SEND's, and with an answer the answer's receive).
    fn request(&self, i: u64, then: Then) -> usize {
        std::thread::scope(|s| {
            let (ready, go) = mpsc::channel();
            let (done, computed) = mpsc::channel::<()>();
            let waiter = s.spawn(move || {
                self.b
                    .post_recv(&[RecvWr::new(i, &[self.mr1.sge(0, 8).unwrap()])])
                    .unwrap();
                self.cq1.req_notify(false).unwrap();
                ready.send(()).unwrap();
                assert_eq!(self.ch1.read_cq_event().unwrap(), self.cq1.handle());
                self.cq1.ack_events(1);
                // (Not armed again: the answer's completion, on the same CQ, would
                // leave an event for the next request's waiter to find.)
                let w = poll_n(&self.cq1, 1, WAIT).unwrap();
                assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
                match then {
                    Then::Answer => {
                        self.b
                            .post_send(&[SendWr::send(i, &[self.mr1.sge(8, 8).unwrap()]).signaled()])
                            .unwrap();
                        let w = poll_n(&self.cq1, 1, WAIT).unwrap();
                        assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Send, "{w:?}");
                    }
                    Then::BlockAgain => {
                        let conn_b = self.conn(&self.b).unwrap();
                        let progress = &self.ctx1.dev.progress;
                        let deadline = Instant::now() + WAIT;
                        while !progress.ack_waits(&conn_b) {
                            assert!(Instant::now() < deadline, "the ACK never waited");
                            std::thread::yield_now();
                        }
                        // Nothing more comes.
                        let _ = self.ch1.get_cq_event(Some(Duration::from_millis(500)));
                    }
                    Then::Compute => computed
                        .recv_timeout(WAIT)
                        .expect("the requester's SEND never completed"),
                }
            });
            go.recv().unwrap();
            if then == Then::Answer {
                self.a
                    .post_recv(&[RecvWr::new(i, &[self.mr0.sge(8, 8).unwrap()])])
                    .unwrap();
            }
            self.a
                .post_send(&[SendWr::send(i, &[self.mr0.sge(0, 8).unwrap()]).signaled()])
                .unwrap();
            let mut wc = [verbs_api::WorkCompletion::default(); 4];
            let deadline = Instant::now() + WAIT;
            let mut first = loop {
                let n = self.cq0.poll(&mut wc).unwrap();
                if n > 0 {
                    break n;
                }
                assert!(
                    Instant::now() < deadline,
                    "request {i}: no completion at the requester"
                );
            };
            // A round delivers what one read brought with `a`'s lock held, the send
            // queue's completions first and then the receive queue's: a poll between the
            // two (the delivering thread preempted there) finds the first alone. Once the
            // lock is free that round is over, and what it brought is in the CQ.
            drop(self.a.qp.inner.lock());
            first += self.cq0.poll(&mut wc[first..]).unwrap();
            assert!(
                wc[0].is_ok() && wc[0].opcode == WcOpcode::Send,
                "{:?}",
                &wc[..first]
            );
            if then == Then::Answer && first == 1 {
                let w = poll_n(&self.cq0, 1, WAIT).unwrap();
                assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
            }
            let _ = done.send(());
            waiter.join().unwrap();
            first
        })
    }
}

/// The ACK of a request whose completion wakes a thread that answers leaves with the
/// answer: the requester gets its SEND's completion and the answer together, in one
/// read (one wake-up of a thread sleeping there, where the ACK alone and then the answer
/// cost two). The first request is acknowledged at once: the application has not
/// answered anything yet. Once the ACK has left, its wait does not end the progress
/// thread's sleep (it would wake it once per message for nothing).
#[test]
fn an_ack_owed_to_a_thread_that_answers_leaves_with_the_answer() {
    let e = Ends::new();
    let progress = &e.ctx1.dev.progress;
    // Long enough for any answer on a loaded host: only the answer ends the wait here.
    progress.set_answer_wait(Duration::from_secs(60));
    e.request(0, Then::Answer);
    for i in 1..20 {
        assert_eq!(
            e.request(i, Then::Answer),
            2,
            "request {i}: its ACK came before the answer"
        );
        assert_eq!(
            progress.answer_deadline(),
            None,
            "request {i}: the progress thread waits for an ACK that left"
        );
    }
}

/// An ACK held for an answer leaves without one when the woken thread sleeps on the
/// channel again (it will not answer), long before the wait would end.
#[test]
fn a_held_ack_leaves_when_the_thread_blocks_again() {
    let e = Ends::new();
    let progress = &e.ctx1.dev.progress;
    progress.set_answer_wait(Duration::from_secs(60));
    e.request(0, Then::Answer);
    e.request(1, Then::Answer);
    let held = progress.acks_held();
    // (`request` waits WAIT, 10 s, for the SEND's completion.)
    assert_eq!(e.request(2, Then::BlockAgain), 1);
    assert_eq!(progress.acks_held(), held + 1);
    assert!(e
        .conn(&e.b)
        .unwrap()
        .answers
        .load(std::sync::atomic::Ordering::Relaxed));
}

/// An ACK held for an answer leaves on its own when the wait ends, the woken thread
/// busy elsewhere; that application is not waited for again until it answers again.
#[test]
fn a_held_ack_leaves_when_the_wait_ends() {
    use std::sync::atomic::Ordering;
    let e = Ends::new();
    let progress = &e.ctx1.dev.progress;
    progress.set_answer_wait(Duration::from_millis(20));
    e.request(0, Then::Answer);
    let conn_b = e.conn(&e.b).unwrap();
    assert!(conn_b.answers.load(Ordering::Relaxed));
    let held = progress.acks_held();
    // The waiter computes until the SEND's completion arrives, which the ACK's wait
    // ending brings.
    assert_eq!(e.request(1, Then::Compute), 1);
    assert_eq!(progress.acks_held(), held + 1);
    assert!(!conn_b.answers.load(Ordering::Relaxed));
}
