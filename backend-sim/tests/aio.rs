//! verbs_api::aio on the sim: many waiters on one CQ, a burst after one wake-up,
//! cancellation (nothing lost, nothing freed early), and async connection setup.
use std::time::Duration;

use backend_sim::{SimBackend, SimContext, SimCq, SimPd, SimQp};
use verbs_api::aio::AsyncCq;
use verbs_api::cm::{connect_async, AsyncCmListener, Offer};
use verbs_api::*;

struct Rig {
    _ctx: SimContext,
    pd: SimPd,
    a: SimQp,
    b: SimQp,
    acq: AsyncCq<SimBackend>,
    cq_b: SimCq,
}

/// A's CQ (send and receive) is async; B's is plain. `rnr_retry` 7 so SENDs wait.
fn rig() -> Rig {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq_a = ctx.create_cq(1024, Some(&ch)).unwrap();
    let cq_b = ctx.create_cq(1024, None).unwrap();
    let cap = QpCap {
        max_send_wr: 512,
        max_recv_wr: 512,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let a = pd.create_qp(&QpInitAttr::rc(&cq_a, &cq_a, cap)).unwrap();
    let b = pd.create_qp(&QpInitAttr::rc(&cq_b, &cq_b, cap)).unwrap();
    let p = RcParams {
        min_rnr_timer: 1,
        ..RcParams::default()
    };
    let ea = local_endpoint(&ctx, &a, &p, 1).unwrap();
    let eb = local_endpoint(&ctx, &b, &p, 2).unwrap();
    connect_rc(&a, &p, ea.psn, &eb).unwrap();
    connect_rc(&b, &p, eb.psn, &ea).unwrap();
    let acq = AsyncCq::new(cq_a, ch).unwrap();
    Rig {
        _ctx: ctx,
        pd,
        a,
        b,
        acq,
        cq_b,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_on_one_cq() {
    let r = rig();
    let mr = r.pd.reg_mr(64 * 1024, AccessFlags::ALL).unwrap();
    let waiters = (0..64u64).map(|i| {
        let (r, mr) = (&r, &mr);
        async move {
            let sge = [mr.sge(i as usize * 8, 8).unwrap()];
            let wc = r
                .acq
                .post_send(&r.a, SendWr::write(i, &sge, mr.remote().at(32768 + i * 8)))
                .await
                .unwrap();
            assert_eq!(wc.wr_id, i);
            assert!(wc.is_ok(), "{wc:?}");
            i
        }
    });
    let done = futures_util::future::join_all(waiters).await;
    assert_eq!(done, (0..64).collect::<Vec<_>>());
    // Nothing left over, nothing delivered twice.
    assert!(tokio::time::timeout(Duration::from_millis(50), r.acq.next())
        .await
        .is_err());
}

#[tokio::test(flavor = "current_thread")]
async fn a_burst_arrives_with_one_wakeup() {
    let r = rig();
    let mr = r.pd.reg_mr(4096, AccessFlags::ALL).unwrap();
    let acq = &r.acq;
    let waiter = async {
        let mut out = Vec::new();
        acq.next_batch(&mut out, 256).await.unwrap();
        out
    };
    tokio::pin!(waiter);
    // Let the waiter arm the CQ and go to sleep on the channel.
    assert!(futures_util::poll!(waiter.as_mut()).is_pending());
    let sge = [mr.sge(0, 8).unwrap()];
    let wrs: Vec<_> = (0..100)
        .map(|i| SendWr::write(i, &sge, mr.remote().at(64)).signaled())
        .collect();
    r.a.post_send(&wrs).unwrap();
    // Keep this (only) runtime thread busy while all 100 complete.
    std::thread::sleep(Duration::from_millis(300));
    let out = waiter.await;
    assert_eq!(out.len(), 100, "one wake-up hands over the whole burst");
    assert_eq!(
        out.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..100).collect::<Vec<_>>()
    );
    assert_eq!(acq.wakeups(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_future_loses_nothing() {
    let r = rig();
    let mr = r.pd.reg_mr(4096, AccessFlags::ALL).unwrap();
    mr.write(0, b"late but intact").unwrap();
    let sge = [mr.sge(0, 15).unwrap()];
    // B has no receive: the SEND is stuck in RNR retries; give up waiting after 50 ms.
    let waited = tokio::time::timeout(
        Duration::from_millis(50),
        r.acq.post_send(&r.a, SendWr::send(7, &sge)),
    )
    .await;
    assert!(waited.is_err(), "completed without a receive");
    r.b.post_recv(&[RecvWr::new(1, &[mr.sge(1024, 64).unwrap()])])
        .unwrap();
    // The completion of the dropped future is delivered by next(), exactly once.
    let wc = tokio::time::timeout(Duration::from_secs(5), r.acq.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
    assert!(tokio::time::timeout(Duration::from_millis(50), r.acq.next())
        .await
        .is_err());
    let got = poll_n(&r.cq_b, 1, Duration::from_secs(5)).unwrap();
    assert_eq!(got[0].byte_len, 15);
    let mut b = [0u8; 15];
    mr.read(1024, &mut b).unwrap();
    assert_eq!(&b, b"late but intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_buffer_outlives_a_dropped_future() {
    let r = rig();
    let dst = r.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let src = r.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    src.write(0, &data).unwrap();
    let wr_id = r.acq.wr_id();
    r.a.post_send(&[SendWr::send(wr_id, &[src.sge_all()]).signaled()])
        .unwrap();
    // Hand the source region to the future, then drop the future mid-flight.
    let fut = r.acq.owned(wr_id, src);
    assert!(tokio::time::timeout(Duration::from_millis(50), fut)
        .await
        .is_err());
    assert_eq!(
        r.acq.parked(),
        1,
        "the region waits for its WR instead of being freed"
    );
    r.b.post_recv(&[RecvWr::new(1, &[dst.sge_all()])]).unwrap();
    let wc = tokio::time::timeout(Duration::from_secs(5), r.acq.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
    assert_eq!(r.acq.parked(), 0, "released once the WR completed");
    poll_n(&r.cq_b, 1, Duration::from_secs(5)).unwrap();
    assert!(dst.to_vec() == data, "the SEND read the parked region intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_returns_the_value_with_the_completion() {
    let r = rig();
    let mr = r.pd.reg_mr(64, AccessFlags::ALL).unwrap();
    mr.write_u64(0, 41).unwrap();
    let res = r.pd.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    let id = r.acq.wr_id();
    r.a.post_send(&[SendWr::fetch_and_add(id, &[res.sge_all()], mr.remote().at(0), 1).signaled()])
        .unwrap();
    let (wc, res) = r.acq.owned(id, res).await;
    assert!(wc.unwrap().is_ok());
    assert_eq!(res.read_u64(0).unwrap(), 41);
    assert_eq!(mr.read_u64(0).unwrap(), 42);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_of_completions() {
    use futures_util::StreamExt;
    let r = rig();
    let mr = r.pd.reg_mr(4096, AccessFlags::ALL).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let wrs: Vec<_> = (0..10)
        .map(|i| SendWr::write(i, &sge, mr.remote().at(64)).signaled())
        .collect();
    r.a.post_send(&wrs).unwrap();
    let got: Vec<u64> = r.acq.stream().take(10).map(|w| w.unwrap().wr_id).collect().await;
    assert_eq!(got, (0..10).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_connect_accept_under_a_timeout() {
    let listener = AsyncCmListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let make = |name: &str| {
        let ctx = SimBackend::default().open(name).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let cap = QpCap::new(4, 4);
        let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
        (ctx, pd, cq, qp)
    };
    let (sctx, _spd, _scq, sqp) = make("sim0");
    let (cctx, _cpd, _ccq, cqp) = make("sim1");
    let params = RcParams::default();
    let s_offer = Offer::new()
        .timeout(Duration::from_secs(5))
        .private_data(b"s".to_vec());
    let c_offer = Offer::new()
        .timeout(Duration::from_secs(5))
        .private_data(b"c".to_vec());
    let (s, c) = tokio::join!(
        listener.accept(&sctx, &sqp, &params, &s_offer),
        connect_async(addr, &cctx, &cqp, &params, &c_offer)
    );
    let (s, c) = (s.unwrap(), c.unwrap());
    assert_eq!(
        (s.private_data.as_slice(), c.private_data.as_slice()),
        (&b"c"[..], &b"s"[..])
    );
    assert_eq!(sqp.state().unwrap(), QpState::Rts);
    assert_eq!(cqp.state().unwrap(), QpState::Rts);
    // Nobody connects: the accept gives up at its bound.
    let (ctx3, _pd3, _cq3, qp3) = make("sim0");
    let t = std::time::Instant::now();
    let e = listener
        .accept(
            &ctx3,
            &qp3,
            &RcParams::default(),
            &Offer::new().timeout(Duration::from_millis(100)),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2));
}

/// A CQ without a completion channel (or with another channel) cannot be awaited: the
/// constructor says so, instead of the first await failing (or never waking).
#[tokio::test(flavor = "current_thread")]
async fn async_cq_refuses_a_cq_without_its_channel_at_construction() {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let plain = ctx.create_cq(16, None).unwrap();
    let e = AsyncCq::<SimBackend>::new(plain, ch)
        .err()
        .expect("a CQ without a channel is refused");
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("AsyncCq::new") && text.contains("without a completion channel"),
        "{text}"
    );

    let ch_a = ctx.create_comp_channel().unwrap();
    let ch_b = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(16, Some(&ch_a)).unwrap();
    let e = AsyncCq::<SimBackend>::new(cq, ch_b)
        .err()
        .expect("a CQ of another channel is refused");
    assert!(e.to_string().contains("another completion channel"), "{e}");

    // Its own channel is accepted.
    let cq = ctx.create_cq(16, Some(&ch_a)).unwrap();
    assert!(AsyncCq::<SimBackend>::new(cq, ch_a).is_ok());
}
