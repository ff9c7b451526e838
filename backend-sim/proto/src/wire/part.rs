//! [`Frame::Part`]: some of a message's packets, cut at packet boundaries (IBA 9.7.1's
//! FIRST, MIDDLE and LAST packets). Over TCP a message travels as one frame of all its
//! packets; a part exists where the packets of one message go apart: a network that cuts
//! a frame into its packets (the deterministic fabric), a requester that resends from a
//! PSN inside a message (IBA 9.7.5.1: SEND and RDMA WRITE resume with MIDDLE and LAST
//! packets, no RETH), a responder's READ response cut the same way.
//!
//! Header: the base header's `aux` holds the kind (low byte) and whether the part holds
//! the message's first ([`P_FIRST`]) and last ([`P_LAST`]) packet; a part never holds
//! both (that is the whole message's own frame). The extension holds the RETH of a
//! WRITE's first part (address, rkey) and the message's total length (the sim's own: the
//! responder places a SEND's whole message when its first packet comes, as it does for a
//! SEND frame).

use super::frame::{Frame, WireError};
use super::header::{u32_at, u64_at, Base, F_INV};

/// `aux` bit: the part holds the message's first packet.
pub(super) const P_FIRST: u16 = 0x100;
/// `aux` bit: the part holds the message's last packet.
pub(super) const P_LAST: u16 = 0x200;

/// What message a [`Frame::Part`] belongs to.
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
    fn from_raw(v: u8) -> Option<PartKind> {
        Some(match v {
            0 => PartKind::Send,
            1 => PartKind::Write,
            2 => PartKind::ReadResp,
            _ => return None,
        })
    }
}

/// A SEND, a WRITE, a READ response or a part of one, seen as the packets of its
/// message it holds ([`Frame::packets`]): the fields of a [`Frame::Part`], which
/// [`Packets::part`] makes of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packets {
    /// PSN of its first packet.
    pub psn: u32,
    /// Payload bytes.
    pub len: u32,
    /// The message's kind.
    pub kind: PartKind,
    /// It holds the message's first packet.
    pub first: bool,
    /// It holds the message's last packet.
    pub last: bool,
    /// A WRITE's RETH address (0 for the others).
    pub addr: u64,
    /// A WRITE's RETH key (0 for the others).
    pub rkey: u32,
    /// The whole message's length.
    pub total: u32,
    /// Immediate data.
    pub imm: Option<u32>,
    /// Solicited event.
    pub solicited: bool,
    /// AckReq.
    pub ack_req: bool,
    /// SEND_WITH_INV's rkey.
    pub inv: Option<u32>,
}

impl Packets {
    /// These packets as a [`Frame::Part`] (the RETH on a first part only).
    pub fn part(&self) -> Frame {
        Frame::Part {
            psn: self.psn,
            len: self.len,
            kind: self.kind,
            first: self.first,
            last: self.last,
            addr: if self.first { self.addr } else { 0 },
            rkey: if self.first { self.rkey } else { 0 },
            total: self.total,
            imm: self.imm,
            solicited: self.solicited,
            ack_req: self.ack_req,
            inv: self.inv,
        }
    }
}

impl Frame {
    /// The packets of a message this frame holds: all of a SEND's, a WRITE's or a READ
    /// response's, some of a part's; `None` for other frames.
    pub fn packets(&self) -> Option<Packets> {
        let whole = |psn, len, kind| Packets {
            psn,
            len,
            kind,
            first: true,
            last: true,
            addr: 0,
            rkey: 0,
            total: len,
            imm: None,
            solicited: false,
            ack_req: false,
            inv: None,
        };
        Some(match *self {
            Frame::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                inv,
            } => Packets {
                imm,
                solicited,
                ack_req,
                inv,
                ..whole(psn, len, PartKind::Send)
            },
            Frame::Write {
                psn,
                len,
                addr,
                rkey,
                imm,
                solicited,
                ack_req,
            } => Packets {
                addr,
                rkey,
                imm,
                solicited,
                ack_req,
                ..whole(psn, len, PartKind::Write)
            },
            Frame::ReadResp { psn, len } => whole(psn, len, PartKind::ReadResp),
            Frame::Part {
                psn,
                len,
                kind,
                first,
                last,
                addr,
                rkey,
                total,
                imm,
                solicited,
                ack_req,
                inv,
            } => Packets {
                psn,
                len,
                kind,
                first,
                last,
                addr,
                rkey,
                total,
                imm,
                solicited,
                ack_req,
                inv,
            },
            _ => return None,
        })
    }

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
