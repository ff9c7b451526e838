//! Completion queues and channels (`man ibv_create_cq`, `man ibv_poll_cq`,
//! `man ibv_req_notify_cq`, `man ibv_get_cq_event`).

use std::time::Duration;

use verbs_api::{
    AccessFlags as A, Backend, CompletionChannel, CompletionQueue, Context, MemoryRegion, QueuePair, RecvWr,
    SendWr,
};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "cq.create",
            "create_cq grants at least the entries asked for",
            "man ibv_create_cq",
            cq_create
        ),
        case!(
            "cq.too-large",
            "a CQ larger than max_cqe is refused with EINVAL",
            "man ibv_create_cq (cqe <= max_cqe)",
            cq_too_large
        ),
        case!(
            "cq.poll-empty",
            "polling an empty CQ returns 0",
            "man ibv_poll_cq",
            cq_poll_empty
        ),
        case!(
            "cq.notify",
            "an armed CQ raises one event on its channel for the next completion",
            "man ibv_req_notify_cq, man ibv_get_cq_event; rdma-core tests/test_cq_events.py",
            cq_notify
        ),
        case!(
            "cq.no-event-unarmed",
            "a CQ that was not armed raises no event",
            "man ibv_req_notify_cq",
            cq_no_event_unarmed
        ),
        case!(
            "cq.solicited-only",
            "armed solicited-only, the CQ ignores plain SENDs and wakes on a solicited one",
            "man ibv_req_notify_cq (solicited_only); IBA 11.4.2.2",
            cq_solicited_only
        ),
        case!(
            "cq.overflow",
            "completions beyond the CQ's capacity are reported as an overflow, never dropped silently",
            "IBA 11.4.2.1 (CQ overrun), man ibv_create_cq",
            cq_overflow
        ),
    ]
}

fn cq_create<B: Backend>(env: &Env<B>) -> CaseResult {
    for n in [1u32, 16, 100, 4096] {
        let cq = env.ctx.create_cq(n, None)?;
        ensure!(cq.capacity() >= n, "asked {n}, got {}", cq.capacity());
    }
    Ok(Outcome::Pass)
}

fn cq_too_large<B: Backend>(env: &Env<B>) -> CaseResult {
    let max = env.ctx.query_device()?.max_cqe;
    match env.ctx.create_cq(max.saturating_add(1), None) {
        Ok(cq) => Err(crate::Failure(format!(
            "cqe {} accepted (capacity {})",
            max as u64 + 1,
            cq.capacity()
        ))),
        Err(e) => {
            ensure_eq!(e.errno(), libc::EINVAL, "errno");
            Ok(Outcome::Pass)
        }
    }
}

fn cq_poll_empty<B: Backend>(env: &Env<B>) -> CaseResult {
    let cq = env.ctx.create_cq(8, None)?;
    let mut wc = [Default::default(); 4];
    ensure_eq!(cq.poll(&mut wc)?, 0, "entries in a new CQ");
    Ok(Outcome::Pass)
}

fn send_one<B: Backend>(
    env: &Env<B>,
    p: &crate::Pair<B>,
    mr: &B::Mr,
    solicited: bool,
    id: u64,
) -> Result<(), crate::Failure> {
    p.b.post_recv(&[RecvWr::new(id, &[mr.sge(512, 64)?])])?;
    let sge = [mr.sge(0, 16)?];
    let mut wr = SendWr::send(id, &sge).signaled();
    if solicited {
        wr = wr.solicited();
    }
    p.a.post_send(&[wr])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "send: {:?}", wc.status);
    Ok(())
}

fn cq_notify<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.channel = true;
    let p = env.pair(&o)?;
    let ch = p.ch_b.as_ref().expect("channel requested");
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    p.cq_b.req_notify(false)?;
    send_one(env, &p, &mr, false, 1)?;
    let ev = ch.get_cq_event(Some(env.cfg.timeout))?;
    ensure_eq!(ev, Some(p.cq_b.handle()), "event");
    p.cq_b.ack_events(1);
    let wc = env.wait1(&p.cq_b)?;
    ensure!(wc.is_ok(), "receive: {:?}", wc.status);
    // One event per arm: a second completion without re-arming raises none.
    send_one(env, &p, &mr, false, 2)?;
    env.wait1(&p.cq_b)?;
    ensure_eq!(
        ch.get_cq_event(Some(Duration::from_millis(100)))?,
        None,
        "event without re-arming"
    );
    Ok(Outcome::Pass)
}

fn cq_no_event_unarmed<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.channel = true;
    let p = env.pair(&o)?;
    let ch = p.ch_b.as_ref().expect("channel requested");
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    send_one(env, &p, &mr, false, 1)?;
    env.wait1(&p.cq_b)?;
    ensure_eq!(ch.get_cq_event(Some(Duration::from_millis(100)))?, None, "event");
    Ok(Outcome::Pass)
}

fn cq_solicited_only<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.channel = true;
    let p = env.pair(&o)?;
    let ch = p.ch_b.as_ref().expect("channel requested");
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    p.cq_b.req_notify(true)?;
    send_one(env, &p, &mr, false, 1)?;
    env.wait1(&p.cq_b)?;
    ensure_eq!(
        ch.get_cq_event(Some(Duration::from_millis(100)))?,
        None,
        "event for an unsolicited SEND"
    );
    send_one(env, &p, &mr, true, 2)?;
    ensure_eq!(
        ch.get_cq_event(Some(env.cfg.timeout))?,
        Some(p.cq_b.handle()),
        "event for a solicited SEND"
    );
    p.cq_b.ack_events(1);
    Ok(Outcome::Pass)
}

fn cq_overflow<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.cqe_b = Some(4);
    o.cap.max_recv_wr = 256;
    o.cap.max_send_wr = 256;
    // Once B's CQ overflows, B goes to ERR and drops A's remaining SENDs; A then gives
    // up after retry_cnt timeouts (a finite count: some devices treat 7 as infinite).
    o.a.retry_cnt = 1;
    o.a.timeout = 14;
    let p = env.pair(&o)?;
    let cap = p.cq_b.capacity() as u64;
    let n = cap + 2;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    for i in 0..n {
        p.b.post_recv(&[RecvWr::new(i, &[mr.sge(1024, 64)?])])?;
    }
    let sge = [mr.sge(0, 8)?];
    let wrs: Vec<_> = (0..n).map(|i| SendWr::send(i, &sge).signaled()).collect();
    p.a.post_send(&wrs)?;
    // Every SEND finishes one way or another (success, transport retries exhausted or
    // flushed); then B's CQ holds more than it can.
    env.wait(&p.cq_a, n as usize)?;
    let mut wc = vec![Default::default(); n as usize + 4];
    let mut polled = 0u64;
    for _ in 0..100 {
        match p.cq_b.poll(&mut wc) {
            Ok(k) => polled += k as u64,
            Err(verbs_api::Error::CqOverflow { .. }) => return Ok(Outcome::Pass),
            Err(e) => {
                return Err(crate::Failure(format!(
                    "poll failed, but not with CqOverflow: {e}"
                )))
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(crate::Failure(format!(
        "{n} receives completed into a CQ of {cap}: polled {polled} entries, no overflow reported"
    )))
}
