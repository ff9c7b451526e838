//! Async completions (`verbs_api::aio`) through each backend's completion channel:
//! the arm / drain / re-arm loop wakes on the channel, many waiters share one CQ, and a
//! dropped future loses no completion (`man ibv_get_cq_event`, `man ibv_req_notify_cq`).

use std::time::Duration;

use verbs_api::aio::AsyncCq;
use verbs_api::{
    connect_rc, local_endpoint, AccessFlags as A, Backend, Context, MemoryRegion, ProtectionDomain, QpCap,
    QpInitAttr, QueuePair, RecvWr, SendWr, WcStatus,
};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Failure, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "aio.wake",
            "a task sleeping on the channel wakes for a completion that arrives later",
            "man ibv_req_notify_cq, man ibv_get_cq_event (arm, drain, re-arm)",
            wake
        ),
        case!(
            "aio.waiters",
            "32 tasks each await their own WRITE on one CQ; each gets its own completion once",
            "verbs-api aio (routing by wr_id)",
            waiters
        ),
        case!(
            "aio.cancel",
            "a dropped wait loses nothing: the completion of its WR is delivered later, once",
            "verbs-api aio (cancellation rule)",
            cancel
        ),
    ]
}

struct Rig<B: Backend> {
    pd: B::Pd,
    a: B::Qp,
    b: B::Qp,
    cq_b: B::Cq,
    acq: AsyncCq<B>,
}

fn rig<B: Backend>(env: &Env<B>) -> Result<Rig<B>, Failure> {
    let pd = env.ctx.alloc_pd()?;
    let ch = env.ctx.create_comp_channel()?;
    let cq_a = env.ctx.create_cq(256, Some(&ch))?;
    let cq_b = env.ctx.create_cq(256, None)?;
    let cap = QpCap::new(64, 64);
    let a = pd.create_qp(&QpInitAttr::rc(&cq_a, &cq_a, cap))?;
    let b = pd.create_qp(&QpInitAttr::rc(&cq_b, &cq_b, cap))?;
    let o = env.opts();
    let ea = local_endpoint(&env.ctx, &a, &o.a, 5)?;
    let eb = local_endpoint(&env.ctx, &b, &o.b, 6)?;
    connect_rc(&a, &o.a, ea.psn, &eb)?;
    connect_rc(&b, &o.b, eb.psn, &ea)?;
    let acq = AsyncCq::new(cq_a, ch)?;
    Ok(Rig { pd, a, b, cq_b, acq })
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("tokio runtime: {e}")))
}

fn wake<B: Backend>(env: &Env<B>) -> CaseResult {
    let rt = runtime()?;
    let _g = rt.enter();
    let r = rig(env)?;
    let mr = env.mr(&r.pd, 4096, A::LOCAL_WRITE)?;
    let bound = env.cfg.timeout;
    rt.block_on(async {
        // The SEND waits for a receive (RNR); the waiter sleeps on the channel meanwhile.
        r.a.post_send(&[SendWr::send(1, &[mr.sge(0, 8)?]).signaled()])?;
        let waiter = r.acq.next();
        tokio::pin!(waiter);
        ensure!(
            tokio::time::timeout(Duration::from_millis(50), waiter.as_mut())
                .await
                .is_err(),
            "a completion before any receive was posted"
        );
        r.b.post_recv(&[RecvWr::new(2, &[mr.sge(1024, 64)?])])?;
        let wc = tokio::time::timeout(bound, waiter)
            .await
            .map_err(|_| Failure("the waiter was not woken".into()))??;
        ensure_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "completion");
        ensure!(
            r.acq.wakeups() >= 1,
            "completion found without sleeping on the channel"
        );
        Ok(Outcome::Pass)
    })
}

fn waiters<B: Backend>(env: &Env<B>) -> CaseResult {
    let rt = runtime()?;
    let _g = rt.enter();
    let r = rig(env)?;
    let mr = env.mr(&r.pd, 8192, A::LOCAL_WRITE | A::REMOTE_WRITE)?;
    let bound = env.cfg.timeout;
    rt.block_on(async {
        let futs = (0..32u64).map(|i| {
            let (r, mr) = (&r, &mr);
            async move {
                let sge = [mr.sge(i as usize * 8, 8)?];
                let wc = r
                    .acq
                    .post_send(&r.a, SendWr::write(i, &sge, mr.remote().at(4096 + i * 8)))
                    .await?;
                Ok::<_, Failure>((i, wc))
            }
        });
        let all = tokio::time::timeout(bound, futures_util::future::join_all(futs))
            .await
            .map_err(|_| Failure("waiters did not finish".into()))?;
        for r in all {
            let (i, wc) = r?;
            ensure_eq!(
                (wc.wr_id, wc.status),
                (i, WcStatus::Success),
                "completion of waiter {i}"
            );
        }
        ensure!(
            tokio::time::timeout(Duration::from_millis(50), r.acq.next())
                .await
                .is_err(),
            "a completion was delivered twice"
        );
        Ok(Outcome::Pass)
    })
}

fn cancel<B: Backend>(env: &Env<B>) -> CaseResult {
    let rt = runtime()?;
    let _g = rt.enter();
    let r = rig(env)?;
    let mr = env.mr(&r.pd, 4096, A::LOCAL_WRITE)?;
    mr.write(0, b"intact")?;
    let bound = env.cfg.timeout;
    rt.block_on(async {
        let sge = [mr.sge(0, 6)?];
        let waited = tokio::time::timeout(
            Duration::from_millis(50),
            r.acq.post_send(&r.a, SendWr::send(7, &sge)),
        )
        .await;
        ensure!(waited.is_err(), "the SEND completed without a receive");
        r.b.post_recv(&[RecvWr::new(1, &[mr.sge(1024, 64)?])])?;
        let wc = tokio::time::timeout(bound, r.acq.next())
            .await
            .map_err(|_| Failure("the dropped WR's completion never came".into()))??;
        ensure_eq!(
            (wc.wr_id, wc.status),
            (7, WcStatus::Success),
            "completion of the dropped WR"
        );
        ensure!(
            tokio::time::timeout(Duration::from_millis(50), r.acq.next())
                .await
                .is_err(),
            "a completion was delivered twice"
        );
        let rc = env.wait1(&r.cq_b)?;
        ensure_eq!(rc.byte_len, 6, "received bytes");
        ensure_eq!(
            crate::env::read_back(&mr, 1024, 6)?,
            b"intact".to_vec(),
            "payload"
        );
        Ok(Outcome::Pass)
    })
}
