//! perf's `--mw`: the one-sided tests' target region is reached through a type 2 memory
//! window instead of the region's own rkey (`man ibv_alloc_mw`, `man ibv_post_send` for
//! `IBV_WR_BIND_MW`), so that a row through a window sits beside the same row through the
//! region; and, on the client, the rate at which a type 2 window is bound through the
//! send queue.
//!
//! Each side registers its region with `MW_BIND` too, allocates a window, publishes the
//! rkey its bind will give ([`inc_rkey`] of the window's), and binds it over the whole
//! region, every remote right granted, once its QP is connected: before its first
//! message, so the peer never uses the rkey before the bind.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use verbs_api::{
    inc_rkey, AccessFlags, Backend, MemoryWindow, MwBindInfo, MwType, ProtectionDomain, QueuePair, RemoteMr,
    SendWr, WorkCompletion,
};

use crate::wait::{check_wc, poll_one_ok, poll_some};
use crate::Res;

/// The remote rights a window grants: all three.
const RIGHTS: AccessFlags = AccessFlags::REMOTE_READ
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The access to register a side's region with: every right, and `MW_BIND` with `--mw`.
pub fn region_access(mw: bool) -> AccessFlags {
    if mw {
        AccessFlags::ALL | AccessFlags::MW_BIND
    } else {
        AccessFlags::ALL
    }
}

/// A side's window over its whole region, not bound yet.
pub struct Window<B: Backend> {
    mw: B::Mw,
    /// The rkey its bind gives it.
    pub rkey: u32,
}

impl<B: Backend> Window<B> {
    /// Allocates the window in `pd`.
    pub fn alloc(pd: &B::Pd) -> Res<Self> {
        let mw = pd
            .alloc_mw(MwType::Type2)
            .context("--mw: allocating a type 2 window")?;
        let rkey = inc_rkey(mw.rkey());
        Ok(Window { mw, rkey })
    }

    /// `region` as the peer reaches it through this window.
    pub fn remote(&self, region: RemoteMr) -> RemoteMr {
        RemoteMr {
            rkey: self.rkey,
            ..region
        }
    }

    /// Binds it over the whole of `mr` through the connected `qp`, waiting on `cq`.
    pub fn bind(&self, qp: &B::Qp, cq: &B::Cq, mr: &B::Mr, timeout: Duration) -> Res<()> {
        let info = MwBindInfo::whole(mr, RIGHTS);
        qp.post_send(&[SendWr::bind_mw(u64::MAX, &self.mw, self.rkey, info).signaled()])
            .context("--mw: posting the window's bind")?;
        poll_one_ok(cq, timeout, &|| "--mw: the window's bind".to_string())?;
        Ok(())
    }
}

/// Binds type 2 windows of `pd` over `mr` and invalidates them again, `binds` binds in
/// all, through the connected `qp`'s send queue: each post binds and invalidates each of
/// `depth / 4` windows once (the provider names a window by the rkey its `struct ibv_mw`
/// held at the post, so one post binds a window once), two posts in flight, the last WR
/// of each signaled; the time it took. A type 2 window must be unbound before it is bound
/// again (IBA 10.6.7.2.2), hence the LOCAL_INV after each bind.
pub fn bind_rate<B: Backend>(
    pd: &B::Pd,
    qp: &B::Qp,
    cq: &B::Cq,
    mr: &B::Mr,
    binds: u64,
    depth: u32,
    timeout: Duration,
) -> Res<Duration> {
    let windows = (0..(depth / 4).max(1))
        .map(|_| pd.alloc_mw(MwType::Type2))
        .collect::<verbs_api::Result<Vec<B::Mw>>>()
        .context("--mw: allocating type 2 windows")?;
    let info = MwBindInfo::whole(mr, RIGHTS);
    let mut wcs = [WorkCompletion::default(); 16];
    let mut wrs = Vec::with_capacity(2 * windows.len());
    let (mut posted, mut outstanding) = (0u64, 0u32);
    let start = Instant::now();
    while posted < binds || outstanding > 0 {
        if posted < binds && outstanding < 2 {
            let n = (windows.len() as u64).min(binds - posted) as usize;
            wrs.clear();
            for w in &windows[..n] {
                let rkey = inc_rkey(w.rkey());
                wrs.push(SendWr::bind_mw(0, w, rkey, info));
                wrs.push(SendWr::local_inv(0, rkey));
            }
            if let Some(last) = wrs.pop() {
                wrs.push(last.signaled());
            }
            qp.post_send(&wrs)
                .map_err(|e| e.error)
                .context("--mw: posting binds")?;
            posted += n as u64;
            outstanding += 1;
            continue;
        }
        let n = poll_some(cq, &mut wcs, timeout, &|| "--mw: bind completions".to_string())?;
        for wc in &wcs[..n] {
            check_wc(wc, &|| "--mw: a bind or invalidation".to_string())?;
        }
        outstanding -= n as u32;
    }
    Ok(start.elapsed())
}
