//! Asynchronous events (`man ibv_get_async_event`, `man ibv_ack_async_event`): the
//! context's fd polls readable exactly while an event waits, every event taken is
//! acknowledged, and destroying the object an event names waits for that
//! acknowledgement, then returns. The events are raised with an SRQ limit, the one
//! affiliated event every SRQ-capable device raises on demand; and the affiliated errors
//! of an RC responder that refuses a request (IBA 11.6.3.1), which rxe does not raise.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use verbs_api::aio::AsyncEvents;
use verbs_api::{
    AccessFlags as A, AsyncElement, AsyncEvent, AsyncEventType, Backend, Context, MemoryRegion, QueuePair,
    RemoteAddr, SendWr, SharedReceiveQueue, SrqAttr, SrqAttrMask, WcStatus,
};

use super::case;
use super::srq::SrqSetup;
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome, Profile};

pub fn list<B: Backend>() -> Vec<crate::Case<B>> {
    vec![
        case!(
            "events.none-pending",
            "a fresh context has no event: the async fd is not readable and get_async_event times out",
            "man ibv_get_async_event (async_fd, O_NONBLOCK)",
            none_pending
        ),
        case!(
            "events.fd-and-ack",
            "an event makes the async fd readable until it is taken; acknowledged, its SRQ and QPs are destroyed at once",
            "man ibv_get_async_event, man ibv_ack_async_event (destroy waits for acknowledgements)",
            fd_and_ack,
            requires [Srq]
        ),
        case!(
            "events.destroy-waits-for-ack",
            "destroying the SRQ an unacknowledged event names waits until the event is acknowledged",
            "man ibv_get_async_event (destroying an object waits for its events to be acknowledged)",
            destroy_waits,
            requires [Srq]
        ),
        case!(
            "events.async-stream",
            "verbs-api's AsyncEvents future wakes for the event and yields it",
            "verbs-api aio::AsyncEvents (async_fd readiness); man ibv_get_async_event",
            async_stream,
            requires [Srq]
        ),
        case!(
            "events.responder-errors",
            "an RC responder refusing a request raises QP_ACCESS_ERR (bad rkey) or QP_REQ_ERR (no responder resources) on its QP",
            "IBA 11.6.3.1 (affiliated asynchronous errors); man ibv_get_async_event",
            responder_errors
        ),
    ]
}

/// rxe's source for raising no affiliated error on the responder.
const RXE_NO_QP_ERROR_EVENTS: &str = "rxe raises no IB_EVENT_QP_ACCESS_ERR or IB_EVENT_QP_REQ_ERR: its \
     responder completes, NAKs and calls rxe_qp_error() (rxe_resp.c), and its only events are \
     SRQ_LIMIT_REACHED, CQ_ERR, SQ_DRAINED and the port events";

fn responder_errors<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut no_resources = env.opts();
    no_resources.b.max_dest_rd_atomic = 0;
    for (what, want, o) in [
        ("WRITE with a bad rkey", AsyncEventType::QpAccessErr, env.opts()),
        (
            "READ without responder resources",
            AsyncEventType::QpReqErr,
            no_resources,
        ),
    ] {
        let p = env.pair(&o)?;
        let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE | A::REMOTE_READ)?;
        let sge = [mr.sge(0, 64)?];
        let wr = if want == AsyncEventType::QpAccessErr {
            SendWr::write(1, &sge, RemoteAddr::new(mr.addr(), mr.rkey() ^ 0x5555_0000))
        } else {
            SendWr::read(1, &sge, mr.remote().at(1024))
        };
        p.a.post_send(&[wr.signaled()])?;
        let wc = env.wait1(&p.cq_a)?;
        ensure!(
            matches!(wc.status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr),
            "{what}: requester status {:?}",
            wc.status
        );
        let wait = if env.profile == Profile::Rxe {
            Duration::from_secs(1).min(env.cfg.timeout)
        } else {
            env.cfg.timeout
        };
        match env.take_event(format!("event after {what}"), wait)? {
            Some(got) => ensure_eq!(
                got,
                (want, AsyncElement::Qp(p.b.qp_num())),
                "the event after {what}"
            ),
            None if env.profile == Profile::Rxe => env.deviation(RXE_NO_QP_ERROR_EVENTS),
            None => {
                return Err(Failure(format!(
                    "{what}: no {want:?} on the responder within {wait:?}"
                )))
            }
        }
    }
    Ok(Outcome::Pass)
}

/// Whether `fd` polls readable within `ms` milliseconds.
fn readable(fd: RawFd, ms: i32) -> Result<bool, Failure> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    ensure!(n >= 0, "poll(async_fd): {}", std::io::Error::last_os_error());
    Ok(n == 1 && p.revents & libc::POLLIN != 0)
}

