//! Protection domains and memory regions (`man ibv_alloc_pd`, `man ibv_reg_mr`).

use verbs_api::{AccessFlags as A, Backend, Context, MemoryRegion, ProtectionDomain};

use super::case;
use crate::env::{pattern, read_back};
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!("mr.reg", "reg_mr returns a region with its length, flags and keys", "man ibv_reg_mr; rdma-core tests/test_mr.py test_reg_mr", mr_reg),
        case!(
            "mr.remote-write-needs-local-write",
            "REMOTE_WRITE without LOCAL_WRITE is refused with EINVAL",
            "man ibv_reg_mr: \"If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, then IBV_ACCESS_LOCAL_WRITE must be set too\"",
            mr_remote_write_needs_local
        ),
        case!(
            "mr.remote-atomic-needs-local-write",
            "REMOTE_ATOMIC without LOCAL_WRITE is refused with EINVAL",
            "man ibv_reg_mr",
            mr_remote_atomic_needs_local
        ),
        case!("mr.keys-unique", "64 regions have 64 distinct lkeys and rkeys", "IBA 10.6.3.1 (keys identify regions)", mr_keys_unique),
        case!(
            "mr.accessors",
            "copy accessors round-trip and refuse ranges outside the region",
            "verbs-api MemoryRegion",
            mr_accessors
        ),
        case!(
            "mr.caller-memory",
            "caller memory registered with reg_mr_raw receives an RDMA WRITE in place",
            "man ibv_reg_mr (addr, length)",
            mr_caller_memory
        ),
        case!(
            "mr.caller-memory-not-owned",
            "reg_mr_raw refuses memory that is not mapped, or read-only for a writable region (EFAULT), and a range that wraps (EINVAL)",
            "drivers/infiniband/core/umem.c ib_umem_get (pin_user_pages, FOLL_WRITE for writable access)",
            mr_caller_memory_not_owned
        ),
        case!("pd.many", "several PDs can be allocated and hold regions", "man ibv_alloc_pd", pd_many),
    ]
}

fn mr_reg<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    for (len, acc) in [
        (4096usize, A::LOCAL_WRITE),
        (100, A::ALL),
        (1 << 20, A::LOCAL_WRITE | A::REMOTE_READ),
        (8, A::REMOTE_READ),
    ] {
        let mr = pd.reg_mr(len, acc)?;
        ensure_eq!(mr.len(), len, "length");
        ensure_eq!(mr.access(), acc, "access flags");
        ensure!(!mr.as_ptr().is_null(), "null address");
        ensure!(mr.lkey() != 0 || mr.rkey() != 0, "both keys zero");
    }
    Ok(Outcome::Pass)
}

fn mr_remote_write_needs_local<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    match pd.reg_mr(4096, A::REMOTE_WRITE) {
        Ok(_) => Err(crate::Failure(
            "REMOTE_WRITE without LOCAL_WRITE was accepted".into(),
        )),
        Err(e) => {
            ensure_eq!(e.errno(), libc::EINVAL, "errno");
            Ok(Outcome::Pass)
        }
    }
}

fn mr_remote_atomic_needs_local<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    match pd.reg_mr(4096, A::REMOTE_ATOMIC | A::REMOTE_READ) {
        Ok(_) => Err(crate::Failure(
            "REMOTE_ATOMIC without LOCAL_WRITE was accepted".into(),
        )),
        Err(e) => {
            ensure_eq!(e.errno(), libc::EINVAL, "errno");
            Ok(Outcome::Pass)
        }
    }
}

fn mr_keys_unique<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    let mrs: Vec<_> = (0..64).map(|_| pd.reg_mr(64, A::ALL)).collect::<Result<_, _>>()?;
    let mut l: Vec<u32> = mrs.iter().map(|m| m.lkey()).collect();
    let mut r: Vec<u32> = mrs.iter().map(|m| m.rkey()).collect();
    l.sort_unstable();
    l.dedup();
    r.sort_unstable();
    r.dedup();
    ensure_eq!(l.len(), 64, "distinct lkeys");
    ensure_eq!(r.len(), 64, "distinct rkeys");
    Ok(Outcome::Pass)
}

