//! Memory windows' data (`enum ibv_mw_type`, `struct ibv_mw_bind_info`, `struct
//! ibv_mw_bind`, the `bind_mw` member of `struct ibv_send_wr`, `ibv_inc_rkey`) and the
//! window itself as a trait. Work requests carry these, so they sit below the work
//! requests and the verbs traits; the public paths and the rules of binding are in
//! [`crate::mw`].

use std::fmt;

use crate::flags::{AccessFlags, SendFlags};
use crate::mr::MemoryRegion;

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

/// A memory window (`struct ibv_mw`, see [`crate::mw`]). A work request names it by
/// reference ([`crate::BindMw`]), so a backend recognises its own windows (the trait is
/// `Any`) and refuses another backend's with EINVAL.
pub trait MemoryWindow: std::any::Any + Send + Sync {
    /// The window's rkey as the application holds it (`ibv_mw::rkey`): the one it was
    /// allocated with, then the rkey of the last bind posted for it (as rxe's and mlx5's
    /// `ibv_bind_mw` update it for a type 1 window; this API does the same for a type 2
    /// window bound through [`SendWr::bind_mw`](crate::SendWr::bind_mw)). A bind that
    /// fails in the send queue leaves the window's real rkey as it was.
    fn rkey(&self) -> u32;

    /// Its type.
    fn mw_type(&self) -> MwType;
}

impl dyn MemoryWindow {
    /// The window as its backend's type `T`, if it is one.
    pub fn downcast_ref<T: MemoryWindow>(&self) -> Option<&T> {
        if <dyn MemoryWindow as std::any::Any>::type_id(self) == std::any::TypeId::of::<T>() {
            // SAFETY: as in `<dyn MemoryRegion>::downcast_ref`.
            Some(unsafe { &*(self as *const dyn MemoryWindow as *const T) })
        } else {
            None
        }
    }
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
