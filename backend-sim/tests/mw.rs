//! Memory windows on the sim (`man ibv_alloc_mw`, `man ibv_bind_mw`; IBA 10.6.7) through
//! the verbs API: binds of both types, accesses through a window's rkey checked against
//! the window (its rights, its range, its QP), local and remote invalidation, tag
//! rotation, deallocation; and `ibv_resize_cq`, `ibv_rereg_mr` by profile.

mod common;

use std::time::Duration;

use backend_sim::{NakReason, Profile};
use common::Pair;
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(5);

fn pair(profile: Profile) -> Pair {
    Pair::on(profile, &RcParams::default(), QpCap::new(16, 2))
}

/// The region on `b`'s side that windows are bound to (MW_BIND and LOCAL_WRITE, no remote
/// rights of its own) and a local buffer on `a`'s side.
fn regions(p: &Pair) -> (backend_sim::SimMr, backend_sim::SimMr) {
    let target = p
        .pd1
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
        .unwrap();
    let local = p.pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    (target, local)
}

fn one(cq: &impl CompletionQueue) -> WorkCompletion {
    poll_n(cq, 1, WAIT).unwrap()[0]
}

/// A signaled WRITE of 8 bytes from `local` to `rkey` at `addr`, over `p.a`: its
/// completion.
fn write(p: &Pair, local: &backend_sim::SimMr, rkey: u32, addr: u64, id: u64) -> WorkCompletion {
    local.write_u64(0, 0x1122_3344_5566_7788 ^ id).unwrap();
    p.a.post_send(&[SendWr::write(id, &[local.sge(0, 8).unwrap()], (addr, rkey)).signaled()])
        .unwrap();
    one(&p.cq0)
}

/// A type 1 window bound with `ibv_bind_mw` grants what its region does not: the peer
/// WRITEs through the window's rkey (the region's own rkey is refused: it has no remote
/// rights), and the bind completes as IBV_WC_BIND_MW with the rkey's tag rotated.
#[test]
fn a_type_1_window_grants_writes_its_region_does_not() {
    let p = pair(Profile::Portable);
    let (target, local) = regions(&p);
    let mw = p.pd1.alloc_mw(MwType::Type1).unwrap();
    let before = mw.rkey();
    let rkey =
        p.b.bind_mw(
            &mw,
            &MwBind::signaled(7, MwBindInfo::new(&target, 1024, 1024, AccessFlags::REMOTE_WRITE)),
        )
        .unwrap();
    assert_eq!(rkey, inc_rkey(before));
    assert_eq!(mw.rkey(), rkey);
    let wc = one(&p.cq1);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (7, WcStatus::Success, WcOpcode::BindMw)
    );
    let wc = write(&p, &local, rkey, target.addr() + 2040, 1);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(target.read_u64(2040).unwrap(), 0x1122_3344_5566_7788 ^ 1);
    // The region's own rkey grants nothing remote.
    let p2 = pair(Profile::Portable);
    let (t2, l2) = regions(&p2);
    let wc = write(&p2, &l2, t2.rkey(), t2.addr(), 2);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(
        NakReason::from_vendor_err(wc.vendor_err),
        Some(NakReason::MrAccess)
    );
}

