//! The error state and local errors (IBA 10.3.1 "Error state", 10.8.3.1; `man ibv_poll_cq`
//! statuses; `man ibv_modify_qp`).
//!
//! In ERR every outstanding and every newly posted WR completes with WR_FLUSH_ERR, each
//! exactly once, in order; local protection and length errors complete with their own
//! statuses and take the QP to ERR.

use std::time::Duration;

use verbs_api::{
    AccessFlags as A, Backend, Context, MemoryRegion, QpAttr, QpAttrMask as M, QpState, QueuePair, RecvWr,
    SendWr, Sge, WcStatus,
};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Failure, Outcome, Profile};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "errors.flush-receives",
            "moving a QP to ERR flushes its 5 posted receives: WR_FLUSH_ERR each, in order",
            "man ibv_modify_qp (IBV_QPS_ERR); IBA 10.3.1",
            flush_receives
        ),
        case!(
            "errors.flush-new-posts",
            "WRs posted in ERR (sends unsignaled or not, receives) complete with WR_FLUSH_ERR",
            "IBA 10.8.3.1 (WRs posted in the error state); man ibv_post_send",
            flush_new_posts
        ),
        case!(
            "errors.flush-outstanding-sends",
            "SENDs stuck in RNR retries are flushed exactly once each when the QP goes to ERR",
            "IBA 10.3.1; man ibv_poll_cq (WR_FLUSH_ERR)",
            flush_outstanding
        ),
        case!(
            "errors.flush-after-remote-error",
            "after REM_ACCESS_ERR the QP is in ERR and the WRs behind the failed one are flushed",
            "IBA 9.9.3 / 10.8.3.1 (requester errors move the QP to ERR)",
            flush_after_remote_error
        ),
        case!("errors.bad-lkey", "a SEND, and a WRITE, with an lkey that names no region complete with LOC_PROT_ERR", "man ibv_poll_cq (IBV_WC_LOC_PROT_ERR)", bad_lkey),
        case!(
            "errors.lkey-other-pd",
            "a SEND, and a WRITE, whose lkey names a region of another PD complete with LOC_PROT_ERR",
            "man ibv_poll_cq (IBV_WC_LOC_PROT_ERR); IBA 10.6.3.1 (a region is used through QPs of its own PD)",
            lkey_other_pd
        ),
        case!(
            "errors.local-side-lkeys",
            "an RDMA READ, and a FETCH_AND_ADD, whose local SGE has an lkey of no region or of another PD's region complete with LOC_PROT_ERR, remote memory unchanged",
            "man ibv_poll_cq (IBV_WC_LOC_PROT_ERR); IBA 10.6.3.1",
            local_side_lkeys
        ),
        case!(
            "errors.lkey-out-of-bounds",
            "a SEND whose SGE runs past its region completes with LOC_PROT_ERR",
            "man ibv_poll_cq (IBV_WC_LOC_PROT_ERR)",
            lkey_oob
        ),
        case!(
            "errors.read-into-readonly",
            "an RDMA READ into a region without LOCAL_WRITE completes with LOC_PROT_ERR",
            "man ibv_reg_mr (IBV_ACCESS_LOCAL_WRITE needed for the HCA to write)",
            read_into_readonly
        ),
        case!(
            "errors.recv-too-small",
            "a SEND longer than the receive: LOC_LEN_ERR at the responder, REM_INV_REQ_ERR at the requester, both QPs in ERR",
            "IBA 9.7.5.2.8 / 10.7.2.2; man ibv_poll_cq (IBV_WC_LOC_LEN_ERR, IBV_WC_REM_INV_REQ_ERR)",
            recv_too_small
        ),
        case!(
            "errors.recv-bad-lkey",
            "a receive with a bad lkey: LOC_PROT_ERR at the responder, the requester's SEND fails (REM_OP_ERR)",
            "IBA 9.7.5.2.8 (NAK remote operational error); man ibv_poll_cq",
            recv_bad_lkey
        ),
        case!(
            "errors.no-responder-resources",
            "READ, CMP_AND_SWP and FETCH_AND_ADD to a QP with max_dest_rd_atomic 0: REM_INV_REQ_ERR, no byte read or changed",
            "man ibv_modify_qp (max_dest_rd_atomic: responder resources for RDMA READ and atomics); IBA 9.7.5.2.8 (NAK invalid request); rxe_resp.c check_resource()",
            no_responder_resources
        ),
        case!(
            "errors.rd-atomic-over-limit",
            "four READs in flight to a QP with max_dest_rd_atomic 1: one fails REM_INV_REQ_ERR, those behind it are flushed",
            "IBA 9.7.5.2.3 (a request the responder has no resources for is an invalid request); man ibv_modify_qp (max_rd_atomic, max_dest_rd_atomic)",
            rd_atomic_over_limit
        ),
    ]
}

