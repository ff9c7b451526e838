//! The frames on every message's path (SEND, RDMA WRITE, ACK, READ response) read in
//! one pass over their fixed-size header, ahead of [`Frame::decode`]'s general reader.
//!
//! The general reader looks each opcode up in several tables (extension length,
//! allowed flags, which base fields it uses) and builds the frame through a second
//! match; for a small message that costs more than everything else its header needs.
//! This reader takes only complete headers that break no rule and answers `None` for
//! anything else (short input, another opcode, any field the general reader would
//! refuse), which then goes the general way: so a frame it returns is exactly the one
//! the general reader returns for the same bytes, and every refusal keeps its error
//! (`tests::the_hot_reader_agrees_with_the_general_one` holds the two together).

use crate::wire::frame::Frame;
use crate::wire::header::{BASE_LEN, F_ACK_REQ, F_IMM, F_INV, F_SOLICITED, MAX_MSG};
use crate::wire::opcode::op;

/// Bytes of the extension of a WRITE (its RETH: address and rkey).
const RETH_LEN: usize = 12;

/// The frame at the front of `buf` and its header's length, if it is a complete and
/// valid SEND, WRITE, WRITE_PLACED, ACK or READ response; `None` for anything else,
/// which the general reader then decodes or refuses.
#[inline(always)]
pub(super) fn decode(buf: &[u8]) -> Option<(Frame, usize)> {
    let h: &[u8; BASE_LEN] = buf.get(..BASE_LEN)?.try_into().ok()?;
    let [opcode, flags, a0, a1, p0, p1, p2, p3, l0, l1, l2, l3, i0, i1, i2, i3] = *h;
    let psn = u32::from_le_bytes([p0, p1, p2, p3]);
    let len = u32::from_le_bytes([l0, l1, l2, l3]);
    let imm_raw = u32::from_le_bytes([i0, i1, i2, i3]);
    // None of these opcodes uses `aux`; every PSN is 24 bits.
    if a0 | a1 != 0 || psn > 0xff_ffff {
        return None;
    }
    let imm = (flags & F_IMM != 0).then_some(imm_raw);
    let solicited = flags & F_SOLICITED != 0;
    let ack_req = flags & F_ACK_REQ != 0;
    match opcode {
        op::SEND => {
            let inv = (flags & F_INV != 0).then_some(imm_raw);
            let bad_flags =
                flags & !(F_IMM | F_SOLICITED | F_ACK_REQ | F_INV) != 0 || (imm.is_some() && inv.is_some());
            if bad_flags || len > MAX_MSG || (imm.is_none() && inv.is_none() && imm_raw != 0) {
                return None;
            }
            let f = Frame::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                inv,
            };
            Some((f, BASE_LEN))
        }
        op::WRITE | op::WRITE_PLACED => {
            let e: &[u8; RETH_LEN] = buf.get(BASE_LEN..BASE_LEN + RETH_LEN)?.try_into().ok()?;
            let bad_flags = flags & !(F_IMM | F_SOLICITED | F_ACK_REQ) != 0;
            if bad_flags || len > MAX_MSG || (imm.is_none() && imm_raw != 0) {
                return None;
            }
            let [x0, x1, x2, x3, x4, x5, x6, x7, k0, k1, k2, k3] = *e;
            let addr = u64::from_le_bytes([x0, x1, x2, x3, x4, x5, x6, x7]);
            let rkey = u32::from_le_bytes([k0, k1, k2, k3]);
            let f = if opcode == op::WRITE {
                Frame::Write {
                    psn,
                    len,
                    addr,
                    rkey,
                    imm,
                    solicited,
                    ack_req,
                }
            } else {
                Frame::WritePlaced {
                    psn,
                    len,
                    addr,
                    rkey,
                    imm,
                    solicited,
                    ack_req,
                }
            };
            Some((f, BASE_LEN + RETH_LEN))
        }
        // An ACK uses the PSN alone; a READ response the PSN and the length.
        op::ACK if flags == 0 && len == 0 && imm_raw == 0 => Some((Frame::Ack { psn }, BASE_LEN)),
        op::READ_RESP if flags == 0 && len <= MAX_MSG && imm_raw == 0 => {
            Some((Frame::ReadResp { psn, len }, BASE_LEN))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::arb_frame;
    use crate::wire::MAX_HDR_LEN;
    use proptest::prelude::*;

    /// Whatever the hot reader takes, the general reader takes the same way.
    fn agree(b: &[u8]) -> Result<(), TestCaseError> {
        if let Some(hit) = decode(b) {
            prop_assert_eq!(Frame::decode_general(b), Ok(Some(hit)));
        }
        Ok(())
    }

    proptest! {
        /// Every valid frame, each of its prefixes and each single-byte mutation of it:
        /// the hot reader either passes or answers as the general one does.
        #[test]
        fn the_hot_reader_agrees_with_the_general_one(
            f in arb_frame(),
            i in 0usize..MAX_HDR_LEN,
            v in any::<u8>(),
        ) {
            let mut b = [0u8; MAX_HDR_LEN];
            let n = f.encode(&mut b);
            for k in 0..=n {
                agree(&b[..k])?;
            }
            b[i % n] = v;
            agree(&b[..n])?;
        }

        /// Any bytes (a hostile peer's) behind a hot opcode.
        #[test]
        fn the_hot_reader_agrees_on_any_bytes(
            opcode in proptest::sample::select(vec![op::SEND, op::WRITE, op::WRITE_PLACED, op::ACK, op::READ_RESP]),
            flags in proptest::sample::select(vec![0u8, F_IMM, F_INV, F_SOLICITED | F_ACK_REQ, F_IMM | F_INV, 0x08, 0xff]),
            mut rest in proptest::collection::vec(any::<u8>(), 0..40),
            zero_aux in any::<bool>(),
            zero_imm in any::<bool>(),
        ) {
            let mut b = vec![opcode, flags];
            b.append(&mut rest);
            if zero_aux && b.len() >= 4 {
                b[2..4].fill(0);
            }
            if zero_imm && b.len() >= 16 {
                b[12..16].fill(0);
            }
            agree(&b)?;
        }
    }

    /// The frames of a message's path are read by the hot reader, not passed on.
    #[test]
    fn the_frames_of_the_message_path_take_the_hot_reader() {
        let frames = [
            Frame::Send {
                psn: 7,
                len: 8,
                imm: None,
                solicited: false,
                ack_req: true,
                inv: None,
            },
            Frame::Send {
                psn: 0xff_ffff,
                len: 0,
                imm: None,
                solicited: true,
                ack_req: false,
                inv: Some(0x1234),
            },
            Frame::Write {
                psn: 9,
                len: 64,
                addr: 0x7f00_0000_1000,
                rkey: 0xabcd,
                imm: Some(5),
                solicited: false,
                ack_req: false,
            },
            Frame::WritePlaced {
                psn: 10,
                len: 64,
                addr: 0x1000,
                rkey: 3,
                imm: None,
                solicited: false,
                ack_req: true,
            },
            Frame::Ack { psn: 11 },
            Frame::ReadResp { psn: 12, len: 4096 },
        ];
        for f in frames {
            let mut b = [0u8; MAX_HDR_LEN];
            let n = f.encode(&mut b);
            assert_eq!(decode(&b[..n]), Some((f, n)), "{f:?}");
            assert_eq!(decode(&b[..n - 1]), None, "{f:?}: a short header");
        }
    }
}
