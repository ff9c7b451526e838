//! Shared receive queues: `ibv_create_srq` / `ibv_destroy_srq`, `ibv_modify_srq`,
//! `ibv_query_srq` and `ibv_post_srq_recv` (`man ibv_create_srq`, `man ibv_modify_srq`,
//! `man ibv_query_srq`, `man ibv_post_srq_recv`).
//!
//! Each SRQ gets a handle, unique within its context, stored in `srq_context`, so that the
//! async thread names it in `IBV_EVENT_SRQ_LIMIT_REACHED` (and `IBV_EVENT_SRQ_ERR`) the way
//! [`SharedReceiveQueue::handle`] does. An SRQ keeps its PD alive and every QP created on it
//! keeps it alive, so `ibv_destroy_srq` never meets a QP that still uses it (libibverbs
//! would refuse with EBUSY). Before it is destroyed the SRQ leaves the registry and waits
//! until the events the application took for it are acknowledged.
//!
//! Posting is `post.rs`'s receive path with `ibv_post_srq_recv` as the provider call: the
//! same one-WR fast path, the same partial-list rule (the WRs before the failing one are
//! posted), ENOMEM past the capacity.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdma_sys::ibv_device_cap_flags;
use rdma_sys::{ibv_create_srq, ibv_destroy_srq, ibv_modify_srq, ibv_post_srq_recv, ibv_query_srq};
use rdma_sys::{ibv_recv_wr, ibv_srq, ibv_srq_attr, ibv_srq_init_attr};
use verbs_api::{
    AsyncElement, Context, Error, PostError, RecvWr, Result, SharedReceiveQueue, SrqAttr, SrqAttrMask,
};

use crate::context::IbvContext;
use crate::errno::{last_errno, rc_errno};
use crate::pd::PdInner;
use crate::post::RecvQueue;

/// The shared part of an SRQ; QPs created on it hold an `Arc` of it.
pub(crate) struct SrqInner {
    pub(crate) raw: *mut ibv_srq,
    handle: u32,
    pub(crate) pd: Arc<PdInner>,
}

// SAFETY: `ibv_srq` is safe for multi-threaded access (crate docs: providers lock their
// queues); destroyed only in Drop, when no QP uses it (they hold an Arc of it).
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let registry = &self.pd.ctx.registry;
        // Leave the table first, so that no event for this SRQ is queued after `forget`.
        registry.srqs.lock().remove(&self.handle);
        registry.events.forget(AsyncElement::Srq(self.handle));
        // SAFETY: no QP uses the SRQ (they hold an Arc of it); destroyed once. The async
        // thread acknowledged every libibverbs event for it, so the call does not wait.
        unsafe { ibv_destroy_srq(self.raw) };
    }
}

/// A shared receive queue (`struct ibv_srq`).
pub struct IbvSrq {
    pub(crate) inner: Arc<SrqInner>,
}

impl std::fmt::Debug for IbvSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvSrq")
            .field("handle", &self.inner.handle)
            .finish()
    }
}

