//! A frame cut into its packets: the fabric carries a message the way a RoCE network
//! does, one packet per PSN, so that one packet inside a message can be lost, duplicated
//! or overtaken (IBA 9.7.1). A SEND, WRITE or READ response of more than one packet of
//! the path MTU, or a part of one ([`Frame::Part`]), becomes a part per packet: FIRST
//! (a WRITE's RETH, the message's length), MIDDLEs, LAST (the AckReq bit, which the
//! requester meant for the message's end); each packet then meets the network's faults
//! on its own.

use crate::psn;
use crate::wire::{Frame, PartKind, MAX_HDR_LEN};

/// What every part cut from one frame shares.
struct Whole {
    kind: PartKind,
    first: bool,
    last: bool,
    addr: u64,
    rkey: u32,
    total: u32,
    imm: Option<u32>,
    solicited: bool,
    ack_req: bool,
    inv: Option<u32>,
}

/// The frames, one per packet, that `frame` (its header `hlen` bytes of `unit`, its
/// payload the rest) is cut into at path MTU `mtu`; `None` for a frame of one packet or
/// one that carries no message.
pub(super) fn packets(frame: &Frame, unit: &[u8], hlen: usize, mtu: u32) -> Option<Vec<Vec<u8>>> {
    let (psn, len, w) = match *frame {
        Frame::Send {
            psn,
            len,
            imm,
            solicited,
            ack_req,
            inv,
        } => (
            psn,
            len,
            Whole {
                kind: PartKind::Send,
                first: true,
                last: true,
                addr: 0,
                rkey: 0,
                total: len,
                imm,
                solicited,
                ack_req,
                inv,
            },
        ),
        Frame::Write {
            psn,
            len,
            addr,
            rkey,
            imm,
            solicited,
            ack_req,
        } => (
            psn,
            len,
            Whole {
                kind: PartKind::Write,
                first: true,
                last: true,
                addr,
                rkey,
                total: len,
                imm,
                solicited,
                ack_req,
                inv: None,
            },
        ),
        Frame::ReadResp { psn, len } => (
            psn,
            len,
            Whole {
                kind: PartKind::ReadResp,
                first: true,
                last: true,
                addr: 0,
                rkey: 0,
                total: len,
                imm: None,
                solicited: false,
                ack_req: false,
                inv: None,
            },
        ),
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
        } => (
            psn,
            len,
            Whole {
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
        ),
        _ => return None,
    };
    let n = psn::packets(u64::from(len), mtu);
    if n < 2 || unit.len() != hlen + len as usize {
        return None;
    }
    let payload = &unit[hlen..];
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let (from, to) = (
            (i * mtu) as usize,
            (((i + 1) as u64 * mtu as u64).min(len as u64)) as usize,
        );
        let (first, last) = (w.first && i == 0, w.last && i + 1 == n);
        let part = Frame::Part {
            psn: psn::add(psn, i),
            len: (to - from) as u32,
            kind: w.kind,
            first,
            last,
            addr: if first { w.addr } else { 0 },
            rkey: if first { w.rkey } else { 0 },
            total: w.total,
            imm: w.imm,
            solicited: w.solicited,
            ack_req: w.ack_req && i + 1 == n,
            inv: w.inv,
        };
        let mut h = [0u8; MAX_HDR_LEN];
        let k = part.encode(&mut h);
        let mut bytes = Vec::with_capacity(k + to - from);
        bytes.extend_from_slice(&h[..k]);
        bytes.extend_from_slice(&payload[from..to]);
        out.push(bytes);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A three-packet WRITE becomes FIRST (with the RETH), MIDDLE and LAST (with the
    /// AckReq bit), each with its own PSN and its bytes of the payload.
    #[test]
    fn a_write_is_cut_into_first_middle_last() {
        let w = Frame::Write {
            psn: 0xff_fffe,
            len: 2500,
            addr: 0x1000,
            rkey: 7,
            imm: Some(9),
            solicited: false,
            ack_req: true,
        };
        let mut h = [0u8; MAX_HDR_LEN];
        let k = w.encode(&mut h);
        let mut unit = h[..k].to_vec();
        unit.extend((0..2500u32).map(|i| i as u8));
        let parts = packets(&w, &unit, k, 1024).expect("three packets");
        let decoded: Vec<(Frame, usize)> = parts.iter().map(|p| Frame::decode(p).unwrap().unwrap()).collect();
        let shape: Vec<_> = decoded
            .iter()
            .map(|(f, _)| match *f {
                Frame::Part {
                    psn,
                    len,
                    first,
                    last,
                    addr,
                    ack_req,
                    ..
                } => (psn, len, first, last, addr, ack_req),
                _ => panic!("{f}"),
            })
            .collect();
        assert_eq!(
            shape,
            [
                (0xff_fffe, 1024, true, false, 0x1000, false),
                (0xff_ffff, 1024, false, false, 0, false),
                (0, 452, false, true, 0, true),
            ]
        );
        let bytes: Vec<u8> = parts
            .iter()
            .zip(&decoded)
            .flat_map(|(p, (_, n))| p[*n..].to_vec())
            .collect();
        assert_eq!(bytes, unit[k..]);
        assert!(packets(&w, &unit, k, 4096).is_none());
    }
}
