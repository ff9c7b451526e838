//! Multicast (`man ibv_attach_mcast`): attaching a UD QP to a group and detaching it,
//! served by the sim's groups (`backend_sim`'s multicast: uverbs' rules, the profile's
//! limits). `ibv_destroy_qp` of an attached QP is EBUSY (see [`crate::qp`]).

use std::ffi::c_int;

use verbs_api::{Gid, QueuePair};

use crate::abi::{ibv_gid, ibv_qp};
use crate::ffi::{errno_of, errno_verb};
use crate::qp::Qp;

/// `ibv_attach_mcast`: 0, or EINVAL (not a multicast GID, not a UD QP, on InfiniBand a
/// LID below 0xc000) or ENOMEM (the device's limits).
pub(crate) unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    errno_verb("ibv_attach_mcast", || {
        // SAFETY: looked up, used within this call.
        let q = unsafe { Qp::get(qp) }?;
        let gid = read_gid(gid)?;
        q.sim
            .attach_mcast(&gid, lid)
            .map_err(|e| errno_of("ibv_attach_mcast", &e))
    })
}

/// `ibv_detach_mcast`: 0, or EINVAL (the QP is not attached with this GID and LID).
pub(crate) unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    errno_verb("ibv_detach_mcast", || {
        // SAFETY: looked up, used within this call.
        let q = unsafe { Qp::get(qp) }?;
        let gid = read_gid(gid)?;
        q.sim
            .detach_mcast(&gid, lid)
            .map_err(|e| errno_of("ibv_detach_mcast", &e))
    })
}

fn read_gid(gid: *const ibv_gid) -> Result<Gid, c_int> {
    if gid.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the program passes a `union ibv_gid *` (16 bytes, any alignment is read
    // unaligned); both members are plain bytes.
    Ok(Gid(unsafe { gid.read_unaligned().raw }))
}
