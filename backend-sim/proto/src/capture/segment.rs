//! A message as the packets an HCA sends for it (IBA 9.2.1, 9.7.1): a SEND or WRITE of
//! more than one path MTU as First, Middle... and Last packets of one PSN each, the
//! RETH on the first and the immediate data, solicited event and AckReq on the last; a
//! READ response as as many response packets, numbered from the request's PSN, the
//! AETH on the first and last; everything else one packet.

use std::ops::Range;

use super::headers::{ack_syndrome, nak_syndrome, Aeth, AtomicEth, Headers, Reth};
use super::opcode::{op, Transport};
use crate::psn;
use crate::wire::{Frame, PartKind};

/// One packet of a message: its headers and the part of the message's payload it
/// carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The transport headers.
    pub headers: Headers,
    /// The payload bytes of the message it carries.
    pub payload: Range<u32>,
}

/// What the packets of a frame need beside the frame: the transport and the
/// destination QP (a connection's frames do not name it), the path MTU, and the
/// responder's message sequence number for the AETH of responses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// RC, UC or UD.
    pub transport: Transport,
    /// The QP the packets go to.
    pub dst_qpn: u32,
    /// Path MTU in bytes (256-4096).
    pub mtu: u32,
    /// The responder's MSN, for ACKs, NAKs and responses.
    pub msn: u32,
}

/// Splits `len` bytes into packets of at most `mtu` (one packet for 0 bytes).
fn pieces(len: u32, mtu: u32) -> impl Iterator<Item = Range<u32>> {
    let mtu = mtu.max(1);
    let n = len.div_ceil(mtu).max(1);
    (0..n).map(move |i| i * mtu..((i + 1) * mtu).min(len))
}