/// Each check of a remote access through a window, with the reason the requester's
/// `vendor_err` names: the window's rights, its range (portable: the window's; rxe: the
/// region's, as rxe_resp.c `check_rkey()` checks it), a stale tag after a rebind, an
/// unbound window.
#[test]
fn accesses_through_a_window_are_checked_against_the_window() {
    for (profile, outside_ok) in [
        (Profile::Portable, false),
        (Profile::Rxe, true),
        (Profile::Mlx5, false),
    ] {
        let fresh = || {
            let p = pair(profile);
            let (target, local) = regions(&p);
            let mw = p.pd1.alloc_mw(MwType::Type1).unwrap();
            (p, target, local, mw)
        };
        let bind = |p: &Pair, mw: &backend_sim::SimMw, target: &backend_sim::SimMr, acc| {
            let k =
                p.b.bind_mw(mw, &MwBind::signaled(1, MwBindInfo::new(target, 1024, 1024, acc)))
                    .unwrap();
            assert_eq!(one(&p.cq1).status, WcStatus::Success);
            k
        };
        let reason = |wc: WorkCompletion| {
            assert_eq!(wc.status, WcStatus::RemAccessErr, "{profile:?}");
            NakReason::from_vendor_err(wc.vendor_err)
        };
        // Rights: a READ-only window refuses a WRITE.
        let (p, target, local, mw) = fresh();
        let k = bind(&p, &mw, &target, AccessFlags::REMOTE_READ);
        assert_eq!(
            reason(write(&p, &local, k, target.addr() + 1024, 1)),
            Some(NakReason::WindowAccess)
        );
        // Range: 8 bytes past the window's end, inside the region.
        let (p, target, local, mw) = fresh();
        let k = bind(&p, &mw, &target, AccessFlags::REMOTE_WRITE);
        let wc = write(&p, &local, k, target.addr() + 2048, 2);
        if outside_ok {
            assert_eq!(wc.status, WcStatus::Success, "{profile:?}");
        } else {
            assert_eq!(reason(wc), Some(NakReason::OutsideWindow));
        }
        // A stale tag: bound again, the first rkey stops working.
        let (p, target, local, mw) = fresh();
        let old = bind(&p, &mw, &target, AccessFlags::REMOTE_WRITE);
        let new = bind(&p, &mw, &target, AccessFlags::REMOTE_WRITE);
        assert_eq!(new, inc_rkey(old));
        assert_eq!(
            reason(write(&p, &local, old, target.addr() + 1024, 3)),
            Some(NakReason::StaleWindowKey)
        );
        // Unbound (a zero-length bind), then deallocated.
        let (p, target, local, mw) = fresh();
        bind(&p, &mw, &target, AccessFlags::REMOTE_WRITE);
        let k =
            p.b.bind_mw(&mw, &MwBind::signaled(2, MwBindInfo::unbound()))
                .unwrap();
        assert_eq!(one(&p.cq1).status, WcStatus::Success);
        assert_eq!(
            reason(write(&p, &local, k, target.addr() + 1024, 4)),
            Some(NakReason::UnboundWindow)
        );
        let (p, target, local, mw) = fresh();
        let k = bind(&p, &mw, &target, AccessFlags::REMOTE_WRITE);
        drop(mw);
        assert_eq!(
            reason(write(&p, &local, k, target.addr() + 1024, 5)),
            Some(NakReason::DeregisteredRkey)
        );
    }
}

/// A type 2 window is bound through the send queue of the QP that will serve it, and is
/// tied to it: READs through it arrive on that QP; LOCAL_INV frees it (later accesses
/// are refused); a bind on a region without MW_BIND fails with IBV_WC_MW_BIND_ERR and
/// takes the QP to ERR.
#[test]
fn a_type_2_window_is_bound_and_invalidated_by_the_send_queue() {
    let p = pair(Profile::Portable);
    let (target, local) = regions(&p);
    target.write_u64(512, 0xfeed).unwrap();
    let mw = p.pd1.alloc_mw(MwType::Type2).unwrap();
    let k = inc_rkey(mw.rkey());
    p.b.post_send(&[SendWr::bind_mw(
        3,
        &mw,
        k,
        MwBindInfo::new(&target, 0, 4096, AccessFlags::REMOTE_READ),
    )
    .signaled()])
        .unwrap();
    assert_eq!(mw.rkey(), k, "the handle holds the new rkey");
    let wc = one(&p.cq1);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::BindMw));
    p.a.post_send(&[SendWr::read(4, &[local.sge(0, 8).unwrap()], (target.addr() + 512, k)).signaled()])
        .unwrap();
    assert_eq!(one(&p.cq0).status, WcStatus::Success);
    assert_eq!(local.read_u64(0).unwrap(), 0xfeed);
    p.b.post_send(&[SendWr::local_inv(5, k).signaled()]).unwrap();
    let wc = one(&p.cq1);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::LocalInv));
    p.a.post_send(&[SendWr::read(6, &[local.sge(0, 8).unwrap()], (target.addr() + 512, k)).signaled()])
        .unwrap();
    let wc = one(&p.cq0);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(
        NakReason::from_vendor_err(wc.vendor_err),
        Some(NakReason::UnboundWindow)
    );

    let p = pair(Profile::Portable);
    let plain = p.pd1.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mw = p.pd1.alloc_mw(MwType::Type2).unwrap();
    p.b.post_send(&[SendWr::bind_mw(
        7,
        &mw,
        inc_rkey(mw.rkey()),
        MwBindInfo::whole(&plain, AccessFlags::REMOTE_READ),
    )])
    .unwrap();
    let wc = one(&p.cq1);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::MwBindErr));
    assert_eq!(p.b.state().unwrap(), QpState::Err);
}

