//! Remote access checks: rkey, PD, access flags (region and QP) and bounds, for WRITE,
//! READ and atomics (IBA 10.6.3 "Memory access protection", 9.7.5.2.8 NAK "Remote Access
//! Error"; `man ibv_reg_mr`, `man ibv_modify_qp` (qp_access_flags)).
//!
//! Each violation completes on the requester with `IBV_WC_REM_ACCESS_ERR`, moves the
//! requester QP to ERR, and leaves the target memory untouched.

use verbs_api::{
    AccessFlags as A, Backend, Context, MemoryRegion, ProtectionDomain, QpState, QueuePair, RecvWr,
    RemoteAddr, SendWr, WcStatus,
};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome, Pair, PairOpts, Profile};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!("access.write-bad-rkey", "WRITE with an rkey that names no region: REM_ACCESS_ERR, memory untouched", "IBA 10.6.3.1 (R_Key check)", write_bad_rkey),
        case!("access.write-no-remote-write", "WRITE to a region without REMOTE_WRITE: REM_ACCESS_ERR", "man ibv_reg_mr (IBV_ACCESS_REMOTE_WRITE)", write_no_flag),
        case!("access.write-out-of-bounds", "WRITE that crosses the end of the region: REM_ACCESS_ERR, nothing written", "IBA 10.6.3.1 (bounds check)", write_oob),
        case!("access.write-other-pd", "WRITE to a region of another PD than the responder QP: REM_ACCESS_ERR", "IBA 10.6.3.1 (PD check); man ibv_alloc_pd", write_other_pd),
        case!(
            "access.write-imm-bad-rkey",
            "WRITE_WITH_IMM with a bad rkey: REM_ACCESS_ERR; the receive it took completes LOC_ACCESS_ERR, the next is flushed",
            "IBA 11.6.2 (Local Access Error: a protection error on a local buffer during an RDMA Write with Immediate); IBA 10.6.3.1",
            write_imm_bad_rkey
        ),
        case!("access.write-qp-flags", "WRITE to a QP whose qp_access_flags lack REMOTE_WRITE: REM_ACCESS_ERR", "man ibv_modify_qp (qp_access_flags)", write_qp_flags),
        case!("access.read-no-remote-read", "READ from a region without REMOTE_READ: REM_ACCESS_ERR", "man ibv_reg_mr (IBV_ACCESS_REMOTE_READ)", read_no_flag),
        case!("access.read-out-of-bounds", "READ past the end of the region: REM_ACCESS_ERR", "IBA 10.6.3.1 (bounds check)", read_oob),
        case!("access.read-qp-flags", "READ from a QP whose qp_access_flags lack REMOTE_READ: REM_ACCESS_ERR", "man ibv_modify_qp (qp_access_flags)", read_qp_flags),
        case!("access.atomic-no-remote-atomic", "atomic on a region without REMOTE_ATOMIC: REM_ACCESS_ERR, word unchanged", "man ibv_reg_mr (IBV_ACCESS_REMOTE_ATOMIC)", atomic_no_flag),
        case!("access.atomic-out-of-bounds", "atomic on the 8 bytes after the region: REM_ACCESS_ERR", "IBA 10.6.3.1 (bounds check)", atomic_oob),
        case!(
            "access.atomic-misaligned",
            "atomic on an address that is not 8-byte aligned fails (REM_INV_REQ_ERR or REM_ACCESS_ERR), word unchanged",
            "IBA 9.4.5 (atomic operations must be 8-byte aligned); man ibv_post_send",
            atomic_misaligned
        ),
        case!("access.deregistered", "WRITE with the rkey of a deregistered region: REM_ACCESS_ERR", "man ibv_dereg_mr; IBA 10.6.3.1", deregistered),
    ]
}

struct Setup<B: Backend> {
    p: Pair<B>,
    src: B::Mr,
}

fn setup<B: Backend>(env: &Env<B>, o: &PairOpts) -> Result<Setup<B>, crate::Failure> {
    let p = env.pair(o)?;
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    src.write(0, &[0x5a; 4096])?;
    Ok(Setup { p, src })
}

