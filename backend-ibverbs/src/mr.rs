//! Memory regions: `ibv_reg_mr` / `ibv_dereg_mr` (`man ibv_reg_mr`).
//!
//! [`ProtectionDomain::reg_mr`](verbs_api::ProtectionDomain::reg_mr) allocates a zeroed,
//! page-aligned buffer and registers it; the MR owns the buffer and frees it after
//! `ibv_dereg_mr`. `reg_mr_raw` registers caller memory. Either way the region is entered
//! in the context's table of registered spans (used to check inline SGEs) and removed
//! again, under the table's write lock, before it is deregistered.

use std::alloc::Layout;
use std::sync::Arc;

use rdma_sys::{ibv_dereg_mr, ibv_mr, ibv_reg_mr, ibv_rereg_mr, ibv_rereg_mr_flags};
use verbs_api::{AccessFlags, Error, MemoryRegion, Result};

use crate::async_events::MrSpan;
use crate::errno::last_errno;
use crate::pd::PdInner;

/// Alignment of buffers from `reg_mr`: one page.
const PAGE: usize = 4096;

/// A registered memory region (`struct ibv_mr`).
pub struct IbvMr {
    raw: *mut ibv_mr,
    addr: *mut u8,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    /// The layout of the buffer this MR owns (from `reg_mr`), `None` for `reg_mr_raw`.
    owned: Option<Layout>,
    pub(crate) pd: Arc<PdInner>,
}

// SAFETY: `ibv_mr` is safe for multi-threaded access (crate docs). The buffer is only
// accessed through raw pointers (the MemoryRegion accessors copy with raw pointers, as
// the HCA does), so sharing the pointer between threads is what the trait allows.
unsafe impl Send for IbvMr {}
// SAFETY: as above.
unsafe impl Sync for IbvMr {}

impl std::fmt::Debug for IbvMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvMr")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

