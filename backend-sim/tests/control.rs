//! The control endpoint (`backend_sim::control`, what `rdma-sim status` reads): every open
//! device answers with its state, its QPs as they are, and its socket goes with it.

use backend_sim::control;
use verbs_api::*;

mod common;
use common::{Pair, WAIT};

fn ours() -> Vec<control::DeviceStatus> {
    control::list(None)
        .expect("the control directory")
        .into_iter()
        .filter_map(|f| f.status.ok())
        .filter(|s| s.pid == std::process::id())
        .collect()
}

#[test]
fn a_device_shows_its_qps_and_is_gone_with_its_context() {
    let pair = Pair::new(&RcParams::default(), QpCap::new(8, 8));
    let mr = pair.pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pair
        .pd1
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    pair.a
        .post_send(&[SendWr::write(1, &[mr.sge(0, 8).unwrap()], dst.remote().at(0)).signaled()])
        .unwrap();
    assert_eq!(poll_n(&pair.cq0, 1, WAIT).unwrap()[0].status, WcStatus::Success);
    pair.b
        .post_recv(&[RecvWr::new(9, &[dst.sge(64, 8).unwrap()])])
        .unwrap();

    let devices = ours();
    assert_eq!(devices.len(), 2, "{devices:#?}");
    let by_qpn = |qpn: u32| {
        devices
            .iter()
            .flat_map(|d| d.qps.iter().map(move |q| (d, q)))
            .find(|(_, q)| q.qpn == qpn)
            .unwrap_or_else(|| panic!("QP {qpn:#x} is listed: {devices:#?}"))
    };
    let (dev_a, a) = by_qpn(pair.a.qp_num());
    let (dev_b, b) = by_qpn(pair.b.qp_num());
    assert_eq!((dev_a.device.as_str(), dev_b.device.as_str()), ("sim0", "sim1"));
    assert_eq!(
        dev_a.program,
        std::fs::read_to_string("/proc/self/comm").unwrap().trim_end()
    );
    assert_eq!(dev_a.profile, "portable");
    assert_eq!(dev_a.mrs, 1);
    assert_eq!(dev_a.lid, pair.c0.query_port(1).unwrap().lid);
    assert!(dev_a.counters.contains_key("ud_dropped"), "{:?}", dev_a.counters);
    assert_eq!((a.qp_type.as_str(), a.state.as_str()), ("RC", "RTS"));
    assert_eq!(a.dest_qpn, Some(pair.b.qp_num()));
    assert_eq!(b.dest_qpn, Some(pair.a.qp_num()));
    assert!(a.connected && b.connected, "{a:?} {b:?}");
    assert_eq!(a.sq_outstanding, 0);
    assert_eq!(b.rq_posted, 1);
    assert_eq!(a.peer.as_deref(), Some(dev_b.listen.as_str()));

    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    pair.a.modify(&err, QpAttrMask::STATE).unwrap();
    let devices = ours();
    let a = devices
        .iter()
        .flat_map(|d| &d.qps)
        .find(|q| q.qpn == pair.a.qp_num())
        .unwrap();
    assert_eq!(a.state, "ERR");

    drop((mr, dst, pair));
    // A device goes with its last reference, which its own threads may hold a moment
    // after the application let go (a task finishing its turn).
    let deadline = std::time::Instant::now() + WAIT;
    while !ours().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "closed devices leave no socket behind"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
