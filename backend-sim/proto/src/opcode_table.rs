//! What each send opcode needs, consumes and answers, in one table: the requester and
//! the responder look here instead of each deciding with a `match` of its own.
//!
//! One row per `IBV_WR_*` opcode ([`WrOpcode`]), after IBA's opcode and transport tables
//! (9.2, 9.3: the extended headers each packet carries; 9.7: which responses each request
//! gets; 11.4.1.1: which QP types post which operations) and `man ibv_post_send`:
//!
//! | opcode | RC | UC | UD | RETH | AtomicETH | ImmDt | IETH | gathers data | consumes a receive | remote access | RC answer |
//! |---|---|---|---|---|---|---|---|---|---|---|---|
//! | `RDMA_WRITE` | yes | yes | no | yes | | | | yes | no | `REMOTE_WRITE` | ACK |
//! | `RDMA_WRITE_WITH_IMM` | yes | yes | no | yes | | yes | | yes | yes | `REMOTE_WRITE` | ACK |
//! | `SEND` | yes | yes | yes | | | | | yes | yes | | ACK |
//! | `SEND_WITH_IMM` | yes | yes | yes | | | yes | | yes | yes | | ACK |
//! | `RDMA_READ` | yes | no | no | yes | | | | no | no | `REMOTE_READ` | READ response |
//! | `ATOMIC_CMP_AND_SWP` | yes | no | no | | yes | | | no | no | `REMOTE_ATOMIC` | atomic ACK |
//! | `ATOMIC_FETCH_AND_ADD` | yes | no | no | | yes | | | no | no | `REMOTE_ATOMIC` | atomic ACK |
//! | `LOCAL_INV` | yes | yes | no | | | | | no | no | | none (local) |
//! | `BIND_MW` | yes | yes | no | | | | | no | no | | none (local) |
//! | `SEND_WITH_INV` | yes | yes | no | | | | yes | yes | yes | | ACK |
//!
//! "Gathers data": the WR's gather list (or inline data) is the message, so
//! `IBV_SEND_INLINE` applies; a READ's and an atomic's list is where the answer lands.
//! UC and UD answer nothing: the RC answer column is what an RC responder sends back.
//! The sim's UC carries SEND_WITH_INV as it carries SEND (its invalidation included),
//! as it always has; a QP type marked "no" is refused at post where the profile checks
//! it there (`Switches::opcode_checked_at_post`), else failed as the WR starts.
//! `tests` hold the table to `verbs_api`'s own per-opcode helpers.

use verbs_api::{AccessFlags, QpType, WrOpcode};

/// What an RC responder sends back for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// An ACK (coalesced, or asked for by the requester).
    Ack,
    /// RDMA READ response packets, carrying the data.
    ReadResponse,
    /// An atomic acknowledgement carrying the original 64-bit value.
    AtomicAck,
    /// Nothing: the operation is executed by the send queue itself.
    Local,
}

/// One opcode's row: see the module's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpcodeRow {
    /// The opcode.
    pub opcode: WrOpcode,
    /// Whether an RC QP may post it.
    pub rc: bool,
    /// Whether a UC QP may post it.
    pub uc: bool,
    /// Whether a UD QP may post it.
    pub ud: bool,
    /// Whether its request carries a RETH (remote address, R_Key, length).
    pub reth: bool,
    /// Whether its request carries an AtomicETH (address, R_Key, operands).
    pub atomic_eth: bool,
    /// Whether its request carries immediate data.
    pub imm_dt: bool,
    /// Whether its request carries an IETH (the R_Key to invalidate).
    pub ieth: bool,
    /// Whether the WR's gather list is the message sent (so it may be inline).
    pub gathers: bool,
    /// Whether it consumes a receive WQE at the responder.
    pub consumes_recv: bool,
    /// The access right the responder's region (and QP) must grant, empty for none.
    pub access: AccessFlags,
    /// What an RC responder answers.
    pub answer: Answer,
}

impl OpcodeRow {
    /// Whether a QP of type `t` may post it.
    pub const fn allowed_on(&self, t: QpType) -> bool {
        match t {
            QpType::Rc => self.rc,
            QpType::Uc => self.uc,
            QpType::Ud => self.ud,
        }
    }

    /// Whether the responder answers with data (READ, atomics): these count against
    /// `max_rd_atomic` and are what `IBV_SEND_FENCE` waits for.
    pub const fn answers_with_data(&self) -> bool {
        matches!(self.answer, Answer::ReadResponse | Answer::AtomicAck)
    }

    /// Whether the send queue executes it without the peer (no message, no PSN).
    pub const fn is_local(&self) -> bool {
        matches!(self.answer, Answer::Local)
    }
}

const NONE: AccessFlags = AccessFlags::empty();

/// A row with every column off but the opcode's: the table below sets what it has.
const fn blank(opcode: WrOpcode) -> OpcodeRow {
    OpcodeRow {
        opcode,
        rc: true,
        uc: false,
        ud: false,
        reth: false,
        atomic_eth: false,
        imm_dt: false,
        ieth: false,
        gathers: false,
        consumes_recv: false,
        access: NONE,
        answer: Answer::Ack,
    }
}

