//! The transport headers of one RoCE packet: the Base Transport Header and the extended
//! headers its opcode calls for (IBA 9.2-9.5), written in network byte order in IBA's
//! order.

use super::opcode::{extensions, Extensions};
use crate::wire::NakCode;

/// The BTH's length.
pub const BTH_LEN: usize = 12;

/// The Base Transport Header (IBA 9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    /// OpCode (transport and operation, [`super::opcode`]).
    pub opcode: u8,
    /// Solicited Event.
    pub solicited: bool,
    /// MigReq (rxe sends 0).
    pub mig_req: bool,
    /// P_Key (0xffff, the default partition, as rxe sends).
    pub pkey: u16,
    /// Destination QP.
    pub dst_qpn: u32,
    /// AckReq.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

/// The RDMA ETH (IBA 9.3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth {
    /// Virtual address.
    pub addr: u64,
    /// R_Key.
    pub rkey: u32,
    /// DMA length: the whole message's.
    pub len: u32,
}

/// The Atomic ETH (IBA 9.3.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicEth {
    /// Virtual address.
    pub addr: u64,
    /// R_Key.
    pub rkey: u32,
    /// Swap (CmpSwap) or add (FetchAdd) operand.
    pub swap_add: u64,
    /// Compare operand (0 for FetchAdd).
    pub compare: u64,
}

/// The ACK ETH (IBA 9.3.5): the syndrome and the responder's MSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aeth {
    /// Syndrome ([`ack_syndrome`], [`nak_syndrome`]).
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// An ACK's syndrome with no credit count (`0b000_11111`: credits not given, what rxe
/// sends).
pub const fn ack_syndrome() -> u8 {
    0x1f
}

/// A NAK's syndrome (IBA table 41): RNR NAK `001` and the timer code, else `011` and the
/// NAK code.
pub const fn nak_syndrome(code: NakCode) -> u8 {
    match code {
        NakCode::Rnr { timer } => 0x20 | (timer & 0x1f),
        NakCode::PsnSeq => 0x60,
        NakCode::InvalidRequest => 0x61,
        NakCode::RemoteAccess => 0x62,
        NakCode::RemoteOperational => 0x63,
    }
}

/// The headers of one packet after the network headers: a BTH and its extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    /// The base header.
    pub bth: Bth,
    /// DETH: Q_Key and source QP (UD).
    pub deth: Option<(u32, u32)>,
    /// RETH.
    pub reth: Option<Reth>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEth>,
    /// AETH.
    pub aeth: Option<Aeth>,
    /// AtomicAckETH: the original value.
    pub atomic_ack: Option<u64>,
    /// ImmDt, as the verbs' `imm_data` (sent as is, network order).
    pub imm: Option<u32>,
    /// IETH: the rkey to invalidate.
    pub ieth: Option<u32>,
}

/// Headers that do not fit their opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The opcode is not one of RC's, UC's or UD's.
    #[error("opcode {0:#04x} is not an RC, UC or UD opcode")]
    Opcode(u8),
    /// The extensions given are not the opcode's (IBA table 39).
    #[error("opcode {0:#04x} carries other extended headers than those given")]
    Extensions(u8),
    /// The bytes end before the headers their opcode carries.
    #[error("{0} bytes are too short for the headers of opcode {1:#04x}")]
    Short(usize, u8),
}

impl Headers {
    /// A packet of `opcode` to `dst_qpn` at `psn` with no extensions yet.
    pub fn new(opcode: u8, dst_qpn: u32, psn: u32) -> Headers {
        Headers {
            bth: Bth {
                opcode,
                solicited: false,
                mig_req: false,
                pkey: 0xffff,
                dst_qpn,
                ack_req: false,
                psn,
            },
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
        }
    }

    fn present(&self, payload: bool) -> Extensions {
        Extensions {
            deth: self.deth.is_some(),
            reth: self.reth.is_some(),
            atomic_eth: self.atomic_eth.is_some(),
            aeth: self.aeth.is_some(),
            atomic_ack_eth: self.atomic_ack.is_some(),
            imm: self.imm.is_some(),
            ieth: self.ieth.is_some(),
            payload,
        }
    }

