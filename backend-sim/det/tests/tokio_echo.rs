//! An async echo server and client as an application writes them (generic over
//! `verbs_api::Backend`, two tokio tasks, `AsyncCq`), connected by the in-memory
//! rendezvous, on the deterministic fabric under loss, duplication and reordering: every
//! seed passes, the same seed gives the same trace, and a `tokio::time::sleep` in the
//! client follows the virtual clock. And what the world refuses: a runtime that is not a
//! paused current_thread one, a second runtime after the one the world is bound to, a
//! wait nothing will end, a polling loop that never awaits, a connection nobody listens
//! for.

use std::time::Duration;

use backend_sim_det::harness::check_seeds;
use backend_sim_det::{Det, DetBuilder, IDLE_POLLS, IDLE_WAIT};
use verbs_api::aio::AsyncCq;
use verbs_api::cm::Offer;
use verbs_api::{
    modify_to_init, AccessFlags, Backend, CompletionQueue, Context, MemoryRegion, MrOf, PdOf,
    ProtectionDomain, QpCap, QpInitAttr, QpOf, QpType, QueuePair, RcParams, RecvWr, SendWr, WcOpcode,
    WcStatus, WorkCompletion,
};

const MSGS: usize = 12;
const SLOT: usize = 4096;
const PORT: u16 = 7471;
/// The client's pause in the middle of the run, in virtual time.
const NAP: Duration = Duration::from_secs(10);

/// One side: a device, a PD, an async CQ with its channel, an RC QP, a region of
/// `2 * MSGS` slots (receives in the first half, sends in the second).
struct Side<B: Backend> {
    qp: QpOf<B>,
    acq: AsyncCq<B>,
    mr: MrOf<B>,
    _pd: PdOf<B>,
    ctx: B::Context,
}

fn side<B: Backend>(b: &B, host: &str) -> verbs_api::Result<Side<B>> {
    let ctx = b.open(host)?;
    let pd = ctx.alloc_pd()?;
    let ch = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(4 * MSGS as u32, Some(&ch))?;
    let cap = QpCap {
        max_send_wr: 2 * MSGS as u32,
        max_recv_wr: 2 * MSGS as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))?;
    let mr = pd.reg_mr(2 * MSGS * SLOT, AccessFlags::ALL)?;
    let acq = AsyncCq::new(cq, ch)?;
    Ok(Side {
        qp,
        acq,
        mr,
        _pd: pd,
        ctx,
    })
}

fn params() -> RcParams {
    RcParams {
        timeout: 10,
        ..RcParams::default()
    }
}

/// Moves `s`'s QP to INIT and posts a receive in each of the first `MSGS` slots.
fn post_receives<B: Backend>(s: &Side<B>) -> verbs_api::Result<()> {
    modify_to_init(&s.qp, &params())?;
    for i in 0..MSGS {
        let sge = [s.mr.sge(i * SLOT, SLOT)?];
        s.qp.post_recv(&[RecvWr::new(i as u64, &sge)])
            .map_err(|e| e.error)?;
    }
    Ok(())
}

fn ok(what: &str, w: verbs_api::Result<WorkCompletion>) -> Result<WorkCompletion, String> {
    let w = w.map_err(|e| format!("{what}: {e}"))?;
    if w.status != WcStatus::Success {
        return Err(format!("{what}: WR {} completed {:?}", w.wr_id, w.status));
    }
    Ok(w)
}

fn message(i: usize) -> Vec<u8> {
    (0..100 + i * 300).map(|k| (k * 7 + i * 13 + 1) as u8).collect()
}

/// The server: each message received is sent back as it came.
async fn echo_server<B: Backend>(s: &Side<B>) -> Result<(), String> {
    let e = |x: verbs_api::Error| x.to_string();
    for i in 0..MSGS {
        let w = ok("server receive", s.acq.completion(i as u64).await)?;
        let mut got = vec![0u8; w.byte_len as usize];
        s.mr.read(i * SLOT, &mut got).map_err(e)?;
        let out = (MSGS + i) * SLOT;
        s.mr.write(out, &got).map_err(e)?;
        let sge = [s.mr.sge(out, got.len()).map_err(e)?];
        ok(
            "server send",
            s.acq.post_send(&s.qp, SendWr::send(100 + i as u64, &sge)).await,
        )?;
    }
    Ok(())
}