impl IbvMr {
    /// Allocates a zeroed page-aligned buffer of `len` bytes (at least one, so that a
    /// zero-length region still has an address to register) and registers it.
    pub(crate) fn register_owned(pd: Arc<PdInner>, len: usize, access: AccessFlags) -> Result<IbvMr> {
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|_| Error::invalid("ibv_reg_mr", format!("cannot allocate {len} bytes")))?;
        // SAFETY: the layout has a non-zero size.
        let addr = unsafe { std::alloc::alloc_zeroed(layout) };
        if addr.is_null() {
            return Err(Error::NoMemory {
                call: "ibv_reg_mr",
                reason: format!("allocating a buffer of {len} bytes failed"),
            });
        }
        // SAFETY: `addr..addr + layout.size()` is our fresh allocation, valid until we
        // free it, which happens only after deregistration (Drop) or right below.
        match unsafe { Self::register(pd, addr, len, layout.size(), access, Some(layout)) } {
            Ok(mr) => Ok(mr),
            Err(e) => {
                // SAFETY: registration failed, so nothing else refers to the buffer.
                unsafe { std::alloc::dealloc(addr, layout) };
                Err(e)
            }
        }
    }

    /// Registers caller memory.
    ///
    /// # Safety
    ///
    /// As [`ProtectionDomain::reg_mr_raw`](verbs_api::ProtectionDomain::reg_mr_raw).
    pub(crate) unsafe fn register_borrowed(
        pd: Arc<PdInner>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<IbvMr> {
        // SAFETY: forwarded caller contract.
        unsafe { Self::register(pd, addr, len, len, access, None) }
    }

    /// `ibv_reg_mr` of `reg_len` bytes at `addr`, presented as a region of `len` bytes.
    ///
    /// # Safety
    ///
    /// `addr..addr + reg_len` is valid for reads and writes until the MR is dropped.
    unsafe fn register(
        pd: Arc<PdInner>,
        addr: *mut u8,
        len: usize,
        reg_len: usize,
        access: AccessFlags,
        owned: Option<Layout>,
    ) -> Result<IbvMr> {
        let flags = access.bits() as std::os::raw::c_int;
        // SAFETY: the PD is live (we hold an Arc); the memory is valid (caller contract).
        let raw = unsafe { ibv_reg_mr(pd.raw, addr.cast(), reg_len, flags) };
        if raw.is_null() {
            let e = last_errno();
            return Err(match e {
                libc::EINVAL if !access.is_valid_for_mr() => Error::invalid(
                    "ibv_reg_mr",
                    format!("access {access:?}: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE"),
                ),
                libc::EINVAL => Error::invalid(
                    "ibv_reg_mr",
                    format!("the device refused {reg_len} bytes at {addr:p} with access {access:?}"),
                ),
                libc::EFAULT => Error::BadAddress {
                    call: "ibv_reg_mr",
                    reason: format!(
                        "the kernel could not pin {reg_len} bytes at {addr:p} with access {access:?} \
                         (a page not mapped, or not writable where writes are asked)"
                    ),
                },
                libc::ENOMEM => Error::NoMemory {
                    call: "ibv_reg_mr",
                    reason: format!("cannot pin or register {reg_len} bytes"),
                },
                e => Error::from_errno("ibv_reg_mr", e),
            });
        }
        // SAFETY: `raw` is a live MR; lkey/rkey are plain fields.
        let (lkey, rkey) = unsafe { ((*raw).lkey, (*raw).rkey) };
        pd.ctx.registry.mrs.write().insert(
            lkey,
            MrSpan {
                addr: addr as u64,
                len: len as u64,
            },
        );
        Ok(IbvMr {
            raw,
            addr,
            len,
            lkey,
            rkey,
            access,
            owned,
            pd,
        })
    }

    /// The `struct ibv_mr *`, valid while this MR lives.
    pub fn as_raw(&self) -> *mut ibv_mr {
        self.raw
    }

    /// `ibv_rereg_mr`: moves the region to `pd` (if it is another), to `translation`
    /// (if given) and to `access` (if given). On success the keys are what the provider
    /// says now, and a buffer the region owned and no longer covers is freed; on failure
    /// the region is as it was (`IBV_REREG_MR_ERR_INPUT`: the provider refused before
    /// changing anything).
    ///
    /// # Safety
    ///
    /// A `translation` must stay valid as [`ProtectionDomain::reg_mr_raw`] requires.
    ///
    /// [`ProtectionDomain::reg_mr_raw`]: verbs_api::ProtectionDomain::reg_mr_raw
    pub(crate) unsafe fn rereg(
        &mut self,
        pd: &Arc<PdInner>,
        translation: Option<(*mut u8, usize)>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        let mut flags = 0;
        if !Arc::ptr_eq(pd, &self.pd) {
            flags |= ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_PD.0;
        }
        if translation.is_some() {
            flags |= ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_TRANSLATION.0;
        }
        if access.is_some() {
            flags |= ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_ACCESS.0;
        }
        if flags == 0 {
            return Ok(());
        }
        if !Arc::ptr_eq(&pd.ctx, &self.pd.ctx) {
            return Err(Error::invalid(
                "ibv_rereg_mr",
                "the PD belongs to another device context than the region",
            ));
        }
        let (addr, len) = translation.unwrap_or((std::ptr::null_mut(), 0));
        let acc = access.unwrap_or(self.access);
        // Out of the span table while it changes, as for a deregistration.
        let ctx = self.pd.ctx.clone();
        let mut spans = ctx.registry.mrs.write();
        let old = spans.remove(&self.lkey);
        // SAFETY: the MR and the PD are live; a new translation is valid (caller
        // contract); the old memory stays allocated until the call has returned.
        let rc = unsafe {
            ibv_rereg_mr(
                self.raw,
                flags as i32,
                pd.raw,
                addr.cast(),
                len,
                acc.bits() as i32,
            )
        };
        if rc != 0 {
            let e = last_errno();
            if let Some(span) = old {
                spans.insert(self.lkey, span);
            }
            return Err(Error::from_errno("ibv_rereg_mr", e));
        }
        // SAFETY: `raw` is a live MR the call updated; plain fields.
        let (lkey, rkey) = unsafe { ((*self.raw).lkey, (*self.raw).rkey) };
        if let Some((a, l)) = translation {
            if let Some(layout) = self.owned.take() {
                // SAFETY: the buffer came from `alloc_zeroed(layout)` and the region no
                // longer covers it.
                unsafe { std::alloc::dealloc(self.addr, layout) };
            }
            self.addr = a;
            self.len = l;
        }
        self.lkey = lkey;
        self.rkey = rkey;
        self.access = acc;
        self.pd = pd.clone();
        spans.insert(
            lkey,
            MrSpan {
                addr: self.addr as u64,
                len: self.len as u64,
            },
        );
        Ok(())
    }
}

impl Drop for IbvMr {
    fn drop(&mut self) {
        // First leave the span table: the write lock waits for inline posts that are
        // reading this region right now, and later ones no longer find it.
        self.pd.ctx.registry.mrs.write().remove(&self.lkey);
        // SAFETY: the MR is live and deregistered once.
        let rc = unsafe { ibv_dereg_mr(self.raw) };
        if let Some(layout) = self.owned {
            if rc == 0 {
                // SAFETY: the buffer came from `alloc_zeroed(layout)`, and after a
                // successful deregistration the HCA can no longer touch it.
                unsafe { std::alloc::dealloc(self.addr, layout) };
            }
            // On failure the registration may still be live: the buffer is leaked on
            // purpose, since the HCA or a peer could still write it.
        }
    }
}

// SAFETY: `addr..addr + len` is valid for reads and writes while the MR exists: an owned
// buffer is freed only in Drop (after deregistration); borrowed memory is valid until the
// MR is dropped by the contract of `reg_mr_raw`.
unsafe impl MemoryRegion for IbvMr {
    fn as_ptr(&self) -> *mut u8 {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn lkey(&self) -> u32 {
        self.lkey
    }

    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn access(&self) -> AccessFlags {
        self.access
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys::ibv_access_flags as A;

    #[test]
    fn access_flag_values_match_verbs_h() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), A::IBV_ACCESS_LOCAL_WRITE.0);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), A::IBV_ACCESS_REMOTE_WRITE.0);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), A::IBV_ACCESS_REMOTE_READ.0);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), A::IBV_ACCESS_REMOTE_ATOMIC.0);
    }
}