fn to_err(qp: &impl QueuePair) -> verbs_api::Result<()> {
    qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        },
        M::STATE,
    )
}

fn flush_receives<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    for i in 0..5u64 {
        p.b.post_recv(&[RecvWr::new(100 + i, &[mr.sge(i as usize * 64, 64)?])])?;
    }
    to_err(&p.b)?;
    let wcs = env.wait(&p.cq_b, 5)?;
    for (i, w) in wcs.iter().enumerate() {
        ensure_eq!(w.wr_id, 100 + i as u64, "wr_id of flushed receive {i}");
        ensure_eq!(w.status, WcStatus::WrFlushErr, "status of flushed receive {i}");
        ensure_eq!(w.qp_num, p.b.qp_num(), "qp_num");
    }
    env.expect_empty(&p.cq_b, "after the flush")?;
    Ok(Outcome::Pass)
}

fn flush_new_posts<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    to_err(&p.a)?;
    let sge = [mr.sge(0, 8)?];
    p.a.post_send(&[SendWr::send(1, &sge), SendWr::send(2, &sge).signaled()])?;
    let wcs = env.wait(&p.cq_a, 2)?;
    ensure_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![1, 2],
        "flushed sends (unsignaled included)"
    );
    ensure!(
        wcs.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "statuses {wcs:?}"
    );
    p.a.post_recv(&[RecvWr::new(3, &[mr.sge(64, 64)?])])?;
    if env.profile == Profile::Rxe {
        let got = env.quiet(&p.cq_a, Duration::from_millis(200))?;
        env.observe(
            "receive posted in ERR",
            got.first()
                .map_or("never completes".to_string(), |w| format!("{:?}", w.status)),
        );
        if got.is_empty() {
            env.deviation(
                "a receive posted in ERR is never flushed: rdma-core's rxe_post_recv (providers/rxe/rxe.c) \
                 only writes the WQE into the user-mapped queue without entering the kernel, and the kernel \
                 flushes the receive queue only when its responder task runs (rxe_resp.c check_resource)",
            );
            return Ok(Outcome::Pass);
        }
        ensure!(
            got.len() == 1 && got[0].wr_id == 3 && got[0].status == WcStatus::WrFlushErr,
            "receive: {got:?}"
        );
    } else {
        let w = env.wait1(&p.cq_a)?;
        env.observe("receive posted in ERR", format_args!("{:?}", w.status));
        ensure!(
            w.wr_id == 3 && w.status == WcStatus::WrFlushErr,
            "receive posted in ERR: {w:?}"
        );
    }
    env.expect_empty(&p.cq_a, "after the flush")?;
    Ok(Outcome::Pass)
}

fn flush_outstanding<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.rnr_retry = 7;
    o.b.min_rnr_timer = 20;
    let p = env.pair(&o)?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let sge = [mr.sge(0, 8)?];
    let wrs: Vec<_> = (0..10).map(|i| SendWr::send(i, &sge).signaled()).collect();
    p.a.post_send(&wrs)?;
    ensure!(
        env.quiet(&p.cq_a, Duration::from_millis(30))?.is_empty(),
        "SENDs completed without receives"
    );
    to_err(&p.a)?;
    let wcs = env.wait(&p.cq_a, 10)?;
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ensure_eq!(ids, (0..10).collect::<Vec<u64>>(), "flushed WRs in order");
    ensure!(
        wcs.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "statuses {wcs:?}"
    );
    env.expect_empty(&p.cq_a, "a second completion for some WR")?;
    Ok(Outcome::Pass)
}

