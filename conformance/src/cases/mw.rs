//! Memory windows (`man ibv_alloc_mw`, `man ibv_bind_mw`, `man ibv_inc_rkey`,
//! `man ibv_post_send` for `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV`;
//! IBA 10.6.7): a window's rkey grants remote access its region does not grant, within the
//! window's bounds and rights; binding needs `IBV_ACCESS_MW_BIND` on the region; a rebind
//! rotates the rkey's tag so the old rkey stops working; an invalidated or deallocated
//! window refuses access with `IBV_WC_REM_ACCESS_ERR`.
//!
//! The windows are B's (the responder's); A accesses them. The region they are bound to
//! has `LOCAL_WRITE | MW_BIND` and no remote right of its own.

use verbs_api::{
    inc_rkey, AccessFlags as A, Backend, MemoryRegion, MemoryWindow, MwBind, MwBindInfo, MwType,
    ProtectionDomain, QueuePair, RecvWr, SendWr, WcFlags, WcOpcode, WcStatus,
};

use super::case;
use crate::{ensure_eq, Case, CaseResult, Env, Outcome, Pair, Profile};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "mw.type1-bind",
            "ibv_bind_mw binds a type 1 window: IBV_WC_BIND_MW, the rkey's tag rotated, a WRITE through it lands",
            "man ibv_bind_mw, man ibv_inc_rkey; IBA 10.6.7.2",
            type1_bind,
            requires [Mw]
        ),
        case!(
            "mw.type2-bind",
            "an IBV_WR_BIND_MW binds a type 2 window to the QP that posted it: a READ through it returns the data",
            "man ibv_post_send (IBV_WR_BIND_MW); IBA 10.6.7.2.2",
            type2_bind,
            requires [Mw]
        ),
        case!(
            "mw.region-rkey",
            "the region's own rkey grants no remote access the region lacks, whatever window is bound to it",
            "IBA 10.6.7 (a window grants access under its own rkey)",
            region_rkey,
            requires [Mw]
        ),
        case!(
            "mw.rights",
            "a READ-only window refuses a WRITE: REM_ACCESS_ERR, memory untouched",
            "IBA 10.6.7.2 (the window's access rights); man ibv_bind_mw (mw_access_flags)",
            rights,
            requires [Mw]
        ),
        case!(
            "mw.bounds",
            "a WRITE past the window's end, inside its region: REM_ACCESS_ERR (rxe checks the region's bounds)",
            "IBA 10.6.7.2 (the window's bounds); kernel rxe_resp.c check_rkey()",
            bounds,
            requires [Mw]
        ),
        case!(
            "mw.stale-tag",
            "bound again, a window refuses its previous rkey: REM_ACCESS_ERR",
            "man ibv_inc_rkey; IBA 10.6.7.2 (the key's tag)",
            stale_tag,
            requires [Mw]
        ),
        case!(
            "mw.no-mw-bind",
            "binding to a region without IBV_ACCESS_MW_BIND fails: IBV_WC_MW_BIND_ERR",
            "IBA C10-73; kernel rxe_mw.c rxe_check_bind_mw()",
            no_mw_bind,
            requires [Mw]
        ),
        case!(
            "mw.local-inv",
            "IBV_WR_LOCAL_INV invalidates a type 2 window: IBV_WC_LOCAL_INV, then REM_ACCESS_ERR through it",
            "man ibv_post_send (IBV_WR_LOCAL_INV); IBA 10.6.7.3",
            local_inv,
            requires [Mw]
        ),
        case!(
            "mw.send-with-inv",
            "a peer's SEND_WITH_INV invalidates a type 2 window: the receive has IBV_WC_WITH_INV and the rkey, then REM_ACCESS_ERR",
            "man ibv_post_send (IBV_WR_SEND_WITH_INV), man ibv_poll_cq (invalidated_rkey); IBA 10.6.7.3",
            send_with_inv,
            requires [Mw]
        ),
        case!(
            "mw.inv-other-qp",
            "a SEND_WITH_INV naming a type 2 window bound to another QP: the receive completes REM_INV_REQ_ERR (rxe invalidates it)",
            "IBA 10.6.7.3 (a type 2B window is invalidated only by a SEND_WITH_INV arriving on its QP); kernel rxe_mw.c rxe_check_invalidate_mw()",
            inv_other_qp,
            requires [Mw]
        ),
        case!(
            "mw.dealloc-bound",
            "a bound window is deallocated; its rkey then refuses access: REM_ACCESS_ERR",
            "man ibv_dealloc_mw; IBA 10.6.7.1",
            dealloc_bound,
            requires [Mw]
        ),
    ]
}

