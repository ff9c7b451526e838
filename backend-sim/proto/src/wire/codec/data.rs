//! The frames of an established connection (IBA 9.7's requests and responses at message
//! granularity): SEND, RDMA WRITE and READ with their RETH, the atomics with their
//! AtomicETH, ACKs, READ responses, atomic responses with their AtomicAckETH. (NAKs are
//! in `nak`.)

use crate::wire::frame::{Frame, WireError};
use crate::wire::header::{u32_at, u64_at, Base, F_INV};
use crate::wire::opcode::op;

impl Frame {
    /// Writes the extension of a request or response (a SEND, an ACK and a READ response
    /// have none).
    #[inline]
    pub(super) fn encode_data_ext(&self, e: &mut [u8]) {
        match *self {
            Frame::Write { addr, rkey, .. }
            | Frame::WritePlaced { addr, rkey, .. }
            | Frame::ReadPlaced { addr, rkey, .. }
            | Frame::Read { addr, rkey, .. } => {
                e[0..8].copy_from_slice(&addr.to_le_bytes());
                e[8..12].copy_from_slice(&rkey.to_le_bytes());
            }
            Frame::CmpSwap {
                addr,
                rkey,
                compare,
                swap,
                ..
            } => {
                e[0..8].copy_from_slice(&addr.to_le_bytes());
                e[8..12].copy_from_slice(&rkey.to_le_bytes());
                e[12..20].copy_from_slice(&compare.to_le_bytes());
                e[20..28].copy_from_slice(&swap.to_le_bytes());
            }
            Frame::FetchAdd { addr, rkey, add, .. } => {
                e[0..8].copy_from_slice(&addr.to_le_bytes());
                e[8..12].copy_from_slice(&rkey.to_le_bytes());
                e[12..20].copy_from_slice(&add.to_le_bytes());
                e[20..28].copy_from_slice(&0u64.to_le_bytes());
            }
            Frame::AtomicPlaced {
                addr,
                rkey,
                compare,
                swap_add,
                ..
            } => {
                // As CMP_SWAP's (compare, swap) or FETCH_ADD's (add, reserved 0).
                let (first, second) = match compare {
                    Some(c) => (c, swap_add),
                    None => (swap_add, 0),
                };
                e[0..8].copy_from_slice(&addr.to_le_bytes());
                e[8..12].copy_from_slice(&rkey.to_le_bytes());
                e[12..20].copy_from_slice(&first.to_le_bytes());
                e[20..28].copy_from_slice(&second.to_le_bytes());
            }
            Frame::AtomicResp { orig, .. } => e[0..8].copy_from_slice(&orig.to_le_bytes()),
            Frame::PlacedRun { msgs, rd_atomic, .. } => {
                e[0..4].copy_from_slice(&msgs.to_le_bytes());
                e[4..8].copy_from_slice(&rd_atomic.to_le_bytes());
            }
            _ => {}
        }
    }

    /// Reads a request or response from its base header and extension.
    #[inline]
    pub(super) fn decode_data(b: &Base, e: &[u8]) -> Result<Frame, WireError> {
        let (psn, len, flags, aux, imm_raw) = (b.psn, b.len, b.flags, b.aux, b.imm_raw);
        let (imm, solicited, ack_req) = (b.imm(), b.solicited(), b.ack_req());
        Ok(match b.opcode {
            op::SEND => Frame::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                inv: (flags & F_INV != 0).then_some(imm_raw),
            },
            op::WRITE => Frame::Write {
                psn,
                len,
                addr: u64_at(e, 0),
                rkey: u32_at(e, 8),
                imm,
                solicited,
                ack_req,
            },
            op::WRITE_PLACED => Frame::WritePlaced {
                psn,
                len,
                addr: u64_at(e, 0),
                rkey: u32_at(e, 8),
                imm,
                solicited,
                ack_req,
            },
            op::READ_PLACED => Frame::ReadPlaced {
                psn,
                len,
                addr: u64_at(e, 0),
                rkey: u32_at(e, 8),
                ack_req,
            },
            op::CMP_SWAP_PLACED => Frame::AtomicPlaced {
                psn,
                addr: u64_at(e, 0),
                rkey: u32_at(e, 8),
                compare: Some(u64_at(e, 12)),
                swap_add: u64_at(e, 20),
                ack_req,
            },
            op::FETCH_ADD_PLACED => Frame::AtomicPlaced {
                psn,
                addr: u64_at(e, 0),
                rkey: u32_at(e, 8),
                compare: None,
                swap_add: u64_at(e, 12),
                ack_req,
            },
            op::READ => Frame::Read {
                psn,
                len,
                addr: u64_at(e, 0),
                rkey: u32_at(e, 8),
                inflight: aux,
            },
            op::CMP_SWAP => Frame::CmpSwap {
                psn,
                inflight: aux,
                addr: u64_at(e, 0),
                rkey: u32_at(e, 8),
                compare: u64_at(e, 12),
                swap: u64_at(e, 20),
            },
            op::FETCH_ADD => Frame::FetchAdd {
                psn,
                inflight: aux,
                addr: u64_at(e, 0),
                rkey: u32_at(e, 8),
                add: u64_at(e, 12),
            },
            op::PLACED_RUN => {
                let (pkts, msgs, rd_atomic) = (len, u32_at(e, 0), u32_at(e, 4));
                // A run takes fewer than half the PSN space (an ACK could not be told from
                // one of the other half), each operation at least one PSN.
                if msgs == 0 || msgs > pkts || rd_atomic > msgs || pkts >= 1 << 23 {
                    return Err(WireError::BadField("placed run counts"));
                }
                Frame::PlacedRun {
                    psn,
                    pkts,
                    msgs,
                    rd_atomic,
                    ack_req,
                }
            }
            op::ACK => Frame::Ack { psn },
            op::READ_RESP => Frame::ReadResp { psn, len },
            op::ATOMIC_RESP => Frame::AtomicResp {
                psn,
                orig: u64_at(e, 0),
            },
            other => return Err(WireError::UnknownOpcode(other)),
        })
    }
}
