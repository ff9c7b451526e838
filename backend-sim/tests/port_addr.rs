//! A port whose address changes (`IBV_EVENT_LID_CHANGE`, `IBV_EVENT_GID_CHANGE`): the
//! event on port 1 in order with the others, the new address in `ibv_query_port` /
//! `ibv_query_gid`, the device reached at the new address, and what still names the old
//! one reaching nothing: RC QPs connected before the change end in RETRY_EXC_ERR on both
//! sides, never a silent success.

use std::time::Duration;

use backend_sim::{Profile, SimContext, SimQp};
use verbs_api::*;

mod common;

const T: Duration = Duration::from_secs(10);

use common::Device as Side;

impl Side {
    fn rc(&self) -> SimQp {
        self.pd
            .create_qp(&QpInitAttr::rc(&self.cq, &self.cq, QpCap::new(16, 16)))
            .unwrap()
    }
}

fn two_devices(profile: Profile) -> (Side, Side) {
    common::two_devices(profile, 64)
}

/// Short retries (timeout 12, retry_cnt 2: well under a second) through GID `gid_index`.
fn params(gid_index: u8) -> RcParams {
    RcParams {
        timeout: 12,
        retry_cnt: 2,
        gid_index,
        ..RcParams::default()
    }
}

/// QP `a` of side `x` connected to QP `b` of side `y`, with the addresses each side's
/// port and GID entry `gid_index` hold now.
fn connect(x: &Side, a: &SimQp, y: &Side, b: &SimQp, gid_index: u8) {
    let p = params(gid_index);
    let ea = local_endpoint(&x.ctx, a, &p, 10).unwrap();
    let eb = local_endpoint(&y.ctx, b, &p, 20).unwrap();
    connect_rc(a, &p, ea.psn, &eb).unwrap();
    connect_rc(b, &p, eb.psn, &ea).unwrap();
}

fn port_event(ctx: &SimContext, want: AsyncEventType) {
    let ev = ctx.get_async_event(Some(T)).unwrap().expect("an event");
    assert_eq!((ev.event_type, ev.element), (want, AsyncElement::Port(1)));
    ctx.ack_async_event(ev);
}

/// A signaled WRITE of 64 bytes from `qp` on `from` to a fresh MR on `to`; its
/// completion's status.
fn write(from: &Side, qp: &SimQp, to: &Side) -> WcStatus {
    let src = from.pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = to
        .pd
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    qp.post_send(&[SendWr::write(7, &[src.sge_all()], dst.remote().at(0)).signaled()])
        .unwrap();
    let wc = poll_n(&from.cq, 1, T).unwrap();
    assert_eq!(wc[0].wr_id, 7, "{wc:?}");
    wc[0].status
}

#[test]
fn a_new_lid_is_announced_queried_and_reached() {
    let (x, y) = two_devices(Profile::Portable);
    let old = x.ctx.query_port(1).unwrap().lid;
    x.ctx.faults().port_down().unwrap();
    let lid = x.ctx.faults().change_lid().unwrap();
    x.ctx.faults().port_up().unwrap();
    // In the order they happened.
    port_event(&x.ctx, AsyncEventType::PortErr);
    port_event(&x.ctx, AsyncEventType::LidChange);
    port_event(&x.ctx, AsyncEventType::PortActive);
    assert_ne!(lid, old);
    assert_eq!(x.ctx.query_port(1).unwrap().lid, lid);
    assert!(y.ctx.get_async_event(Some(Duration::ZERO)).unwrap().is_none());
    // QPs connected with the new LID reach the device.
    let (a, b) = (x.rc(), y.rc());
    connect(&x, &a, &y, &b, 0);
    assert_eq!(write(&y, &b, &x), WcStatus::Success);
    assert_eq!(write(&x, &a, &y), WcStatus::Success);
    // A RC QP of the other device told the old LID reaches nothing.
    let c = y.rc();
    let p = params(0);
    let mut stale = local_endpoint(&x.ctx, &x.rc(), &p, 0).unwrap();
    stale.lid = old;
    connect_rc(&c, &p, 0, &stale).unwrap();
    assert_eq!(write(&y, &c, &x), WcStatus::RetryExcErr);
}

#[test]
fn rc_qps_connected_before_a_lid_change_fail_on_both_sides() {
    let (x, y) = two_devices(Profile::Portable);
    let (a, b) = (x.rc(), y.rc());
    connect(&x, &a, &y, &b, 0);
    assert_eq!(write(&x, &a, &y), WcStatus::Success);
    x.ctx.faults().change_lid().unwrap();
    port_event(&x.ctx, AsyncEventType::LidChange);
    // The peer's address vector names the old LID: its requests reach nothing, and the
    // hellos of the QP whose LID changed, naming the new one, are refused.
    assert_eq!(write(&y, &b, &x), WcStatus::RetryExcErr);
    assert_eq!(write(&x, &a, &y), WcStatus::RetryExcErr);
    assert_eq!(a.state().unwrap(), QpState::Err);
    assert_eq!(b.state().unwrap(), QpState::Err);
}