/// The packets of `frame`, or none for frames that are not RoCE traffic (setup, link,
/// verification and rdma_cm rendezvous frames of the sim's own).
pub fn segments(frame: &Frame, cx: &Context) -> Vec<Segment> {
    let base = cx.transport.base();
    let new = |opcode: u8, psn: u32| Headers::new(base | opcode, cx.dst_qpn, psn);
    let aeth = |syndrome| {
        Some(Aeth {
            syndrome,
            msn: cx.msn,
        })
    };
    match *frame {
        Frame::Read {
            psn, len, addr, rkey, ..
        } => {
            let mut h = new(op::READ_REQUEST, psn);
            h.reth = Some(Reth { addr, rkey, len });
            h.bth.ack_req = true;
            vec![Segment {
                headers: h,
                payload: 0..0,
            }]
        }
        Frame::Send { .. } | Frame::Write { .. } | Frame::ReadResp { .. } | Frame::Part { .. } => {
            message_packets(frame, cx)
        }
        Frame::WritePlaced {
            psn,
            len,
            addr,
            rkey,
            imm,
            solicited,
            ack_req,
        } => {
            // The data went straight to the responder's memory (the same-host fast
            // path): the frame is the WRITE's header alone, so the capture shows one WRITE
            // ONLY packet whose RETH names the whole length and which carries no bytes.
            // Its PSNs after the first are not on the wire: the next packet's PSN skips them.
            let opcode = if imm.is_some() {
                op::WRITE_ONLY_IMM
            } else {
                op::WRITE_ONLY
            };
            one(new(opcode, psn), |h| {
                h.reth = Some(Reth { addr, rkey, len });
                h.imm = imm;
                h.bth.solicited = solicited;
                h.bth.ack_req = ack_req;
            })
        }
        // A run of operations the requester executed itself (the same-host fast path):
        // the capture shows one empty WRITE ONLY packet at the run's first PSN; the
        // run's other PSNs are not on the wire.
        Frame::PlacedRun { psn, ack_req, .. } => one(new(op::WRITE_ONLY, psn), |h| {
            h.reth = Some(Reth {
                addr: 0,
                rkey: 0,
                len: 0,
            });
            h.bth.ack_req = ack_req;
        }),
        // A READ or an atomic the requester executed itself (the same-host fast path):
        // the capture shows the request it stands for, answered by an ACK.
        Frame::ReadPlaced {
            psn, len, addr, rkey, ..
        } => one(new(op::READ_REQUEST, psn), |h| {
            h.reth = Some(Reth { addr, rkey, len });
            h.bth.ack_req = true;
        }),
        Frame::AtomicPlaced {
            psn,
            addr,
            rkey,
            compare,
            swap_add,
            ..
        } => {
            let opcode = if compare.is_some() {
                op::COMPARE_SWAP
            } else {
                op::FETCH_ADD
            };
            one(new(opcode, psn), |h| {
                h.atomic_eth = Some(AtomicEth {
                    addr,
                    rkey,
                    swap_add,
                    compare: compare.unwrap_or(0),
                });
                h.bth.ack_req = true;
            })
        }
        Frame::CmpSwap {
            psn,
            addr,
            rkey,
            compare,
            swap,
            ..
        } => one(new(op::COMPARE_SWAP, psn), |h| {
            h.atomic_eth = Some(AtomicEth {
                addr,
                rkey,
                swap_add: swap,
                compare,
            });
            h.bth.ack_req = true;
        }),
        Frame::FetchAdd {
            psn, addr, rkey, add, ..
        } => one(new(op::FETCH_ADD, psn), |h| {
            h.atomic_eth = Some(AtomicEth {
                addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
            h.bth.ack_req = true;
        }),
        Frame::Ack { psn } => one(new(op::ACKNOWLEDGE, psn), |h| h.aeth = aeth(ack_syndrome())),
        Frame::Nak { psn, code, .. } => one(new(op::ACKNOWLEDGE, psn), |h| h.aeth = aeth(nak_syndrome(code))),
        Frame::AtomicResp { psn, orig } => one(new(op::ATOMIC_ACKNOWLEDGE, psn), |h| {
            h.aeth = aeth(ack_syndrome());
            h.atomic_ack = Some(orig);
        }),
        Frame::Datagram {
            psn,
            len,
            dst_qpn,
            src_qpn,
            qkey,
            imm,
            solicited,
            ..
        } => {
            let opcode = if imm.is_some() {
                op::SEND_ONLY_IMM
            } else {
                op::SEND_ONLY
            };
            let mut h = Headers::new(Transport::Ud.base() | opcode, dst_qpn, psn);
            h.deth = Some((qkey, src_qpn));
            h.imm = imm;
            h.bth.solicited = solicited;
            vec![Segment {
                headers: h,
                payload: 0..len,
            }]
        }
        Frame::Hello { .. }
        | Frame::HelloAck
        | Frame::HelloNak { .. }
        | Frame::Verify { .. }
        | Frame::LinkHello { .. }
        | Frame::LinkVerify { .. }
        | Frame::CmLookup { .. }
        | Frame::CmAddress { .. } => Vec::new(),
    }
}

/// The packets of a SEND, a WRITE, a READ response or a [`Frame::Part`] of one, read
/// through [`Frame::packets`]: ONLY for a message of one packet, else FIRST on the
/// message's first packet, LAST on its last, MIDDLE between; the RETH (of the whole
/// message's length) on a WRITE's first, the AETH on a READ response's first and last,
/// the immediate data, IETH, solicited event and AckReq on a SEND's or WRITE's last.
fn message_packets(frame: &Frame, cx: &Context) -> Vec<Segment> {
    let Some(p) = frame.packets() else {
        return Vec::new();
    };
    let ops = match (p.kind, p.imm, p.inv) {
        (PartKind::Send, Some(_), _) => [
            op::SEND_FIRST,
            op::SEND_MIDDLE,
            op::SEND_LAST_IMM,
            op::SEND_ONLY_IMM,
        ],
        (PartKind::Send, None, Some(_)) => [
            op::SEND_FIRST,
            op::SEND_MIDDLE,
            op::SEND_LAST_INV,
            op::SEND_ONLY_INV,
        ],
        (PartKind::Send, None, None) => [op::SEND_FIRST, op::SEND_MIDDLE, op::SEND_LAST, op::SEND_ONLY],
        (PartKind::Write, Some(_), _) => [
            op::WRITE_FIRST,
            op::WRITE_MIDDLE,
            op::WRITE_LAST_IMM,
            op::WRITE_ONLY_IMM,
        ],
        (PartKind::Write, None, _) => [op::WRITE_FIRST, op::WRITE_MIDDLE, op::WRITE_LAST, op::WRITE_ONLY],
        (PartKind::ReadResp, ..) => [
            op::READ_RESPONSE_FIRST,
            op::READ_RESPONSE_MIDDLE,
            op::READ_RESPONSE_LAST,
            op::READ_RESPONSE_ONLY,
        ],
    };
    message(p.len, cx.mtu, |i, n| {
        let (is_first, is_last) = (p.first && i == 0, p.last && i + 1 == n);
        let opcode = match (is_first, is_last) {
            (true, true) => ops[3],
            (true, false) => ops[0],
            (false, true) => ops[2],
            (false, false) => ops[1],
        };
        let mut h = Headers::new(cx.transport.base() | opcode, cx.dst_qpn, psn::add(p.psn, i));
        if p.kind == PartKind::ReadResp {
            if is_first || is_last {
                h.aeth = Some(Aeth {
                    syndrome: ack_syndrome(),
                    msn: cx.msn,
                });
            }
            return h;
        }
        if is_first && p.kind == PartKind::Write {
            h.reth = Some(Reth {
                addr: p.addr,
                rkey: p.rkey,
                len: p.total,
            });
        }
        if is_last {
            h.imm = p.imm;
            h.ieth = p.inv;
            h.bth.solicited = p.solicited;
            h.bth.ack_req = p.ack_req;
        }
        h
    })
}

fn message(len: u32, mtu: u32, mut make: impl FnMut(u32, u32) -> Headers) -> Vec<Segment> {
    let parts: Vec<Range<u32>> = pieces(len, mtu).collect();
    let n = parts.len() as u32;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, payload)| Segment {
            headers: make(i as u32, n),
            payload,
        })
        .collect()
}