/// The rows, at the index of each opcode's number (`WrOpcode as usize`).
const TABLE: [OpcodeRow; 10] = [
    OpcodeRow {
        uc: true,
        reth: true,
        gathers: true,
        access: AccessFlags::REMOTE_WRITE,
        ..blank(WrOpcode::RdmaWrite)
    },
    OpcodeRow {
        uc: true,
        reth: true,
        imm_dt: true,
        gathers: true,
        consumes_recv: true,
        access: AccessFlags::REMOTE_WRITE,
        ..blank(WrOpcode::RdmaWriteWithImm)
    },
    OpcodeRow {
        uc: true,
        ud: true,
        gathers: true,
        consumes_recv: true,
        ..blank(WrOpcode::Send)
    },
    OpcodeRow {
        uc: true,
        ud: true,
        imm_dt: true,
        gathers: true,
        consumes_recv: true,
        ..blank(WrOpcode::SendWithImm)
    },
    OpcodeRow {
        reth: true,
        access: AccessFlags::REMOTE_READ,
        answer: Answer::ReadResponse,
        ..blank(WrOpcode::RdmaRead)
    },
    OpcodeRow {
        atomic_eth: true,
        access: AccessFlags::REMOTE_ATOMIC,
        answer: Answer::AtomicAck,
        ..blank(WrOpcode::AtomicCmpAndSwp)
    },
    OpcodeRow {
        atomic_eth: true,
        access: AccessFlags::REMOTE_ATOMIC,
        answer: Answer::AtomicAck,
        ..blank(WrOpcode::AtomicFetchAndAdd)
    },
    OpcodeRow {
        uc: true,
        answer: Answer::Local,
        ..blank(WrOpcode::LocalInv)
    },
    OpcodeRow {
        uc: true,
        answer: Answer::Local,
        ..blank(WrOpcode::BindMw)
    },
    OpcodeRow {
        uc: true,
        ieth: true,
        gathers: true,
        consumes_recv: true,
        ..blank(WrOpcode::SendWithInv)
    },
];

/// The row of `opcode`.
#[inline]
pub const fn row(opcode: WrOpcode) -> &'static OpcodeRow {
    &TABLE[opcode as usize]
}

#[cfg(test)]
mod tests {
    use verbs_api::{RemoteAddr, WrOp};

    use super::*;

    fn every_op() -> [WrOp; 10] {
        let remote = RemoteAddr { addr: 0, rkey: 1 };
        [
            WrOp::RdmaWrite { remote },
            WrOp::RdmaWriteWithImm { remote, imm_data: 1 },
            WrOp::Send,
            WrOp::SendWithImm { imm_data: 1 },
            WrOp::RdmaRead { remote },
            WrOp::AtomicCmpAndSwp {
                remote,
                compare: 0,
                swap: 1,
            },
            WrOp::AtomicFetchAndAdd { remote, add: 1 },
            WrOp::LocalInv { rkey: 1 },
            WrOp::BindMw,
            WrOp::SendWithInv { rkey: 1 },
        ]
    }

    #[test]
    fn each_row_sits_at_its_opcodes_number() {
        for (i, r) in TABLE.iter().enumerate() {
            assert_eq!(r.opcode as usize, i, "{:?}", r.opcode);
        }
    }

    /// The table agrees with what `verbs_api` says of each operation.
    #[test]
    fn the_table_agrees_with_the_operations_own_helpers() {
        for op in every_op() {
            let r = row(op.opcode());
            assert_eq!(r.opcode, op.opcode());
            assert_eq!(r.consumes_recv, op.consumes_recv(), "{op:?}");
            assert_eq!(r.answers_with_data(), op.is_read_or_atomic(), "{op:?}");
            assert_eq!(r.atomic_eth, op.is_atomic(), "{op:?}");
            assert_eq!(r.is_local(), op.is_local(), "{op:?}");
            assert_eq!(r.reth || r.atomic_eth, op.remote().is_some(), "{op:?}");
            assert_eq!(r.imm_dt, op.imm_data().is_some(), "{op:?}");
            assert_eq!(r.ieth, op.invalidate_rkey().is_some() && !r.is_local(), "{op:?}");
            // Only what goes to a peer needs a right there, and only a remote address does.
            assert_eq!(!r.access.is_empty(), r.reth || r.atomic_eth, "{op:?}");
            assert!(r.rc, "{op:?}");
            assert!(!r.ud || r.uc, "{op:?}: UD's opcodes are UC's too");
        }
    }

    #[test]
    fn ud_posts_only_sends_and_uc_no_read_or_atomic() {
        let on = |t: QpType| -> Vec<WrOpcode> {
            TABLE
                .iter()
                .filter(|r| r.allowed_on(t))
                .map(|r| r.opcode)
                .collect()
        };
        assert_eq!(on(QpType::Ud), [WrOpcode::Send, WrOpcode::SendWithImm]);
        assert!(on(QpType::Uc).iter().all(|&o| !row(o).answers_with_data()));
        assert_eq!(on(QpType::Rc).len(), TABLE.len());
    }
}