#[test]
fn a_roce_port_gains_and_loses_a_gid() {
    let (x, y) = two_devices(Profile::Rxe);
    assert!(x.ctx.faults().change_lid().is_err(), "a RoCE port has LID 0");
    let index = x.ctx.faults().add_gid(None).unwrap();
    port_event(&x.ctx, AsyncEventType::GidChange);
    let gid = x.ctx.query_gid(1, index).unwrap();
    assert_ne!(gid, Gid::default());
    assert_ne!(gid, x.ctx.query_gid(1, 1).unwrap());
    // The device is reached at its new GID, and its QPs send from it.
    let (a, b) = (x.rc(), y.rc());
    let pa = params(index as u8);
    let pb = params(1);
    let ea = local_endpoint(&x.ctx, &a, &pa, 10).unwrap();
    let eb = local_endpoint(&y.ctx, &b, &pb, 20).unwrap();
    assert_eq!(ea.gid, gid);
    connect_rc(&a, &pa, ea.psn, &eb).unwrap();
    connect_rc(&b, &pb, eb.psn, &ea).unwrap();
    assert_eq!(write(&y, &b, &x), WcStatus::Success);
    assert_eq!(write(&x, &a, &y), WcStatus::Success);
    // Another pair, through the port's own GID, which stays.
    let (c, d) = (x.rc(), y.rc());
    connect(&x, &c, &y, &d, 1);
    x.ctx.faults().remove_gid(index).unwrap();
    port_event(&x.ctx, AsyncEventType::GidChange);
    assert_eq!(x.ctx.query_gid(1, index).unwrap(), Gid::default());
    assert!(x.ctx.faults().remove_gid(index).is_err(), "removed already");
    assert!(x.ctx.faults().remove_gid(1).is_err(), "the port's own entry");
    assert_eq!(write(&x, &c, &y), WcStatus::Success);
    assert_eq!(write(&y, &d, &x), WcStatus::Success);
    assert_eq!(write(&y, &b, &x), WcStatus::RetryExcErr);
    assert_eq!(write(&x, &a, &y), WcStatus::RetryExcErr);
    // The emptied entry is the next one filled.
    assert_eq!(x.ctx.faults().add_gid(None).unwrap(), index);
    port_event(&x.ctx, AsyncEventType::GidChange);
}

/// A UD QP on side `s` (Q_Key 7) with 8 receives of 128 bytes posted.
fn ud(s: &Side) -> (SimQp, backend_sim::SimMr) {
    let qp = common::ud_qp(&s.pd, &s.cq, 7);
    let mr = s.pd.reg_mr(8 * 128, AccessFlags::LOCAL_WRITE).unwrap();
    for n in 0..8u64 {
        qp.post_recv(&[RecvWr::new(n, &[mr.sge(n as usize * 128, 128).unwrap()])])
            .unwrap();
    }
    (qp, mr)
}

/// Datagram `id` (its immediate data) from `qp` on side `from` to `to` through `ah`:
/// its WR completes successfully whether it arrives or not, as UD's do.
fn datagram(from: &Side, qp: &SimQp, ah: &backend_sim::SimAh, to: &SimQp, id: u32) {
    let src = from.pd.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_send(&[SendWr::send_with_imm(id as u64, &[src.sge_all()], id)
        .signaled()
        .ud(ah, to.qp_num(), 7)])
        .unwrap();
    let wc = poll_n(&from.cq, 1, T).unwrap();
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (id as u64, WcStatus::Success),
        "{wc:?}"
    );
}

/// The immediate data of the datagrams `s` received within `quiet`.
fn received(s: &Side, quiet: Duration) -> Vec<u32> {
    let wcs = poll_quiet(&s.cq, quiet).unwrap();
    assert!(wcs.iter().all(|wc| wc.status == WcStatus::Success), "{wcs:?}");
    wcs.iter().map(|wc| wc.imm().expect("immediate data")).collect()
}

/// `y`'s UD QP reached from `x` through an address handle built from `y`'s address at
/// GID entry `gid_index` now; after `change` (which moves that address), a datagram
/// through that handle completes successfully and never arrives, while one through a
/// handle to the address `y` holds after the change at entry `stays` does.
fn datagrams_to_an_old_address_are_lost(
    x: &Side,
    y: &Side,
    (gid_index, stays): (u8, u8),
    change: impl FnOnce(),
    event: AsyncEventType,
) {
    let (a, _ma) = ud(x);
    let (b, _mb) = ud(y);
    // (From `x`'s entry `stays`, its own address.)
    let ah_to = |gid_index: u8| {
        let e = local_endpoint(&y.ctx, &b, &params(gid_index), 0).unwrap();
        x.pd.create_ah(&ah_attr_for(&e, &params(stays))).unwrap()
    };
    let old = ah_to(gid_index);
    datagram(x, &a, &old, &b, 1);
    assert_eq!(received(y, Duration::from_millis(300)), [1]);
    // The task of `y`'s end of the link sees it closed only once its thread runs again,
    // and datagram 2 waits in its socket by then, as on a loaded machine.
    y.ctx
        .faults()
        .stall_setup_thread(Duration::from_millis(200))
        .unwrap();
    change();
    port_event(&y.ctx, event);
    datagram(x, &a, &old, &b, 2);
    let new = ah_to(stays);
    datagram(x, &a, &new, &b, 3);
    let mut got = received(y, Duration::from_millis(300));
    got.extend(received(y, Duration::from_millis(300)));
    assert_eq!(got, [3], "datagram 2 went to the old address");
}

#[test]
fn a_datagram_to_an_old_lid_is_lost() {
    let (x, y) = two_devices(Profile::Portable);
    datagrams_to_an_old_address_are_lost(
        &x,
        &y,
        (0, 0),
        || {
            y.ctx.faults().change_lid().unwrap();
        },
        AsyncEventType::LidChange,
    );
}

#[test]
fn a_datagram_to_a_removed_gid_is_lost() {
    let (x, y) = two_devices(Profile::Rxe);
    let index = y.ctx.faults().add_gid(None).unwrap();
    port_event(&y.ctx, AsyncEventType::GidChange);
    datagrams_to_an_old_address_are_lost(
        &x,
        // Entry 1 is the port's own address, which stays.
        &y,
        (index as u8, 1),
        || y.ctx.faults().remove_gid(index).unwrap(),
        AsyncEventType::GidChange,
    );
}
