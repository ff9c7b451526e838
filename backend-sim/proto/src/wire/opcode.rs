//! The opcodes of the sim's frames and what each one's header holds: the length of its
//! extension, the flags it may carry, which base header fields it uses. Unknown opcodes
//! are `None` here and a [`WireError::UnknownOpcode`](super::WireError::UnknownOpcode)
//! where a frame is read.

use super::header::{BASE_LEN, F_ACK_REQ, F_GRH, F_IMM, F_INV, F_SOLICITED};

/// The opcode byte of each frame kind (the first byte of its base header).
pub(super) mod op {
    pub const HELLO: u8 = 0x01;
    pub const HELLO_ACK: u8 = 0x02;
    pub const HELLO_NAK: u8 = 0x03;
    pub const VERIFY: u8 = 0x04;
    pub const LINK_HELLO: u8 = 0x05;
    pub const LINK_VERIFY: u8 = 0x06;
    pub const CM_LOOKUP: u8 = 0x07;
    pub const CM_ADDRESS: u8 = 0x08;
    pub const SEND: u8 = 0x10;
    pub const WRITE: u8 = 0x11;
    pub const READ: u8 = 0x12;
    pub const CMP_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    pub const WRITE_PLACED: u8 = 0x15;
    pub const READ_PLACED: u8 = 0x16;
    pub const CMP_SWAP_PLACED: u8 = 0x17;
    pub const FETCH_ADD_PLACED: u8 = 0x18;
    pub const PLACED_RUN: u8 = 0x19;
    pub const ACK: u8 = 0x20;
    pub const NAK: u8 = 0x21;
    pub const READ_RESP: u8 = 0x22;
    pub const ATOMIC_RESP: u8 = 0x23;
    pub const PART: u8 = 0x24;
    pub const DATAGRAM: u8 = 0x30;
}

/// Bytes of the extension after the base header, or `None` for an unknown opcode.
pub(super) fn ext_len(opcode: u8) -> Option<usize> {
    Some(match opcode {
        op::HELLO => 48,
        op::VERIFY => 32,
        op::LINK_HELLO | op::LINK_VERIFY => 40,
        op::CM_LOOKUP => 8,
        op::CM_ADDRESS => 24,
        op::DATAGRAM => 36,
        op::HELLO_ACK | op::HELLO_NAK | op::SEND | op::ACK | op::NAK | op::READ_RESP => 0,
        op::WRITE | op::WRITE_PLACED | op::READ | op::READ_PLACED => 12,
        op::CMP_SWAP | op::FETCH_ADD | op::CMP_SWAP_PLACED | op::FETCH_ADD_PLACED => 28,
        op::ATOMIC_RESP | op::PLACED_RUN => 8,
        op::PART => 16,
        _ => return None,
    })
}

/// Bytes of the whole header of a frame whose first byte is `opcode` (base and
/// extension), or `None` for an unknown opcode: lets a reader take exactly one header off
/// a stream, as connection setup does before it allocates anything for the connection.
pub fn header_len(opcode: u8) -> Option<usize> {
    ext_len(opcode).map(|e| BASE_LEN + e)
}

/// The flags a frame of `opcode` may carry (any other set flag is malformed).
#[inline]
pub(super) fn allowed_flags(opcode: u8) -> u8 {
    match opcode {
        op::SEND => F_IMM | F_SOLICITED | F_ACK_REQ | F_INV,
        op::WRITE | op::WRITE_PLACED => F_IMM | F_SOLICITED | F_ACK_REQ,
        op::READ_PLACED | op::CMP_SWAP_PLACED | op::FETCH_ADD_PLACED | op::PLACED_RUN => F_ACK_REQ,
        op::PART => F_IMM | F_SOLICITED | F_ACK_REQ | F_INV,
        op::DATAGRAM => F_IMM | F_SOLICITED | F_GRH,
        _ => 0,
    }
}

/// Whether `opcode` is one of connection or link setup (or the CM rendezvous): these
/// carry the protocol version and no PSN.
#[inline]
pub(super) fn is_setup(opcode: u8) -> bool {
    matches!(
        opcode,
        op::HELLO
            | op::VERIFY
            | op::HELLO_ACK
            | op::HELLO_NAK
            | op::LINK_HELLO
            | op::LINK_VERIFY
            | op::CM_LOOKUP
            | op::CM_ADDRESS
    )
}

/// Whether a frame of `opcode` uses the base header's length field (it has a payload, or
/// for a READ, asks for one).
#[inline]
pub(super) fn uses_len(opcode: u8) -> bool {
    matches!(
        opcode,
        op::SEND
            | op::WRITE
            | op::WRITE_PLACED
            | op::READ
            | op::READ_PLACED
            | op::PLACED_RUN
            | op::READ_RESP
            | op::DATAGRAM
            | op::PART
    )
}

/// Whether a frame of `opcode` uses the base header's 16-bit `aux` field (the version,
/// a refusal's reason, a NAK's syndrome, the count of READs and atomics outstanding).
#[inline]
pub(super) fn uses_aux(opcode: u8) -> bool {
    (is_setup(opcode) && opcode != op::HELLO_ACK)
        || matches!(
            opcode,
            op::NAK | op::READ | op::CMP_SWAP | op::FETCH_ADD | op::PART
        )
}
