//! The sim says why a remote access or a request was refused: the requester's
//! `IBV_WC_REM_ACCESS_ERR` or `IBV_WC_REM_INV_REQ_ERR` completion carries the responder's
//! reason in `vendor_err` ([`NakReason`], where an HCA puts its vendor syndrome). One test
//! per reason, over real connections between two devices; the statuses themselves are
//! the conformance suite's (access.*, errors.*), which runs on rxe0 too.

use backend_sim::NakReason;
use verbs_api::*;

mod common;
use common::{Pair, WAIT};

const ALL_REMOTE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Connects a pair with `p`, lets `post` post the WR to be refused on A (with a 64-byte
/// source SGE at hand), and returns its completion. What `post` returns (the regions the
/// WR names) lives until the WR has completed.
fn refused<K>(p: &RcParams, post: impl FnOnce(&Pair, &[Sge]) -> K) -> WorkCompletion {
    let pair = Pair::new(p, QpCap::new(8, 8));
    let src = pair.pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [src.sge(0, 64).unwrap()];
    let keep = post(&pair, &sge);
    let wc = poll_n(&pair.cq0, 1, WAIT).expect("the refused WR completes");
    drop(keep);
    assert_eq!(pair.a.state().unwrap(), QpState::Err, "requester after {wc:?}");
    wc[0]
}

/// Posts `wr` (signaled) on A.
fn post(pair: &Pair, wr: SendWr<'_>) {
    pair.a.post_send(&[wr.signaled()]).unwrap();
}

fn check(wc: WorkCompletion, status: WcStatus, reason: NakReason) {
    assert_eq!(wc.status, status, "{wc:?}");
    assert_eq!(
        NakReason::from_vendor_err(wc.vendor_err),
        Some(reason),
        "vendor_err {:#x}, expected {:#x} ({reason})",
        wc.vendor_err,
        reason.vendor_err()
    );
}

#[test]
fn an_rkey_that_names_no_region() {
    let wc = refused(&RcParams::default(), |p, sge| {
        let dst = p.pd1.reg_mr(4096, ALL_REMOTE).unwrap();
        post(
            p,
            SendWr::write(1, sge, RemoteAddr::new(dst.addr(), dst.rkey() ^ 0x5555_0000)),
        );
        dst
    });
    check(wc, WcStatus::RemAccessErr, NakReason::UnknownRkey);
}

#[test]
fn the_rkey_of_a_deregistered_region() {
    let wc = refused(&RcParams::default(), |p, sge| {
        let dst = p.pd1.reg_mr(4096, ALL_REMOTE).unwrap();
        let remote = dst.remote();
        drop(dst);
        post(p, SendWr::write(1, sge, remote.at(0)));
    });
    check(wc, WcStatus::RemAccessErr, NakReason::DeregisteredRkey);
}

#[test]
fn a_region_of_another_pd() {
    let wc = refused(&RcParams::default(), |p, sge| {
        let other = p.c1.alloc_pd().unwrap();
        let dst = other.reg_mr(4096, ALL_REMOTE).unwrap();
        post(p, SendWr::write(1, sge, dst.remote().at(0)));
        (dst, other)
    });
    check(wc, WcStatus::RemAccessErr, NakReason::WrongPd);
}

#[test]
fn a_qp_whose_access_flags_lack_the_right() {
    let p = RcParams {
        access: AccessFlags::REMOTE_READ,
        ..RcParams::default()
    };
    let wc = refused(&p, |p, sge| {
        let dst = p.pd1.reg_mr(4096, ALL_REMOTE).unwrap();
        post(p, SendWr::write(1, sge, dst.remote().at(0)));
        dst
    });
    check(wc, WcStatus::RemAccessErr, NakReason::QpAccess);
}

/// Each operation needs its own right of the region: REMOTE_WRITE, REMOTE_READ,
/// REMOTE_ATOMIC.
#[test]
fn a_region_without_the_right_the_operation_needs() {
    let without = |right: AccessFlags| ALL_REMOTE.difference(right);
    let wc = refused(&RcParams::default(), |p, sge| {
        let dst = p.pd1.reg_mr(4096, without(AccessFlags::REMOTE_WRITE)).unwrap();
        post(p, SendWr::write(1, sge, dst.remote().at(0)));
        dst
    });
    check(wc, WcStatus::RemAccessErr, NakReason::MrAccess);
    let wc = refused(&RcParams::default(), |p, _| {
        let dst = p.pd1.reg_mr(4096, without(AccessFlags::REMOTE_READ)).unwrap();
        let sink = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        post(
            p,
            SendWr::read(1, &[sink.sge(0, 64).unwrap()], dst.remote().at(0)),
        );
        (dst, sink)
    });
    check(wc, WcStatus::RemAccessErr, NakReason::MrAccess);
    let wc = refused(&RcParams::default(), |p, _| {
        let dst = p.pd1.reg_mr(4096, without(AccessFlags::REMOTE_ATOMIC)).unwrap();
        let old = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        post(
            p,
            SendWr::fetch_and_add(1, &[old.sge(0, 8).unwrap()], dst.remote().at(0), 1),
        );
        (dst, old)
    });
    check(wc, WcStatus::RemAccessErr, NakReason::MrAccess);
}

#[test]
fn a_range_that_leaves_the_region() {
    let wc = refused(&RcParams::default(), |p, sge| {
        let dst = p.pd1.reg_mr(4096, ALL_REMOTE).unwrap();
        post(p, SendWr::write(1, sge, dst.remote().at(4096 - 32)));
        dst
    });
    check(wc, WcStatus::RemAccessErr, NakReason::OutOfBounds);
}

#[test]
fn a_misaligned_atomic() {
    let wc = refused(&RcParams::default(), |p, _| {
        let dst = p.pd1.reg_mr(4096, ALL_REMOTE).unwrap();
        let old = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        post(
            p,
            SendWr::fetch_and_add(1, &[old.sge(0, 8).unwrap()], dst.remote().at(4), 1),
        );
        (dst, old)
    });
    check(wc, WcStatus::RemInvReqErr, NakReason::MisalignedAtomic);
}

#[test]
fn a_read_to_a_qp_without_responder_resources() {
    let p = RcParams {
        max_dest_rd_atomic: 0,
        ..RcParams::default()
    };
    let wc = refused(&p, |p, _| {
        let dst = p.pd1.reg_mr(4096, ALL_REMOTE).unwrap();
        let sink = p.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        post(
            p,
            SendWr::read(1, &[sink.sge(0, 64).unwrap()], dst.remote().at(0)),
        );
        (dst, sink)
    });
    check(wc, WcStatus::RemInvReqErr, NakReason::NoRdAtomicResources);
}

#[test]
fn a_send_longer_than_the_receive() {
    let wc = refused(&RcParams::default(), |p, sge| {
        let rx = p.pd1.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        p.b.post_recv(&[RecvWr::new(9, &[rx.sge(0, 16).unwrap()])])
            .unwrap();
        post(p, SendWr::send(1, sge));
        rx
    });
    check(wc, WcStatus::RemInvReqErr, NakReason::RecvTooShort);
}

/// Errors that carry no reason leave `vendor_err` 0 (and successes too).
#[test]
fn other_completions_carry_no_reason() {
    let pair = Pair::new(&RcParams::default(), QpCap::new(8, 8));
    let src = pair.pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pair.pd1.reg_mr(4096, ALL_REMOTE).unwrap();
    let sge = [src.sge(0, 64).unwrap()];
    pair.a
        .post_send(&[SendWr::write(1, &sge, dst.remote().at(0)).signaled()])
        .unwrap();
    let wc = poll_n(&pair.cq0, 1, WAIT).unwrap();
    assert_eq!((wc[0].status, wc[0].vendor_err), (WcStatus::Success, 0));
    let bad = [Sge::new(src.addr(), 8, src.lkey() ^ 0x5a5a_0000)];
    pair.a
        .post_send(&[SendWr::write(2, &bad, dst.remote().at(0)).signaled()])
        .unwrap();
    let wc = poll_n(&pair.cq0, 1, WAIT).unwrap();
    assert_eq!((wc[0].status, wc[0].vendor_err), (WcStatus::LocProtErr, 0));
}