/// A peer's SEND_WITH_INV invalidates the type 2 window it names: the receive completes
/// with IBV_WC_WITH_INV and the rkey, and the window refuses the next access. Naming a
/// window bound to another QP is refused where the profile checks it (IBA, mlx5): the
/// receive completes with IBV_WC_REM_INV_REQ_ERR and the QP goes to ERR; rxe invalidates
/// it all the same.
#[test]
fn a_send_with_invalidate_frees_the_window_it_names() {
    let p = pair(Profile::Portable);
    let (target, local) = regions(&p);
    let mw = p.pd1.alloc_mw(MwType::Type2).unwrap();
    let k = inc_rkey(mw.rkey());
    p.b.post_send(&[
        SendWr::bind_mw(1, &mw, k, MwBindInfo::whole(&target, AccessFlags::REMOTE_WRITE)).signaled(),
    ])
    .unwrap();
    assert_eq!(one(&p.cq1).status, WcStatus::Success);
    p.b.post_recv(&[RecvWr::new(9, &[target.sge(0, 64).unwrap()])])
        .unwrap();
    p.a.post_send(&[SendWr::send_with_inv(2, &[local.sge(0, 16).unwrap()], k).signaled()])
        .unwrap();
    assert_eq!(one(&p.cq0).status, WcStatus::Success);
    let wc = one(&p.cq1);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (9, WcStatus::Success, WcOpcode::Recv, 16)
    );
    assert_eq!(wc.invalidated_rkey(), Some(k));
    assert_eq!(wc.imm(), None);
    let wc = write(&p, &local, k, target.addr(), 3);
    assert_eq!(wc.status, WcStatus::RemAccessErr);

    for (profile, checked) in [(Profile::Portable, true), (Profile::Rxe, false)] {
        // Two pairs between the same devices: the window is bound to b, the SEND_WITH_INV
        // arrives on b2.
        let p = pair(profile);
        let (target, local) = regions(&p);
        let mw = p.pd1.alloc_mw(MwType::Type2).unwrap();
        let k = inc_rkey(mw.rkey());
        p.b.post_send(&[
            SendWr::bind_mw(1, &mw, k, MwBindInfo::whole(&target, AccessFlags::REMOTE_WRITE)).signaled(),
        ])
        .unwrap();
        assert_eq!(one(&p.cq1).status, WcStatus::Success);
        let rp = RcParams::default();
        let cq_a2 = p.c0.create_cq(16, None).unwrap();
        let a2 = p
            .pd0
            .create_qp(&QpInitAttr::rc(&cq_a2, &cq_a2, QpCap::new(4, 1)))
            .unwrap();
        let cq2 = p.c1.create_cq(16, None).unwrap();
        let b2 = p
            .pd1
            .create_qp(&QpInitAttr::rc(&cq2, &cq2, QpCap::new(4, 1)))
            .unwrap();
        let ea = local_endpoint(&p.c0, &a2, &rp, 11).unwrap();
        let eb = local_endpoint(&p.c1, &b2, &rp, 12).unwrap();
        connect_rc(&a2, &rp, ea.psn, &eb).unwrap();
        connect_rc(&b2, &rp, eb.psn, &ea).unwrap();
        b2.post_recv(&[RecvWr::new(4, &[target.sge(0, 64).unwrap()])])
            .unwrap();
        a2.post_send(&[SendWr::send_with_inv(5, &[], k).signaled()])
            .unwrap();
        let wc = one(&cq2);
        if checked {
            assert_eq!((wc.wr_id, wc.status), (4, WcStatus::RemInvReqErr), "{profile:?}");
            assert_eq!(b2.state().unwrap(), QpState::Err);
            assert_eq!(write(&p, &local, k, target.addr(), 6).status, WcStatus::Success);
        } else {
            assert_eq!(wc.invalidated_rkey(), Some(k), "{profile:?}");
            assert_eq!(
                write(&p, &local, k, target.addr(), 6).status,
                WcStatus::RemAccessErr
            );
        }
    }
}

