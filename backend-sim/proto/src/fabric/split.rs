//! A frame cut into its packets: the fabric carries a message the way a RoCE network
//! does, one packet per PSN, so that one packet inside a message can be lost, duplicated
//! or overtaken (IBA 9.7.1). A SEND, WRITE or READ response of more than one packet of
//! the path MTU, or a part of one ([`Frame::Part`]), becomes a part per packet: FIRST
//! (a WRITE's RETH, the message's length), MIDDLEs, LAST (the AckReq bit, which the
//! requester meant for the message's end); each packet then meets the network's faults
//! on its own.

use crate::psn;
use crate::wire::{Frame, Packets, MAX_HDR_LEN};

/// The frames, one per packet, that `frame` (its header `hlen` bytes of `unit`, its
/// payload the rest) is cut into at path MTU `mtu`; `None` for a frame of one packet or
/// one that carries no message.
pub(super) fn packets(frame: &Frame, unit: &[u8], hlen: usize, mtu: u32) -> Option<Vec<Vec<u8>>> {
    let w = frame.packets()?;
    let n = psn::packets(u64::from(w.len), mtu);
    if n < 2 || unit.len() != hlen + w.len as usize {
        return None;
    }
    let payload = &unit[hlen..];
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let from = (i * mtu) as usize;
        let to = ((u64::from(i) + 1) * u64::from(mtu)).min(u64::from(w.len)) as usize;
        let part = Packets {
            psn: psn::add(w.psn, i),
            len: (to - from) as u32,
            first: w.first && i == 0,
            last: w.last && i + 1 == n,
            ack_req: w.ack_req && i + 1 == n,
            ..w
        }
        .part();
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