/// One sender and one receiver on an SRQ whose limit event has just been raised (2
/// receives posted, limit 2, one consumed), without taking the event.
fn raise_limit<B: Backend>(env: &Env<B>) -> Result<SrqSetup<B>, Failure> {
    let s = SrqSetup::new(env, 1, SrqAttr::new(16, 1), &env.opts())?;
    s.post(0, 0)?;
    s.post(1, 1)?;
    s.srq
        .modify(&SrqAttr::default().with_limit(2), SrqAttrMask::LIMIT)?;
    s.send_recv(env, 0, 0, 0x33)?;
    Ok(s)
}

/// Checks that `ev` is the limit event of `srq`.
fn is_limit_event<B: Backend>(ev: &AsyncEvent, srq: &B::Srq) -> Result<(), Failure> {
    ensure_eq!(
        (ev.event_type, ev.element),
        (AsyncEventType::SrqLimitReached, AsyncElement::Srq(srq.handle())),
        "the event"
    );
    Ok(())
}

fn none_pending<B: Backend>(env: &Env<B>) -> CaseResult {
    ensure!(
        !readable(env.ctx.async_fd(), 50)?,
        "the async fd of a fresh context is readable"
    );
    if let Some(ev) = env.ctx.get_async_event(Some(Duration::from_millis(50)))? {
        let text = ev.to_string();
        env.ctx.ack_async_event(ev);
        return Err(Failure(format!("a fresh context has an event: {text}")));
    }
    Ok(Outcome::Pass)
}

fn fd_and_ack<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = raise_limit(env)?;
    let fd = env.ctx.async_fd();
    let ms = i32::try_from(env.cfg.timeout.as_millis()).unwrap_or(i32::MAX);
    ensure!(
        readable(fd, ms)?,
        "the async fd did not become readable for the limit event"
    );
    let ev = env
        .ctx
        .get_async_event(Some(Duration::ZERO))?
        .ok_or_else(|| Failure("the fd was readable but get_async_event found nothing".into()))?;
    let checked = is_limit_event::<B>(&ev, &s.srq);
    ensure!(
        !readable(fd, 0)?,
        "the async fd is still readable after the only event was taken"
    );
    env.ctx.ack_async_event(ev);
    checked?;
    let t0 = Instant::now();
    drop(s);
    let took = t0.elapsed();
    ensure!(
        took < Duration::from_secs(5),
        "destroying the SRQ and its QPs after the acknowledgement took {took:?}"
    );
    Ok(Outcome::Pass)
}

fn destroy_waits<B: Backend>(env: &Env<B>) -> CaseResult {
    const HOLD: Duration = Duration::from_millis(300);
    let s = raise_limit(env)?;
    let ev = env
        .ctx
        .get_async_event(Some(env.cfg.timeout))?
        .ok_or_else(|| Failure("no SRQ limit event".into()))?;
    if let Err(f) = is_limit_event::<B>(&ev, &s.srq) {
        env.ctx.ack_async_event(ev);
        return Err(f);
    }
    let SrqSetup {
        pd,
        srq,
        cq_a,
        cq_b,
        a,
        b,
        src,
        dst,
    } = s;
    // The QPs go first (they keep the SRQ alive); no event names them.
    drop((a, b, cq_a, cq_b, src, dst));
    let ctx = &env.ctx;
    // The acknowledging thread raises `acking` just before it acknowledges: a destroy
    // that returns with it still down went before the acknowledgement, however the
    // machine's load stretched or shrank the clock's reading.
    let acking = std::sync::atomic::AtomicBool::new(false);
    let (took, acked_first) = std::thread::scope(|sc| {
        let acking = &acking;
        sc.spawn(move || {
            std::thread::sleep(HOLD);
            acking.store(true, std::sync::atomic::Ordering::SeqCst);
            ctx.ack_async_event(ev);
        });
        let t0 = Instant::now();
        drop(srq);
        (t0.elapsed(), acking.load(std::sync::atomic::Ordering::SeqCst))
    });
    drop(pd);
    ensure!(
        acked_first,
        "the SRQ was destroyed after {took:?}, before its event was acknowledged (after {HOLD:?})"
    );
    ensure!(
        took < HOLD + Duration::from_secs(5),
        "destroying the SRQ took {took:?} after the acknowledgement"
    );
    Ok(Outcome::Pass)
}

fn async_stream<B: Backend>(env: &Env<B>) -> CaseResult {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("tokio runtime: {e}")))?;
    let _g = rt.enter();
    let events = AsyncEvents::new(&env.ctx)?;
    let s = raise_limit(env)?;
    let ev = rt
        .block_on(async { tokio::time::timeout(env.cfg.timeout, events.next()).await })
        .map_err(|_| Failure(format!("no event within {:?}", env.cfg.timeout)))??;
    let checked = is_limit_event::<B>(&ev, &s.srq);
    env.ctx.ack_async_event(ev);
    checked?;
    Ok(Outcome::Pass)
}
