//! UD datagrams on a link between two devices (docs/wire.md "Links: UD datagrams"): the
//! datagram's header size, its limits, and the fields of the GRH its sender chooses
//! (read and written in `codec::datagram`).

use super::header::BASE_LEN;

/// Bytes of a datagram's header (base and extension).
pub const DATAGRAM_HDR_LEN: usize = BASE_LEN + 36;
/// Largest datagram payload: the port's MTU (4096, `IBV_MTU_4096`, which the sim's port
/// reports as its active MTU). A UD message longer than that is never sent (IBA
/// C10-93.1.1), so a longer datagram on a link is malformed.
pub const MAX_DATAGRAM: u32 = 4096;
/// Bytes of the global route header (IBA 8.3) at the start of every UD receive buffer
/// (`man ibv_post_recv`).
pub const GRH_LEN: usize = 40;

/// The fields of a datagram's global route header that its sender chooses (its address
/// handle's `ibv_global_route`). The receiver builds the 40-byte GRH from them, the
/// datagram's length and the source GID of the link it arrived on (never a GID the frame
/// names: the sender's identity comes from the link's check).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Grh {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// The source GID is the sender's default GID (its GID 0,
    /// [`gid::default_of`](crate::gid::default_of) its link's), not the GID of its IP.
    pub src_default: bool,
}
