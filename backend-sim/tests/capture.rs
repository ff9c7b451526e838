//! `RDMA_SIM_PCAP`: the traffic of a process's devices written as RoCE v2 packets. A
//! WRITE of four path MTUs, a READ of two and a FETCH_AND_ADD between two devices of
//! this process, then a UD datagram, come out as the packets an HCA sends, with their
//! PSNs, in order, then a UC SEND without AckReq, and
//! tshark reads the file without a malformed packet. (Its own test binary: the setting
//! is read once per process.)

mod common;

use capture_judge::{well_formed, Scratch};
use common::{connect_uc, name, roce, Pair};
use verbs_api::*;

#[test]
fn the_traffic_is_captured_as_roce_packets() {
    let scratch = Scratch::dir("capture-test");
    let dir = scratch.path();
    // Set before any device of this process exists (the setting is read when the first
    // connection is made), in a test binary of its own.
    std::env::set_var(backend_sim::capture::SETTING, dir.join("run-%p.pcapng"));
    let params = RcParams::default();
    assert_eq!(params.path_mtu, Mtu::Mtu1024);
    let p = Pair::new(&params, QpCap::new(4, 4));
    let src = p.pd0.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p
        .pd1
        .reg_mr(
            8192,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let remote = dst.remote();
    let sges = [
        src.sge(0, 4096).unwrap(),
        src.sge(4096, 2048).unwrap(),
        src.sge(8000, 8).unwrap(),
    ];
    let wrs = [
        SendWr::write(1, &sges[0..1], remote.at(0)).signaled(),
        SendWr::read(2, &sges[1..2], remote.at(0)).signaled(),
        SendWr::fetch_and_add(3, &sges[2..3], remote.at(4096), 5).signaled(),
    ];
    for wr in &wrs {
        p.a.post_send(std::slice::from_ref(wr)).unwrap();
        let wc = poll_n(&p.cq0, 1, std::time::Duration::from_secs(10)).unwrap();
        assert!(wc[0].is_ok(), "{:?}", wc[0]);
    }
    // A UD datagram from sim0 to sim1: its one packet, with its DETH.
    const QKEY: u32 = 0x1111;
    let (ux, uy) = (
        common::ud_qp(&p.pd0, &p.cq0, QKEY),
        common::ud_qp(&p.pd1, &p.cq1, QKEY),
    );
    let rbuf = p.pd1.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    uy.post_recv(&[RecvWr::new(9, &[rbuf.sge(0, 4096).unwrap()])])
        .unwrap();
    let ah = p
        .pd0
        .create_ah(&ah_attr_for(
            &local_endpoint(&p.c1, &uy, &params, 0).unwrap(),
            &params,
        ))
        .unwrap();
    let usge = [src.sge(0, 100).unwrap()];
    ux.post_send(&[SendWr::send(4, &usge).signaled().ud(&ah, uy.qp_num(), QKEY)])
        .unwrap();
    assert!(poll_n(&p.cq0, 1, std::time::Duration::from_secs(10)).unwrap()[0].is_ok());
    assert!(poll_n(&p.cq1, 1, std::time::Duration::from_secs(10)).unwrap()[0].is_ok());
    // A UC SEND: no AckReq on it, as nothing acknowledges UC (rxe leaves the bit clear).
    let (ua, ub) = (
        p.pd0
            .create_qp(&QpInitAttr::uc(&p.cq0, &p.cq0, QpCap::new(4, 4)))
            .unwrap(),
        p.pd1
            .create_qp(&QpInitAttr::uc(&p.cq1, &p.cq1, QpCap::new(4, 4)))
            .unwrap(),
    );
    let ea = local_endpoint(&p.c0, &ua, &params, 9).unwrap();
    let eb = local_endpoint(&p.c1, &ub, &params, 9).unwrap();
    connect_uc(&ua, &params, ea.psn, &eb).unwrap();
    connect_uc(&ub, &params, eb.psn, &ea).unwrap();
    ub.post_recv(&[RecvWr::new(10, &[rbuf.sge(0, 4096).unwrap()])])
        .unwrap();
    ua.post_send(&[SendWr::send(5, &usge).signaled()]).unwrap();
    assert!(poll_n(&p.cq0, 1, std::time::Duration::from_secs(10)).unwrap()[0].is_ok());
    assert!(poll_n(&p.cq1, 1, std::time::Duration::from_secs(10)).unwrap()[0].is_ok());

    let cap = backend_sim::capture::global().expect("the capture is on");
    cap.flush();
    let path = dir.join(format!("run-{}.pcapng", std::process::id()));
    assert_eq!(cap.path(), Some(path.as_path()));
    let bytes = std::fs::read(&path).unwrap();
    let packets = roce(&bytes);
    let got: Vec<(String, u32, u32)> = packets
        .iter()
        .map(|(r, ..)| (name(r).to_owned(), r.headers.bth.psn, r.headers.bth.dst_qpn))
        .collect();
    let uc = packets.last().unwrap().0.headers.bth;
    assert!(!uc.ack_req, "AckReq on a UC packet: {uc:?}");
    let (a, b) = (p.a.qp_num(), p.b.qp_num());
    let want: Vec<(String, u32, u32)> = [
        ("RDMA_WRITE_FIRST", 1, b),
        ("RDMA_WRITE_MIDDLE", 2, b),
        ("RDMA_WRITE_MIDDLE", 3, b),
        ("RDMA_WRITE_LAST", 4, b),
        ("ACKNOWLEDGE", 4, a),
        ("RDMA_READ_REQUEST", 5, b),
        ("RDMA_READ_RESPONSE_FIRST", 5, a),
        ("RDMA_READ_RESPONSE_LAST", 6, a),
        ("FETCH_ADD", 7, b),
        ("ATOMIC_ACKNOWLEDGE", 7, a),
        ("SEND_ONLY", 0, uy.qp_num()),
        ("SEND_ONLY", 9, ub.qp_num()),
    ]
    .into_iter()
    .map(|(n, psn, q)| (n.to_owned(), psn, q))
    .collect();
    assert_eq!(got, want);

    // (The rest are the verbs context's events.)
    let rows = well_formed(&path, &["infiniband.bth.opcode"]);
    let packets = rows.iter().filter(|r| !r[0].is_empty()).count();
    assert_eq!(packets, want.len(), "{rows:?}");
}