/// Posts `wr` on A and expects REM_ACCESS_ERR, A in ERR.
fn expect_rem_access<B: Backend>(
    env: &Env<B>,
    s: &Setup<B>,
    wr: SendWr<'_>,
    what: &str,
) -> Result<(), crate::Failure> {
    s.p.a.post_send(&[wr.signaled()])?;
    let wc = env.wait1(&s.p.cq_a)?;
    env.expect_status(what, &wc, WcStatus::RemAccessErr, &[])?;
    ensure_eq!(s.p.a.state()?, QpState::Err, "requester state after {what}");
    Ok(())
}

fn untouched(mr: &impl MemoryRegion, what: &str) -> Result<(), crate::Failure> {
    ensure!(
        mr.to_vec().iter().all(|&b| b == 0),
        "{what}: the target memory was modified"
    );
    Ok(())
}

fn write_bad_rkey<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let bad = RemoteAddr::new(dst.addr(), dst.rkey() ^ 0x5555_0000);
    expect_rem_access(
        env,
        &s,
        SendWr::write(1, &[s.src.sge(0, 64)?], bad),
        "WRITE with a bad rkey",
    )?;
    untouched(&dst, "WRITE with a bad rkey")?;
    Ok(Outcome::Pass)
}

fn write_imm_bad_rkey<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    s.p.b.post_recv(&[
        RecvWr::new(10, &[dst.sge(2048, 64)?]),
        RecvWr::new(11, &[dst.sge(3072, 64)?]),
    ])?;
    let bad = RemoteAddr::new(dst.addr(), dst.rkey() ^ 0x5555_0000);
    expect_rem_access(
        env,
        &s,
        SendWr::write_with_imm(1, &[s.src.sge(0, 64)?], bad, 0x1234),
        "WRITE_WITH_IMM with a bad rkey",
    )?;
    let wcs = env.wait(&s.p.cq_b, 2)?;
    ensure_eq!(
        (wcs[0].wr_id, wcs[1].wr_id),
        (10, 11),
        "the responder's receives, in order"
    );
    env.expect_status(
        "the receive WRITE_WITH_IMM with a bad rkey took",
        &wcs[0],
        WcStatus::LocAccessErr,
        &[(
            Profile::Rxe,
            WcStatus::RemAccessErr,
            "rxe_resp.c completes the receive it took before check_rkey() with the status it NAKs \
             with: RESPST_ERR_RKEY_VIOLATION -> do_class_ac_error(qp, AETH_NAK_REM_ACC_ERR, \
             IB_WC_REM_ACCESS_ERR) -> do_complete()",
        )],
    )?;
    env.expect_status("the receive after it", &wcs[1], WcStatus::WrFlushErr, &[])?;
    ensure_eq!(s.p.b.state()?, QpState::Err, "responder state");
    untouched(&dst, "WRITE_WITH_IMM with a bad rkey")?;
    Ok(Outcome::Pass)
}

fn write_no_flag<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_READ)?;
    expect_rem_access(
        env,
        &s,
        SendWr::write(1, &[s.src.sge(0, 64)?], dst.remote().at(0)),
        "WRITE without REMOTE_WRITE",
    )?;
    untouched(&dst, "WRITE without REMOTE_WRITE")?;
    Ok(Outcome::Pass)
}

fn write_oob<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    expect_rem_access(
        env,
        &s,
        SendWr::write(1, &[s.src.sge(0, 64)?], dst.remote().at(4096 - 32)),
        "WRITE across the end",
    )?;
    untouched(&dst, "WRITE across the end")?;
    Ok(Outcome::Pass)
}

fn write_other_pd<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let other = env.ctx.alloc_pd()?;
    let dst = other.reg_mr(4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    expect_rem_access(
        env,
        &s,
        SendWr::write(1, &[s.src.sge(0, 64)?], dst.remote().at(0)),
        "WRITE into another PD",
    )?;
    untouched(&dst, "WRITE into another PD")?;
    Ok(Outcome::Pass)
}

/// rxe checks `qp_access_flags` in its opcode check and answers "invalid request"
/// instead of "remote access error".
const RXE_QP_FLAGS: &str =
    "rxe checks qp_access_flags in check_op_valid() and NAKs with AETH_NAK_INVALID_REQ \
(drivers/infiniband/sw/rxe/rxe_resp.c)";

fn write_qp_flags<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.b.access = A::REMOTE_READ;
    let s = setup(env, &o)?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    s.p.a
        .post_send(&[SendWr::write(1, &[s.src.sge(0, 64)?], dst.remote().at(0)).signaled()])?;
    let wc = env.wait1(&s.p.cq_a)?;
    env.expect_status(
        "WRITE to a QP without REMOTE_WRITE",
        &wc,
        WcStatus::RemAccessErr,
        &[(Profile::Rxe, WcStatus::RemInvReqErr, RXE_QP_FLAGS)],
    )?;
    untouched(&dst, "WRITE to a QP without REMOTE_WRITE")?;
    Ok(Outcome::Pass)
}

