//! Unit tests of threads that wait in `ibv_get_cq_event` on their device's connections
//! (`progress::waiter`): the waiting thread services what arrives itself, the progress
//! thread takes the connections back when no thread waits, several waiters share one
//! device, and the progress thread's timers (RNR and ACK-timeout retries) run while a
//! thread waits.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use verbs_api::{
    connect_rc, local_endpoint, poll_n, AccessFlags, Backend, CompletionChannel, CompletionQueue, Context,
    MemoryRegion, ProtectionDomain, QpCap, QpInitAttr, QueuePair, RcParams, RecvWr, SendWr, WcOpcode,
    WcStatus,
};

use crate::event_tests::Ends;
use crate::{SimBackend, SimChannel, SimCq, SimQp};

/// How long a test waits for what must come.
const WAIT: Duration = Duration::from_secs(10);

/// Waits until `n` threads wait on the connections of `ends`' second device.
fn until_waiting(ends: &Ends, n: usize) {
    let deadline = Instant::now() + WAIT;
    while ends.ctx1.dev.progress.waiters_now() < n {
        assert!(Instant::now() < deadline, "no thread came to wait on the channel");
        std::thread::yield_now();
    }
}

/// With the second device's progress thread stopped, a thread blocked on its channel
/// still gets the event of each SEND: it reads the connection, delivers the completion
/// and sends the ACK itself (the requester's SEND completes). Waiting in `read(2)` of
/// the channel's descriptor alone, it waited for ever (the progress thread read the
/// socket and signalled the channel, two wake-ups per message where one does).
#[test]
fn a_waiting_thread_services_its_connection_itself() {
    let e = Ends::new();
    e.send_to_waiter(0, || ());
    e.ctx1.dev.progress.shutdown();
    for i in 1..20u64 {
        e.b.post_recv(&[RecvWr::new(i, &[e.mr1.sge(0, 8).unwrap()])])
            .unwrap();
        e.cq1.req_notify(false).unwrap();
        let requester_done = std::thread::scope(|s| {
            let waiter = s.spawn(|| e.ch1.read_cq_event().unwrap());
            e.a.post_send(&[SendWr::send(i, &[e.mr0.sge(0, 8).unwrap()]).signaled()])
                .unwrap();
            // (sim0's own progress thread runs: this poll drives nothing of sim1's.)
            let done = poll_n(&e.cq0, 1, WAIT);
            if done.is_err() {
                // Free the waiter before failing: this poll services sim1's connection.
                let _ = poll_n(&e.cq1, 1, WAIT);
            }
            assert_eq!(waiter.join().unwrap(), e.cq1.handle());
            done
        });
        let w = requester_done
            .unwrap_or_else(|err| panic!("SEND {i}: no ACK without the progress thread: {err}"));
        assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Send, "{w:?}");
        e.cq1.ack_events(1);
        let w = poll_n(&e.cq1, 1, WAIT).unwrap();
        assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
    }
}

/// A completion that arrives while the thread is not waiting (it waited before, and is
/// busy elsewhere) is delivered by the progress thread, and its event is there when the
/// thread comes back; one that arrives while it waits is taken by the thread. In turn,
/// many times: the connection changes hands every time.
#[test]
fn completions_arrive_while_the_thread_waits_and_while_it_does_not() {
    let e = Ends::new();
    for i in 0..30u64 {
        e.b.post_recv(&[RecvWr::new(i, &[e.mr1.sge(0, 8).unwrap()])])
            .unwrap();
        e.cq1.req_notify(false).unwrap();
        let waits = i % 2 == 0;
        let e = &e;
        std::thread::scope(|s| {
            let (go, went) = mpsc::channel();
            let waiter = s.spawn(move || {
                if !waits {
                    // Busy: comes to the channel only once the event is queued.
                    went.recv().unwrap();
                }
                e.ch1.read_cq_event().unwrap()
            });
            if waits {
                until_waiting(e, 1);
            }
            e.a.post_send(&[SendWr::send(i, &[e.mr0.sge(0, 8).unwrap()]).signaled()])
                .unwrap();
            let w = poll_n(&e.cq0, 1, WAIT).unwrap();
            assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Send, "{w:?}");
            if !waits {
                let deadline = Instant::now() + WAIT;
                while !e.ch1.ch.has_event() {
                    assert!(
                        Instant::now() < deadline,
                        "SEND {i}: no event while nobody waited"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                go.send(()).unwrap();
            }
            assert_eq!(waiter.join().unwrap(), e.cq1.handle());
        });
        e.cq1.ack_events(1);
        let w = poll_n(&e.cq1, 1, WAIT).unwrap();
        assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
    }
}

/// `n` QPs of `dev1`, each with its receive CQ on a channel of its own, connected to
/// `n` QPs of `dev0`.
struct Many {
    ctxs: (crate::SimContext, crate::SimContext),
    _pds: (crate::SimPd, crate::SimPd),
    cq0: SimCq,
    senders: Vec<SimQp>,
    receivers: Vec<(SimQp, SimCq, SimChannel)>,
    mr0: crate::SimMr,
    mr1: crate::SimMr,
}

impl Many {
    fn new(n: usize) -> Many {
        let sim = SimBackend::default();
        let (ctx0, ctx1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
        let (pd0, pd1) = (ctx0.alloc_pd().unwrap(), ctx1.alloc_pd().unwrap());
        let cq0 = ctx0.create_cq(256, None).unwrap();
        let p = RcParams::default();
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for i in 0..n {
            let ch = ctx1.create_comp_channel().unwrap();
            let fd = ch.fd();
            // SAFETY: fcntl on the channel's descriptor, which it keeps open: blocking,
            // as the C ABI hands it out.
            unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFL);
                assert!(flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0);
            }
            let cq = ctx1.create_cq(16, Some(&ch)).unwrap();
            let cap = QpCap::new(16, 16);
            let a = pd0.create_qp(&QpInitAttr::rc(&cq0, &cq0, cap)).unwrap();
            let b = pd1.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
            let psn = 10 * i as u32;
            let ea = local_endpoint(&ctx0, &a, &p, psn + 1).unwrap();
            let eb = local_endpoint(&ctx1, &b, &p, psn + 2).unwrap();
            connect_rc(&a, &p, psn + 1, &eb).unwrap();
            connect_rc(&b, &p, psn + 2, &ea).unwrap();
            senders.push(a);
            receivers.push((b, cq, ch));
        }
        let mr0 = pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let mr1 = pd1.reg_mr(64 * n, AccessFlags::LOCAL_WRITE).unwrap();
        let deadline = Instant::now() + WAIT;
        while receivers.iter().any(|(b, _, _)| b.qp.inner.lock().conn.is_none())
            || senders.iter().any(|a| a.qp.inner.lock().conn.is_none())
        {
            assert!(Instant::now() < deadline, "no connection");
            std::thread::sleep(Duration::from_millis(1));
        }
        Many {
            ctxs: (ctx0, ctx1),
            _pds: (pd0, pd1),
            cq0,
            senders,
            receivers,
            mr0,
            mr1,
        }
    }
}

