//! A part's header ([`Frame::Part`]): the kind and the first/last bits in `aux`, the
//! extension (a WRITE's RETH on its first part, the message's total length), written
//! and read, and checked (a part never holds a whole message, nor more than it).

use crate::wire::frame::{Frame, WireError};
use crate::wire::header::{u32_at, u64_at, Base, F_INV};
use crate::wire::packets::Packets;
use crate::wire::part::{PartKind, P_FIRST, P_LAST};

impl Frame {
    /// The part's `aux` field.
    pub(super) fn part_aux(kind: PartKind, first: bool, last: bool) -> u16 {
        kind as u16 | if first { P_FIRST } else { 0 } | if last { P_LAST } else { 0 }
    }

    /// Writes a part's extension.
    pub(super) fn encode_part_ext(&self, e: &mut [u8]) {
        if let Frame::Part {
            addr, rkey, total, ..
        } = *self
        {
            e[0..8].copy_from_slice(&addr.to_le_bytes());
            e[8..12].copy_from_slice(&rkey.to_le_bytes());
            e[12..16].copy_from_slice(&total.to_le_bytes());
        }
    }

    /// Reads a part from its base header and extension.
    pub(super) fn decode_part(b: &Base, e: &[u8]) -> Result<Frame, WireError> {
        let kind = PartKind::from_raw(b.aux as u8).ok_or(WireError::BadField("part kind"))?;
        if b.aux & !(0xff | P_FIRST | P_LAST) != 0 {
            return Err(WireError::BadField("reserved field"));
        }
        let (first, last) = (b.aux & P_FIRST != 0, b.aux & P_LAST != 0);
        let (addr, rkey, total) = (u64_at(e, 0), u32_at(e, 8), u32_at(e, 12));
        if first && last {
            return Err(WireError::BadField("part holding a whole message"));
        }
        if (kind != PartKind::Write || !first) && (addr != 0 || rkey != 0) {
            return Err(WireError::BadField("reserved field"));
        }
        if b.len > total {
            return Err(WireError::BadField("part longer than its message"));
        }
        let inv = (b.flags & F_INV != 0).then_some(b.imm_raw);
        if (kind != PartKind::Send && inv.is_some()) || (kind == PartKind::ReadResp && b.flags != 0) {
            return Err(WireError::BadField("flags"));
        }
        Ok(Packets {
            psn: b.psn,
            len: b.len,
            kind,
            first,
            last,
            addr,
            rkey,
            total,
            imm: b.imm(),
            solicited: b.solicited(),
            ack_req: b.ack_req(),
            inv,
        }
        .part())
    }
}