    /// Their length in bytes (BTH included).
    pub fn len(&self) -> usize {
        BTH_LEN + self.present(false).len()
    }

    /// Never empty: a BTH is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the headers to `out` for a packet of `payload` bytes (whose length sets
    /// the BTH's pad count), checking they are what the opcode carries.
    pub fn write(&self, payload: usize, out: &mut Vec<u8>) -> Result<(), HeaderError> {
        let b = &self.bth;
        let want = extensions(b.opcode).ok_or(HeaderError::Opcode(b.opcode))?;
        if self.present(want.payload) != want || (!want.payload && payload > 0) {
            return Err(HeaderError::Extensions(b.opcode));
        }
        let pad = ((4 - payload % 4) % 4) as u8;
        out.push(b.opcode);
        // SE, M, pad count, transport header version 0.
        out.push(((b.solicited as u8) << 7) | ((b.mig_req as u8) << 6) | (pad << 4));
        out.extend_from_slice(&b.pkey.to_be_bytes());
        out.extend_from_slice(&(b.dst_qpn & 0x00ff_ffff).to_be_bytes());
        out.extend_from_slice(&((((b.ack_req as u32) << 31) | (b.psn & 0x00ff_ffff)).to_be_bytes()));
        if let Some((qkey, src_qpn)) = self.deth {
            out.extend_from_slice(&qkey.to_be_bytes());
            out.extend_from_slice(&(src_qpn & 0x00ff_ffff).to_be_bytes());
        }
        if let Some(r) = self.reth {
            out.extend_from_slice(&r.addr.to_be_bytes());
            out.extend_from_slice(&r.rkey.to_be_bytes());
            out.extend_from_slice(&r.len.to_be_bytes());
        }
        if let Some(a) = self.atomic_eth {
            out.extend_from_slice(&a.addr.to_be_bytes());
            out.extend_from_slice(&a.rkey.to_be_bytes());
            out.extend_from_slice(&a.swap_add.to_be_bytes());
            out.extend_from_slice(&a.compare.to_be_bytes());
        }
        if let Some(a) = self.aeth {
            out.extend_from_slice(&(((a.syndrome as u32) << 24) | (a.msn & 0x00ff_ffff)).to_be_bytes());
        }
        if let Some(v) = self.atomic_ack {
            out.extend_from_slice(&v.to_be_bytes());
        }
        if let Some(v) = self.imm {
            out.extend_from_slice(&v.to_be_bytes());
        }
        if let Some(v) = self.ieth {
            out.extend_from_slice(&v.to_be_bytes());
        }
        Ok(())
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    ((be32(b, at) as u64) << 32) | be32(b, at + 4) as u64
}

impl Headers {
    /// Reads the headers at the start of `b`: the BTH, then the extensions its opcode
    /// carries. Returns them, their length and the BTH's pad count.
    pub fn read(b: &[u8]) -> Result<(Headers, usize, usize), HeaderError> {
        let opcode = *b.first().ok_or(HeaderError::Short(0, 0))?;
        let ext = extensions(opcode).ok_or(HeaderError::Opcode(opcode))?;
        let len = BTH_LEN + ext.len();
        if b.len() < len {
            return Err(HeaderError::Short(b.len(), opcode));
        }
        let mut h = Headers::new(opcode, be32(b, 4) & 0x00ff_ffff, be32(b, 8) & 0x00ff_ffff);
        h.bth.solicited = b[1] & 0x80 != 0;
        h.bth.mig_req = b[1] & 0x40 != 0;
        h.bth.pkey = u16::from_be_bytes([b[2], b[3]]);
        h.bth.ack_req = b[8] & 0x80 != 0;
        let pad = ((b[1] >> 4) & 3) as usize;
        let mut at = BTH_LEN;
        let mut take = |n: usize| {
            at += n;
            at - n
        };
        if ext.deth {
            let i = take(8);
            h.deth = Some((be32(b, i), be32(b, i + 4) & 0x00ff_ffff));
        }
        if ext.reth {
            let i = take(16);
            h.reth = Some(Reth {
                addr: be64(b, i),
                rkey: be32(b, i + 8),
                len: be32(b, i + 12),
            });
        }
        if ext.atomic_eth {
            let i = take(28);
            h.atomic_eth = Some(AtomicEth {
                addr: be64(b, i),
                rkey: be32(b, i + 8),
                swap_add: be64(b, i + 12),
                compare: be64(b, i + 20),
            });
        }
        if ext.aeth {
            let i = take(4);
            h.aeth = Some(Aeth {
                syndrome: b[i],
                msn: be32(b, i) & 0x00ff_ffff,
            });
        }
        if ext.atomic_ack_eth {
            let i = take(8);
            h.atomic_ack = Some(be64(b, i));
        }
        if ext.imm {
            let i = take(4);
            h.imm = Some(be32(b, i));
        }
        if ext.ieth {
            let i = take(4);
            h.ieth = Some(be32(b, i));
        }
        Ok((h, len, pad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::opcode::op;

    #[test]
    fn a_write_only_with_immediate() {
        let mut h = Headers::new(op::WRITE_ONLY_IMM, 0x12_3456, 0xab_cdef);
        h.bth.ack_req = true;
        h.bth.solicited = true;
        h.reth = Some(Reth {
            addr: 0x1122_3344_5566_7788,
            rkey: 0xdead_beef,
            len: 5,
        });
        h.imm = Some(0x0102_0304);
        let mut out = Vec::new();
        h.write(5, &mut out).unwrap();
        assert_eq!(out.len(), h.len());
        assert_eq!(out.len(), 12 + 16 + 4);
        assert_eq!(out[0], 0x0b);
        assert_eq!(out[1], 0x80 | (3 << 4), "SE and a pad of 3 for 5 bytes");
        assert_eq!(&out[2..4], &[0xff, 0xff]);
        assert_eq!(&out[4..8], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&out[8..12], &[0x80, 0xab, 0xcd, 0xef]);
        assert_eq!(&out[20..24], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&out[28..32], &[1, 2, 3, 4]);
    }

    #[test]
    fn headers_that_do_not_fit_the_opcode_are_refused() {
        let h = Headers::new(op::WRITE_ONLY, 1, 0);
        assert_eq!(
            h.write(0, &mut Vec::new()),
            Err(HeaderError::Extensions(op::WRITE_ONLY))
        );
        let h = Headers::new(op::ACKNOWLEDGE, 1, 0);
        assert!(h.write(0, &mut Vec::new()).is_err(), "an ACK needs its AETH");
        let mut h = Headers::new(op::READ_REQUEST, 1, 0);
        h.reth = Some(Reth {
            addr: 0,
            rkey: 0,
            len: 8,
        });
        assert!(
            h.write(8, &mut Vec::new()).is_err(),
            "a READ request has no payload"
        );
        assert!(h.write(0, &mut Vec::new()).is_ok());
        assert_eq!(
            Headers::new(0x18, 1, 0).write(0, &mut Vec::new()),
            Err(HeaderError::Opcode(0x18))
        );
    }

    #[test]
    fn headers_read_back_as_written() {
        let mut h = Headers::new(op::COMPARE_SWAP, 7, 9);
        h.atomic_eth = Some(AtomicEth {
            addr: 0x1000,
            rkey: 3,
            swap_add: 5,
            compare: 6,
        });
        h.bth.ack_req = true;
        let mut out = Vec::new();
        h.write(0, &mut out).unwrap();
        assert_eq!(Headers::read(&out), Ok((h, out.len(), 0)));
        assert_eq!(
            Headers::read(&out[..20]),
            Err(HeaderError::Short(20, op::COMPARE_SWAP))
        );
        assert_eq!(Headers::read(&[]), Err(HeaderError::Short(0, 0)));
    }

    #[test]
    fn nak_syndromes_are_ibas() {
        assert_eq!(nak_syndrome(NakCode::Rnr { timer: 12 }), 0x2c);
        assert_eq!(nak_syndrome(NakCode::PsnSeq), 0x60);
        assert_eq!(nak_syndrome(NakCode::RemoteAccess), 0x62);
    }
}