fn mr_accessors<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    let mr = pd.reg_mr(256, A::LOCAL_WRITE)?;
    let p = pattern(100, 3);
    mr.write(10, &p)?;
    ensure_eq!(read_back(&mr, 10, 100)?, p, "read back");
    ensure!(mr.write(200, &p).is_err(), "write past the end accepted");
    let mut b = [0u8; 8];
    ensure!(mr.read(250, &mut b).is_err(), "read past the end accepted");
    ensure!(
        mr.read(usize::MAX, &mut b).is_err(),
        "overflowing offset accepted"
    );
    mr.write_u64(64, 0x0123_4567_89ab_cdef)?;
    ensure_eq!(mr.read_u64(64)?, 0x0123_4567_89ab_cdef, "u64");
    mr.fill(0xaa);
    ensure!(mr.to_vec().iter().all(|&x| x == 0xaa), "fill");
    Ok(Outcome::Pass)
}

fn mr_caller_memory<B: Backend>(env: &Env<B>) -> CaseResult {
    use verbs_api::{QueuePair, SendWr};
    let p = env.pair(&env.opts())?;
    let mut backing = vec![0u8; 8192];
    let base = backing.as_mut_ptr();
    // SAFETY: `backing` outlives `target` (dropped at the end of this function, before
    // `backing`) and is not touched through references while registered.
    let target = unsafe { p.pd.reg_mr_raw(base, 8192, A::LOCAL_WRITE | A::REMOTE_WRITE)? };
    ensure_eq!(target.addr(), base as u64, "address of caller memory");
    let src = env.mr(&p.pd, 4096, A::LOCAL_WRITE)?;
    let data = pattern(4096, 9);
    src.write(0, &data)?;
    p.a.post_send(&[SendWr::write(1, &[src.sge(0, 4096)?], target.remote().at(1000)).signaled()])?;
    let wc = env.wait1(&p.cq_a)?;
    ensure!(wc.is_ok(), "WRITE into caller memory: {:?}", wc.status);
    drop(target);
    ensure_eq!(&backing[1000..5096], &data[..], "bytes in the caller's buffer");
    Ok(Outcome::Pass)
}

fn mr_caller_memory_not_owned<B: Backend>(env: &Env<B>) -> CaseResult {
    let pd = env.ctx.alloc_pd()?;
    // SAFETY: sysconf reads a constant of the system.
    let pg = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh anonymous mapping of three pages; nothing else uses it.
    let base = unsafe { libc::mmap(std::ptr::null_mut(), 3 * pg, libc::PROT_READ, anon, -1, 0) };
    ensure!(base != libc::MAP_FAILED, "mmap failed");
    let base = base.cast::<u8>();
    // SAFETY: the middle page is part of that mapping: a hole in it.
    unsafe { libc::munmap(base.add(pg).cast(), pg) };
    let top = (usize::MAX - pg + 1) as *mut u8;
    let rw = A::LOCAL_WRITE | A::REMOTE_WRITE | A::REMOTE_READ;
    let attempts = [
        ("across a hole", base, 3 * pg, A::REMOTE_READ, libc::EFAULT),
        ("read-only, LOCAL_WRITE", base, pg, rw, libc::EFAULT),
        ("wrapping past the top", top, 2 * pg, A::REMOTE_READ, libc::EINVAL),
    ];
    let mut verdict = Ok(());
    for (what, addr, len, access, want) in attempts {
        // SAFETY: each registration is refused (or dropped at once), and nothing reaches
        // the memory through references.
        let got = match unsafe { pd.reg_mr_raw(addr, len, access) } {
            Ok(_) => 0,
            Err(e) => e.errno(),
        };
        if got != want && verdict.is_ok() {
            verdict = Err(crate::Failure(format!("{what}: errno {got}, expected {want}")));
        }
    }
    // SAFETY: a read-only page of this mapping, registered for remote reads only, and
    // dropped before the mapping goes.
    let ro = unsafe { pd.reg_mr_raw(base, pg, A::REMOTE_READ) };
    let ro_ok = ro.is_ok();
    drop(ro);
    // SAFETY: unmaps what this case mapped (the hole is fine to unmap again).
    unsafe { libc::munmap(base.cast(), 3 * pg) };
    verdict?;
    ensure!(ro_ok, "read-only memory registered for REMOTE_READ was refused");
    Ok(Outcome::Pass)
}

fn pd_many<B: Backend>(env: &Env<B>) -> CaseResult {
    let pds: Vec<_> = (0..8).map(|_| env.ctx.alloc_pd()).collect::<Result<_, _>>()?;
    let mrs: Vec<_> = pds
        .iter()
        .map(|pd| pd.reg_mr(4096, A::LOCAL_WRITE))
        .collect::<Result<_, _>>()?;
    // Drop the PDs first: each region keeps its PD alive.
    drop(pds);
    for m in &mrs {
        m.write(0, b"still usable")?;
    }
    Ok(Outcome::Pass)
}
