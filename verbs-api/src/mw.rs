//! Memory windows (`man ibv_alloc_mw`, `man ibv_bind_mw`, `man ibv_inc_rkey`; IBA 10.6.7):
//! `enum ibv_mw_type`, `struct ibv_mw_bind_info`, `struct ibv_mw_bind` and the
//! `bind_mw` member of `struct ibv_send_wr`.
//!
//! A window grants remote access to part of a memory region under an rkey of its own and
//! with rights of its own. The region must have been registered with
//! [`AccessFlags::MW_BIND`](crate::AccessFlags::MW_BIND) (and `LOCAL_WRITE` for a window
//! that grants remote writes or atomics). A type 1 window is bound with
//! [`QueuePair::bind_mw`](crate::QueuePair::bind_mw) and stays bound until it is bound
//! again (a zero-length bind unbinds it) or deallocated; a type 2 window is bound by an
//! `IBV_WR_BIND_MW` work request ([`SendWr::bind_mw`](crate::SendWr::bind_mw)) and is
//! tied to the QP that posted it: only requests arriving on that QP may use it, and it
//! stays bound until a `IBV_WR_LOCAL_INV` on any QP of its PD or a peer's
//! `IBV_WR_SEND_WITH_INV` invalidates it. The low byte of a window's rkey is a tag the
//! consumer chooses at each bind ([`inc_rkey`]), so an rkey handed out before a rebind
//! stops working.
//!
//! Binds and local invalidations are executed by the send queue in order with the other
//! work requests, and complete as `IBV_WC_BIND_MW` / `IBV_WC_LOCAL_INV` (a failed bind as
//! `IBV_WC_MW_BIND_ERR`, and the QP goes to ERR).

use std::fmt;

use crate::error::{Error, Result};
use crate::flags::AccessFlags;
use crate::flags::SendFlags;
use crate::traits::{MemoryRegion, MemoryWindow, QueuePair};
use crate::wr::SendWr;

/// `enum ibv_mw_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound by `ibv_bind_mw`, associated with its PD.
    Type1 = 1,
    /// `IBV_MW_TYPE_2`: bound by a `IBV_WR_BIND_MW` work request, associated with the QP
    /// that bound it (IBA's type 2B: the QP and its PD).
    Type2 = 2,
}

impl MwType {
    /// From the raw `ibv_mw_type` value.
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            1 => Some(MwType::Type1),
            2 => Some(MwType::Type2),
            _ => None,
        }
    }
}

/// `ibv_inc_rkey`: the rkey with its low byte (the tag the consumer owns) incremented,
/// wrapping within the byte. The window's index, the upper 24 bits, stays.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// `struct ibv_mw_bind_info`: what a window is bound to.
#[derive(Clone, Copy)]
pub struct MwBindInfo<'a> {
    /// The region (`None`: unbind a type 1 window; `length` must be 0 then).
    pub mr: Option<&'a dyn MemoryRegion>,
    /// The window's first address, inside the region.
    pub addr: u64,
    /// The window's length (0: unbind, type 1 only).
    pub length: u64,
    /// The remote rights the window grants (`REMOTE_READ`, `REMOTE_WRITE`,
    /// `REMOTE_ATOMIC`).
    pub mw_access_flags: AccessFlags,
}

impl<'a> MwBindInfo<'a> {
    /// A window over `length` bytes at `offset` into `mr`, granting `access`.
    pub fn new(mr: &'a dyn MemoryRegion, offset: u64, length: u64, access: AccessFlags) -> Self {
        MwBindInfo {
            mr: Some(mr),
            addr: mr.addr().wrapping_add(offset),
            length,
            mw_access_flags: access,
        }
    }

    /// A window over the whole of `mr`, granting `access`.
    pub fn whole(mr: &'a dyn MemoryRegion, access: AccessFlags) -> Self {
        Self::new(mr, 0, mr.len() as u64, access)
    }

    /// No region: a type 1 window bound to this is unbound (`man ibv_bind_mw`).
    pub fn unbound() -> Self {
        MwBindInfo {
            mr: None,
            addr: 0,
            length: 0,
            mw_access_flags: AccessFlags::empty(),
        }
    }
}

