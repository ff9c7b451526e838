//! Where a work request's bytes are: a local buffer (`struct ibv_sge`) and a remote one
//! (the `remote_addr` and `rkey` of `wr.rdma` / `wr.atomic`). Plain data that memory
//! regions hand out and work requests carry; re-exported from [`crate::wr`].

/// `struct ibv_sge`: a local buffer inside a registered memory region.
///
/// Laid out as the C structure (`uint64_t addr; uint32_t length; uint32_t lkey;`), so
/// that a C program's SGE array can be read as a slice of these without a copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start address (virtual address inside the MR).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR that holds `[addr, addr + length)`.
    pub lkey: u32,
}

impl Sge {
    /// A scatter/gather entry.
    pub fn new(addr: u64, length: u32, lkey: u32) -> Self {
        Sge { addr, length, lkey }
    }
}

/// A remote buffer: the `remote_addr` and `rkey` of `wr.rdma` / `wr.atomic`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Virtual address in the remote MR.
    pub addr: u64,
    /// Remote key of that MR.
    pub rkey: u32,
}

impl RemoteAddr {
    /// A remote address.
    pub fn new(addr: u64, rkey: u32) -> Self {
        RemoteAddr { addr, rkey }
    }
}

impl From<(u64, u32)> for RemoteAddr {
    /// `(remote_addr, rkey)`.
    fn from((addr, rkey): (u64, u32)) -> Self {
        RemoteAddr { addr, rkey }
    }
}
