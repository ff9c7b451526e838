//! A datagram's extension (the DETH's QPNs and Q_Key, the GRH's fields): written and
//! read, and its fields checked.

use crate::wire::datagram::{Grh, MAX_DATAGRAM};
use crate::wire::frame::{Frame, WireError};
use crate::wire::header::{u32_at, Base, F_GRH};

impl Frame {
    /// Writes a datagram's extension (the DETH's QPNs and Q_Key, the GRH's fields, zeros
    /// without a GRH).
    pub(super) fn encode_datagram_ext(&self, e: &mut [u8]) {
        if let Frame::Datagram {
            dst_qpn,
            src_qpn,
            qkey,
            grh,
            ..
        } = *self
        {
            let g = grh.unwrap_or_default();
            e[0..4].copy_from_slice(&dst_qpn.to_le_bytes());
            e[4..8].copy_from_slice(&src_qpn.to_le_bytes());
            e[8..12].copy_from_slice(&qkey.to_le_bytes());
            e[12..16].copy_from_slice(&g.flow_label.to_le_bytes());
            e[16] = g.traffic_class;
            e[17] = g.hop_limit;
            e[18] = g.src_default as u8;
            e[19] = 0;
            e[20..36].copy_from_slice(&g.dgid);
        }
    }

    /// Reads a datagram from its base header and extension.
    pub(super) fn decode_datagram(b: &Base, e: &[u8]) -> Result<Frame, WireError> {
        let (psn, len, flags) = (b.psn, b.len, b.flags);
        let (imm, solicited) = (b.imm(), b.solicited());
        let dst_qpn = u32_at(e, 0);
        let src_qpn = u32_at(e, 4);
        if dst_qpn > 0xff_ffff || src_qpn > 0xff_ffff {
            return Err(WireError::BadField("QPN"));
        }
        if len > MAX_DATAGRAM {
            return Err(WireError::BadField("datagram length (above the MTU)"));
        }
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&e[20..36]);
        let g = Grh {
            dgid,
            flow_label: u32_at(e, 12),
            traffic_class: e[16],
            hop_limit: e[17],
            src_default: e[18] == 1,
        };
        if g.flow_label > 0xf_ffff || e[18] > 1 || e[19] != 0 {
            return Err(WireError::BadField("GRH fields"));
        }
        let grh = if flags & F_GRH != 0 {
            Some(g)
        } else if g != Grh::default() {
            return Err(WireError::BadField("GRH fields without F_GRH"));
        } else {
            None
        };
        Ok(Frame::Datagram {
            psn,
            len,
            dst_qpn,
            src_qpn,
            qkey: u32_at(e, 8),
            imm,
            solicited,
            grh,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BASE_LEN, DATAGRAM_HDR_LEN, F_ACK_REQ, F_GRH, MAX_HDR_LEN};

    fn datagram(grh: Option<Grh>) -> Frame {
        Frame::Datagram {
            psn: 5,
            len: 100,
            dst_qpn: 0x12_3456,
            src_qpn: 0x65_4321,
            qkey: 0x8000_0011,
            imm: Some(7),
            solicited: true,
            grh,
        }
    }

    /// A datagram is neither a request nor a response (it never travels on a QP pair's
    /// connection), its payload follows it, and its header has one length.
    #[test]
    fn a_datagram_is_neither_request_nor_response() {
        let mut b = [0u8; MAX_HDR_LEN];
        for grh in [
            None,
            Some(Grh::default()),
            Some(Grh {
                dgid: [3; 16],
                flow_label: 0xf_ffff,
                traffic_class: 9,
                hop_limit: 64,
                src_default: true,
            }),
        ] {
            let f = datagram(grh);
            assert!(!f.is_request() && !f.is_response());
            assert_eq!(f.payload_len(), 100);
            assert_eq!(f.encode(&mut b), DATAGRAM_HDR_LEN);
            assert_eq!(
                Frame::decode(&b[..DATAGRAM_HDR_LEN]),
                Ok(Some((f, DATAGRAM_HDR_LEN)))
            );
        }
    }

    /// What a datagram may not carry: a payload above the MTU, AckReq (UD has no
    /// acknowledgements), GRH fields without the GRH flag, a flow label wider than 20
    /// bits, a QPN wider than 24.
    #[test]
    fn malformed_datagrams_are_refused() {
        let mut b = [0u8; MAX_HDR_LEN];
        let n = datagram(None).encode(&mut b);
        let bad = |b: &[u8]| assert!(Frame::decode(b).is_err(), "{:?}", Frame::decode(b));
        let mut c = b;
        c[8..12].copy_from_slice(&(MAX_DATAGRAM + 1).to_le_bytes());
        bad(&c[..n]);
        let mut c = b;
        c[1] |= F_ACK_REQ;
        bad(&c[..n]);
        let mut c = b;
        c[BASE_LEN + 17] = 1;
        bad(&c[..n]);
        let mut c = b;
        c[BASE_LEN + 3] = 1;
        bad(&c[..n]);
        let n = datagram(Some(Grh::default())).encode(&mut b);
        let mut c = b;
        c[BASE_LEN + 12..BASE_LEN + 16].copy_from_slice(&0x10_0000u32.to_le_bytes());
        bad(&c[..n]);
        let mut c = b;
        c[BASE_LEN + 18] = 2;
        bad(&c[..n]);
        let mut c = b;
        c[BASE_LEN + 19] = 1;
        bad(&c[..n]);
        // The GRH flag is a datagram's only.
        let n = Frame::Send {
            psn: 1,
            len: 0,
            imm: None,
            solicited: false,
            ack_req: false,
            inv: None,
        }
        .encode(&mut b);
        b[1] = F_GRH;
        bad(&b[..n]);
    }
}
