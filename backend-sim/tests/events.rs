//! The asynchronous events the sim raises (`man ibv_get_async_event`), through the
//! verbs-api traits only: CQ_ERR once when a CQ overflows, SQ_DRAINED when a QP moved to
//! SQD with `en_sqd_async_notify` has drained, QP_ACCESS_ERR and QP_REQ_ERR on the
//! responder's QP when it refuses a request (IBA 11.6.3.1), each naming its element;
//! destroying a QP or CQ waits for the acknowledgement of an event taken for it; and
//! `aio::AsyncEvents` delivers.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use backend_sim::{SimBackend, SimContext, SimCq, SimPd, SimQp};
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(5);

/// QP `a` on sim0 connected to QP `b` on sim1, each with its own CQ of `cqe` entries.
struct Two {
    _sim: SimBackend,
    c0: SimContext,
    c1: SimContext,
    pd0: SimPd,
    pd1: SimPd,
    cq0: SimCq,
    _cq1: SimCq,
    a: SimQp,
    b: SimQp,
}

fn two(cqe: u32, p: &RcParams) -> Two {
    let sim = SimBackend::default();
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let (cq0, cq1) = (c0.create_cq(cqe, None).unwrap(), c1.create_cq(cqe, None).unwrap());
    let cap = QpCap::new(16, 16);
    let a = pd0.create_qp(&QpInitAttr::rc(&cq0, &cq0, cap)).unwrap();
    let b = pd1.create_qp(&QpInitAttr::rc(&cq1, &cq1, cap)).unwrap();
    let ea = local_endpoint(&c0, &a, p, 1).unwrap();
    let eb = local_endpoint(&c1, &b, p, 2).unwrap();
    connect_rc(&a, p, ea.psn, &eb).unwrap();
    connect_rc(&b, p, eb.psn, &ea).unwrap();
    Two {
        _sim: sim,
        c0,
        c1,
        pd0,
        pd1,
        cq0,
        _cq1: cq1,
        a,
        b,
    }
}

/// The next event of `ctx` within `d`.
fn event(ctx: &SimContext, d: Duration) -> Option<AsyncEvent> {
    ctx.get_async_event(Some(d)).unwrap()
}

/// No event within 200 ms.
fn quiet(ctx: &SimContext, when: &str) {
    if let Some(ev) = event(ctx, Duration::from_millis(200)) {
        panic!("{when}: unexpected {ev}");
    }
}

/// Takes the next event, checks it and acknowledges it.
fn expect(ctx: &SimContext, t: AsyncEventType, element: AsyncElement) {
    let ev = event(ctx, WAIT).unwrap_or_else(|| panic!("no {t} within {WAIT:?}"));
    assert_eq!((ev.event_type, ev.element), (t, element), "{ev}");
    ctx.ack_async_event(ev);
}

/// Runs `f` on another thread and returns how long it took, failing the test (instead of
/// hanging it) if it has not returned within `limit`.
fn timed(limit: Duration, f: impl FnOnce() + Send + 'static) -> Duration {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        f();
        let _ = tx.send(t0.elapsed());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("still running after {limit:?}"))
}

fn to_state(qp: &SimQp, s: QpState, notify: bool) {
    let attr = QpAttr {
        qp_state: s,
        en_sqd_async_notify: notify,
        ..Default::default()
    };
    let mask = if notify {
        QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY
    } else {
        QpAttrMask::STATE
    };
    qp.modify(&attr, mask).unwrap();
}

