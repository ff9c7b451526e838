//! IBA's transport opcodes (IBA 9.2.1, table 38: the BTH's OpCode field, three bits of
//! transport and five of operation) and the extended transport headers each one carries
//! (table 39), for the transports the sim serves: RC, UC and UD.

/// The transport an opcode belongs to (its top three bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected, `000`.
    Rc,
    /// Unreliable Connected, `001`.
    Uc,
    /// Unreliable Datagram, `011`.
    Ud,
}

impl Transport {
    /// The opcode's top three bits for this transport.
    pub const fn base(self) -> u8 {
        match self {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
        }
    }
}

/// The operation, the opcode's low five bits (the same number on every transport that
/// has the operation).
pub mod op {
    /// SEND First.
    pub const SEND_FIRST: u8 = 0x00;
    /// SEND Middle.
    pub const SEND_MIDDLE: u8 = 0x01;
    /// SEND Last.
    pub const SEND_LAST: u8 = 0x02;
    /// SEND Last with Immediate.
    pub const SEND_LAST_IMM: u8 = 0x03;
    /// SEND Only.
    pub const SEND_ONLY: u8 = 0x04;
    /// SEND Only with Immediate.
    pub const SEND_ONLY_IMM: u8 = 0x05;
    /// RDMA WRITE First.
    pub const WRITE_FIRST: u8 = 0x06;
    /// RDMA WRITE Middle.
    pub const WRITE_MIDDLE: u8 = 0x07;
    /// RDMA WRITE Last.
    pub const WRITE_LAST: u8 = 0x08;
    /// RDMA WRITE Last with Immediate.
    pub const WRITE_LAST_IMM: u8 = 0x09;
    /// RDMA WRITE Only.
    pub const WRITE_ONLY: u8 = 0x0a;
    /// RDMA WRITE Only with Immediate.
    pub const WRITE_ONLY_IMM: u8 = 0x0b;
    /// RDMA READ Request.
    pub const READ_REQUEST: u8 = 0x0c;
    /// RDMA READ Response First.
    pub const READ_RESPONSE_FIRST: u8 = 0x0d;
    /// RDMA READ Response Middle.
    pub const READ_RESPONSE_MIDDLE: u8 = 0x0e;
    /// RDMA READ Response Last.
    pub const READ_RESPONSE_LAST: u8 = 0x0f;
    /// RDMA READ Response Only.
    pub const READ_RESPONSE_ONLY: u8 = 0x10;
    /// Acknowledge (an ACK or a NAK, by its AETH's syndrome).
    pub const ACKNOWLEDGE: u8 = 0x11;
    /// ATOMIC Acknowledge.
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    /// CmpSwap.
    pub const COMPARE_SWAP: u8 = 0x13;
    /// FetchAdd.
    pub const FETCH_ADD: u8 = 0x14;
    /// SEND Last with Invalidate.
    pub const SEND_LAST_INV: u8 = 0x16;
    /// SEND Only with Invalidate.
    pub const SEND_ONLY_INV: u8 = 0x17;
}

/// The extended transport headers an opcode carries after its BTH, in the order IBA
/// places them (DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extensions {
    /// Datagram ETH (8 bytes: Q_Key, source QP).
    pub deth: bool,
    /// RDMA ETH (16 bytes: virtual address, rkey, DMA length).
    pub reth: bool,
    /// Atomic ETH (28 bytes: virtual address, rkey, swap/add, compare).
    pub atomic_eth: bool,
    /// ACK ETH (4 bytes: syndrome, MSN).
    pub aeth: bool,
    /// Atomic ACK ETH (8 bytes: the original value).
    pub atomic_ack_eth: bool,
    /// Immediate data (4 bytes).
    pub imm: bool,
    /// Invalidate ETH (4 bytes: the rkey to invalidate).
    pub ieth: bool,
    /// Whether the opcode carries payload.
    pub payload: bool,
}

impl Extensions {
    /// Their length in bytes.
    pub const fn len(&self) -> usize {
        (self.deth as usize) * 8
            + (self.reth as usize) * 16
            + (self.atomic_eth as usize) * 28
            + (self.aeth as usize) * 4
            + (self.atomic_ack_eth as usize) * 8
            + (self.imm as usize) * 4
            + (self.ieth as usize) * 4
    }

