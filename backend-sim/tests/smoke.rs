//! End-to-end over loopback TCP: two RC QPs on one sim device.
use std::time::Duration;
use verbs_api::*;

fn pair(
    ctx: &backend_sim::SimContext,
) -> (
    backend_sim::SimPd,
    backend_sim::SimCq,
    backend_sim::SimQp,
    backend_sim::SimQp,
) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let a = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let b = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let p = RcParams::default();
    let ea = local_endpoint(ctx, &a, &p, 100).unwrap();
    let eb = local_endpoint(ctx, &b, &p, 200).unwrap();
    connect_rc(&a, &p, ea.psn, &eb).unwrap();
    connect_rc(&b, &p, eb.psn, &ea).unwrap();
    (pd, cq, a, b)
}

#[test]
fn send_write_read_atomic() {
    let sim = backend_sim::SimBackend::default();
    let ctx = sim.open("sim0").unwrap();
    let (pd, cq, a, b) = pair(&ctx);
    let mr = pd.reg_mr(2 << 20, AccessFlags::ALL).unwrap();
    let t = Duration::from_secs(5);
    mr.write(0, b"hello").unwrap();
    b.post_recv(&[RecvWr::new(1, &[mr.sge(4096, 64).unwrap()])])
        .unwrap();
    a.post_send(&[SendWr::send(2, &[mr.sge(0, 5).unwrap()]).signaled()])
        .unwrap();
    let wcs = poll_n(&cq, 2, t).unwrap();
    assert!(wcs.iter().all(|w| w.is_ok()), "{wcs:?}");
    let mut got = [0u8; 5];
    mr.read(4096, &mut got).unwrap();
    assert_eq!(&got, b"hello");

    // big write + read back
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    mr.write(0, &data).unwrap();
    a.post_send(&[SendWr::write(3, &[mr.sge(0, data.len()).unwrap()], mr.remote().at(500_000)).signaled()])
        .unwrap();
    let w = poll_n(&cq, 1, t).unwrap();
    assert!(w[0].is_ok(), "{w:?}");
    let mut back = vec![0u8; data.len()];
    mr.read(500_000, &mut back).unwrap();
    assert!(back == data);
    a.post_send(&[SendWr::read(
        4,
        &[mr.sge(800_000, data.len()).unwrap()],
        mr.remote().at(500_000),
    )
    .signaled()])
        .unwrap();
    let w = poll_n(&cq, 1, t).unwrap();
    assert!(w[0].is_ok(), "{w:?}");
    mr.read(800_000, &mut back).unwrap();
    assert!(back == data);

    mr.write_u64(1000, 41).unwrap();
    a.post_send(&[SendWr::fetch_and_add(5, &[mr.sge(1008, 8).unwrap()], mr.remote().at(1000), 1).signaled()])
        .unwrap();
    let w = poll_n(&cq, 1, t).unwrap();
    assert!(w[0].is_ok(), "{w:?}");
    assert_eq!(mr.read_u64(1008).unwrap(), 41);
    assert_eq!(mr.read_u64(1000).unwrap(), 42);
}