/// A CQ that overflows raises CQ_ERR naming it, once however many completions are lost
/// after; polls report the overflow; the QP that overflowed it goes to ERR.
#[test]
fn cq_overflow_raises_cq_err_once() {
    let t = two(2, &RcParams::default());
    let mr = t.pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let rmr = t
        .pd1
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let wrs: Vec<SendWr<'_>> = (0..4)
        .map(|i| SendWr::write(i, &sge, rmr.remote().at(8 * i)).signaled())
        .collect();
    t.a.post_send(&wrs).unwrap();
    expect(&t.c0, AsyncEventType::CqErr, AsyncElement::Cq(t.cq0.handle()));
    let mut wc = [WorkCompletion::default(); 4];
    let deadline = Instant::now() + WAIT;
    loop {
        match t.cq0.poll(&mut wc) {
            Err(Error::CqOverflow { cq, .. }) => {
                assert_eq!(cq, t.cq0.handle());
                break;
            }
            r => assert!(Instant::now() < deadline, "no overflow reported: {r:?}"),
        }
    }
    assert_eq!(t.a.state().unwrap(), QpState::Err);
    t.a.post_send(&wrs[..1]).unwrap();
    quiet(&t.c0, "more completions lost");
    quiet(&t.c1, "the peer's device");
}

/// RTS -> SQD with `en_sqd_async_notify` raises SQ_DRAINED once the WQE in flight (a
/// SEND waiting on RNR) completes; at once with nothing in flight; never without the
/// flag.
#[test]
fn sqd_raises_sq_drained_when_drained() {
    let p = RcParams {
        min_rnr_timer: 1,
        ..RcParams::default()
    };
    let t = two(16, &p);
    let mr = t.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let rmr = t.pd1.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    t.a.post_send(&[SendWr::send(1, &[mr.sge(0, 8).unwrap()]).signaled()])
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    to_state(&t.a, QpState::Sqd, true);
    assert!(t.a.query().unwrap().sq_draining);
    quiet(&t.c0, "a SEND still in flight");
    t.b.post_recv(&[RecvWr::new(1, &[rmr.sge(0, 64).unwrap()])])
        .unwrap();
    expect(&t.c0, AsyncEventType::SqDrained, AsyncElement::Qp(t.a.qp_num()));
    assert!(poll_n(&t.cq0, 1, WAIT).unwrap()[0].is_ok());
    assert!(!t.a.query().unwrap().sq_draining);
    quiet(&t.c0, "once");

    to_state(&t.a, QpState::Rts, false);
    to_state(&t.a, QpState::Sqd, true);
    expect(&t.c0, AsyncEventType::SqDrained, AsyncElement::Qp(t.a.qp_num()));
    to_state(&t.a, QpState::Rts, false);
    to_state(&t.a, QpState::Sqd, false);
    quiet(&t.c0, "SQD without en_sqd_async_notify");
}

/// A WRITE the responder refuses for its rkey raises QP_ACCESS_ERR on the responder's
/// QP (on its device, not the requester's); a misaligned atomic raises QP_REQ_ERR.
#[test]
fn refused_requests_raise_access_and_request_errors() {
    let t = two(16, &RcParams::default());
    let mr = t.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let rmr = t.pd1.reg_mr(64, AccessFlags::ALL).unwrap();
    let mut bad = rmr.remote().at(0);
    bad.rkey ^= 0x10;
    t.a.post_send(&[SendWr::write(1, &[mr.sge(0, 8).unwrap()], bad).signaled()])
        .unwrap();
    assert_eq!(poll_n(&t.cq0, 1, WAIT).unwrap()[0].status, WcStatus::RemAccessErr);
    expect(&t.c1, AsyncEventType::QpAccessErr, AsyncElement::Qp(t.b.qp_num()));
    assert_eq!(t.b.state().unwrap(), QpState::Err);
    quiet(&t.c0, "the requester's device");

    let t = two(16, &RcParams::default());
    let mr = t.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let rmr = t.pd1.reg_mr(64, AccessFlags::ALL).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    t.a.post_send(&[SendWr::fetch_and_add(1, &sge, rmr.remote().at(4), 1).signaled()])
        .unwrap();
    assert_eq!(poll_n(&t.cq0, 1, WAIT).unwrap()[0].status, WcStatus::RemInvReqErr);
    expect(&t.c1, AsyncEventType::QpReqErr, AsyncElement::Qp(t.b.qp_num()));
    quiet(&t.c0, "the requester's device");
}