impl fmt::Debug for MwBindInfo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MwBindInfo")
            .field("mr_lkey", &self.mr.map(|m| format!("{:#x}", m.lkey())))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("length", &self.length)
            .field("mw_access_flags", &self.mw_access_flags)
            .finish()
    }
}

impl PartialEq for MwBindInfo<'_> {
    /// The same region (by identity), range and rights.
    fn eq(&self, other: &Self) -> bool {
        let same_mr = match (self.mr, other.mr) {
            (Some(a), Some(b)) => std::ptr::addr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same_mr
            && self.addr == other.addr
            && self.length == other.length
            && self.mw_access_flags == other.mw_access_flags
    }
}

impl Eq for MwBindInfo<'_> {}

/// `wr.bind_mw` of `struct ibv_send_wr`: the window an `IBV_WR_BIND_MW` binds, the rkey it
/// gets, and what it is bound to.
#[derive(Clone, Copy)]
pub struct BindMw<'a> {
    /// The window (`wr.bind_mw.mw`).
    pub mw: &'a dyn MemoryWindow,
    /// The window's rkey after the bind (`wr.bind_mw.rkey`): its index with the tag the
    /// consumer chose, usually [`inc_rkey`] of the current one.
    pub rkey: u32,
    /// What it is bound to (`wr.bind_mw.bind_info`).
    pub bind_info: MwBindInfo<'a>,
}

impl fmt::Debug for BindMw<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BindMw")
            .field("mw_rkey", &format_args!("{:#x}", self.mw.rkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("bind_info", &self.bind_info)
            .finish()
    }
}

impl PartialEq for BindMw<'_> {
    /// The same window (by identity), new rkey and binding.
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(self.mw, other.mw) && self.rkey == other.rkey && self.bind_info == other.bind_info
    }
}

impl Eq for BindMw<'_> {}

/// `struct ibv_mw_bind`: the arguments of `ibv_bind_mw` for a type 1 window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBind<'a> {
    /// Returned in the bind's completion.
    pub wr_id: u64,
    /// `IBV_SEND_SIGNALED` (a completion on success) and `IBV_SEND_FENCE`.
    pub send_flags: SendFlags,
    /// What the window is bound to.
    pub bind_info: MwBindInfo<'a>,
}

impl<'a> MwBind<'a> {
    /// A signaled bind to `bind_info`.
    pub fn signaled(wr_id: u64, bind_info: MwBindInfo<'a>) -> Self {
        MwBind {
            wr_id,
            send_flags: SendFlags::SIGNALED,
            bind_info,
        }
    }
}

/// `ibv_bind_mw` as rxe's and mlx5's providers do it, after libibverbs' own checks: a
/// `IBV_WR_BIND_MW` of the type 1 window `mw` on `qp` with the rkey [`inc_rkey`] of its
/// current one, which it returns (see [`QueuePair::bind_mw`]; the check that the region
/// belongs to the window's PD is the backend's).
pub fn post_type1_bind<Q: QueuePair + ?Sized>(
    qp: &Q,
    mw: &dyn MemoryWindow,
    bind: &MwBind<'_>,
) -> Result<u32> {
    if mw.mw_type() != MwType::Type1 {
        return Err(Error::invalid(
            "ibv_bind_mw",
            "the window is of type 2: bind it with an IBV_WR_BIND_MW work request",
        ));
    }
    let info = &bind.bind_info;
    if info.mr.is_none() && (info.addr != 0 || info.length != 0) {
        return Err(Error::invalid(
            "ibv_bind_mw",
            "a bind without a memory region must have address and length 0",
        ));
    }
    let rkey = inc_rkey(mw.rkey());
    let wr = SendWr::bind_mw(bind.wr_id, mw, rkey, *info).with_flags(bind.send_flags);
    qp.post_send(&[wr]).map_err(|e| e.error)?;
    Ok(rkey)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_rotates_the_tag_only() {
        assert_eq!(inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(0xffff_ffff), 0xffff_ff00);
        assert_eq!(MwType::from_raw(2), Some(MwType::Type2));
        assert_eq!(MwType::from_raw(3), None);
    }
}
