//! The base header every frame starts with (opcode, flags, `aux`, PSN, length,
//! immediate: 16 bytes, like the BTH), its flags, the header size limits, and the
//! little-endian readers the decoders use. This is the bottom of the wire format: it
//! names no frame; the two functions that write and read a whole header are in `codec`.

/// Bytes of the base header.
pub const BASE_LEN: usize = 16;
/// Longest header (base + largest extension: the hello's).
pub const MAX_HDR_LEN: usize = BASE_LEN + 48;
/// Longest header of a frame that travels on an established connection (requests and
/// responses; the setup frames are longer).
pub const MAX_DATA_HDR_LEN: usize = BASE_LEN + 28;
/// Largest message (2^31 bytes, as `ibv_port_attr::max_msg_sz` on most HCAs).
pub const MAX_MSG: u32 = 1 << 31;

/// Frame flag: the request carries immediate data.
pub const F_IMM: u8 = 1;
/// Frame flag: the solicited-event bit.
pub const F_SOLICITED: u8 = 2;
/// Frame flag: the requester asks for an ACK (the BTH's AckReq bit, IBA 9.2): the
/// responder acknowledges the request once it is executed instead of coalescing the ACK
/// with later ones (see `Requester::ack_req_due` for when requesters set it).
pub const F_ACK_REQ: u8 = 4;
/// Frame flag, on datagrams only: the sender's address handle had a GRH (`is_global`),
/// whose fields the frame carries ([`Grh`](super::Grh)).
pub const F_GRH: u8 = 8;
/// Frame flag, on SEND only: SEND_WITH_INV (IBA's IETH), the rkey to invalidate in the
/// base header's immediate field (a SEND with invalidate carries no immediate).
pub const F_INV: u8 = 16;

/// The base header's fields as read, for the modules that build a frame from them and
/// its extension.
#[derive(Clone, Copy)]
pub(super) struct Base {
    /// The frame's opcode.
    pub opcode: u8,
    /// The flags (`F_*`).
    pub flags: u8,
    /// The 16-bit field whose use depends on the opcode (see `opcode::uses_aux`).
    pub aux: u16,
    /// The PSN (24 bits, checked).
    pub psn: u32,
    /// The length (at most [`MAX_MSG`], checked).
    pub len: u32,
    /// The immediate field as it travels (also a NAK's reason, a SEND_WITH_INV's rkey).
    pub imm_raw: u32,
}

impl Base {
    /// The immediate data, if the frame says it carries one ([`F_IMM`]).
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        (self.flags & F_IMM != 0).then_some(self.imm_raw)
    }

    /// The solicited-event bit ([`F_SOLICITED`]).
    #[inline]
    pub fn solicited(&self) -> bool {
        self.flags & F_SOLICITED != 0
    }

    /// The AckReq bit ([`F_ACK_REQ`]).
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.flags & F_ACK_REQ != 0
    }
}

pub(super) fn flags_of(imm: Option<u32>, solicited: bool, ack_req: bool) -> u8 {
    (if imm.is_some() { F_IMM } else { 0 })
        | (if solicited { F_SOLICITED } else { 0 })
        | (if ack_req { F_ACK_REQ } else { 0 })
}

pub(super) fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

pub(super) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

pub(super) fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}