fn one(mut h: Headers, set: impl FnOnce(&mut Headers)) -> Vec<Segment> {
    set(&mut h);
    vec![Segment {
        headers: h,
        payload: 0..0,
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::opcode::extensions;
    use crate::wire::NakCode;
    use proptest::prelude::*;

    fn rc(mtu: u32) -> Context {
        Context {
            transport: Transport::Rc,
            dst_qpn: 0x12,
            mtu,
            msn: 7,
        }
    }

    #[test]
    fn a_send_of_two_and_a_half_mtus() {
        let f = Frame::Send {
            psn: 0xff_fffe,
            len: 2560,
            imm: Some(9),
            solicited: true,
            ack_req: true,
            inv: None,
        };
        let s = segments(&f, &rc(1024));
        let ops: Vec<u8> = s.iter().map(|s| s.headers.bth.opcode).collect();
        assert_eq!(ops, vec![op::SEND_FIRST, op::SEND_MIDDLE, op::SEND_LAST_IMM]);
        let psns: Vec<u32> = s.iter().map(|s| s.headers.bth.psn).collect();
        assert_eq!(
            psns,
            vec![0xff_fffe, 0xff_ffff, 0],
            "PSNs wrap at 2^24 within the message"
        );
        assert_eq!(s[2].payload, 2048..2560);
        assert!(s[2].headers.bth.ack_req && s[2].headers.bth.solicited && s[2].headers.imm == Some(9));
        assert!(!s[0].headers.bth.ack_req && s[0].headers.imm.is_none());
    }

    #[test]
    fn a_nak_carries_its_syndrome_and_the_msn() {
        let f = Frame::Nak {
            psn: 4,
            code: NakCode::Rnr { timer: 14 },
            reason: None,
        };
        let s = segments(&f, &rc(4096));
        assert_eq!(
            s[0].headers.aeth,
            Some(Aeth {
                syndrome: 0x2e,
                msn: 7
            })
        );
    }

    /// A notice of a READ or an atomic the requester executed itself shows as the
    /// request it stands for (one packet, its RETH or AtomicETH), as a capture of the
    /// responder's side sees it.
    #[test]
    fn notices_show_as_the_requests_they_stand_for() {
        let (addr, rkey) = (0x7f00_0000_1000, 0x99);
        let pairs = [
            (
                Frame::ReadPlaced {
                    psn: 5,
                    len: 3000,
                    addr,
                    rkey,
                    ack_req: false,
                },
                Frame::Read {
                    psn: 5,
                    len: 3000,
                    addr,
                    rkey,
                    inflight: 1,
                },
            ),
            (
                Frame::AtomicPlaced {
                    psn: 8,
                    addr,
                    rkey,
                    compare: Some(1),
                    swap_add: 2,
                    ack_req: true,
                },
                Frame::CmpSwap {
                    psn: 8,
                    inflight: 1,
                    addr,
                    rkey,
                    compare: 1,
                    swap: 2,
                },
            ),
            (
                Frame::AtomicPlaced {
                    psn: 9,
                    addr,
                    rkey,
                    compare: None,
                    swap_add: 3,
                    ack_req: false,
                },
                Frame::FetchAdd {
                    psn: 9,
                    inflight: 1,
                    addr,
                    rkey,
                    add: 3,
                },
            ),
        ];
        for (notice, request) in pairs {
            assert_eq!(
                segments(&notice, &rc(1024)),
                segments(&request, &rc(1024)),
                "{notice:?}"
            );
        }
    }

    proptest! {
        /// Every packet of every message has its opcode's headers, payload within the
        /// MTU, the payload covered exactly once, and consecutive PSNs.
        #[test]
        fn packets_fit_their_opcodes(len in 0u32..20_000, mtu_log in 8u32..=12, psn0 in 0u32..(1 << 24), kind in 0u8..4, uc: bool) {
            let mtu = 1 << mtu_log;
            let cx = Context { transport: if uc && kind < 2 { Transport::Uc } else { Transport::Rc }, ..rc(mtu) };
            let f = match kind {
                0 => Frame::Send { psn: psn0, len, imm: None, solicited: false, ack_req: true, inv: None },
                1 => Frame::Write { psn: psn0, len, addr: 0x1000, rkey: 5, imm: Some(1), solicited: false, ack_req: true },
                _ => Frame::ReadResp { psn: psn0, len },
            };
            let s = segments(&f, &cx);
            let mut next = 0;
            for (i, seg) in s.iter().enumerate() {
                prop_assert_eq!(seg.headers.bth.psn, psn::add(psn0, i as u32));
                prop_assert_eq!(seg.payload.start, next);
                prop_assert!(seg.payload.len() as u32 <= mtu);
                next = seg.payload.end;
                let mut out = Vec::new();
                prop_assert!(seg.headers.write(seg.payload.len(), &mut out).is_ok());
                let pad = (4 - seg.payload.len() % 4) % 4;
                prop_assert_eq!(Headers::read(&out), Ok((seg.headers, out.len(), pad)));
                prop_assert!(extensions(seg.headers.bth.opcode).is_some());
            }
            prop_assert_eq!(next, len);
            prop_assert_eq!(s.len() as u32, len.div_ceil(mtu).max(1));
        }
    }

    /// Parts of a message (the packets of a frame the network cut, or a resend from a
    /// packet inside the message): a WRITE's first part carries the RETH of the whole
    /// message and no LAST; its last part MIDDLE then LAST with the immediate and no
    /// RETH; a READ response's parts the AETH on the message's first and last packet.
    #[test]
    fn parts_are_first_middle_last_of_their_message() {
        let part = |psn, len, kind, first, last| Frame::Part {
            psn,
            len,
            kind,
            first,
            last,
            addr: if first { 0x1000 } else { 0 },
            rkey: if first { 9 } else { 0 },
            total: 3000,
            imm: (kind == PartKind::Write).then_some(5),
            solicited: false,
            ack_req: last,
            inv: None,
        };
        let shape = |f: &Frame| -> Vec<(u8, u32, bool, Option<u32>, bool, bool)> {
            segments(f, &rc(1024))
                .iter()
                .map(|s| {
                    let h = &s.headers;
                    (
                        h.bth.opcode,
                        h.bth.psn,
                        h.reth.is_some(),
                        h.imm,
                        h.aeth.is_some(),
                        h.bth.ack_req,
                    )
                })
                .collect()
        };
        assert_eq!(
            shape(&part(0xff_ffff, 1024, PartKind::Write, true, false)),
            [(op::WRITE_FIRST, 0xff_ffff, true, None, false, false)]
        );
        assert_eq!(
            segments(&part(0xff_ffff, 1024, PartKind::Write, true, false), &rc(1024))[0]
                .headers
                .reth
                .map(|r| r.len),
            Some(3000)
        );
        assert_eq!(
            shape(&part(0, 1976, PartKind::Write, false, true)),
            [
                (op::WRITE_MIDDLE, 0, false, None, false, false),
                (op::WRITE_LAST_IMM, 1, false, Some(5), false, true)
            ]
        );
        assert_eq!(
            shape(&part(4, 2048, PartKind::ReadResp, true, false)),
            [
                (op::READ_RESPONSE_FIRST, 4, false, None, true, false),
                (op::READ_RESPONSE_MIDDLE, 5, false, None, false, false)
            ]
        );
        assert_eq!(
            shape(&part(6, 952, PartKind::ReadResp, false, true)),
            [(op::READ_RESPONSE_LAST, 6, false, None, true, false)]
        );
    }
}