/// `ibv_resize_cq`: growing keeps the completions the CQ holds, in order, and makes
/// room for more; shrinking below what it holds is EINVAL and changes nothing. (Each QP
/// is moved to ERR after its posts: every WR has its completion in the CQ when that
/// returns, executed or flushed.)
#[test]
fn a_resized_cq_keeps_its_completions_in_order() {
    let sim = backend_sim::SimBackend::default();
    let ctx = sim.open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let mr = pd
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let p = RcParams::default();
    let to_err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    let complete = |ids: std::ops::Range<u64>| {
        let qp = pd
            .create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(16, 1)))
            .unwrap();
        let me = local_endpoint(&ctx, &qp, &p, 7).unwrap();
        connect_rc(&qp, &p, me.psn, &me).unwrap();
        for id in ids {
            qp.post_send(&[SendWr::write(id, &[mr.sge(0, 8).unwrap()], mr.remote().at(8)).signaled()])
                .unwrap();
        }
        qp.modify(&to_err, QpAttrMask::STATE).unwrap();
        qp
    };
    let _q1 = complete(0..3);
    assert_eq!(cq.resize(2).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(cq.capacity(), 4);
    cq.resize(10).unwrap();
    assert_eq!(cq.capacity(), 10);
    let _q2 = complete(3..10);
    let ids: Vec<u64> = poll_n(&cq, 10, WAIT).unwrap().iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>(), "in order, none lost");
    cq.resize(1).unwrap();
    assert_eq!(cq.capacity(), 1);
    assert_eq!(cq.resize(0).unwrap_err().errno(), libc::EINVAL);
}

/// `ibv_rereg_mr`: rxe refuses it (EOPNOTSUPP, the region unchanged); mlx5 changes a
/// region's access (a WRITE refused before is taken after, under the same rkey) and
/// moves it to another PD.
#[test]
fn rereg_mr_changes_access_and_pd_where_the_profile_has_it() {
    let p = pair(Profile::Rxe);
    let (mut target, _) = regions(&p);
    let e = p
        .pd1
        .rereg_mr(
            &mut target,
            Some(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE),
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::EOPNOTSUPP);
    assert_eq!(target.access(), AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);

    let p = pair(Profile::Mlx5);
    let (target, local) = regions(&p);
    target.write_u64(0, 5).unwrap();
    assert_eq!(
        write(&p, &local, target.rkey(), target.addr(), 1).status,
        WcStatus::RemAccessErr
    );
    let p = pair(Profile::Mlx5);
    let (mut target, local) = (
        p.pd1
            .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
            .unwrap(),
        p.pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap(),
    );
    target.write_u64(64, 5).unwrap();
    p.pd1
        .rereg_mr(
            &mut target,
            Some(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE),
        )
        .unwrap();
    assert_eq!(target.read_u64(64).unwrap(), 5, "the memory stays");
    assert_eq!(
        write(&p, &local, target.rkey(), target.addr(), 2).status,
        WcStatus::Success
    );
    // To another PD: the QP's PD no longer matches.
    let other = p.c1.alloc_pd().unwrap();
    other.rereg_mr(&mut target, None).unwrap();
    let wc = write(&p, &local, target.rkey(), target.addr(), 3);
    assert_eq!(
        NakReason::from_vendor_err(wc.vendor_err),
        Some(NakReason::WrongPd)
    );
}

/// A bind and the invalidation of the window it bound, in one post, the invalidation
/// alone signaled: its completion comes (the unsignaled bind completes silently before it).
#[test]
fn a_signaled_invalidation_after_an_unsignaled_bind_completes() {
    let p = pair(Profile::Portable);
    let (target, _local) = regions(&p);
    let windows: Vec<_> = (0..4).map(|_| p.pd1.alloc_mw(MwType::Type2).unwrap()).collect();
    let info = MwBindInfo::whole(&target, AccessFlags::REMOTE_READ);
    for round in 0..3 {
        let mut wrs = Vec::new();
        for w in &windows {
            let k = inc_rkey(w.rkey());
            wrs.push(SendWr::bind_mw(round, w, k, info));
            wrs.push(SendWr::local_inv(round, k));
        }
        let last = wrs.pop().unwrap();
        wrs.push(last.signaled());
        p.b.post_send(&wrs).unwrap();
        let wc = one(&p.cq1);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (round, WcStatus::Success, WcOpcode::LocalInv)
        );
    }
}
