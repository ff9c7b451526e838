//! The sim's wire format: frame encode/decode only, no I/O.
//!
//! One TCP stream carries both directions of a QP pair, as the two halves of an IB RC
//! connection share one path: each side's requests and the answers of its responder to
//! the other side's requests (see docs/wire.md for the connection hello). The frames
//! mirror InfiniBand's headers at message granularity (TCP already segments and
//! retransmits): a 16-byte base header (like the BTH: opcode, flags, PSN, plus length and
//! immediate), then an extension that depends on the opcode (RETH for RDMA, AtomicETH for
//! atomics, AtomicAckETH for atomic responses, a hello block for connection setup, the
//! DETH and the GRH's fields for a datagram), then `len` payload bytes for SEND, WRITE,
//! READ responses and datagrams. A NAK, which has no immediate, carries the responder's
//! [`NakReason`] in that field.
//!
//! UD datagrams travel on a different stream: one *link* per pair of devices, which
//! carries the datagrams of every UD QP of both ([`Frame::Datagram`]), set up by a
//! [`Frame::LinkHello`] that the accepting device checks with the claimed device
//! ([`Frame::LinkVerify`]).
//!
//! All integers are little-endian. The decoder accepts any bytes: short input asks for
//! more, anything malformed (unknown opcode, a length beyond the message limit, a PSN or
//! QPN wider than 24 bits, bad magic) is a [`WireError`], never a panic.
//!
//! The modules, one job each, from the bottom up: the base header every frame starts
//! with, its flags and size limits (`header`); the opcodes and what each one's header
//! holds (`opcode`); the values the frame kinds carry: a datagram's GRH fields
//! (`datagram`), a NAK's syndrome and reason (`nak`), a part's kind (`part`), the setup
//! frames' version, token and refusals (`setup`); [`Frame`] and its accessors, and
//! [`WireError`] (`frame`); a frame seen as the packets of its message, cut at packet
//! boundaries (`packets`); and on top the writing and reading of whole headers, the base
//! header in `codec` and each kind's extension in `codec::{data, datagram, nak, part,
//! setup}`. No module imports one above it.

mod codec;
mod datagram;
mod frame;
mod header;
mod nak;
mod opcode;
mod packets;
mod part;
mod setup;

pub use codec::setup_header_len;
pub use datagram::{Grh, DATAGRAM_HDR_LEN, GRH_LEN, MAX_DATAGRAM};
pub use frame::{Frame, WireError};
pub use header::{
    BASE_LEN, F_ACK_REQ, F_GRH, F_IMM, F_INV, F_SOLICITED, MAX_DATA_HDR_LEN, MAX_HDR_LEN, MAX_MSG,
};
pub use nak::{NakCode, NakReason};
pub use opcode::header_len;
pub use packets::Packets;
pub use part::PartKind;
pub use setup::{HelloReject, HELLO_MAGIC, TOKEN_LEN, VERSION};

#[cfg(test)]
pub(crate) mod tests;
