//! Address handles: `ibv_create_ah` / `ibv_destroy_ah` (`man ibv_create_ah`), the
//! destination of UD sends.
//!
//! An AH keeps its PD (and so the context) alive. A send WR names it by reference
//! ([`verbs_api::SendWr::ud`]); `post.rs` recognises this backend's handles by type and
//! refuses any other (another backend's, or one of another device context, whose provider
//! would read it as its own structure) with EINVAL before the provider sees it.

use std::sync::Arc;

use rdma_sys::{ibv_ah, ibv_create_ah, ibv_destroy_ah};
use verbs_api::{AddressHandle, AhAttr, Context, Error, LinkLayer, Result};

use crate::context::IbvContext;
use crate::errno::last_errno;
use crate::pd::PdInner;
use crate::qp::ah_to_raw;

/// An address handle (`struct ibv_ah`).
pub struct IbvAh {
    pub(crate) raw: *mut ibv_ah,
    attr: AhAttr,
    pub(crate) pd: Arc<PdInner>,
}

// SAFETY: `ibv_ah` is safe for multi-threaded access (crate docs); providers only read it
// when a WR is posted. Destroyed only in Drop.
unsafe impl Send for IbvAh {}
// SAFETY: as above.
unsafe impl Sync for IbvAh {}

impl std::fmt::Debug for IbvAh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvAh").field("attr", &self.attr).finish()
    }
}

impl Drop for IbvAh {
    fn drop(&mut self) {
        // SAFETY: the AH is live and destroyed once; its PD outlives it (Arc held in a
        // field, dropped after this). Providers copy the address vector into each WQE (or
        // look the handle up when the WR executes and fail it if it is gone), so a WR
        // posted with it does not read freed memory.
        unsafe { ibv_destroy_ah(self.raw) };
    }
}

impl IbvAh {
    /// `ibv_create_ah`.
    pub(crate) fn create(pd: Arc<PdInner>, attr: &AhAttr) -> Result<IbvAh> {
        let mut raw_attr = ah_to_raw(attr);
        // SAFETY: the PD is live (we hold an Arc); `raw_attr` is a valid attribute struct.
        let raw = unsafe { ibv_create_ah(pd.raw, &mut raw_attr) };
        if raw.is_null() {
            return Err(create_error(&pd, attr, last_errno()));
        }
        Ok(IbvAh { raw, attr: *attr, pd })
    }

    /// The `struct ibv_ah *`, valid while this AH lives.
    pub fn as_raw(&self) -> *mut ibv_ah {
        self.raw
    }
}

/// Why `ibv_create_ah` refused `attr`.
#[cold]
fn create_error(pd: &Arc<PdInner>, attr: &AhAttr, errno: i32) -> Error {
    let ctx = IbvContext {
        inner: pd.ctx.clone(),
    };
    let port = ctx.query_port(attr.port_num);
    match errno {
        libc::EINVAL => {
            let reason = match &port {
                Err(_) => format!("port {} does not exist on {}", attr.port_num, ctx.inner.name),
                Ok(p) if p.link_layer == LinkLayer::Ethernet && !attr.is_global => format!(
                    "port {} of {} is Ethernet (RoCE): an address handle needs the GRH \
                     (is_global with dgid and sgid_index)",
                    attr.port_num, ctx.inner.name
                ),
                Ok(p) if attr.is_global && u32::from(attr.grh.sgid_index) >= p.gid_tbl_len => format!(
                    "sgid_index {} is past the GID table of port {} ({} entries)",
                    attr.grh.sgid_index, attr.port_num, p.gid_tbl_len
                ),
                Ok(_) => format!(
                    "the address vector (dlid {}, sl {}, static_rate {}, is_global {}, sgid_index {}) \
                     is not valid for port {}",
                    attr.dlid, attr.sl, attr.static_rate, attr.is_global, attr.grh.sgid_index, attr.port_num
                ),
            };
            Error::invalid("ibv_create_ah", reason)
        }
        // The kernel's GID cache has no entry there (rdma_get_gid_attr: -ENODATA).
        libc::ENODATA => Error::InvalidAttr {
            name: "grh.sgid_index",
            reason: format!(
                "no GID at index {} of port {} on {} (ibv_create_ah: ENODATA)",
                attr.grh.sgid_index, attr.port_num, ctx.inner.name
            ),
        },
        libc::ENOMEM => Error::NoMemory {
            call: "ibv_create_ah",
            reason: "cannot allocate an address handle".into(),
        },
        libc::EOPNOTSUPP | libc::ENOSYS => Error::Unsupported {
            backend: "ibverbs",
            what: format!("address handles on {}", ctx.inner.name),
        },
        e => Error::from_errno("ibv_create_ah", e),
    }
}

impl AddressHandle for IbvAh {
    fn attr(&self) -> AhAttr {
        self.attr
    }
}
