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
//! The modules, one job each: [`Frame`] and its accessors (`frame`), the base header
//! every frame starts with and the two functions that write and read whole headers
//! (`header`), the opcodes and what each one's header holds (`opcode`), the extensions of
//! requests and responses (`data`), of connection and link setup (`setup`), of datagrams
//! (`datagram`), the NAK's syndrome and reason (`nak`), and the parts of a message cut
//! at packet boundaries (`part`).

mod data;
mod datagram;
mod frame;
mod header;
mod nak;
mod opcode;
mod part;
mod setup;

pub use datagram::{Grh, DATAGRAM_HDR_LEN, GRH_LEN, MAX_DATAGRAM};
pub use frame::{Frame, WireError};
pub use header::{
    BASE_LEN, F_ACK_REQ, F_GRH, F_IMM, F_INV, F_SOLICITED, MAX_DATA_HDR_LEN, MAX_HDR_LEN, MAX_MSG,
};
pub use nak::{NakCode, NakReason};
pub use opcode::header_len;
pub use part::{Packets, PartKind};
pub use setup::{setup_header_len, HelloReject, HELLO_MAGIC, TOKEN_LEN, VERSION};

#[cfg(test)]
pub(crate) mod tests;