/// The client: sends each message, awaits its echo and compares; naps half-way.
async fn echo_client<B: Backend>(s: &Side<B>) -> Result<(), String> {
    let e = |x: verbs_api::Error| x.to_string();
    for i in 0..MSGS {
        if i == MSGS / 2 {
            tokio::time::sleep(NAP).await;
        }
        let m = message(i);
        let out = (MSGS + i) * SLOT;
        s.mr.write(out, &m).map_err(e)?;
        let sge = [s.mr.sge(out, m.len()).map_err(e)?];
        ok(
            "client send",
            s.acq.post_send(&s.qp, SendWr::send(100 + i as u64, &sge)).await,
        )?;
        let w = ok("client receive", s.acq.completion(i as u64).await)?;
        let mut got = vec![0u8; w.byte_len as usize];
        s.mr.read(i * SLOT, &mut got).map_err(e)?;
        if w.opcode != WcOpcode::Recv || got != m {
            return Err(format!(
                "echo {i}: {} bytes came back ({:?}), {} sent, equal: {}",
                got.len(),
                w.opcode,
                m.len(),
                got == m
            ));
        }
    }
    Ok(())
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// One run: the server and the client as two tokio tasks on a paused runtime, set up by
/// the in-memory rendezvous.
fn echo(det: &Det) -> Result<(), String> {
    let e = |x: verbs_api::Error| x.to_string();
    let started = std::time::Instant::now();
    let virtual_start = det.now();
    paused_runtime().block_on(async {
        let listener = det.listen("server", PORT).map_err(e)?;
        let d = det.clone();
        let server = tokio::spawn(async move {
            let s = side(&d, "server").map_err(e)?;
            post_receives(&s).map_err(e)?;
            let offer = Offer::new().mr(s.mr.remote()).private_data(*b"echo v1");
            let peer = listener
                .accept(&s.ctx, &s.qp, &params(), &offer)
                .await
                .map_err(e)?;
            if peer.private_data != b"hello" {
                return Err(format!("the client said {:?}", peer.private_data));
            }
            echo_server(&s).await.map(|()| s)
        });
        let d = det.clone();
        let client = tokio::spawn(async move {
            let s = side(&d, "client").map_err(e)?;
            post_receives(&s).map_err(e)?;
            let offer = Offer::new().private_data(*b"hello");
            let peer = d
                .connect("server", PORT, &s.ctx, &s.qp, &params(), &offer)
                .await
                .map_err(e)?;
            if peer.private_data != b"echo v1" || peer.mrs.len() != 1 {
                return Err(format!("the server offered {peer:?}"));
            }
            echo_client(&s).await.map(|()| s)
        });
        // Each side's QP lives until both are done: the client has its last echo before
        // the server has the ACK of it, which a destroyed client QP would never send.
        let (s, c) = (server.await, client.await);
        let _sides = (s.map_err(|j| j.to_string())??, c.map_err(|j| j.to_string())??);
        Ok::<_, String>(())
    })?;
    // The nap took virtual time, not wall time: a sleep on the wall clock would have
    // taken all of it.
    let slept = det.now() - virtual_start;
    if slept < NAP || started.elapsed() >= NAP {
        return Err(format!(
            "the run took {slept:?} of virtual time and {:?} of wall time, with a {NAP:?} nap",
            started.elapsed()
        ));
    }
    Ok(())
}

fn stormy() -> DetBuilder {
    Det::builder()
        .hosts(["client", "server"])
        .loss(5)
        .dup(5)
        .dup_gap(Duration::from_micros(10))
        .jitter(Duration::from_micros(30))
}

#[test]
fn an_async_echo_runs_on_every_seed_under_loss_dup_and_reorder_and_replays() {
    let first = check_seeds(&stormy(), 0..20, echo).unwrap_or_else(|f| panic!("{f}"));
    let again = check_seeds(&stormy(), 0..20, echo).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(first, again, "the same seeds gave other traces");
    // The seeds' runs differ (the faults are the seed's), so the trace is the run's.
    let mut distinct = first.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(first.len() == 1 || distinct.len() > 1, "{first:x?}");
}

#[test]
fn the_faults_were_there() {
    let det = stormy().seed(3).build();
    echo(&det).unwrap();
    let s = det.stats();
    assert!(s.lost > 0 && s.duplicated > 0, "{s:?}");
}

/// A wait on a CQ of `det` in `rt`: what it returns, and the world's time then.
fn wait_in(det: &Det, rt: tokio::runtime::Runtime) -> (String, Duration) {
    rt.block_on(async {
        let s = side(det, "det0").expect("a side");
        let m = s.acq.next().await.expect_err("refused").to_string();
        (m, det.now())
    })
}

#[test]
fn a_runtime_that_is_not_a_paused_current_thread_one_is_refused() {
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (m, _) = wait_in(&Det::builder().build(), multi);
    assert!(m.contains("multi-thread") && m.contains("start_paused"), "{m}");
    let running = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (m, _) = wait_in(&Det::builder().build(), running);
    assert!(m.contains("not paused") && m.contains("start_paused"), "{m}");
}

#[test]
fn a_world_used_from_a_second_runtime_is_refused_naming_both() {
    let det = Det::builder().build();
    let first = paused_runtime();
    let second = paused_runtime();
    // The first async wait binds the world to the first runtime (it times out here).
    let (s, bound) = first.block_on(async {
        let s = side(&det, "det0").expect("a side");
        let _ = tokio::time::timeout(Duration::from_millis(1), s.acq.next()).await;
        (s, tokio::runtime::Handle::current().id())
    });
    let (other, wait, verb) = second.block_on(async {
        // Bounded, so that a world that does not refuse shows as a wrong outcome here
        // rather than as a hang.
        let wait = tokio::time::timeout(Duration::from_secs(1), s.acq.next()).await;
        let verb = det.open("det0").err().map(|e| e.to_string());
        (tokio::runtime::Handle::current().id(), wait, verb)
    });
    let m = match wait {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(w)) => panic!("a completion from the second runtime: {w:?}"),
        Err(_) => panic!("the wait from the second runtime was not refused"),
    };
    for m in [&m, &verb.expect("a verb from the second runtime refused")] {
        assert!(
            m.contains(&format!("runtime {other}")) && m.contains(&format!("runtime {bound}")),
            "{m}"
        );
        assert!(
            m.contains("one runtime per world") && m.contains("a world per runtime"),
            "{m}"
        );
    }
    // The runtime it is bound to still runs it.
    let again = first.block_on(async { tokio::time::timeout(Duration::from_millis(1), s.acq.next()).await });
    assert!(again.is_err(), "the first runtime's wait ended: {again:?}");
}