/// The pair, the region on B's side windows are bound to, and A's local buffer.
struct Setup<B: Backend> {
    p: Pair<B>,
    target: B::Mr,
    local: B::Mr,
}

fn setup<B: Backend>(env: &Env<B>) -> Result<Setup<B>, crate::Failure> {
    let p = env.pair(&env.opts())?;
    let target = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::MW_BIND)?;
    let local = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    Ok(Setup { p, target, local })
}

/// Binds the type 1 window `mw` on B over 1 KiB at offset 1024 of the target with `access`;
/// the bind's completion is waited for and checked. Its new rkey.
fn bind1<B: Backend>(env: &Env<B>, s: &Setup<B>, mw: &B::Mw, access: A) -> Result<u32, crate::Failure> {
    let rkey = s.p.b.bind_mw(
        mw,
        &MwBind::signaled(1, MwBindInfo::new(&s.target, 1024, 1024, access)),
    )?;
    let wc = env.wait1(&s.p.cq_b)?;
    env.expect_status("the bind", &wc, WcStatus::Success, &[])?;
    ensure_eq!(wc.opcode, WcOpcode::BindMw, "the bind's opcode");
    Ok(rkey)
}

/// Binds the type 2 window `mw` by an IBV_WR_BIND_MW on B over 1 KiB at offset 1024 of
/// the target with `access`, waiting for its completion. Its new rkey.
fn bind2<B: Backend>(env: &Env<B>, s: &Setup<B>, mw: &B::Mw, access: A) -> Result<u32, crate::Failure> {
    let rkey = inc_rkey(mw.rkey());
    let info = MwBindInfo::new(&s.target, 1024, 1024, access);
    s.p.b
        .post_send(&[SendWr::bind_mw(2, mw, rkey, info).signaled()])?;
    let wc = env.wait1(&s.p.cq_b)?;
    env.expect_status("the type 2 bind", &wc, WcStatus::Success, &[])?;
    ensure_eq!(wc.opcode, WcOpcode::BindMw, "the bind's opcode");
    ensure_eq!(mw.rkey(), rkey, "the window's rkey after its bind");
    Ok(rkey)
}

/// A signaled WRITE of 8 bytes from A to `offset` of the target under `rkey`: its status,
/// recorded as `what`.
fn write<B: Backend>(
    env: &Env<B>,
    s: &Setup<B>,
    rkey: u32,
    offset: u64,
    what: &str,
) -> Result<WcStatus, crate::Failure> {
    s.local.write_u64(0, 0x0123_4567_89ab_cdef)?;
    let remote = (s.target.addr() + offset, rkey);
    s.p.a
        .post_send(&[SendWr::write(10, &[s.local.sge(0, 8)?], remote).signaled()])?;
    let wc = env.wait1(&s.p.cq_a)?;
    env.observe(what, format_args!("{:?}", wc.status));
    Ok(wc.status)
}

/// A WRITE through `rkey` is refused as a remote access error and leaves the memory as
/// it was.
fn refused<B: Backend>(env: &Env<B>, s: &Setup<B>, rkey: u32, offset: u64, what: &str) -> CaseResult {
    let st = write(env, s, rkey, offset, what)?;
    ensure_eq!(st, WcStatus::RemAccessErr, "{what}");
    ensure_eq!(
        s.target.read_u64(offset as usize)?,
        0,
        "{what}: the target's memory"
    );
    Ok(Outcome::Pass)
}