fn attr_to_raw(a: &SrqAttr) -> ibv_srq_attr {
    ibv_srq_attr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

fn attr_from_raw(a: &ibv_srq_attr) -> SrqAttr {
    SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

impl IbvSrq {
    /// `ibv_create_srq` with `srq_context` = a fresh handle of the PD's context.
    pub(crate) fn create(pd: Arc<PdInner>, attr: &SrqAttr) -> Result<IbvSrq> {
        let registry = &pd.ctx.registry;
        let handle = registry.next_srq_handle.fetch_add(1, Ordering::Relaxed);
        // Enter the table before the SRQ exists, so that no event can miss it.
        registry.srqs.lock().insert(handle);
        let mut init = ibv_srq_init_attr {
            srq_context: handle as usize as *mut c_void,
            attr: attr_to_raw(attr),
        };
        // SAFETY: the PD is live (we hold an Arc); `init` is a valid attribute struct that
        // the provider writes the granted sizes back into.
        let raw = unsafe { ibv_create_srq(pd.raw, &mut init) };
        if raw.is_null() {
            let e = last_errno();
            registry.srqs.lock().remove(&handle);
            return Err(create_error(&pd, attr, e));
        }
        Ok(IbvSrq {
            inner: Arc::new(SrqInner { raw, handle, pd }),
        })
    }

    /// The `struct ibv_srq *`, valid while this SRQ or a QP using it lives.
    pub fn as_raw(&self) -> *mut ibv_srq {
        self.inner.raw
    }
}

/// Why `ibv_create_srq` refused `attr`, in the device's limits.
#[cold]
fn create_error(pd: &Arc<PdInner>, attr: &SrqAttr, errno: i32) -> Error {
    let ctx = IbvContext {
        inner: pd.ctx.clone(),
    };
    match errno {
        libc::EINVAL => {
            let limits = ctx.query_device().map_or(String::new(), |d| {
                format!(
                    " (the device allows max_wr 1..={}, max_sge up to {})",
                    d.max_srq_wr, d.max_srq_sge
                )
            });
            Error::invalid(
                "ibv_create_srq",
                format!(
                    "max_wr {} / max_sge {} is out of range{limits}",
                    attr.max_wr, attr.max_sge
                ),
            )
        }
        libc::ENOMEM => Error::NoMemory {
            call: "ibv_create_srq",
            reason: format!(
                "cannot allocate an SRQ of {} receives of {} SGEs (or max_srq is reached)",
                attr.max_wr, attr.max_sge
            ),
        },
        libc::EOPNOTSUPP | libc::ENOSYS => Error::Unsupported {
            backend: "ibverbs",
            what: format!("shared receive queues on {}", ctx.inner.name),
        },
        e => Error::from_errno("ibv_create_srq", e),
    }
}

impl SrqInner {
    fn query(&self) -> Result<SrqAttr> {
        let mut a = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 0,
        };
        // SAFETY: the SRQ is live; `a` is a writable out-parameter.
        let rc = unsafe { ibv_query_srq(self.raw, &mut a) };
        if rc != 0 {
            return Err(Error::from_errno("ibv_query_srq", rc_errno(rc)));
        }
        Ok(attr_from_raw(&a))
    }

    /// Why `ibv_modify_srq` refused `attr` under `mask`, from the SRQ's current state.
    #[cold]
    fn modify_error(&self, attr: &SrqAttr, mask: SrqAttrMask, errno: i32) -> Error {
        let cur = self.query().ok();
        let ctx = IbvContext {
            inner: self.pd.ctx.clone(),
        };
        let resizable = ctx
            .query_device()
            .map(|d| d.device_cap_flags & ibv_device_cap_flags::IBV_DEVICE_SRQ_RESIZE.0 != 0)
            .unwrap_or(true);
        if mask.contains(SrqAttrMask::MAX_WR)
            && !resizable
            && matches!(errno, libc::EINVAL | libc::EOPNOTSUPP)
        {
            return Error::Unsupported {
                backend: "ibverbs",
                what: format!(
                    "resizing an SRQ (IBV_SRQ_MAX_WR): {} lacks IBV_DEVICE_SRQ_RESIZE",
                    ctx.inner.name
                ),
            };
        }
        match errno {
            libc::EINVAL => {
                let mut why = Vec::new();
                if mask.contains(SrqAttrMask::LIMIT) {
                    match cur {
                        Some(c) if attr.srq_limit > c.max_wr => why.push(format!(
                            "srq_limit {} exceeds the {} receives the SRQ holds",
                            attr.srq_limit, c.max_wr
                        )),
                        _ => why.push(format!("srq_limit {}", attr.srq_limit)),
                    }
                }
                if mask.contains(SrqAttrMask::MAX_WR) {
                    let limit = cur.map_or(String::new(), |c| format!(" (armed limit {})", c.srq_limit));
                    why.push(format!(
                        "max_wr {} is 0, above the device's max_srq_wr, below the armed limit{limit} \
                         or below the receives posted now",
                        attr.max_wr
                    ));
                }
                if why.is_empty() {
                    why.push(format!("attribute mask {mask:?}"));
                }
                Error::invalid(
                    "ibv_modify_srq",
                    format!("{}; nothing was modified", why.join("; ")),
                )
            }
            libc::EOPNOTSUPP | libc::ENOSYS => Error::Unsupported {
                backend: "ibverbs",
                what: format!("ibv_modify_srq with {mask:?} on {}", ctx.inner.name),
            },
            e => Error::from_errno("ibv_modify_srq", e),
        }
    }
}

impl RecvQueue for SrqInner {
    #[inline(always)]
    unsafe fn post_raw(&self, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
        // SAFETY: the SRQ is live; the caller passes a valid WR list and out-pointer.
        unsafe { ibv_post_srq_recv(self.raw, wr, bad) }
    }

    #[cold]
    #[inline(never)]
    fn post_error(&self, errno: i32, index: usize, wr_id: u64) -> PostError {
        let error = match errno {
            libc::ENOMEM => Error::NoMemory {
                call: "ibv_post_srq_recv",
                reason: format!(
                    "SRQ {} is full: {} receives are posted",
                    self.handle,
                    self.query()
                        .map_or_else(|_| "all its".into(), |a| a.max_wr.to_string())
                ),
            },
            libc::EINVAL => Error::invalid(
                "ibv_post_srq_recv",
                format!(
                    "the provider refused WR #{index} (EINVAL): more SGEs than the SRQ's max_sge ({})",
                    self.query()
                        .map_or_else(|_| "?".into(), |a| a.max_sge.to_string())
                ),
            ),
            e => Error::from_errno("ibv_post_srq_recv", e),
        };
        PostError { index, wr_id, error }
    }
}

impl SharedReceiveQueue for IbvSrq {
    #[inline]
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        crate::post::post_recv(&*self.inner, wrs)
    }

    fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        let mut raw = attr_to_raw(attr);
        // SAFETY: the SRQ is live; `raw` is a valid attribute struct; the mask bits are
        // libibverbs' IBV_SRQ_* values (checked in the tests).
        let rc = unsafe { ibv_modify_srq(self.inner.raw, &mut raw, mask.bits() as c_int) };
        if rc == 0 {
            return Ok(());
        }
        Err(self.inner.modify_error(attr, mask, rc_errno(rc)))
    }

    fn query(&self) -> Result<SrqAttr> {
        self.inner.query()
    }

    fn handle(&self) -> u32 {
        self.inner.handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys::ibv_srq_attr_mask as M;

    #[test]
    fn mask_bits_match_verbs_h() {
        assert_eq!(SrqAttrMask::MAX_WR.bits(), M::IBV_SRQ_MAX_WR.0);
        assert_eq!(SrqAttrMask::LIMIT.bits(), M::IBV_SRQ_LIMIT.0);
    }

    #[test]
    fn attr_roundtrip() {
        let a = SrqAttr::new(100, 3).with_limit(7);
        let r = attr_to_raw(&a);
        assert_eq!((r.max_wr, r.max_sge, r.srq_limit), (100, 3, 7));
        assert_eq!(attr_from_raw(&r), a);
    }
}
