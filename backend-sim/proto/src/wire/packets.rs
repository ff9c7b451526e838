//! A frame seen as the packets of its message it holds ([`Packets`]): all of a SEND's, a
//! WRITE's or a READ response's, some of a [`Frame::Part`]'s; the requester and the
//! fabric cut and resume messages at packet boundaries through it.

use super::frame::Frame;
use super::part::PartKind;

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
}
