//! Atomics: FETCH_AND_ADD and CMP_AND_SWP on 64-bit remote words (IBA 9.4.5,
//! `man ibv_post_send` (wr.atomic)).

use verbs_api::{AccessFlags as A, AtomicCap, Backend, Context, MemoryRegion, QueuePair, SendWr, WcOpcode};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "atomic.fetch-add",
            "FETCH_AND_ADD adds and returns the old value into the local SGE",
            "IBA 9.4.5; man ibv_post_send",
            fetch_add
        ),
        case!(
            "atomic.cmp-swap-hit",
            "CMP_AND_SWP with a matching compare swaps and returns the old value",
            "IBA 9.4.5",
            cas_hit
        ),
        case!(
            "atomic.cmp-swap-miss",
            "CMP_AND_SWP with a different compare leaves the word and returns it",
            "IBA 9.4.5",
            cas_miss
        ),
        case!(
            "atomic.wrap",
            "FETCH_AND_ADD wraps around 2^64",
            "IBA 9.4.5 (modulo 2^64 addition)",
            wrap
        ),
        case!(
            "atomic.concurrent",
            "4 QPs x 250 FETCH_AND_ADD from 4 threads: the word ends at 1000 and every old value is distinct",
            "IBA 9.4.5 / man ibv_query_device (IBV_ATOMIC_HCA: atomic between QPs of the HCA)",
            concurrent
        ),
    ]
}

fn skip_without_atomics<B: Backend>(env: &Env<B>) -> Result<Option<Outcome>, crate::Failure> {
    if env.ctx.query_device()?.atomic_cap == AtomicCap::None {
        return Ok(Some(Outcome::Skip(
            crate::report::Lack::Atomics,
            "the device reports IBV_ATOMIC_NONE".into(),
        )));
    }
    Ok(None)
}

fn one<B: Backend>(
    env: &Env<B>,
    wr: impl Fn(&[verbs_api::Sge], verbs_api::RemoteAddr) -> SendWr<'_>,
    start: u64,
) -> Result<(u64, u64, WcOpcode), crate::Failure> {
    let p = env.pair(&env.opts())?;
    let target = env.mr(&p.pd, 64, A::LOCAL_WRITE | A::REMOTE_ATOMIC)?;
    let res = env.mr(&p.pd, 64, A::LOCAL_WRITE)?;
    target.write_u64(8, start)?;
    res.write_u64(0, 0xffff_ffff_ffff_ffff)?;
    let sge = [res.sge(0, 8)?];
    p.a.post_send(&[wr(&sge, target.remote().at(8)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "status {:?}", wc.status);
    Ok((res.read_u64(0)?, target.read_u64(8)?, wc.opcode))
}

fn fetch_add<B: Backend>(env: &Env<B>) -> CaseResult {
    if let Some(s) = skip_without_atomics(env)? {
        return Ok(s);
    }
    let (old, now, op) = one(env, |s, r| SendWr::fetch_and_add(1, s, r, 5), 37)?;
    ensure_eq!(old, 37, "returned old value");
    ensure_eq!(now, 42, "new value");
    ensure_eq!(op, WcOpcode::FetchAdd, "opcode");
    Ok(Outcome::Pass)
}

fn cas_hit<B: Backend>(env: &Env<B>) -> CaseResult {
    if let Some(s) = skip_without_atomics(env)? {
        return Ok(s);
    }
    let (old, now, op) = one(env, |s, r| SendWr::cmp_and_swp(1, s, r, 0, 1), 0)?;
    ensure_eq!(old, 0, "returned old value");
    ensure_eq!(now, 1, "new value");
    ensure_eq!(op, WcOpcode::CompSwap, "opcode");
    Ok(Outcome::Pass)
}

fn cas_miss<B: Backend>(env: &Env<B>) -> CaseResult {
    if let Some(s) = skip_without_atomics(env)? {
        return Ok(s);
    }
    let (old, now, _) = one(env, |s, r| SendWr::cmp_and_swp(1, s, r, 0, 1), 1)?;
    ensure_eq!(old, 1, "returned old value (the lock is held)");
    ensure_eq!(now, 1, "word after a failed compare");
    Ok(Outcome::Pass)
}

fn wrap<B: Backend>(env: &Env<B>) -> CaseResult {
    if let Some(s) = skip_without_atomics(env)? {
        return Ok(s);
    }
    let (old, now, _) = one(env, |s, r| SendWr::fetch_and_add(1, s, r, 2), u64::MAX)?;
    ensure_eq!(old, u64::MAX, "returned old value");
    ensure_eq!(now, 1, "wrapped value");
    Ok(Outcome::Pass)
}

fn concurrent<B: Backend>(env: &Env<B>) -> CaseResult {
    if let Some(s) = skip_without_atomics(env)? {
        return Ok(s);
    }
    const QPS: usize = 4;
    const OPS: usize = 250;
    let mut o = env.opts();
    o.cap.max_send_wr = 32;
    let pairs: Vec<_> = (0..QPS).map(|_| env.pair(&o)).collect::<Result<_, _>>()?;
    // Every pair has its own PD, so the one word (caller memory) is registered once per PD:
    // all four QPs then hit the same 8 bytes.
    let mut backing = vec![0u64; 8];
    let base = backing.as_mut_ptr().cast::<u8>();
    let targets: Vec<_> = pairs
        .iter()
        .map(|p| {
            // SAFETY: `backing` outlives every region (they are dropped below, before it)
            // and is only accessed through the regions while they are registered.
            unsafe {
                verbs_api::ProtectionDomain::reg_mr_raw(&p.pd, base, 64, A::LOCAL_WRITE | A::REMOTE_ATOMIC)
            }
        })
        .collect::<Result<_, _>>()?;
    let results: Vec<_> = pairs
        .iter()
        .map(|p| env.mr(&p.pd, OPS * 8, A::LOCAL_WRITE))
        .collect::<Result<_, _>>()?;
    const BATCH: usize = 10;
    let timeout = env.cfg.timeout;
    let outcome: Result<(), String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..QPS)
            .map(|i| {
                let (p, t, r) = (&pairs[i], &targets[i], &results[i]);
                s.spawn(move || -> Result<(), String> {
                    for batch in 0..OPS / BATCH {
                        for k in batch * BATCH..(batch + 1) * BATCH {
                            let sge = [r.sge(k * 8, 8).map_err(|e| e.to_string())?];
                            let wr = SendWr::fetch_and_add(k as u64, &sge, t.remote().at(0), 1).signaled();
                            p.a.post_send(&[wr]).map_err(|e| e.to_string())?;
                        }
                        let wcs = verbs_api::poll_n(&p.cq_a, BATCH, timeout).map_err(|e| e.to_string())?;
                        if let Some(bad) = wcs.iter().find(|w| !w.is_ok()) {
                            return Err(format!("QP {i}: status {:?}", bad.status));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
    });
    outcome.map_err(crate::Failure)?;
    let final_value = targets[0].read_u64(0)?;
    ensure_eq!(final_value, (QPS * OPS) as u64, "final value");
    let mut olds: Vec<u64> = Vec::new();
    for r in &results {
        for k in 0..OPS {
            olds.push(r.read_u64(k * 8)?);
        }
    }
    olds.sort_unstable();
    ensure!(
        olds == (0..(QPS * OPS) as u64).collect::<Vec<_>>(),
        "old values are not exactly 0..{}",
        QPS * OPS
    );
    drop(targets);
    drop(backing);
    Ok(Outcome::Pass)
}
