//! Memory windows (`ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw`): the handle of a
//! window in the device's table (`backend_sim_proto::window`), and what a bind posted
//! through a QP names.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use verbs_api::{BindMw, Error, MemoryWindow, MwType, Result};

use crate::device::{DeviceShared, PdShared};
use backend_sim_proto::window::{BindReq, MwShared};

/// A memory window of the sim. Dropping it deallocates it (`ibv_dealloc_mw`), bound or
/// not: its rkey is refused from then on.
pub struct SimMw {
    pub(crate) mw: Arc<MwShared>,
    pub(crate) pd: Arc<PdShared>,
    /// The rkey as the application holds it (`ibv_mw::rkey`, see
    /// [`MemoryWindow::rkey`]): the window's own may differ after a failed bind.
    rkey: AtomicU32,
}

impl SimMw {
    pub(crate) fn new(mw: Arc<MwShared>, pd: Arc<PdShared>) -> SimMw {
        let rkey = AtomicU32::new(mw.rkey());
        SimMw { mw, pd, rkey }
    }

    /// Sets the rkey the handle holds, as a C program writes `ibv_mw::rkey` (the C ABI
    /// keeps the two the same: a bind names the window by it).
    pub fn set_rkey(&self, rkey: u32) {
        self.rkey.store(rkey, Ordering::Relaxed);
    }

    /// The PD handle the window belongs to.
    pub fn pd_handle(&self) -> u32 {
        self.pd.handle
    }
}

impl MemoryWindow for SimMw {
    fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Relaxed)
    }
    fn mw_type(&self) -> MwType {
        self.mw.mw_type
    }
}

impl Drop for SimMw {
    fn drop(&mut self) {
        self.pd.dev.mrs.dealloc_window(&self.mw);
    }
}

impl std::fmt::Debug for SimMw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMw")
            .field("type", &self.mw.mw_type)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

/// The bind a `IBV_WR_BIND_MW` on device `dev` asks for, resolved for the send queue:
/// the window must be a window of the sim on that device (EINVAL otherwise). The
/// window's handle takes the new rkey (see [`MemoryWindow::rkey`]).
pub(crate) fn bind_req(b: &BindMw<'_>, dev: &Arc<DeviceShared>) -> Result<BindReq> {
    let mw =
        b.mw.downcast_ref::<SimMw>()
            .filter(|m| Arc::ptr_eq(&m.pd.dev, dev))
            .ok_or_else(|| {
                Error::invalid(
                    "ibv_post_send",
                    "wr.bind_mw.mw is not a memory window of this device",
                )
            })?;
    let info = &b.bind_info;
    if info.mr.is_none() && info.length != 0 {
        return Err(Error::invalid(
            "ibv_post_send",
            "a bind without a memory region must have length 0",
        ));
    }
    let req = BindReq {
        mw: mw.mw.clone(),
        mw_rkey: mw.rkey(),
        new_rkey: b.rkey,
        mr_key: info.mr.map(|m| m.lkey()),
        addr: info.addr,
        len: info.length,
        access: info.mw_access_flags,
    };
    Ok(req)
}

/// The window of a bind posted: its handle now holds the new rkey.
pub(crate) fn bound(b: &BindMw<'_>) {
    if let Some(mw) = b.mw.downcast_ref::<SimMw>() {
        mw.set_rkey((mw.rkey() & !0xff) | (b.rkey & 0xff));
    }
}