fn type1_bind<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type1)?;
    ensure_eq!(mw.mw_type(), MwType::Type1, "the window's type");
    let before = mw.rkey();
    let rkey = bind1(env, &s, &mw, A::REMOTE_WRITE)?;
    ensure_eq!(
        rkey,
        inc_rkey(before),
        "the bound rkey (ibv_inc_rkey of the window's)"
    );
    ensure_eq!(mw.rkey(), rkey, "mw->rkey after ibv_bind_mw");
    let st = write(env, &s, rkey, 2040, "WRITE through the window")?;
    ensure_eq!(st, WcStatus::Success, "WRITE through the window");
    ensure_eq!(
        s.target.read_u64(2040)?,
        0x0123_4567_89ab_cdef,
        "the written word"
    );
    Ok(Outcome::Pass)
}

fn type2_bind<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type2)?;
    ensure_eq!(mw.mw_type(), MwType::Type2, "the window's type");
    let rkey = bind2(env, &s, &mw, A::REMOTE_READ)?;
    s.target.write_u64(1024, 0xfeed_f00d_dead_beef)?;
    let remote = (s.target.addr() + 1024, rkey);
    s.p.a
        .post_send(&[SendWr::read(11, &[s.local.sge(0, 8)?], remote).signaled()])?;
    let wc = env.wait1(&s.p.cq_a)?;
    env.expect_status("READ through the window", &wc, WcStatus::Success, &[])?;
    ensure_eq!(s.local.read_u64(0)?, 0xfeed_f00d_dead_beef, "the word read");
    Ok(Outcome::Pass)
}

fn region_rkey<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type1)?;
    bind1(env, &s, &mw, A::REMOTE_WRITE)?;
    refused(env, &s, s.target.rkey(), 1024, "WRITE under the region's rkey")
}

fn rights<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type1)?;
    let rkey = bind1(env, &s, &mw, A::REMOTE_READ)?;
    refused(env, &s, rkey, 1024, "WRITE through a READ-only window")
}

fn bounds<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type1)?;
    let rkey = bind1(env, &s, &mw, A::REMOTE_WRITE)?;
    let what = "WRITE 8 bytes past the window's end";
    let st = write(env, &s, rkey, 2048, what)?;
    if st == WcStatus::Success && env.profile == Profile::Rxe {
        env.deviation(
            "the WRITE past the window's end landed: rxe checks an access through a window against \
             the bounds of the window's region (rxe_resp.c check_rkey(): mr_check_range(mr, ...) \
             after rxe_lookup_mw())",
        );
        return Ok(Outcome::Pass);
    }
    ensure_eq!(st, WcStatus::RemAccessErr, "{what}");
    ensure_eq!(s.target.read_u64(2048)?, 0, "{what}: the target's memory");
    Ok(Outcome::Pass)
}

fn stale_tag<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type1)?;
    let old = bind1(env, &s, &mw, A::REMOTE_WRITE)?;
    let new = bind1(env, &s, &mw, A::REMOTE_WRITE)?;
    ensure_eq!(new, inc_rkey(old), "the second bind's rkey");
    refused(env, &s, old, 1024, "WRITE under the previous rkey")
}

fn no_mw_bind<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let plain = env.mr(&s.p.pd, 4096, A::LOCAL_WRITE)?;
    let mw = s.p.pd.alloc_mw(MwType::Type2)?;
    let rkey = inc_rkey(mw.rkey());
    let info = MwBindInfo::whole(&plain, A::REMOTE_READ);
    s.p.b
        .post_send(&[SendWr::bind_mw(3, &mw, rkey, info).signaled()])?;
    let wc = env.wait1(&s.p.cq_b)?;
    env.expect_status(
        "a bind to a region without MW_BIND",
        &wc,
        WcStatus::MwBindErr,
        &[],
    )?;
    Ok(Outcome::Pass)
}

