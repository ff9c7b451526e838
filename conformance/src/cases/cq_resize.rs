//! Resizing completion queues (`man ibv_resize_cq`): the CQ holds at least the entries
//! asked for, the completions it holds stay, in order, and a size below what it holds or
//! above `max_cqe` is refused with EINVAL (kernel rxe_cq.c `rxe_cq_chk_attr()`).
//!
//! The held completions are B's receives of three SENDs; A's READ from B after them
//! completes only once B's responder has taken them (a responder serves its requests in
//! order and completes a receive before the next request), so they are in B's CQ when
//! the READ's completion is.

use verbs_api::{
    AccessFlags as A, Backend, CompletionQueue, Context, MemoryRegion, QueuePair, RecvWr, SendWr,
};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome, PairOpts};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "cq-resize.empty",
            "an empty CQ shrinks to 1 entry and grows to 64: it holds at least what was asked",
            "man ibv_resize_cq",
            empty
        ),
        case!(
            "cq-resize.keeps-completions",
            "a CQ grown while it holds three completions returns them, in order",
            "man ibv_resize_cq (the completions in the CQ are kept)",
            keeps_completions
        ),
        case!(
            "cq-resize.below-held",
            "a resize below the completions the CQ holds is refused with EINVAL; they stay",
            "man ibv_resize_cq; kernel rxe_cq.c rxe_cq_chk_attr() (cqe < count)",
            below_held
        ),
        case!(
            "cq-resize.too-large",
            "a resize above max_cqe, or to 0, is refused with EINVAL",
            "man ibv_resize_cq (cqe <= max_cqe); kernel rxe_cq.c rxe_cq_chk_attr()",
            too_large
        ),
    ]
}

fn empty<B: Backend>(env: &Env<B>) -> CaseResult {
    let cq = env.ctx.create_cq(16, None)?;
    cq.resize(1)?;
    ensure!(
        cq.capacity() >= 1,
        "capacity {} after a resize to 1",
        cq.capacity()
    );
    cq.resize(64)?;
    ensure!(
        cq.capacity() >= 64,
        "capacity {} after a resize to 64",
        cq.capacity()
    );
    Ok(Outcome::Pass)
}

/// A pair whose B CQ holds three receive completions (wr_id 1, 2, 3), with `cqe_b` entries.
fn held<B: Backend>(env: &Env<B>) -> Result<(crate::Pair<B>, B::Mr), crate::Failure> {
    let p = env.pair(&PairOpts {
        cqe_b: Some(8),
        ..env.opts()
    })?;
    let mr = env.mr(&p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_READ)?;
    for id in 1..=3u64 {
        p.b.post_recv(&[RecvWr::new(id, &[mr.sge(64 * id as usize, 64)?])])?;
    }
    for id in 1..=3u64 {
        p.a.post_send(&[SendWr::send(10 + id, &[mr.sge(0, 8)?]).signaled()])?;
    }
    let remote = (mr.addr() + 1024, mr.rkey());
    p.a.post_send(&[SendWr::read(14, &[mr.sge(512, 8)?], remote).signaled()])?;
    let done = env.wait(&p.cq_a, 4)?;
    ensure!(
        done.iter().all(|w| w.status == verbs_api::WcStatus::Success),
        "A's SENDs and READ: {done:?}"
    );
    Ok((p, mr))
}

/// B's CQ returns the receives 1, 2, 3 in order.
fn drain_in_order<B: Backend>(env: &Env<B>, p: &crate::Pair<B>) -> CaseResult {
    let wcs = env.wait(&p.cq_b, 3)?;
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ensure_eq!(ids, vec![1, 2, 3], "the receives' wr_ids");
    env.expect_empty(&p.cq_b, "B's CQ after the three receives")?;
    Ok(Outcome::Pass)
}

fn keeps_completions<B: Backend>(env: &Env<B>) -> CaseResult {
    let (p, _mr) = held(env)?;
    p.cq_b.resize(64)?;
    ensure!(
        p.cq_b.capacity() >= 64,
        "capacity {} after a resize to 64",
        p.cq_b.capacity()
    );
    drain_in_order(env, &p)
}

fn below_held<B: Backend>(env: &Env<B>) -> CaseResult {
    let (p, _mr) = held(env)?;
    let r = p.cq_b.resize(2);
    env.observe("resize to 2 holding 3", errno_of(&r));
    ensure_eq!(errno_of(&r), "EINVAL", "a resize to 2 while holding 3");
    drain_in_order(env, &p)
}

fn too_large<B: Backend>(env: &Env<B>) -> CaseResult {
    let max = env.ctx.query_device()?.max_cqe;
    let cq = env.ctx.create_cq(16, None)?;
    let r = cq.resize(max.saturating_add(1));
    env.observe("resize above max_cqe", errno_of(&r));
    ensure_eq!(errno_of(&r), "EINVAL", "a resize to max_cqe + 1");
    let r = cq.resize(0);
    env.observe("resize to 0", errno_of(&r));
    ensure_eq!(errno_of(&r), "EINVAL", "a resize to 0");
    ensure!(
        cq.capacity() >= 16,
        "capacity {} after refused resizes",
        cq.capacity()
    );
    Ok(Outcome::Pass)
}

/// `ok`, or the errno's name of a refusal.
fn errno_of(r: &verbs_api::Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => crate::env::errno_name(e.errno()),
    }
}
