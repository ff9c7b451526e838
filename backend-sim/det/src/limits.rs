//! What every device of the deterministic world is, fixed: its limits (what
//! `ibv_query_device` reports and the verbs check against) and its addresses (the `n`-th
//! device's node GUID and its link-local GID). Nothing here depends on the world, so the
//! verbs that report and the verbs that check read one source.

use verbs_api::Gid;

/// The most entries a CQ may have.
pub(crate) const MAX_CQE: u32 = 1 << 16;
/// The most WRs a queue may hold.
pub(crate) const MAX_QP_WR: u32 = 1 << 14;
/// The most receives an SRQ may hold.
pub(crate) const MAX_SRQ_WR: u32 = 1 << 14;
/// The most SRQs a device may have.
pub(crate) const MAX_SRQ: u32 = 1 << 16;
/// The most scatter/gather entries a receive posted to an SRQ may have.
pub(crate) const MAX_SRQ_SGE: u32 = 32;
/// The most scatter/gather entries a WR may have.
pub(crate) const MAX_SGE: u32 = 32;
/// The most RDMA READs and atomics in flight, each way.
pub(crate) const MAX_RD_ATOM: u32 = 16;
/// The most bytes of inline data a send may carry.
pub(crate) const MAX_INLINE: u32 = 256;
/// The largest message.
pub(crate) const MAX_MSG: u32 = 1 << 31;

/// The node GUID of the world's `n`-th device.
pub(crate) fn guid(n: usize) -> u64 {
    0x0de7_0000_0000_0000 | (n as u64 + 1)
}

/// The GID of the world's `n`-th device (link-local, its index in the last bytes).
pub(crate) fn gid(n: usize) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..].copy_from_slice(&guid(n).to_be_bytes());
    Gid(g)
}
