//! Receiver-not-ready: what happens when a SEND finds no posted receive (IBA 9.7.5.2.8,
//! `man ibv_modify_qp` (rnr_retry, min_rnr_timer)).

use std::time::Duration;

use verbs_api::{
    timers::rnr_timer, AccessFlags as A, Backend, MemoryRegion, QpState, QueuePair, RecvWr, SendWr, WcStatus,
};

use super::case;
use crate::env::{pattern, read_back};
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Failure, Outcome, Pair};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "rnr.exhausted",
            "with rnr_retry 0 a SEND to an empty receive queue fails with RNR_RETRY_EXC_ERR and the QP goes to ERR",
            "IBA 9.7.5.2.8 (RNR NAK), man ibv_modify_qp (rnr_retry)",
            rnr_exhausted
        ),
        case!(
            "rnr.retry-count",
            "with rnr_retry 3 and no receive the SEND still retries 2.5 RNR timer periods after its post, then fails with RNR_RETRY_EXC_ERR",
            "IBA 9.7.5.2.8 (RNR NAK timer), man ibv_modify_qp (rnr_retry, min_rnr_timer)",
            rnr_retry_count
        ),
        case!(
            "rnr.last-retry",
            "with rnr_retry 3 a receive posted after the 2nd RNR retry was refused is found by the 3rd: the SEND succeeds",
            "IBA 9.7.5.2.8 (rnr_retry counts retries after the first attempt), man ibv_modify_qp (rnr_retry)",
            rnr_last_retry
        ),
        case!(
            "rnr.recovery",
            "a receive posted during RNR retries lets the SEND through intact",
            "IBA 9.7.5.2.8",
            rnr_recovery
        ),
        case!(
            "rnr.infinite",
            "with rnr_retry 7 the SEND waits as long as it takes, then completes",
            "man ibv_modify_qp: rnr_retry 7 means infinite",
            rnr_infinite
        ),
        case!(
            "rnr.write-imm",
            "RDMA_WRITE_WITH_IMM needs a receive too: with none and rnr_retry 0 it fails with RNR_RETRY_EXC_ERR",
            "IBA 9.4.2 (WRITE with immediate consumes a receive WQE)",
            rnr_write_imm
        ),
        case!(
            "rnr.write-needs-no-receive",
            "a plain RDMA WRITE succeeds with an empty receive queue and rnr_retry 0",
            "IBA 9.4.2 (RDMA WRITE is one-sided)",
            rnr_write_no_recv
        ),
    ]
}

fn rnr_exhausted<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.rnr_retry = 0;
    let p = env.pair(&o)?;
    let mr = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    p.a.post_send(&[SendWr::send(1, &[mr.sge(0, 8)?]).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    env.expect_status("SEND", &wc, WcStatus::RnrRetryExcErr, &[])?;
    ensure_eq!(wc.wr_id, 1, "wr_id");
    ensure_eq!(p.a.state()?, QpState::Err, "requester state");
    ensure_eq!(p.b.state()?, QpState::Rts, "responder state");
    Ok(Outcome::Pass)
}

/// `rnr_retry` of the counting cases: finite (7 is for ever) and above 1, so that "one
/// retry short" and "no retry" are different bugs.
const COUNTED_RETRIES: u8 = 3;

/// `min_rnr_timer` of the counting cases (122.88 ms): a period long enough that a thread
/// of the TCP sim or a kernel timer of rxe, late by a scheduler period or a jiffy, still
/// lands on the side of the period boundary the case means.
const COUNTED_TIMER: u8 = 27;

/// The time after a SEND's post at which it has been NAKed RNR for its first attempt
/// and its first `COUNTED_RETRIES - 1` retries, half an RNR period before its last retry.
/// On the deterministic backend `Env::settle` runs exactly this much virtual time, so
/// the retries are counted, not timed.
fn before_last_retry() -> Duration {
    rnr_timer(COUNTED_TIMER) * (2 * u32::from(COUNTED_RETRIES) - 1) / 2
}

/// A pair whose A retries RNR NAKs `COUNTED_RETRIES` times, told by B to wait
/// `COUNTED_TIMER` periods.
fn counted_pair<B: Backend>(env: &Env<B>) -> Result<Pair<B>, Failure> {
    let mut o = env.opts();
    o.a.rnr_retry = COUNTED_RETRIES;
    o.b.min_rnr_timer = COUNTED_TIMER;
    env.pair(&o)
}

fn rnr_retry_count<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = counted_pair(env)?;
    let mr = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    p.a.post_send(&[SendWr::send(1, &[mr.sge(0, 8)?]).signaled()])?;
    let early = env.quiet(&p.cq_a, before_last_retry())?;
    ensure!(
        early.is_empty(),
        "completed {:?} before its retry {COUNTED_RETRIES} of rnr_retry {COUNTED_RETRIES}",
        early.iter().map(|w| w.status).collect::<Vec<_>>()
    );
    let wc = env.wait1(&p.cq_a)?;
    env.expect_status("SEND", &wc, WcStatus::RnrRetryExcErr, &[])?;
    ensure_eq!(p.a.state()?, QpState::Err, "requester state");
    Ok(Outcome::Pass)
}