fn flush_after_remote_error<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let bad = verbs_api::RemoteAddr::new(dst.addr(), dst.rkey() ^ 0x00ff_0000);
    let sge = [src.sge(0, 16)?];
    p.a.post_send(&[
        SendWr::write(1, &sge, bad).signaled(),
        SendWr::write(2, &sge, dst.remote().at(0)).signaled(),
        SendWr::write(3, &sge, dst.remote().at(64)).signaled(),
    ])?;
    let wcs = env.wait(&p.cq_a, 3)?;
    ensure_eq!(wcs[0].wr_id, 1, "first completion");
    env.expect_status("WRITE with a bad rkey", &wcs[0], WcStatus::RemAccessErr, &[])?;
    for w in &wcs[1..] {
        ensure_eq!(
            w.status,
            WcStatus::WrFlushErr,
            "status of WR {} behind the failed one",
            w.wr_id
        );
    }
    ensure_eq!(p.a.state()?, QpState::Err, "requester state");
    p.a.post_send(&[SendWr::write(4, &sge, dst.remote().at(0))])?;
    let w = env.wait1(&p.cq_a)?;
    ensure!(
        w.wr_id == 4 && w.status == WcStatus::WrFlushErr,
        "WR posted after the error: {w:?}"
    );
    ensure!(
        dst.to_vec().iter().all(|&b| b == 0),
        "flushed WRITEs modified memory"
    );
    Ok(Outcome::Pass)
}

fn bad_lkey<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let bad = Sge::new(mr.addr(), 16, mr.lkey() ^ 0x0f0f_0000);
    send_and_write_fail(env, &p, &mr, bad, "with a bad lkey")?;
    Ok(Outcome::Pass)
}