/// Destroying a QP waits until an event taken for it is acknowledged; so does
/// destroying a CQ. (Each drop runs on its own thread, bounded, so a drop that never
/// returns fails the test instead of hanging it.)
#[test]
fn destroy_waits_for_the_acknowledgement() {
    let t = two(16, &RcParams::default());
    to_state(&t.a, QpState::Sqd, true);
    let ev = event(&t.c0, WAIT).expect("SQ_DRAINED");
    assert_eq!(ev.element, AsyncElement::Qp(t.a.qp_num()));
    let Two { c0, a, .. } = t;
    destroy_waits_for(c0, ev, a, "QP");

    let t = two(1, &RcParams::default());
    let mr = t.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let rmr = t.pd1.reg_mr(64, AccessFlags::ALL).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let wrs = [
        SendWr::write(1, &sge, rmr.remote().at(0)).signaled(),
        SendWr::write(2, &sge, rmr.remote().at(8)).signaled(),
    ];
    t.a.post_send(&wrs).unwrap();
    let ev = event(&t.c0, WAIT).expect("CQ_ERR");
    assert_eq!(ev.element, AsyncElement::Cq(t.cq0.handle()));
    let Two { c0, a, cq0, .. } = t;
    drop(a);
    destroy_waits_for(c0, ev, cq0, "CQ");
}

/// Drops `object` on one thread while another holds `ev` for a while and then
/// acknowledges it: the drop must not return before the acknowledgement has begun. No
/// clock is read: the acknowledging thread raises a flag just before it acknowledges,
/// and the dropping thread looks at it once its drop has returned.
fn destroy_waits_for<T: Send + 'static>(c0: SimContext, ev: AsyncEvent, object: T, what: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const HOLD: Duration = Duration::from_millis(300);
    let acking = Arc::new(AtomicBool::new(false));
    let acker = {
        let acking = acking.clone();
        std::thread::spawn(move || {
            std::thread::sleep(HOLD);
            acking.store(true, Ordering::SeqCst);
            c0.ack_async_event(ev);
        })
    };
    let seen = acking.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(object);
        let _ = tx.send(seen.load(Ordering::SeqCst));
    });
    let acked_first = rx
        .recv_timeout(HOLD + WAIT)
        .unwrap_or_else(|_| panic!("the {what} was still being destroyed after {:?}", HOLD + WAIT));
    acker.join().unwrap();
    assert!(acked_first, "the {what} went before its event was acknowledged");
}

/// An event nobody took goes with its object: destroying it does not wait.
#[test]
fn untaken_events_go_with_their_object() {
    let t = two(16, &RcParams::default());
    to_state(&t.a, QpState::Sqd, true);
    std::thread::sleep(Duration::from_millis(50));
    let Two { c0, a, .. } = t;
    let took = timed(WAIT, move || drop(a));
    assert!(took < Duration::from_secs(1), "{took:?}");
    quiet(&c0, "the destroyed QP's event");
}

/// `aio::AsyncEvents` wakes for an event raised while it waits and yields it.
#[tokio::test(flavor = "current_thread")]
async fn async_events_deliver() {
    let t = two(16, &RcParams::default());
    let events = aio::AsyncEvents::new(&t.c0).unwrap();
    let qpn = t.a.qp_num();
    let a = &t.a;
    let raise = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        to_state(a, QpState::Sqd, true);
    };
    let (ev, ()) = tokio::join!(async { tokio::time::timeout(WAIT, events.next()).await }, raise);
    let ev = ev.expect("no event within the timeout").unwrap();
    assert_eq!(
        (ev.event_type, ev.element),
        (AsyncEventType::SqDrained, AsyncElement::Qp(qpn))
    );
    t.c0.ack_async_event(ev);
}