fn rnr_last_retry<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = counted_pair(env)?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let data = pattern(100, 5);
    mr.write(0, &data)?;
    p.a.post_send(&[SendWr::send(1, &[mr.sge(0, 100)?]).signaled()])?;
    env.settle(before_last_retry())?;
    // The state, not a poll of the CQ: on the deterministic backend an empty poll runs
    // the world on to its next event, which is that last retry.
    ensure_eq!(
        p.a.state()?,
        QpState::Rts,
        "requester state before its retry {COUNTED_RETRIES} of rnr_retry {COUNTED_RETRIES}"
    );
    p.b.post_recv(&[RecvWr::new(2, &[mr.sge(1024, 128)?])])?;
    let s = env.wait1(&p.cq_a)?;
    env.expect_status("SEND", &s, WcStatus::Success, &[])?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(r.is_ok(), "receive status {:?}", r.status);
    ensure_eq!(read_back(&mr, 1024, 100)?, data, "payload");
    Ok(Outcome::Pass)
}

fn rnr_recovery<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.rnr_retry = 7;
    o.b.min_rnr_timer = 14; // 1.28 ms
    let p = env.pair(&o)?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let data = pattern(100, 4);
    mr.write(0, &data)?;
    p.a.post_send(&[SendWr::send(1, &[mr.sge(0, 100)?]).signaled()])?;
    // Long enough for the SEND to reach B and be NAKed (the RNR this case recovers
    // from) on a loaded host, where B's progress may wait several scheduler periods of
    // ~30 ms for a CPU; rnr_retry 7 retries the SEND meanwhile without end.
    ensure!(
        env.quiet(&p.cq_a, Duration::from_millis(300))?.is_empty(),
        "SEND completed before a receive was posted"
    );
    p.b.post_recv(&[RecvWr::new(2, &[mr.sge(1024, 128)?])])?;
    let s = env.wait1(&p.cq_a)?;
    let r = env.wait1(&p.cq_b)?;
    ensure!(s.is_ok() && r.is_ok(), "statuses {:?} / {:?}", s.status, r.status);
    ensure_eq!(read_back(&mr, 1024, 100)?, data, "payload");
    Ok(Outcome::Pass)
}

fn rnr_infinite<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.rnr_retry = 7;
    o.b.min_rnr_timer = 1; // 0.01 ms: thousands of retries
    let p = env.pair(&o)?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    p.a.post_send(&[SendWr::send(1, &[mr.sge(0, 8)?]).signaled()])?;
    let early = env.quiet(&p.cq_a, Duration::from_millis(300))?;
    ensure!(early.is_empty(), "completed without a receive: {early:?}");
    ensure_eq!(p.a.state()?, QpState::Rts, "state while retrying");
    p.b.post_recv(&[RecvWr::new(2, &[mr.sge(1024, 64)?])])?;
    let s = env.wait1(&p.cq_a)?;
    ensure!(s.is_ok(), "status {:?}", s.status);
    Ok(Outcome::Pass)
}

fn rnr_write_imm<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.rnr_retry = 0;
    let p = env.pair(&o)?;
    let src = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    src.write(0, &[7u8; 16])?;
    p.a.post_send(&[SendWr::write_with_imm(1, &[src.sge(0, 16)?], dst.remote().at(0), 5).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    env.expect_status("WRITE_WITH_IMM", &wc, WcStatus::RnrRetryExcErr, &[])?;
    Ok(Outcome::Pass)
}

fn rnr_write_no_recv<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.rnr_retry = 0;
    let p = env.pair(&o)?;
    let src = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    src.write(0, &[7u8; 16])?;
    p.a.post_send(&[SendWr::write(1, &[src.sge(0, 16)?], dst.remote().at(0)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "status {:?}", wc.status);
    ensure_eq!(read_back(&dst, 0, 16)?, vec![7u8; 16], "written bytes");
    env.expect_empty(&p.cq_b, "the responder's CQ")?;
    Ok(Outcome::Pass)
}