/// Six threads, each blocked on a channel of its own on one device (more connections
/// than a thread reads directly), with the device's progress thread stopped: every
/// thread gets its event, whichever thread read the connection of its QP.
#[test]
fn many_threads_wait_on_channels_of_one_device() {
    let n = 6;
    let m = Many::new(n);
    m.ctxs.1.dev.progress.shutdown();
    for round in 0..5u64 {
        for (i, (b, cq, _)) in m.receivers.iter().enumerate() {
            b.post_recv(&[RecvWr::new(round, &[m.mr1.sge(64 * i, 8).unwrap()])])
                .unwrap();
            cq.req_notify(false).unwrap();
        }
        std::thread::scope(|s| {
            let waiters: Vec<_> = m
                .receivers
                .iter()
                .map(|(_, cq, ch)| s.spawn(move || (ch.read_cq_event().unwrap(), cq.handle())))
                .collect();
            for a in &m.senders {
                a.post_send(&[SendWr::send(round, &[m.mr0.sge(0, 8).unwrap()]).signaled()])
                    .unwrap();
            }
            let sent = poll_n(&m.cq0, n, WAIT);
            if sent.is_err() {
                // Free the waiters before failing: these polls service the connections.
                for (_, cq, _) in &m.receivers {
                    let _ = poll_n(cq, 1, Duration::from_secs(1));
                }
            }
            for w in waiters {
                let (got, own) = w.join().unwrap();
                assert_eq!(got, own, "a thread took another channel's event");
            }
            let sent = sent.unwrap_or_else(|err| panic!("round {round}: SENDs not acknowledged: {err}"));
            assert!(sent.iter().all(|w| w.is_ok()), "{sent:?}");
        });
        for (_, cq, _) in &m.receivers {
            cq.ack_events(1);
            let w = poll_n(cq, 1, WAIT).unwrap();
            assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
        }
    }
}

/// While a thread waits on the channel of `b`'s CQ for `b`'s SEND, the peer answers it
/// RNR three times: the retries come from the progress thread's timers (the waiting
/// thread reads the NAKs but runs no timer), and the SEND completes, waking the thread.
#[test]
fn the_progress_thread_retries_while_a_thread_waits() {
    let e = Ends::new();
    e.send_to_waiter(0, || ());
    let faults = e.ctx0.faults();
    faults.force_rnr(e.a.qp_num(), 3).unwrap();
    e.a.post_recv(&[RecvWr::new(1, &[e.mr0.sge(0, 8).unwrap()])])
        .unwrap();
    e.cq1.req_notify(false).unwrap();
    let cq = std::thread::scope(|s| {
        let waiter = s.spawn(|| e.ch1.read_cq_event());
        until_waiting(&e, 1);
        e.b.post_send(&[SendWr::send(1, &[e.mr1.sge(0, 8).unwrap()]).signaled()])
            .unwrap();
        waiter.join().unwrap()
    });
    assert_eq!(cq.unwrap(), e.cq1.handle());
    e.cq1.ack_events(1);
    let w = poll_n(&e.cq1, 1, WAIT).unwrap();
    assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
    assert!(faults.stats().forced_rnr >= 3);
    let w = poll_n(&e.cq0, 1, WAIT).unwrap();
    assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
}