#[test]
fn a_wait_nothing_will_end_fails_after_the_idle_wait_in_no_wall_time() {
    let det = Det::builder().build();
    let started = std::time::Instant::now();
    let (m, waited) = wait_in(&det, paused_runtime());
    assert!(m.contains("will never come"), "{m}");
    assert!(waited >= IDLE_WAIT, "refused after {waited:?}");
    assert!(started.elapsed() < IDLE_WAIT);
}

#[test]
fn a_polling_loop_that_never_awaits_a_timer_is_refused() {
    let det = Det::builder().build();
    let m = paused_runtime().block_on(async {
        let s = side(&det, "det0").expect("a side");
        // The world is attached by the first async wait (which times out here).
        let _ = tokio::time::timeout(Duration::from_millis(1), s.acq.next()).await;
        let mut wc = [WorkCompletion::default(); 4];
        for _ in 0..=IDLE_POLLS {
            if let Err(e) = s.acq.cq().poll(&mut wc) {
                return e.to_string();
            }
            tokio::task::yield_now().await;
        }
        "never refused".into()
    });
    assert!(m.contains("AsyncCq") && m.contains("tokio::time::sleep"), "{m}");
}

#[test]
fn the_rendezvous_refuses_as_cm_does() {
    let det = Det::builder().hosts(["client", "server"]).build();
    let e = |x: verbs_api::Error| (x.errno(), x.to_string());
    paused_runtime().block_on(async {
        let s = side(&det, "client").unwrap();
        let no = det
            .connect("server", PORT, &s.ctx, &s.qp, &params(), &Offer::new())
            .await
            .map_err(e)
            .unwrap_err();
        assert_eq!(no.0, libc::ECONNREFUSED, "{}", no.1);
        let l = det.listen("server", PORT).unwrap();
        assert_eq!(
            det.listen("server", PORT).map_err(e).unwrap_err().0,
            libc::EADDRINUSE
        );
        assert_eq!(
            det.listen("nowhere", PORT).map_err(e).unwrap_err().0,
            libc::EADDRNOTAVAIL
        );
        // A listener that never accepts: the client's offer timeout, in virtual time.
        let offer = Offer::new().timeout(Duration::from_secs(5));
        let late = det
            .connect("server", PORT, &s.ctx, &s.qp, &params(), &offer)
            .await
            .map_err(e)
            .unwrap_err();
        assert_eq!(late.0, libc::ETIMEDOUT, "{}", late.1);
        drop(l);
        let gone = det
            .connect("server", PORT, &s.ctx, &s.qp, &params(), &Offer::new())
            .await
            .map_err(e)
            .unwrap_err();
        assert_eq!(gone.0, libc::ECONNREFUSED, "{}", gone.1);
    });
}