/// A SEND from `sge` on pair `p`, and a WRITE from it on a second pair, each fail with
/// the status of a bad lkey (rxe's for an lkey `lookup_mr()` refuses), `how` naming the
/// SGE in the observations; both QPs go to ERR, and `target` (the receive's and the
/// WRITE's, registered with `REMOTE_WRITE`) is untouched.
fn send_and_write_fail<B: Backend>(
    env: &Env<B>,
    p: &crate::Pair<B>,
    target: &B::Mr,
    sge: Sge,
    how: &str,
) -> Result<(), Failure> {
    p.b.post_recv(&[RecvWr::new(1, &[target.sge(1024, 64)?])])?;
    p.a.post_send(&[SendWr::send(2, &[sge]).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    let rxe = [(
        Profile::Rxe,
        WcStatus::LocQpOpErr,
        super::send_error::RXE_BAD_LKEY,
    )];
    env.expect_status(&format!("SEND {how}"), &wc, WcStatus::LocProtErr, &rxe)?;
    ensure_eq!(p.a.state()?, QpState::Err, "requester state after the SEND");
    let q = env.pair(&env.opts())?;
    let dst = env.mr(&q.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    q.a.post_send(&[SendWr::write(3, &[sge], dst.remote().at(0)).signaled()])?;
    let wc = env.wait1(&q.cq_a)?;
    env.expect_status(&format!("WRITE {how}"), &wc, WcStatus::LocProtErr, &rxe)?;
    ensure_eq!(q.a.state()?, QpState::Err, "requester state after the WRITE");
    ensure!(
        dst.to_vec().iter().all(|&b| b == 0) && target.to_vec().iter().all(|&b| b == 0),
        "a failed SEND or WRITE changed memory"
    );
    Ok(())
}

/// The SGE names a region that exists, on the same device, but belongs to another PD than
/// the QP's: rxe's `lookup_mr()` refuses the PD mismatch as it refuses an unknown key.
fn lkey_other_pd<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let target = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let other = env.ctx.alloc_pd()?;
    let theirs = env.mr(&other, 4096, A::LOCAL_WRITE)?;
    theirs.fill(0x5a);
    let sge = theirs.sge(0, 16)?;
    send_and_write_fail(env, &p, &target, sge, "from another PD's region")?;
    Ok(Outcome::Pass)
}

/// The local side of a READ and of an atomic is where the response lands: rxe checks it
/// when the response arrives (rxe_comp.c `do_read()`, `do_atomic()`), and any failure of
/// `copy_data()` there is LOC_PROT_ERR, an unknown key and another PD's region alike.
fn local_side_lkeys<B: Backend>(env: &Env<B>) -> CaseResult {
    let other = env.ctx.alloc_pd()?;
    let theirs = env.mr(&other, 64, A::LOCAL_WRITE)?;
    for (how, foreign) in [("with a bad lkey", false), ("into another PD's region", true)] {
        for atomic in [false, true] {
            let p = env.pair(&env.opts())?;
            let remote = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_READ | A::REMOTE_ATOMIC)?;
            remote.fill(0x33);
            let mine = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
            let sge = if foreign {
                theirs.sge(0, 8)?
            } else {
                Sge::new(mine.addr(), 8, mine.lkey() ^ 0x0f0f_0000)
            };
            let (op, wr) = if atomic {
                (
                    "FETCH_AND_ADD",
                    SendWr::fetch_and_add(1, std::slice::from_ref(&sge), remote.remote().at(0), 1),
                )
            } else {
                (
                    "READ",
                    SendWr::read(1, std::slice::from_ref(&sge), remote.remote().at(0)),
                )
            };
            p.a.post_send(&[wr.signaled()])?;
            let wc = env.wait1(&p.cq_a)?;
            env.expect_status(&format!("{op} {how}"), &wc, WcStatus::LocProtErr, &[])?;
            ensure_eq!(p.a.state()?, QpState::Err, "requester state after the {op} {how}");
            ensure!(
                mine.to_vec().iter().all(|&b| b == 0) && theirs.to_vec().iter().all(|&b| b == 0),
                "the {op} {how} wrote a local region"
            );
        }
    }
    Ok(Outcome::Pass)
}

fn lkey_oob<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    p.b.post_recv(&[RecvWr::new(1, &[mr.sge(0, 4096)?])])?;
    let oob = Sge::new(mr.addr() + 4000, 200, mr.lkey());
    p.a.post_send(&[SendWr::send(2, &[oob]).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    env.expect_status("SEND past the end of its region", &wc, WcStatus::LocProtErr, &[])?;
    Ok(Outcome::Pass)
}

fn read_into_readonly<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let remote = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_READ)?;
    remote.write(0, &[9u8; 64])?;
    let local = env.mr(&p.pd, 4096, A::REMOTE_READ)?;
    p.a.post_send(&[SendWr::read(1, &[local.sge(0, 64)?], remote.remote().at(0)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    env.expect_status(
        "READ into a region without LOCAL_WRITE",
        &wc,
        WcStatus::LocProtErr,
        &[],
    )?;
    ensure!(
        local.to_vec().iter().all(|&b| b == 0),
        "the read-only region was written"
    );
    Ok(Outcome::Pass)
}

const RXE_LEN: &str = "rxe's copy_data() returns -EINVAL when the message exceeds the receive's SGEs \
(rxe_mr.c), send_data_in() reports RESPST_ERR_MALFORMED_WQE, completed as LOC_QP_OP_ERR with a \
'remote operational error' NAK (rxe_resp.c)";

fn recv_too_small<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    p.b.post_recv(&[RecvWr::new(1, &[mr.sge(2048, 16)?])])?;
    p.a.post_send(&[SendWr::send(2, &[mr.sge(0, 100)?]).signaled()])?;
    let r = env.wait1(&p.cq_b)?;
    let s = env.wait1(&p.cq_a)?;
    env.expect_status(
        "responder",
        &r,
        WcStatus::LocLenErr,
        &[(Profile::Rxe, WcStatus::LocQpOpErr, RXE_LEN)],
    )?;
    env.expect_status(
        "requester",
        &s,
        WcStatus::RemInvReqErr,
        &[(Profile::Rxe, WcStatus::RemOpErr, RXE_LEN)],
    )?;
    ensure_eq!(p.a.state()?, QpState::Err, "requester state");
    ensure_eq!(p.b.state()?, QpState::Err, "responder state");
    Ok(Outcome::Pass)
}

fn recv_bad_lkey<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.pair(&env.opts())?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let bad = Sge::new(mr.addr() + 1024, 64, mr.lkey() ^ 0x0f0f_0000);
    p.b.post_recv(&[RecvWr::new(1, &[bad])])?;
    p.a.post_send(&[SendWr::send(2, &[mr.sge(0, 16)?]).signaled()])?;
    let r = env.wait1(&p.cq_b)?;
    let s = env.wait1(&p.cq_a)?;
    env.expect_status(
        "responder",
        &r,
        WcStatus::LocProtErr,
        &[(
            Profile::Rxe,
            WcStatus::LocQpOpErr,
            "rxe's copy_data() fails with -EINVAL on the bad lkey, send_data_in() turns that into \
             RESPST_ERR_MALFORMED_WQE, completed as IB_WC_LOC_QP_OP_ERR (rxe_resp.c)",
        )],
    )?;
    env.expect_status("requester", &s, WcStatus::RemOpErr, &[])?;
    Ok(Outcome::Pass)
}

/// A responder without resources for RDMA READ and atomics (`max_dest_rd_atomic` 0)
/// refuses them as invalid requests (rxe's `check_resource()` answers
/// `RESPST_ERR_TOO_MANY_RDMA_ATM_REQ` with an invalid-request NAK) and executes nothing:
/// the FETCH_AND_ADD does not add, the CMP_AND_SWP does not swap, the READ returns no data,
/// and no old value lands in the requester's buffer.
fn no_responder_resources<B: Backend>(env: &Env<B>) -> CaseResult {
    const SENTINEL: u64 = 0x5a5a_5a5a_5a5a_5a5a;
    let mut o = env.opts();
    o.b.max_dest_rd_atomic = 0;
    for op in ["READ", "CMP_AND_SWP", "FETCH_AND_ADD"] {
        // A fresh pair each: the first error takes the requester to ERR.
        let p = env.pair(&o)?;
        let dst = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_READ | A::REMOTE_ATOMIC)?;
        let local = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
        dst.write(0, &crate::env::pattern(4096, 7))?;
        dst.write_u64(0, 41)?;
        local.write_u64(0, SENTINEL)?;
        let before = dst.to_vec();
        let sge = [local.sge(0, 8)?];
        let read_sge = [local.sge(0, 64)?];
        let wr = match op {
            "READ" => SendWr::read(1, &read_sge, dst.remote().at(0)),
            // 41 == 41: the swap would happen.
            "CMP_AND_SWP" => SendWr::cmp_and_swp(1, &sge, dst.remote().at(0), 41, 1000),
            _ => SendWr::fetch_and_add(1, &sge, dst.remote().at(0), 1),
        };
        p.a.post_send(&[wr.signaled()])?;
        let wc = env.wait1(&p.cq_a)?;
        env.expect_status(
            &format!("{op} to a QP with max_dest_rd_atomic 0"),
            &wc,
            WcStatus::RemInvReqErr,
            &[],
        )?;
        ensure!(
            dst.to_vec() == before,
            "{op} to a QP with max_dest_rd_atomic 0: the remote memory changed (word 0 is now {})",
            dst.read_u64(0)?
        );
        ensure_eq!(
            local.read_u64(0)?,
            SENTINEL,
            "{op} to a QP with max_dest_rd_atomic 0: the requester's buffer"
        );
        ensure!(
            crate::env::read_back(&local, 8, 56)?.iter().all(|&b| b == 0),
            "{op} to a QP with max_dest_rd_atomic 0: data landed in the requester's buffer"
        );
        ensure_eq!(
            p.a.state()?,
            QpState::Err,
            "requester state after the refused {op}"
        );
    }
    Ok(Outcome::Pass)
}

