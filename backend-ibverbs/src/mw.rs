//! Memory windows: `ibv_alloc_mw` / `ibv_dealloc_mw` (`man ibv_alloc_mw`), and what a
//! `IBV_WR_BIND_MW` work request needs of them (`man ibv_bind_mw`).
//!
//! A window's rkey lives in its `struct ibv_mw`, which the provider reads when a bind
//! names the window (rxe and mlx5 pass `mw->rkey` to the device, which refuses a bind
//! whose window rkey is stale) and which a type 1 bind updates. This API updates it for
//! both types once a bind is posted ([`verbs_api::MemoryWindow::rkey`]); the field is
//! written and read by posts only while the window's lock is held, so two threads that
//! post binds of one window do not race on it.

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use rdma_sys::{ibv_alloc_mw, ibv_dealloc_mw, ibv_mw, ibv_mw_type};
use verbs_api::{BindMw, Error, MemoryWindow, MwType, Result};

use crate::errno::last_errno;
use crate::pd::PdInner;

/// A memory window (`struct ibv_mw`). Dropping it is `ibv_dealloc_mw`.
pub struct IbvMw {
    raw: *mut ibv_mw,
    mw_type: MwType,
    /// Serialises the posts of binds of this window (see the module docs).
    lock: Mutex<()>,
    pub(crate) pd: Arc<PdInner>,
}

// SAFETY: `ibv_mw` is safe for multi-threaded access (crate docs); its `rkey` field is
// written only under `lock`.
unsafe impl Send for IbvMw {}
// SAFETY: as above.
unsafe impl Sync for IbvMw {}

impl std::fmt::Debug for IbvMw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvMw")
            .field("type", &self.mw_type)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl IbvMw {
    /// `ibv_alloc_mw`.
    pub(crate) fn alloc(pd: Arc<PdInner>, mw_type: MwType) -> Result<IbvMw> {
        let t = match mw_type {
            MwType::Type1 => ibv_mw_type::IBV_MW_TYPE_1,
            MwType::Type2 => ibv_mw_type::IBV_MW_TYPE_2,
        };
        // SAFETY: the PD is live (we hold an Arc of it).
        let raw = unsafe { ibv_alloc_mw(pd.raw, t) }.unwrap_or(std::ptr::null_mut());
        if raw.is_null() {
            return Err(Error::from_errno("ibv_alloc_mw", last_errno()));
        }
        Ok(IbvMw {
            raw,
            mw_type,
            lock: Mutex::new(()),
            pd,
        })
    }

    /// The `struct ibv_mw *`, valid while this window lives.
    pub fn as_raw(&self) -> *mut ibv_mw {
        self.raw
    }

    /// Holds the window's bind lock (see the module docs).
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock()
    }

    /// Sets the rkey the `struct ibv_mw` holds to the new tag of `b` (a bind posted).
    ///
    /// The caller holds the window's lock.
    pub(crate) fn bound(&self, b: &BindMw<'_>) {
        // SAFETY: the window is live; its `rkey` is written under the lock, which the
        // caller holds, as every post that reads it does.
        unsafe { (*self.raw).rkey = ((*self.raw).rkey & !0xff) | (b.rkey & 0xff) };
    }
}

impl MemoryWindow for IbvMw {
    fn rkey(&self) -> u32 {
        let _g = self.lock.lock();
        // SAFETY: the window is live; read under the lock.
        unsafe { (*self.raw).rkey }
    }
    fn mw_type(&self) -> MwType {
        self.mw_type
    }
}

impl Drop for IbvMw {
    fn drop(&mut self) {
        // SAFETY: the window is live and deallocated once; a failure cannot be reported
        // from Drop.
        unsafe { ibv_dealloc_mw(self.raw) };
    }
}
