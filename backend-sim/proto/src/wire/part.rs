//! [`Frame::Part`](super::Frame::Part): some of a message's packets, cut at packet
//! boundaries (IBA 9.7.1's FIRST, MIDDLE and LAST packets). Over TCP a message travels as
//! one frame of all its packets; a part exists where the packets of one message go apart:
//! a network that cuts a frame into its packets (the deterministic fabric), a requester
//! that resends from a PSN inside a message (IBA 9.7.5.1: SEND and RDMA WRITE resume with
//! MIDDLE and LAST packets, no RETH), a responder's READ response cut the same way.
//!
//! Header: the base header's `aux` holds the kind (low byte) and whether the part holds
//! the message's first ([`P_FIRST`]) and last ([`P_LAST`]) packet; a part never holds
//! both (that is the whole message's own frame). The extension holds the RETH of a
//! WRITE's first part (address, rkey) and the message's total length (the sim's own: the
//! responder places a SEND's whole message when its first packet comes, as it does for a
//! SEND frame).
//!
//! Here the part's kind and its `aux` bits; a frame's packets are
//! [`Packets`](super::Packets) (`packets`), and a part's header is written and read in
//! `codec::part`.

/// `aux` bit: the part holds the message's first packet.
pub(super) const P_FIRST: u16 = 0x100;
/// `aux` bit: the part holds the message's last packet.
pub(super) const P_LAST: u16 = 0x200;

/// What message a [`Frame::Part`](super::Frame::Part) belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PartKind {
    /// A SEND (with immediate or invalidate as its flags say): a request.
    Send = 0,
    /// An RDMA WRITE (with immediate as its flags say): a request.
    Write = 1,
    /// A READ response: a response.
    ReadResp = 2,
}

impl PartKind {
    pub(super) fn from_raw(v: u8) -> Option<PartKind> {
        Some(match v {
            0 => PartKind::Send,
            1 => PartKind::Write,
            2 => PartKind::ReadResp,
            _ => return None,
        })
    }
}
