//! The two functions that write and read a whole header ([`Frame::encode`],
//! [`Frame::decode`]): the base header here, the extension in the module of its frame
//! kind (`data`, `datagram`, `nak`, `part`, `setup`), each of which reads its fields
//! into a [`Frame`] and checks them; the frames of every message's path also have a
//! one-pass reader (`hot`), tried first. This is the top of the wire format: it stands on
//! [`Frame`] and on the value types the frame kinds carry.

mod data;
mod datagram;
mod hot;
mod nak;
mod part;
mod setup;

pub use setup::setup_header_len;

use super::frame::{Frame, WireError};
use super::header::{
    flags_of, u16_at, u32_at, u64_at, Base, BASE_LEN, F_GRH, F_IMM, F_INV, MAX_HDR_LEN, MAX_MSG,
};
use super::nak::NakReason;
use super::opcode::{allowed_flags, ext_len, is_setup, op, uses_aux, uses_len};
use super::setup::VERSION;

impl Frame {
    /// Encodes the header into `out`, returning the number of bytes written.
    #[inline]
    pub fn encode(&self, out: &mut [u8; MAX_HDR_LEN]) -> usize {
        let (opcode, flags, aux, psn, len, imm) = match *self {
            Frame::Hello { .. } => (op::HELLO, 0, VERSION, 0, 0, 0),
            Frame::Verify { .. } => (op::VERIFY, 0, VERSION, 0, 0, 0),
            Frame::LinkHello { .. } => (op::LINK_HELLO, 0, VERSION, 0, 0, 0),
            Frame::LinkVerify { .. } => (op::LINK_VERIFY, 0, VERSION, 0, 0, 0),
            Frame::CmLookup { .. } => (op::CM_LOOKUP, 0, VERSION, 0, 0, 0),
            Frame::CmAddress { .. } => (op::CM_ADDRESS, 0, VERSION, 0, 0, 0),
            Frame::Datagram {
                psn,
                len,
                imm,
                solicited,
                grh,
                ..
            } => (
                op::DATAGRAM,
                flags_of(imm, solicited, false) | if grh.is_some() { F_GRH } else { 0 },
                0,
                psn,
                len,
                imm.unwrap_or(0),
            ),
            Frame::HelloAck => (op::HELLO_ACK, 0, 0, 0, 0, 0),
            Frame::HelloNak { reason } => (op::HELLO_NAK, 0, reason as u16, 0, 0, 0),
            Frame::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                inv,
            } => (
                op::SEND,
                flags_of(imm, solicited, ack_req) | if inv.is_some() { F_INV } else { 0 },
                0,
                psn,
                len,
                imm.or(inv).unwrap_or(0),
            ),
            Frame::Write {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                ..
            } => (
                op::WRITE,
                flags_of(imm, solicited, ack_req),
                0,
                psn,
                len,
                imm.unwrap_or(0),
            ),
            Frame::WritePlaced {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                ..
            } => (
                op::WRITE_PLACED,
                flags_of(imm, solicited, ack_req),
                0,
                psn,
                len,
                imm.unwrap_or(0),
            ),
            Frame::ReadPlaced {
                psn, len, ack_req, ..
            } => (op::READ_PLACED, flags_of(None, false, ack_req), 0, psn, len, 0),
            Frame::AtomicPlaced {
                psn,
                compare,
                ack_req,
                ..
            } => (
                if compare.is_some() {
                    op::CMP_SWAP_PLACED
                } else {
                    op::FETCH_ADD_PLACED
                },
                flags_of(None, false, ack_req),
                0,
                psn,
                0,
                0,
            ),
            Frame::PlacedRun {
                psn, pkts, ack_req, ..
            } => (op::PLACED_RUN, flags_of(None, false, ack_req), 0, psn, pkts, 0),
            Frame::Read {
                psn, len, inflight, ..
            } => (op::READ, 0, inflight, psn, len, 0),
            Frame::CmpSwap { psn, inflight, .. } => (op::CMP_SWAP, 0, inflight, psn, 0, 0),
            Frame::FetchAdd { psn, inflight, .. } => (op::FETCH_ADD, 0, inflight, psn, 0, 0),
            Frame::Ack { psn } => (op::ACK, 0, 0, psn, 0, 0),
            Frame::Nak { psn, code, reason } => (
                op::NAK,
                0,
                code.to_raw(),
                psn,
                0,
                reason.map_or(0, NakReason::vendor_err),
            ),
            Frame::ReadResp { psn, len } => (op::READ_RESP, 0, 0, psn, len, 0),
            Frame::AtomicResp { psn, .. } => (op::ATOMIC_RESP, 0, 0, psn, 0, 0),
            Frame::Part {
                psn,
                len,
                kind,
                first,
                last,
                imm,
                solicited,
                ack_req,
                inv,
                ..
            } => (
                op::PART,
                flags_of(imm, solicited, ack_req) | if inv.is_some() { F_INV } else { 0 },
                Frame::part_aux(kind, first, last),
                psn,
                len,
                imm.or(inv).unwrap_or(0),
            ),
        };
        out[0] = opcode;
        out[1] = flags;
        out[2..4].copy_from_slice(&aux.to_le_bytes());
        out[4..8].copy_from_slice(&psn.to_le_bytes());
        out[8..12].copy_from_slice(&len.to_le_bytes());
        out[12..16].copy_from_slice(&imm.to_le_bytes());
        let e = &mut out[BASE_LEN..];
        match *self {
            Frame::Hello { .. }
            | Frame::Verify { .. }
            | Frame::LinkHello { .. }
            | Frame::LinkVerify { .. }
            | Frame::CmLookup { .. }
            | Frame::CmAddress { .. } => self.encode_setup_ext(e),
            Frame::Datagram { .. } => self.encode_datagram_ext(e),
            Frame::Part { .. } => self.encode_part_ext(e),
            _ => self.encode_data_ext(e),
        }
        BASE_LEN + ext_len(opcode).expect("encoder only emits known opcodes")
    }

    /// Decodes one header from the front of `buf`. `Ok(None)`: more bytes are needed.
    /// `Ok(Some((frame, n)))`: the header took `n` bytes (its payload, if any, follows).
    /// The frames of every message's path are read by a one-pass reader first (`hot`),
    /// which leaves everything else, and every refusal, to the general one.
    #[inline]
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
        match hot::decode(buf) {
            Some(hit) => Ok(Some(hit)),
            None => Frame::decode_general(buf),
        }
    }

    /// [`Frame::decode`] for any frame, through the opcode's tables.
    fn decode_general(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
        if buf.len() < BASE_LEN {
            return Ok(None);
        }
        let opcode = buf[0];
        let ext = ext_len(opcode).ok_or(WireError::UnknownOpcode(opcode))?;
        if buf.len() < BASE_LEN + ext {
            return Ok(None);
        }
        let b = Base {
            opcode,
            flags: buf[1],
            aux: u16_at(buf, 2),
            psn: u32_at(buf, 4),
            len: u32_at(buf, 8),
            imm_raw: u32_at(buf, 12),
        };
        let flags = b.flags;
        if flags & !allowed_flags(opcode) != 0 || flags & (F_IMM | F_INV) == F_IMM | F_INV {
            return Err(WireError::BadField("flags"));
        }
        if b.psn > 0xff_ffff {
            return Err(WireError::BadField("PSN"));
        }
        if b.len > MAX_MSG {
            return Err(WireError::TooLong(b.len));
        }
        let e = &buf[BASE_LEN..];
        let setup = is_setup(opcode);
        let frame = match opcode {
            op::DATAGRAM => Frame::decode_datagram(&b, e)?,
            op::NAK => Frame::decode_nak(&b)?,
            op::PART => Frame::decode_part(&b, e)?,
            _ if setup => Frame::decode_setup(&b, e)?,
            _ => Frame::decode_data(&b, e)?,
        };
        // Fields that the frame kind does not use must be zero, so that every frame has
        // exactly one encoding (the property tests rely on it).
        if (!uses_len(opcode) && b.len != 0)
            || (!uses_aux(opcode) && b.aux != 0)
            || (setup && b.psn != 0)
            || (b.imm().is_none() && b.imm_raw != 0 && opcode != op::NAK && flags & F_INV == 0)
        {
            return Err(WireError::BadField("reserved field"));
        }
        if matches!(opcode, op::FETCH_ADD | op::FETCH_ADD_PLACED) && u64_at(e, 20) != 0 {
            return Err(WireError::BadField("reserved field"));
        }
        Ok(Some((frame, BASE_LEN + ext)))
    }
}