/// The granularity of tokio's timers: a wait wakes at most this long after its event.
const TICK: Duration = Duration::from_millis(1);

#[test]
fn a_wait_wakes_when_the_other_task_posts_not_at_its_idle_bound() {
    let det = Det::builder().hosts(["client", "server"]).build();
    let e = |x: verbs_api::Error| x.to_string();
    let (sent, received) = paused_runtime()
        .block_on(async {
            let listener = det.listen("server", PORT).map_err(e)?;
            let d = det.clone();
            let server = tokio::spawn(async move {
                let s = side(&d, "server").map_err(e)?;
                post_receives(&s).map_err(e)?;
                listener
                    .accept(&s.ctx, &s.qp, &params(), &Offer::new())
                    .await
                    .map_err(e)?;
                // Nothing is in flight now: this wait sleeps until the client posts.
                ok("server receive", s.acq.completion(0).await)?;
                Ok::<_, String>((d.now(), s))
            });
            let d = det.clone();
            let client = tokio::spawn(async move {
                let s = side(&d, "client").map_err(e)?;
                d.connect("server", PORT, &s.ctx, &s.qp, &params(), &Offer::new())
                    .await
                    .map_err(e)?;
                tokio::time::sleep(NAP).await;
                let sent = d.now();
                let sge = [s.mr.sge(0, 64).map_err(e)?];
                ok("client send", s.acq.post_send(&s.qp, SendWr::send(1, &sge)).await)?;
                Ok::<_, String>((sent, s))
            });
            let (r, s) = (
                server.await.map_err(|j| j.to_string())??,
                client.await.map_err(|j| j.to_string())??,
            );
            Ok::<_, String>((s.0, r.0))
        })
        .unwrap();
    assert!(sent >= NAP, "sent at {sent:?}");
    assert!(
        received > sent && received <= sent + TICK,
        "sent at {sent:?}, received at {received:?}"
    );
}

/// A sync side (its context, PD, CQ, QP and region): no channel, a CQ polled in a loop.
type SyncSide<B> = (
    <B as Backend>::Context,
    PdOf<B>,
    verbs_api::CqOf<B>,
    QpOf<B>,
    MrOf<B>,
);

fn sync_side<B: Backend>(b: &B, host: &str) -> verbs_api::Result<SyncSide<B>> {
    let ctx = b.open(host)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))?;
    let mr = pd.reg_mr(SLOT, AccessFlags::ALL)?;
    Ok((ctx, pd, cq, qp, mr))
}

#[test]
fn the_two_step_rendezvous_connects_sync_code_in_one_thread() {
    let det = stormy().seed(5).build();
    let (cctx, _cpd, ccq, cqp, cmr) = sync_side(&det, "client").unwrap();
    let (sctx, _spd, scq, sqp, smr) = sync_side(&det, "server").unwrap();
    let listener = det.listen("server", PORT).unwrap();
    let again = |e: verbs_api::Error| (e.errno(), e.to_string());
    // The server's step before any request says what to do first.
    let early = listener
        .accept_now(&sctx, &sqp, &params(), &Offer::new())
        .map_err(again)
        .unwrap_err();
    assert_eq!(early.0, libc::EAGAIN, "{}", early.1);
    assert!(early.1.contains("connect_start"), "{}", early.1);
    let c = det
        .connect_start(
            "server",
            PORT,
            &cctx,
            &cqp,
            &params(),
            &Offer::new().private_data(*b"hi"),
        )
        .unwrap();
    modify_to_init(&sqp, &params()).unwrap();
    let sge = [smr.sge(0, SLOT).unwrap()];
    sqp.post_recv(&[RecvWr::new(1, &sge)]).unwrap();
    let at_server = listener
        .accept_now(&sctx, &sqp, &params(), &Offer::new().mr(smr.remote()))
        .unwrap();
    assert_eq!(at_server.private_data, b"hi");
    let at_client = c.finish(&cqp, &params()).unwrap();
    assert_eq!((at_client.endpoint, at_client.mrs.len()), (at_server.local, 1));
    assert_eq!(cqp.state().unwrap(), verbs_api::QpState::Rts);

    // A sync polling loop (no tokio here): the poll moves the clock.
    cmr.write(0, b"ping").unwrap();
    let sge = [cmr.sge(0, 4).unwrap()];
    cqp.post_send(&[SendWr::send(2, &sge).signaled()]).unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    while scq.poll(&mut wc).unwrap() == 0 {}
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (1, WcStatus::Success, 4)
    );
    while ccq.poll(&mut wc).unwrap() == 0 {}
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::Success));
}
