//! Protection domains: `ibv_alloc_pd` / `ibv_dealloc_pd` (`man ibv_alloc_pd`), and the
//! factories for what belongs to a PD: memory regions (`man ibv_reg_mr`, `man
//! ibv_rereg_mr`), memory windows (`man ibv_alloc_mw`), queue pairs
//! (`man ibv_create_qp`), shared receive queues (`man ibv_create_srq`) and address handles
//! (`man ibv_create_ah`).

use std::sync::Arc;

use rdma_sys::{ibv_alloc_pd, ibv_dealloc_pd, ibv_pd};
use verbs_api::{AccessFlags, Error, MwType, ProtectionDomain, QpInitAttr, Result};

use crate::ah::IbvAh;
use crate::context::CtxInner;
use crate::cq::IbvCq;
use crate::device::IbvBackend;
use crate::errno::last_errno;
use crate::mr::IbvMr;
use crate::mw::IbvMw;
use crate::qp::IbvQp;
use crate::srq::IbvSrq;

/// The shared part of a PD; MRs, QPs, SRQs and AHs hold an `Arc` of it.
pub(crate) struct PdInner {
    pub(crate) raw: *mut ibv_pd,
    pub(crate) ctx: Arc<CtxInner>,
}

// SAFETY: `ibv_pd` is safe for multi-threaded access (crate docs); it is deallocated
// only in Drop, when no MR, QP, SRQ or AH (which hold an Arc of it) is left.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: no MR, QP, SRQ or AH of this PD is left (they hold an Arc of it), so the PD is
        // unused; deallocated once. A failure cannot be reported from Drop and leaves
        // nothing dangling on our side.
        unsafe { ibv_dealloc_pd(self.raw) };
    }
}

/// A protection domain (`struct ibv_pd`).
pub struct IbvPd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for IbvPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: the PD is live; `handle` is a plain field.
        let handle = unsafe { (*self.inner.raw).handle };
        f.debug_struct("IbvPd").field("handle", &handle).finish()
    }
}

impl IbvPd {
    /// `ibv_alloc_pd`.
    pub(crate) fn alloc(ctx: Arc<CtxInner>) -> Result<IbvPd> {
        // SAFETY: the context is open (we hold an Arc of it).
        let raw = unsafe { ibv_alloc_pd(ctx.raw) };
        if raw.is_null() {
            return Err(Error::from_errno("ibv_alloc_pd", last_errno()));
        }
        Ok(IbvPd {
            inner: Arc::new(PdInner { raw, ctx }),
        })
    }

    /// The `struct ibv_pd *`, valid while this PD or any of its MRs and QPs lives.
    pub fn as_raw(&self) -> *mut ibv_pd {
        self.inner.raw
    }
}

impl ProtectionDomain for IbvPd {
    type Backend = IbvBackend;

    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<IbvMr> {
        IbvMr::register_owned(self.inner.clone(), len, access)
    }

    unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<IbvMr> {
        // SAFETY: forwarded caller contract: `addr..addr + len` stays valid until the MR
        // is dropped and is accessed only through raw pointers meanwhile.
        unsafe { IbvMr::register_borrowed(self.inner.clone(), addr, len, access) }
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, IbvCq, IbvSrq>) -> Result<IbvQp> {
        IbvQp::create(self.inner.clone(), attr)
    }

    fn create_srq(&self, attr: &verbs_api::SrqAttr) -> Result<IbvSrq> {
        IbvSrq::create(self.inner.clone(), attr)
    }

    fn create_ah(&self, attr: &verbs_api::AhAttr) -> Result<IbvAh> {
        IbvAh::create(self.inner.clone(), attr)
    }

    fn alloc_mw(&self, mw_type: MwType) -> Result<IbvMw> {
        IbvMw::alloc(self.inner.clone(), mw_type)
    }

    fn rereg_mr(&self, mr: &mut IbvMr, access: Option<AccessFlags>) -> Result<()> {
        // SAFETY: no new translation: the region keeps the memory it was registered over.
        unsafe { mr.rereg(&self.inner, None, access) }
    }

    unsafe fn rereg_mr_raw(
        &self,
        mr: &mut IbvMr,
        addr: *mut u8,
        len: usize,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        // SAFETY: forwarded caller contract for the new memory.
        unsafe { mr.rereg(&self.inner, Some((addr, len)), access) }
    }
}