fn local_inv<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type2)?;
    let rkey = bind2(env, &s, &mw, A::REMOTE_WRITE)?;
    s.p.b.post_send(&[SendWr::local_inv(4, rkey).signaled()])?;
    let wc = env.wait1(&s.p.cq_b)?;
    env.expect_status("LOCAL_INV", &wc, WcStatus::Success, &[])?;
    ensure_eq!(wc.opcode, WcOpcode::LocalInv, "LOCAL_INV's opcode");
    refused(env, &s, rkey, 1024, "WRITE through the invalidated window")
}

fn send_with_inv<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type2)?;
    let rkey = bind2(env, &s, &mw, A::REMOTE_WRITE)?;
    let inbox = env.mr(&s.p.pd, 64, A::LOCAL_WRITE)?;
    s.p.b.post_recv(&[RecvWr::new(20, &[inbox.sge(0, 64)?])])?;
    s.p.a
        .post_send(&[SendWr::send_with_inv(21, &[s.local.sge(0, 8)?], rkey).signaled()])?;
    let sent = env.wait1(&s.p.cq_a)?;
    env.expect_status("SEND_WITH_INV", &sent, WcStatus::Success, &[])?;
    ensure_eq!(sent.opcode, WcOpcode::Send, "SEND_WITH_INV's completion opcode");
    let got = env.wait1(&s.p.cq_b)?;
    env.expect_status("its receive", &got, WcStatus::Success, &[])?;
    let mark = got.wc_flags & (WcFlags::WITH_INV | WcFlags::IP_CSUM_OK);
    env.observe("the receive's invalidation flag", format_args!("{mark:?}"));
    if mark == WcFlags::IP_CSUM_OK && env.profile == Profile::Rxe {
        env.deviation(
            "the receive is marked IBV_WC_IP_CSUM_OK, not IBV_WC_WITH_INV: rxe writes the \
             kernel's IB_WC_WITH_INVALIDATE (1 << 2) into the user's CQE (rxe_resp.c \
             do_complete()), which the provider copies as it is",
        );
    } else {
        ensure_eq!(mark, WcFlags::WITH_INV, "the receive's invalidation flag");
    }
    ensure_eq!(got.imm_data, rkey, "the receive's invalidated_rkey");
    refused(env, &s, rkey, 1024, "WRITE through the invalidated window")
}

fn inv_other_qp<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    // A's window, bound by (and to) A; the SEND_WITH_INV naming it arrives on B.
    let mw = s.p.pd.alloc_mw(MwType::Type2)?;
    let rkey = inc_rkey(mw.rkey());
    let info = MwBindInfo::new(&s.target, 1024, 1024, A::REMOTE_WRITE);
    s.p.a
        .post_send(&[SendWr::bind_mw(2, &mw, rkey, info).signaled()])?;
    let wc = env.wait1(&s.p.cq_a)?;
    env.expect_status("A's bind", &wc, WcStatus::Success, &[])?;
    let inbox = env.mr(&s.p.pd, 64, A::LOCAL_WRITE)?;
    s.p.b.post_recv(&[RecvWr::new(20, &[inbox.sge(0, 64)?])])?;
    s.p.a
        .post_send(&[SendWr::send_with_inv(21, &[s.local.sge(0, 8)?], rkey)])?;
    let got = env.wait1(&s.p.cq_b)?;
    env.expect_status(
        "B's receive of a SEND_WITH_INV naming A's window",
        &got,
        WcStatus::RemInvReqErr,
        &[(
            Profile::Rxe,
            WcStatus::Success,
            "rxe_check_invalidate_mw() (rxe_mw.c) looks at the window's type and state, not at \
             the QP it is bound to",
        )],
    )?;
    Ok(Outcome::Pass)
}

fn dealloc_bound<B: Backend>(env: &Env<B>) -> CaseResult {
    let s = setup(env)?;
    let mw = s.p.pd.alloc_mw(MwType::Type1)?;
    let rkey = bind1(env, &s, &mw, A::REMOTE_WRITE)?;
    drop(mw);
    refused(env, &s, rkey, 1024, "WRITE through the deallocated window")
}
