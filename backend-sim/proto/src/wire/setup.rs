//! Connection and link setup frames (docs/wire.md "Connection setup", "Links"): the
//! hello of a QP pair's connection and its check with the claimed device, a link's hello
//! and its check, the CM rendezvous, their answers: the protocol version they carry, the
//! hello's magic and token, and why a hello is refused. Their headers are written and
//! read in `codec::setup`.

/// Magic of the hello frame ("RSIM").
pub const HELLO_MAGIC: u32 = 0x4d49_5352;
/// Protocol version in the hello frame (13: the notices of consecutive operations a
/// same-host requester executed itself may travel as one
/// [`Frame::PlacedRun`](super::Frame::PlacedRun); 12: a READ or an atomic the requester executed
/// itself on a same-host peer's memory travels as a notice,
/// [`Frame::ReadPlaced`](super::Frame::ReadPlaced) or
/// [`Frame::AtomicPlaced`](super::Frame::AtomicPlaced); 11: a same-host connection's setup message also
/// passes the one-sided fast path's tables and use counts, and a WRITE the requester
/// placed itself travels as [`Frame::WritePlaced`](super::Frame::WritePlaced), without its payload; 10: on a same-host (unix socket) connection of a
/// QP pair, the connector follows the hello's answer with one message that passes the
/// shared-memory rings its frames then take, or says they stay on the socket; 9: a
/// message's packets may travel apart, and a requester resends from a PSN inside a
/// message ([`Frame::Part`](super::Frame::Part)); 8: the connection manager: a rendezvous
/// at an rdma_cm port ([`Frame::CmLookup`](super::Frame::CmLookup),
/// [`Frame::CmAddress`](super::Frame::CmAddress)) and CM messages as datagrams to QP 1
/// ([`crate::cm_msg`]); 7: SEND_WITH_INV ([`F_INV`](super::F_INV)), and NAK reasons for
/// memory windows; 6: a datagram's GRH says whether its source is the sender's default
/// GID ([`Grh::src_default`](super::Grh::src_default)), and READs and atomics carry the
/// requester's count of them outstanding ([`Frame::Read`](super::Frame::Read)'s
/// `inflight`); 5: links between devices carry UD datagrams
/// ([`Frame::LinkHello`](super::Frame::LinkHello),
/// [`Frame::LinkVerify`](super::Frame::LinkVerify),
/// [`Frame::Datagram`](super::Frame::Datagram)); 4: hellos name the QP type, RC or UC,
/// and a UC connection's responder acknowledges every message it took in; 3: hellos carry
/// a token that the passive side checks with the claimed peer device
/// ([`Frame::Verify`](super::Frame::Verify)), and a NAK may carry a
/// [`NakReason`](super::NakReason); 2: SEND and WRITE may carry
/// [`F_ACK_REQ`](super::F_ACK_REQ)). A device refuses a hello of another version
/// ([`HelloReject::Version`]): both ends of a connection must run builds that speak the
/// same frames.
pub const VERSION: u16 = 13;
/// Bytes of the token a hello carries.
pub const TOKEN_LEN: usize = 16;

/// Why a connection setup (or a [`Frame::Verify`](super::Frame::Verify)) was refused.
///
/// A device tells a stranger nothing about its QPs: whether the QP does not exist, is
/// not ready, expects another peer or the claim failed its check, the refusal is the same
/// bytes ([`HelloReject::Refused`]); the device logs the real reason at debug level. Only
/// a protocol version mismatch, which says nothing about QPs, is told apart, so that the
/// other build can report it instead of retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum HelloReject {
    /// Refused (no such QP, not ready, another peer, or the claim was not confirmed).
    Refused = 1,
    /// Protocol version mismatch.
    Version = 4,
}