fn read_no_flag<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let sink = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE)?;
    expect_rem_access(
        env,
        &s,
        SendWr::read(1, &[sink.sge(0, 64)?], dst.remote().at(0)),
        "READ without REMOTE_READ",
    )?;
    untouched(&sink, "READ without REMOTE_READ (local buffer)")?;
    Ok(Outcome::Pass)
}

fn read_oob<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_READ)?;
    let sink = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE)?;
    expect_rem_access(
        env,
        &s,
        SendWr::read(1, &[sink.sge(0, 128)?], dst.remote().at(4000)),
        "READ past the end",
    )?;
    Ok(Outcome::Pass)
}

fn read_qp_flags<B: Backend>(env: &Env<B>) -> CaseResult {
    let mut o = env.opts();
    o.b.access = A::REMOTE_WRITE;
    let s = setup(env, &o)?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_READ)?;
    let sink = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE)?;
    s.p.a
        .post_send(&[SendWr::read(1, &[sink.sge(0, 64)?], dst.remote().at(0)).signaled()])?;
    let wc = env.wait1(&s.p.cq_a)?;
    env.expect_status(
        "READ from a QP without REMOTE_READ",
        &wc,
        WcStatus::RemAccessErr,
        &[(Profile::Rxe, WcStatus::RemInvReqErr, RXE_QP_FLAGS)],
    )?;
    Ok(Outcome::Pass)
}

fn atomic_no_flag<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE | A::REMOTE_READ)?;
    let res = env.mr(&s.p.pd, 64, A::LOCAL_WRITE)?;
    expect_rem_access(
        env,
        &s,
        SendWr::fetch_and_add(1, &[res.sge(0, 8)?], dst.remote().at(0), 1),
        "FETCH_AND_ADD without REMOTE_ATOMIC",
    )?;
    ensure_eq!(dst.read_u64(0)?, 0, "target word");
    Ok(Outcome::Pass)
}

fn atomic_oob<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_ATOMIC)?;
    let res = env.mr(&s.p.pd, 64, A::LOCAL_WRITE)?;
    expect_rem_access(
        env,
        &s,
        SendWr::cmp_and_swp(1, &[res.sge(0, 8)?], dst.remote().at(4096), 0, 1),
        "CMP_AND_SWP past the end",
    )?;
    Ok(Outcome::Pass)
}

fn atomic_misaligned<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_ATOMIC)?;
    let res = env.mr(&s.p.pd, 64, A::LOCAL_WRITE)?;
    let sge = [res.sge(0, 8)?];
    let wr = SendWr::fetch_and_add(1, &sge, dst.remote().at(4), 1).signaled();
    let posted = s.p.a.post_send(&[wr]);
    env.observe_post("post", &posted);
    match posted {
        Err(e) if env.profile == Profile::Rxe && e.errno() == libc::EINVAL => {
            env.deviation(
                "misaligned atomic refused at post time with EINVAL: rxe's post_send checks \
                 `wr->wr.atomic.remote_addr & 7` (rdma-core providers/rxe/rxe.c validate_send_wr)",
            );
        }
        Err(e) => return Err(e.into()),
        Ok(()) => {
            let wc = env.wait1(&s.p.cq_a)?;
            env.observe("completion", format_args!("{:?}", wc.status));
            ensure!(
                matches!(wc.status, WcStatus::RemInvReqErr | WcStatus::RemAccessErr),
                "misaligned FETCH_AND_ADD: expected REM_INV_REQ_ERR or REM_ACCESS_ERR, got {:?}",
                wc.status
            );
        }
    }
    ensure!(
        dst.to_vec().iter().all(|&b| b == 0),
        "the target memory was modified"
    );
    Ok(Outcome::Pass)
}

fn deregistered<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env, &env.opts())?;
    let dst = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let remote = dst.remote();
    drop(dst);
    expect_rem_access(
        env,
        &s,
        SendWr::write(1, &[s.src.sge(0, 64)?], remote.at(0)),
        "WRITE to a deregistered region",
    )?;
    Ok(Outcome::Pass)
}