    /// Whether there are none.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The extended headers of `opcode` (table 39), or `None` for an opcode the sim never
/// sends (reserved, RD, XRC, CNP).
pub fn extensions(opcode: u8) -> Option<Extensions> {
    let transport = match opcode >> 5 {
        0 => Transport::Rc,
        1 => Transport::Uc,
        3 => Transport::Ud,
        _ => return None,
    };
    let o = opcode & 0x1f;
    let e = Extensions::default();
    let data = Extensions { payload: true, ..e };
    let ext = match o {
        op::SEND_FIRST | op::SEND_MIDDLE | op::SEND_LAST | op::SEND_ONLY => data,
        op::SEND_LAST_IMM | op::SEND_ONLY_IMM => Extensions { imm: true, ..data },
        op::WRITE_FIRST | op::WRITE_ONLY => Extensions { reth: true, ..data },
        op::WRITE_MIDDLE | op::WRITE_LAST => data,
        op::WRITE_LAST_IMM => Extensions { imm: true, ..data },
        op::WRITE_ONLY_IMM => Extensions {
            reth: true,
            imm: true,
            ..data
        },
        op::READ_REQUEST => Extensions { reth: true, ..e },
        op::READ_RESPONSE_FIRST | op::READ_RESPONSE_LAST | op::READ_RESPONSE_ONLY => {
            Extensions { aeth: true, ..data }
        }
        op::READ_RESPONSE_MIDDLE => data,
        op::ACKNOWLEDGE => Extensions { aeth: true, ..e },
        op::ATOMIC_ACKNOWLEDGE => Extensions {
            aeth: true,
            atomic_ack_eth: true,
            ..e
        },
        op::COMPARE_SWAP | op::FETCH_ADD => Extensions {
            atomic_eth: true,
            ..e
        },
        op::SEND_LAST_INV | op::SEND_ONLY_INV => Extensions { ieth: true, ..data },
        _ => return None,
    };
    // Which operations each transport has (table 38): UC has SENDs and WRITEs, UD only
    // SEND Only (with Immediate), each with its DETH.
    let valid = match transport {
        Transport::Rc => true,
        Transport::Uc => o <= op::WRITE_ONLY_IMM,
        Transport::Ud => o == op::SEND_ONLY || o == op::SEND_ONLY_IMM,
    };
    valid.then_some(match transport {
        Transport::Ud => Extensions { deth: true, ..ext },
        _ => ext,
    })
}

/// The operation's name as IBA's table 38 gives it, in capitals (`SEND_FIRST`,
/// `RDMA_READ_RESPONSE_ONLY`, `ACKNOWLEDGE`), or `None` for an opcode the sim never sends.
pub fn name(opcode: u8) -> Option<&'static str> {
    extensions(opcode)?;
    Some(match opcode & 0x1f {
        op::SEND_FIRST => "SEND_FIRST",
        op::SEND_MIDDLE => "SEND_MIDDLE",
        op::SEND_LAST => "SEND_LAST",
        op::SEND_LAST_IMM => "SEND_LAST_WITH_IMMEDIATE",
        op::SEND_ONLY => "SEND_ONLY",
        op::SEND_ONLY_IMM => "SEND_ONLY_WITH_IMMEDIATE",
        op::WRITE_FIRST => "RDMA_WRITE_FIRST",
        op::WRITE_MIDDLE => "RDMA_WRITE_MIDDLE",
        op::WRITE_LAST => "RDMA_WRITE_LAST",
        op::WRITE_LAST_IMM => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
        op::WRITE_ONLY => "RDMA_WRITE_ONLY",
        op::WRITE_ONLY_IMM => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        op::READ_REQUEST => "RDMA_READ_REQUEST",
        op::READ_RESPONSE_FIRST => "RDMA_READ_RESPONSE_FIRST",
        op::READ_RESPONSE_MIDDLE => "RDMA_READ_RESPONSE_MIDDLE",
        op::READ_RESPONSE_LAST => "RDMA_READ_RESPONSE_LAST",
        op::READ_RESPONSE_ONLY => "RDMA_READ_RESPONSE_ONLY",
        op::ACKNOWLEDGE => "ACKNOWLEDGE",
        op::ATOMIC_ACKNOWLEDGE => "ATOMIC_ACKNOWLEDGE",
        op::COMPARE_SWAP => "COMPARE_SWAP",
        op::FETCH_ADD => "FETCH_ADD",
        op::SEND_LAST_INV => "SEND_LAST_WITH_INVALIDATE",
        _ => "SEND_ONLY_WITH_INVALIDATE",
    })
}

/// The transport of an opcode the sim sends.
pub fn transport(opcode: u8) -> Option<Transport> {
    extensions(opcode)?;
    Some(match opcode >> 5 {
        0 => Transport::Rc,
        1 => Transport::Uc,
        _ => Transport::Ud,
    })
}

/// Whether the opcode is a responder's (an acknowledgement or a READ response) rather
/// than a request.
pub fn is_response(opcode: u8) -> bool {
    (op::READ_RESPONSE_FIRST..=op::ATOMIC_ACKNOWLEDGE).contains(&(opcode & 0x1f)) && opcode >> 5 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_lengths() {
        // IBA table 38/39's header lengths for a few opcodes.
        assert_eq!(extensions(0x0a).unwrap().len(), 16); // RC WRITE Only: RETH
        assert_eq!(extensions(0x0b).unwrap().len(), 20); // RETH + ImmDt
        assert_eq!(extensions(0x13).unwrap().len(), 28); // CmpSwap: AtomicETH
        assert_eq!(extensions(0x12).unwrap().len(), 12); // AETH + AtomicAckETH
        assert_eq!(extensions(0x65).unwrap().len(), 12); // UD SEND Only Imm: DETH + ImmDt
        assert_eq!(extensions(0x2a).unwrap().len(), 16); // UC WRITE Only
        assert!(extensions(0x2c).is_none()); // UC has no READ
        assert!(extensions(0x60).is_none()); // UD has no SEND First
        assert!(extensions(0x40).is_none()); // RD is not served
        assert!(extensions(0x18).is_none()); // reserved
    }

    #[test]
    fn names_and_kinds() {
        assert_eq!(name(0x0a), Some("RDMA_WRITE_ONLY"));
        assert_eq!(name(0x2a), Some("RDMA_WRITE_ONLY"));
        assert_eq!(name(0x17), Some("SEND_ONLY_WITH_INVALIDATE"));
        assert_eq!(name(0x2c), None);
        assert_eq!(transport(0x64), Some(Transport::Ud));
        assert!(is_response(0x11) && is_response(0x10) && !is_response(0x0c) && !is_response(0x24));
    }
}