fn rd_atomic_over_limit<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.a.max_rd_atomic = 4;
    o.b.max_dest_rd_atomic = 1;
    let p = env.pair(&o)?;
    let remote = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_READ)?;
    remote.write(0, &crate::env::pattern(4096, 3))?;
    let local = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let sges: Vec<[Sge; 1]> = (0..4)
        .map(|i| Ok([local.sge(i * 64, 64)?]))
        .collect::<Result<_, Failure>>()?;
    let wrs: Vec<SendWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, sge)| SendWr::read(i as u64, sge, remote.remote().at(i as u64 * 64)).signaled())
        .collect();
    p.a.post_send(&wrs)?;
    let wcs = env.wait(&p.cq_a, 4)?;
    let first_error = wcs.iter().find(|w| w.status != WcStatus::Success);
    env.observe(
        "four READs, max_dest_rd_atomic 1",
        first_error.map_or("all served".to_string(), |w| format!("{:?}", w.status)),
    );
    match first_error {
        None if env.profile == Profile::Rxe => {
            env.deviation(
                "rxe serves every READ and atomic however many are outstanding: rxe_resp.c \
                 check_resource() (\"it is the requesters job to not send too many read/atomic \
                 ops, we just recycle the responder resource queue\")",
            );
            ensure_eq!(
                crate::env::read_back(&local, 0, 256)?,
                crate::env::read_back(&remote, 0, 256)?,
                "the data read"
            );
        }
        None => {
            return Err(Failure(
                "four READs served by a responder with one resource".into(),
            ))
        }
        Some(bad) => {
            ensure_eq!(
                bad.status,
                WcStatus::RemInvReqErr,
                "the first failed READ ({:?})",
                bad.wr_id
            );
            let after: Vec<_> = wcs.iter().filter(|w| w.wr_id > bad.wr_id).collect();
            ensure!(
                after.iter().all(|w| w.status == WcStatus::WrFlushErr),
                "the READs behind the refused one: {after:?}"
            );
            ensure_eq!(p.a.state()?, QpState::Err, "requester state");
        }
    }
    Ok(Outcome::Pass)
}
