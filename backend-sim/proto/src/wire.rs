//! The sim's wire format: frame encode/decode only, no I/O.
//!
//! One TCP stream carries both directions of a QP pair, as the two halves of an IB RC
//! connection share one path: each side's requests and the answers of its responder to
//! the other side's requests (see docs/wire.md for the connection hello). The frames
//! mirror InfiniBand's headers at message granularity (TCP already segments and
//! retransmits): a 16-byte base header (like the BTH: opcode, flags, PSN, plus length and
//! immediate), then an extension that depends on the opcode (RETH for RDMA, AtomicETH for
//! atomics, AtomicAckETH for atomic responses, a hello block for connection setup, the
//! DETH and the GRH's fields for a datagram), then `len` payload bytes for SEND, WRITE,
//! READ responses and datagrams. A NAK, which has no immediate, carries the responder's
//! [`NakReason`] in that field.
//!
//! UD datagrams travel on a different stream: one *link* per pair of devices, which
//! carries the datagrams of every UD QP of both ([`Frame::Datagram`]), set up by a
//! [`Frame::LinkHello`] that the accepting device checks with the claimed device
//! ([`Frame::LinkVerify`]).
//!
//! All integers are little-endian. The decoder accepts any bytes: short input asks for
//! more, anything malformed (unknown opcode, a length beyond the message limit, a PSN or
//! QPN wider than 24 bits, bad magic) is a [`WireError`], never a panic.

use std::fmt;

use verbs_api::QpType;

/// Bytes of the base header.
pub const BASE_LEN: usize = 16;
/// Longest header (base + largest extension: the hello's).
pub const MAX_HDR_LEN: usize = BASE_LEN + 48;
/// Longest header of a frame that travels on an established connection (requests and
/// responses; the setup frames are longer).
pub const MAX_DATA_HDR_LEN: usize = BASE_LEN + 28;
/// Bytes of a datagram's header (base and extension).
pub const DATAGRAM_HDR_LEN: usize = BASE_LEN + 36;
/// Largest datagram payload: the port's MTU (4096, `IBV_MTU_4096`, which the sim's port
/// reports as its active MTU). A UD message longer than that is never sent (IBA
/// C10-93.1.1), so a longer datagram on a link is malformed.
pub const MAX_DATAGRAM: u32 = 4096;
/// Bytes of the global route header (IBA 8.3) at the start of every UD receive buffer
/// (`man ibv_post_recv`).
pub const GRH_LEN: usize = 40;
/// Largest message (2^31 bytes, as `ibv_port_attr::max_msg_sz` on most HCAs).
pub const MAX_MSG: u32 = 1 << 31;
/// Magic of the hello frame ("RSIM").
pub const HELLO_MAGIC: u32 = 0x4d49_5352;
/// Protocol version in the hello frame (8: the connection manager: a rendezvous at an
/// rdma_cm port ([`Frame::CmLookup`], [`Frame::CmAddress`]) and CM messages as datagrams
/// to QP 1 ([`crate::cm_msg`]); 7: SEND_WITH_INV ([`F_INV`]), and NAK reasons for memory
/// windows; 6: a datagram's GRH says whether its source is
/// the sender's default GID ([`Grh::src_default`]), and READs and atomics carry the
/// requester's count of them outstanding ([`Frame::Read`]'s `inflight`); 5: links between devices carry UD datagrams
/// ([`Frame::LinkHello`], [`Frame::LinkVerify`], [`Frame::Datagram`]); 4: hellos name the
/// QP type, RC or UC, and a UC connection's responder acknowledges every message it took
/// in; 3: hellos carry a
/// token that the passive side checks with the claimed peer device ([`Frame::Verify`]),
/// and a NAK may carry a [`NakReason`]; 2: SEND and WRITE may carry [`F_ACK_REQ`]). A
/// device refuses a hello of another version ([`HelloReject::Version`]): both ends of a
/// connection must run builds that speak the same frames.
pub const VERSION: u16 = 8;
/// Bytes of the token a hello carries.
pub const TOKEN_LEN: usize = 16;

/// Frame flag: the request carries immediate data.
pub const F_IMM: u8 = 1;
/// Frame flag: the solicited-event bit.
pub const F_SOLICITED: u8 = 2;
/// Frame flag: the requester asks for an ACK (the BTH's AckReq bit, IBA 9.2): the
/// responder acknowledges the request once it is executed instead of coalescing the ACK
/// with later ones (see `Requester::ack_req_due` for when requesters set it).
pub const F_ACK_REQ: u8 = 4;
/// Frame flag, on datagrams only: the sender's address handle had a GRH (`is_global`),
/// whose fields the frame carries ([`Grh`]).
pub const F_GRH: u8 = 8;
/// Frame flag, on SEND only: SEND_WITH_INV (IBA's IETH), the rkey to invalidate in the
/// base header's immediate field (a SEND with invalidate carries no immediate).
pub const F_INV: u8 = 16;

/// Why a connection setup (or a [`Frame::Verify`]) was refused.
///
/// A device tells a stranger nothing about its QPs: whether the QP does not exist, is
/// not ready, expects another peer or the claim failed its check, the refusal is the same
/// bytes ([`HelloReject::Refused`]); the device logs the real reason at debug level. Only
/// a protocol version mismatch, which says nothing about QPs, is told apart, so that the
/// other build can report it instead of retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum HelloReject {
    /// Refused (no such QP, not ready, another peer, or the claim was not confirmed).
    Refused = 1,
    /// Protocol version mismatch.
    Version = 4,
}

impl HelloReject {
    fn from_raw(v: u16) -> Result<Self, WireError> {
        Ok(match v {
            1 => HelloReject::Refused,
            4 => HelloReject::Version,
            _ => return Err(WireError::BadField("hello reject reason")),
        })
    }
}

/// The syndrome of a NAK (IBA 9.7.5.2.8, AETH syndrome encodings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    /// Receiver not ready: no receive posted. Carries the responder's RNR timer code.
    Rnr {
        /// `min_rnr_timer` code of the responder QP.
        timer: u8,
    },
    /// PSN sequence error: the responder expected another PSN (carried in the frame).
    PsnSeq,
    /// Invalid request (message too long for the receive, misaligned atomic, ...).
    InvalidRequest,
    /// Remote access error (rkey, PD, rights, bounds).
    RemoteAccess,
    /// Remote operational error (the responder failed, e.g. a bad receive SGE).
    RemoteOperational,
}

impl NakCode {
    fn to_raw(self) -> u16 {
        match self {
            NakCode::Rnr { timer } => 0x100 | (timer as u16 & 31),
            NakCode::PsnSeq => 0x200,
            NakCode::InvalidRequest => 0x201,
            NakCode::RemoteAccess => 0x202,
            NakCode::RemoteOperational => 0x203,
        }
    }

    fn from_raw(v: u16) -> Result<Self, WireError> {
        Ok(match v {
            0x100..=0x11f => NakCode::Rnr {
                timer: (v & 31) as u8,
            },
            0x200 => NakCode::PsnSeq,
            0x201 => NakCode::InvalidRequest,
            0x202 => NakCode::RemoteAccess,
            0x203 => NakCode::RemoteOperational,
            _ => return Err(WireError::BadField("NAK syndrome")),
        })
    }
}

/// Which check a responder's request failed, carried in its NAK beside the syndrome (a
/// field of the sim's own: the AETH of IBA 9.7.5.2.8 has room only for the syndrome) and
/// reported by the requester in the work completion's `vendor_err`, where an HCA puts its
/// vendor syndrome. `IBV_WC_REM_ACCESS_ERR` says that a remote access was refused,
/// `IBV_WC_REM_INV_REQ_ERR` that a request was invalid; the code says why.
///
/// | `vendor_err` | status | reason |
/// |---|---|---|
/// | `0x101` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::UnknownRkey`] |
/// | `0x102` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::DeregisteredRkey`] |
/// | `0x103` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::WrongPd`] |
/// | `0x104` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::QpAccess`] |
/// | `0x105` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::MrAccess`] |
/// | `0x106` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::OutOfBounds`] |
/// | `0x107` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::UnboundWindow`] |
/// | `0x108` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::StaleWindowKey`] |
/// | `0x109` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::WindowOfOtherQp`] |
/// | `0x10a` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::WindowAccess`] |
/// | `0x10b` | `IBV_WC_REM_ACCESS_ERR` | [`NakReason::OutsideWindow`] |
/// | `0x201` | `IBV_WC_REM_INV_REQ_ERR` | [`NakReason::MisalignedAtomic`] |
/// | `0x202` | `IBV_WC_REM_INV_REQ_ERR` | [`NakReason::NoRdAtomicResources`] |
/// | `0x203` | `IBV_WC_REM_INV_REQ_ERR` | [`NakReason::RecvTooShort`] |
/// | `0x204` | `IBV_WC_REM_INV_REQ_ERR` | [`NakReason::RdAtomicOverLimit`] |
///
/// `vendor_err` 0 with these statuses: the responder gave no reason. The codes do not
/// overlap the `errno` values that `IBV_WC_RETRY_EXC_ERR` carries there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum NakReason {
    /// The rkey names no memory region of the responder's device (nor one deregistered
    /// recently).
    UnknownRkey = 0x101,
    /// The rkey named a memory region that has been deregistered (`ibv_dereg_mr`), or a
    /// memory window deallocated (`ibv_dealloc_mw`): the device remembers the last 1024
    /// such keys.
    DeregisteredRkey = 0x102,
    /// The memory region belongs to another protection domain than the responder QP.
    WrongPd = 0x103,
    /// The responder QP's `qp_access_flags` do not allow the operation
    /// (`IBV_ACCESS_REMOTE_WRITE`, `_REMOTE_READ` or `_REMOTE_ATOMIC`).
    QpAccess = 0x104,
    /// The memory region was registered without the right the operation needs
    /// (`IBV_ACCESS_REMOTE_WRITE` for WRITE, `_REMOTE_READ` for READ, `_REMOTE_ATOMIC`
    /// for atomics).
    MrAccess = 0x105,
    /// The address range leaves the memory region.
    OutOfBounds = 0x106,
    /// The rkey names a memory window that is not bound (never bound, unbound, or
    /// invalidated).
    UnboundWindow = 0x107,
    /// The rkey names a memory window whose rkey has another tag now: it was bound again
    /// since the rkey was handed out (`ibv_inc_rkey`).
    StaleWindowKey = 0x108,
    /// The rkey names a type 2 memory window bound to another QP than the one the
    /// request arrived on.
    WindowOfOtherQp = 0x109,
    /// The memory window does not grant the operation (its `mw_access_flags`).
    WindowAccess = 0x10a,
    /// The address range leaves the memory window.
    OutsideWindow = 0x10b,
    /// An atomic on an address that is not 8-byte aligned.
    MisalignedAtomic = 0x201,
    /// An RDMA READ or atomic to a QP with no responder resources for them
    /// (`max_dest_rd_atomic` 0).
    NoRdAtomicResources = 0x202,
    /// A SEND longer than the receive buffers posted for it (the responder's receive
    /// completes with `IBV_WC_LOC_LEN_ERR`).
    RecvTooShort = 0x203,
    /// An RDMA READ or atomic sent while the requester had more of them outstanding than
    /// the responder QP's `max_dest_rd_atomic` (its responder resources).
    RdAtomicOverLimit = 0x204,
}

impl NakReason {
    /// Every reason, in code order.
    pub const ALL: [NakReason; 15] = [
        NakReason::UnknownRkey,
        NakReason::DeregisteredRkey,
        NakReason::WrongPd,
        NakReason::QpAccess,
        NakReason::MrAccess,
        NakReason::OutOfBounds,
        NakReason::UnboundWindow,
        NakReason::StaleWindowKey,
        NakReason::WindowOfOtherQp,
        NakReason::WindowAccess,
        NakReason::OutsideWindow,
        NakReason::MisalignedAtomic,
        NakReason::NoRdAtomicResources,
        NakReason::RecvTooShort,
        NakReason::RdAtomicOverLimit,
    ];

    /// The code, as a work completion's `vendor_err` carries it.
    pub fn vendor_err(self) -> u32 {
        self as u32
    }

    /// The reason a `vendor_err` of an `IBV_WC_REM_ACCESS_ERR` or `IBV_WC_REM_INV_REQ_ERR`
    /// completion names (`None`: no reason given, or not a code of this table).
    pub fn from_vendor_err(code: u32) -> Option<NakReason> {
        NakReason::ALL.into_iter().find(|r| r.vendor_err() == code)
    }

    /// Whether a NAK with syndrome `code` may give this reason: its own [`code`](Self::code),
    /// or for [`NakReason::QpAccess`] also an invalid request, which a device whose
    /// profile refuses those as invalid requests sends
    /// (`switches::Switches::qp_access_invalid_request`, rxe's choice).
    pub fn may_carry(self, code: NakCode) -> bool {
        self.code() == code || (self == NakReason::QpAccess && code == NakCode::InvalidRequest)
    }

    /// The syndrome a NAK with this reason carries.
    pub fn code(self) -> NakCode {
        match self {
            NakReason::MisalignedAtomic
            | NakReason::NoRdAtomicResources
            | NakReason::RecvTooShort
            | NakReason::RdAtomicOverLimit => NakCode::InvalidRequest,
            _ => NakCode::RemoteAccess,
        }
    }
}

impl fmt::Display for NakReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NakReason::UnknownRkey => "the rkey names no memory region",
            NakReason::DeregisteredRkey => {
                "the rkey names a deregistered memory region (or a deallocated memory window)"
            }
            NakReason::WrongPd => "the memory region belongs to another protection domain than the QP",
            NakReason::QpAccess => "the QP's qp_access_flags do not allow the operation",
            NakReason::MrAccess => "the memory region's access flags do not allow the operation",
            NakReason::OutOfBounds => "the address range leaves the memory region",
            NakReason::UnboundWindow => "the rkey names a memory window that is not bound",
            NakReason::StaleWindowKey => {
                "the rkey names a memory window that was bound again since (its tag changed)"
            }
            NakReason::WindowOfOtherQp => "the rkey names a type 2 memory window bound to another QP",
            NakReason::WindowAccess => "the memory window does not grant the operation",
            NakReason::OutsideWindow => "the address range leaves the memory window",
            NakReason::MisalignedAtomic => "the atomic's address is not 8-byte aligned",
            NakReason::NoRdAtomicResources => {
                "the QP has no responder resources for RDMA READ and atomics (max_dest_rd_atomic 0)"
            }
            NakReason::RecvTooShort => "the message is longer than the receive buffers",
            NakReason::RdAtomicOverLimit => {
                "more RDMA READ and atomic requests outstanding than the QP's max_dest_rd_atomic"
            }
        })
    }
}

/// The fields of a datagram's global route header that its sender chooses (its address
/// handle's `ibv_global_route`). The receiver builds the 40-byte GRH from them, the
/// datagram's length and the source GID of the link it arrived on (never a GID the frame
/// names: the sender's identity comes from the link's check).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Grh {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// The source GID is the sender's default GID (its GID 0,
    /// [`gid::default_of`](crate::gid::default_of) its link's), not the GID of its IP.
    pub src_default: bool,
}

/// One decoded frame (the header; payload bytes, if any, follow on the stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Connection setup, active QP's device → passive QP's device.
    Hello {
        /// GID of the active QP's device (its entry at the QP's `sgid_index`).
        src_gid: [u8; 16],
        /// LID (TCP port) of the active QP's device.
        src_lid: u16,
        /// The active QP's transport (RC or UC): a QP accepts only a peer of its own
        /// type, as an HCA drops packets of another transport's opcodes.
        qp_type: QpType,
        /// Active QP number.
        src_qpn: u32,
        /// Passive QP number.
        dst_qpn: u32,
        /// A random secret of this attempt, which the claimed device confirms to the
        /// passive side through [`Frame::Verify`].
        token: [u8; TOKEN_LEN],
    },
    /// Connection accepted (or, answering a [`Frame::Verify`], the claim confirmed).
    HelloAck,
    /// Connection refused (or, answering a [`Frame::Verify`], the claim denied).
    HelloNak {
        /// Why.
        reason: HelloReject,
    },
    /// The passive side's check of a hello, sent to the listener at the address its QP's
    /// address vector names (never to an address the hello names): "is your QP `src_qpn`
    /// saying hello to my QP `dst_qpn` with `token` right now?" Answered with
    /// [`Frame::HelloAck`] or [`Frame::HelloNak`], then the connection closes.
    Verify {
        /// The QP that claims to be saying hello (on the device asked).
        src_qpn: u32,
        /// The QP it says hello to (on the asking device).
        dst_qpn: u32,
        /// The hello's token.
        token: [u8; TOKEN_LEN],
    },
    /// Link setup, connecting device → accepting device: "the device at (`src_gid`,
    /// `src_lid`) opens a link for UD datagrams".
    LinkHello {
        /// GID of the connecting device: the GID of its IP (its GID table entry 1).
        src_gid: [u8; 16],
        /// LID (TCP port) of the connecting device.
        src_lid: u16,
        /// A random secret of this attempt, which the claimed device confirms to the
        /// accepting one through [`Frame::LinkVerify`].
        token: [u8; TOKEN_LEN],
    },
    /// The accepting device's check of a link hello, sent to the listener at the address
    /// the hello's GID and LID name: "are you opening a link, with `token`, that arrived
    /// at my address `at_ip`:`at_port`?" Answered with [`Frame::HelloAck`] or
    /// [`Frame::HelloNak`], then the connection closes.
    LinkVerify {
        /// The address the link arrived at (the accepting socket's local address, as an
        /// IPv6 or IPv4-mapped address).
        at_ip: [u8; 16],
        /// Its TCP port.
        at_port: u16,
        /// The link hello's token.
        token: [u8; TOKEN_LEN],
    },
    /// The connection manager's rendezvous (docs/wire.md "Connection manager"), sent to
    /// the TCP port an rdma_cm listener holds: "which device takes connection requests
    /// for port `port` of port space `port_space` here?" Answered with
    /// [`Frame::CmAddress`] or [`Frame::HelloNak`], then the connection closes.
    CmLookup {
        /// rdma_cm's port space (`RDMA_PS_TCP` 0x106, `RDMA_PS_UDP` 0x111, ...).
        port_space: u16,
        /// The rdma_cm port.
        port: u16,
    },
    /// The answer to a [`Frame::CmLookup`]: the device that takes the requests, as its
    /// GID (the GID of its IP) and LID name it.
    CmAddress {
        /// The device's GID.
        gid: [u8; 16],
        /// Its LID (0 on an Ethernet port).
        lid: u16,
    },
    /// A UD datagram (IBA's UD SEND ONLY with its DETH), followed by `len` payload bytes
    /// (at most [`MAX_DATAGRAM`]). Travels on a link, never on a QP pair's connection.
    Datagram {
        /// The sending QP's packet sequence number.
        psn: u32,
        /// Payload length.
        len: u32,
        /// The destination QP (on the device at the other end of the link).
        dst_qpn: u32,
        /// The sending QP (on the device at this end of the link).
        src_qpn: u32,
        /// The Q_Key the datagram carries (the DETH's).
        qkey: u32,
        /// Immediate data (SEND_WITH_IMM).
        imm: Option<u32>,
        /// Solicited event.
        solicited: bool,
        /// The GRH fields, when the sender's address handle had a GRH ([`F_GRH`]).
        grh: Option<Grh>,
    },
    /// SEND / SEND_WITH_IMM / SEND_WITH_INV, followed by `len` payload bytes.
    Send {
        /// Packet sequence number.
        psn: u32,
        /// Payload length.
        len: u32,
        /// Immediate data.
        imm: Option<u32>,
        /// Solicited event.
        solicited: bool,
        /// The requester asks for an ACK ([`F_ACK_REQ`]).
        ack_req: bool,
        /// SEND_WITH_INV: the rkey of the memory window the responder invalidates
        /// ([`F_INV`]; never with `imm`).
        inv: Option<u32>,
    },
    /// RDMA WRITE / WRITE_WITH_IMM, followed by `len` payload bytes.
    Write {
        /// Packet sequence number.
        psn: u32,
        /// Payload length.
        len: u32,
        /// Remote virtual address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: Option<u32>,
        /// Solicited event.
        solicited: bool,
        /// The requester asks for an ACK ([`F_ACK_REQ`]).
        ack_req: bool,
    },
    /// RDMA READ request of `len` bytes.
    Read {
        /// Packet sequence number.
        psn: u32,
        /// Bytes requested.
        len: u32,
        /// Remote virtual address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// RDMA READs and atomics the requester has outstanding, this one included (a
        /// field of the sim's own: a responder learns from it that it is asked for more
        /// than its `max_dest_rd_atomic`, as an HCA learns from its resources running out).
        inflight: u16,
    },
    /// ATOMIC CMP_AND_SWP.
    CmpSwap {
        /// Packet sequence number.
        psn: u32,
        /// As [`Frame::Read`]'s.
        inflight: u16,
        /// Remote virtual address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// ATOMIC FETCH_AND_ADD.
    FetchAdd {
        /// Packet sequence number.
        psn: u32,
        /// As [`Frame::Read`]'s.
        inflight: u16,
        /// Remote virtual address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// Positive acknowledgement of every request up to and including `psn`.
    Ack {
        /// Last PSN acknowledged.
        psn: u32,
    },
    /// Negative acknowledgement of the request `psn` (and implicit ACK of those before).
    Nak {
        /// The PSN refused (for PSN sequence errors: the PSN expected).
        psn: u32,
        /// Why.
        code: NakCode,
        /// Which check failed, for remote access errors and invalid requests (travels in
        /// the base header's immediate field, which a NAK does not otherwise use; 0 there
        /// is `None`). Always of `code`'s kind ([`NakReason::code`]).
        reason: Option<NakReason>,
    },
    /// READ response for request `psn`, followed by `len` payload bytes.
    ReadResp {
        /// PSN of the READ request.
        psn: u32,
        /// Payload length.
        len: u32,
    },
    /// Atomic response for request `psn`: the original value of the word.
    AtomicResp {
        /// PSN of the atomic request.
        psn: u32,
        /// Value before the operation.
        orig: u64,
    },
}

/// A malformed frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Unknown opcode byte.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// A field out of range.
    #[error("malformed {0}")]
    BadField(&'static str),
    /// A payload length beyond the message limit.
    #[error("message length {0} exceeds the 2^31 byte limit")]
    TooLong(u32),
    /// A hello of another protocol version.
    #[error("the peer speaks sim protocol version {0}, this build version {VERSION}")]
    Version(u16),
}

mod op {
    pub const HELLO: u8 = 0x01;
    pub const HELLO_ACK: u8 = 0x02;
    pub const HELLO_NAK: u8 = 0x03;
    pub const VERIFY: u8 = 0x04;
    pub const LINK_HELLO: u8 = 0x05;
    pub const LINK_VERIFY: u8 = 0x06;
    pub const CM_LOOKUP: u8 = 0x07;
    pub const CM_ADDRESS: u8 = 0x08;
    pub const SEND: u8 = 0x10;
    pub const WRITE: u8 = 0x11;
    pub const READ: u8 = 0x12;
    pub const CMP_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    pub const ACK: u8 = 0x20;
    pub const NAK: u8 = 0x21;
    pub const READ_RESP: u8 = 0x22;
    pub const ATOMIC_RESP: u8 = 0x23;
    pub const DATAGRAM: u8 = 0x30;
}

fn ext_len(opcode: u8) -> Option<usize> {
    Some(match opcode {
        op::HELLO => 48,
        op::VERIFY => 32,
        op::LINK_HELLO | op::LINK_VERIFY => 40,
        op::CM_LOOKUP => 8,
        op::CM_ADDRESS => 24,
        op::DATAGRAM => 36,
        op::HELLO_ACK | op::HELLO_NAK | op::SEND | op::ACK | op::NAK | op::READ_RESP => 0,
        op::WRITE | op::READ => 12,
        op::CMP_SWAP | op::FETCH_ADD => 28,
        op::ATOMIC_RESP => 8,
        _ => return None,
    })
}

/// Bytes of the whole header of a frame whose first byte is `opcode` (base and
/// extension), or `None` for an unknown opcode: lets a reader take exactly one header off
/// a stream, as connection setup does before it allocates anything for the connection.
pub fn header_len(opcode: u8) -> Option<usize> {
    ext_len(opcode).map(|e| BASE_LEN + e)
}

/// The header length of a connection-setup frame (hello, link hello, their checks and
/// their answers)
/// from its base header alone, so that setup reads exactly one header and never a data
/// frame's: any other opcode is an error, and so is a hello or check of another protocol
/// version, before its extension (whose length may differ between versions) is read.
pub fn setup_header_len(base: &[u8; BASE_LEN]) -> Result<usize, WireError> {
    let opcode = base[0];
    match opcode {
        op::HELLO | op::VERIFY | op::LINK_HELLO | op::LINK_VERIFY | op::CM_LOOKUP | op::CM_ADDRESS
            if u16_at(base, 2) != VERSION =>
        {
            Err(WireError::Version(u16_at(base, 2)))
        }
        op::HELLO
        | op::HELLO_ACK
        | op::HELLO_NAK
        | op::VERIFY
        | op::LINK_HELLO
        | op::LINK_VERIFY
        | op::CM_LOOKUP
        | op::CM_ADDRESS => Ok(header_len(opcode).expect("setup opcodes are known")),
        _ => Err(WireError::UnknownOpcode(opcode)),
    }
}

impl Frame {
    /// Payload bytes that follow this frame's header on the stream.
    pub fn payload_len(&self) -> u32 {
        match *self {
            Frame::Send { len, .. }
            | Frame::Write { len, .. }
            | Frame::ReadResp { len, .. }
            | Frame::Datagram { len, .. } => len,
            _ => 0,
        }
    }

    /// Whether the frame is a SEND or WRITE that asks for an ACK ([`F_ACK_REQ`]).
    pub fn ack_req(&self) -> bool {
        matches!(
            self,
            Frame::Send { ack_req: true, .. } | Frame::Write { ack_req: true, .. }
        )
    }

    /// The PSN, for request and response frames.
    pub fn psn(&self) -> Option<u32> {
        match *self {
            Frame::Send { psn, .. }
            | Frame::Write { psn, .. }
            | Frame::Read { psn, .. }
            | Frame::CmpSwap { psn, .. }
            | Frame::FetchAdd { psn, .. }
            | Frame::Ack { psn }
            | Frame::Nak { psn, .. }
            | Frame::ReadResp { psn, .. }
            | Frame::AtomicResp { psn, .. }
            | Frame::Datagram { psn, .. } => Some(psn),
            Frame::Hello { .. }
            | Frame::HelloAck
            | Frame::HelloNak { .. }
            | Frame::Verify { .. }
            | Frame::LinkHello { .. }
            | Frame::LinkVerify { .. }
            | Frame::CmLookup { .. }
            | Frame::CmAddress { .. } => None,
        }
    }

    /// Whether this frame travels requester → responder on a QP pair's connection (a
    /// datagram, which travels on a link, is neither a request nor a response).
    pub fn is_request(&self) -> bool {
        matches!(
            self,
            Frame::Send { .. }
                | Frame::Write { .. }
                | Frame::Read { .. }
                | Frame::CmpSwap { .. }
                | Frame::FetchAdd { .. }
        )
    }

    /// Whether this frame travels responder → requester.
    pub fn is_response(&self) -> bool {
        matches!(
            self,
            Frame::Ack { .. } | Frame::Nak { .. } | Frame::ReadResp { .. } | Frame::AtomicResp { .. }
        )
    }

    /// Encodes the header into `out`, returning the number of bytes written.
    #[inline]
    pub fn encode(&self, out: &mut [u8; MAX_HDR_LEN]) -> usize {
        let (opcode, flags, aux, psn, len, imm) = match *self {
            Frame::Hello { .. } => (op::HELLO, 0, VERSION, 0, 0, 0),
            Frame::Verify { .. } => (op::VERIFY, 0, VERSION, 0, 0, 0),
            Frame::LinkHello { .. } => (op::LINK_HELLO, 0, VERSION, 0, 0, 0),
            Frame::LinkVerify { .. } => (op::LINK_VERIFY, 0, VERSION, 0, 0, 0),
            Frame::CmLookup { .. } => (op::CM_LOOKUP, 0, VERSION, 0, 0, 0),
            Frame::CmAddress { .. } => (op::CM_ADDRESS, 0, VERSION, 0, 0, 0),
            Frame::Datagram {
                psn,
                len,
                imm,
                solicited,
                grh,
                ..
            } => (
                op::DATAGRAM,
                flags_of(imm, solicited, false) | if grh.is_some() { F_GRH } else { 0 },
                0,
                psn,
                len,
                imm.unwrap_or(0),
            ),
            Frame::HelloAck => (op::HELLO_ACK, 0, 0, 0, 0, 0),
            Frame::HelloNak { reason } => (op::HELLO_NAK, 0, reason as u16, 0, 0, 0),
            Frame::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                inv,
            } => (
                op::SEND,
                flags_of(imm, solicited, ack_req) | if inv.is_some() { F_INV } else { 0 },
                0,
                psn,
                len,
                imm.or(inv).unwrap_or(0),
            ),
            Frame::Write {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                ..
            } => (
                op::WRITE,
                flags_of(imm, solicited, ack_req),
                0,
                psn,
                len,
                imm.unwrap_or(0),
            ),
            Frame::Read {
                psn, len, inflight, ..
            } => (op::READ, 0, inflight, psn, len, 0),
            Frame::CmpSwap { psn, inflight, .. } => (op::CMP_SWAP, 0, inflight, psn, 0, 0),
            Frame::FetchAdd { psn, inflight, .. } => (op::FETCH_ADD, 0, inflight, psn, 0, 0),
            Frame::Ack { psn } => (op::ACK, 0, 0, psn, 0, 0),
            Frame::Nak { psn, code, reason } => (
                op::NAK,
                0,
                code.to_raw(),
                psn,
                0,
                reason.map_or(0, NakReason::vendor_err),
            ),
            Frame::ReadResp { psn, len } => (op::READ_RESP, 0, 0, psn, len, 0),
            Frame::AtomicResp { psn, .. } => (op::ATOMIC_RESP, 0, 0, psn, 0, 0),
        };
        out[0] = opcode;
        out[1] = flags;
        out[2..4].copy_from_slice(&aux.to_le_bytes());
        out[4..8].copy_from_slice(&psn.to_le_bytes());
        out[8..12].copy_from_slice(&len.to_le_bytes());
        out[12..16].copy_from_slice(&imm.to_le_bytes());
        let e = &mut out[BASE_LEN..];
        match *self {
            Frame::Hello {
                src_gid,
                src_lid,
                qp_type,
                src_qpn,
                dst_qpn,
                token,
            } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&src_lid.to_le_bytes());
                e[6..8].copy_from_slice(&(qp_type as u16).to_le_bytes());
                e[8..12].copy_from_slice(&src_qpn.to_le_bytes());
                e[12..16].copy_from_slice(&dst_qpn.to_le_bytes());
                e[16..32].copy_from_slice(&src_gid);
                e[32..48].copy_from_slice(&token);
            }
            Frame::Verify {
                src_qpn,
                dst_qpn,
                token,
            } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..8].copy_from_slice(&src_qpn.to_le_bytes());
                e[8..12].copy_from_slice(&dst_qpn.to_le_bytes());
                e[12..16].copy_from_slice(&0u32.to_le_bytes());
                e[16..32].copy_from_slice(&token);
            }
            Frame::LinkHello {
                src_gid,
                src_lid,
                token,
            } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&src_lid.to_le_bytes());
                e[6..8].copy_from_slice(&0u16.to_le_bytes());
                e[8..24].copy_from_slice(&src_gid);
                e[24..40].copy_from_slice(&token);
            }
            Frame::LinkVerify {
                at_ip,
                at_port,
                token,
            } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&at_port.to_le_bytes());
                e[6..8].copy_from_slice(&0u16.to_le_bytes());
                e[8..24].copy_from_slice(&at_ip);
                e[24..40].copy_from_slice(&token);
            }
            Frame::CmLookup { port_space, port } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&port_space.to_le_bytes());
                e[6..8].copy_from_slice(&port.to_le_bytes());
            }
            Frame::CmAddress { gid, lid } => {
                e[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
                e[4..6].copy_from_slice(&lid.to_le_bytes());
                e[6..8].copy_from_slice(&0u16.to_le_bytes());
                e[8..24].copy_from_slice(&gid);
            }
            Frame::Datagram {
                dst_qpn,
                src_qpn,
                qkey,
                grh,
                ..
            } => {
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
            Frame::Write { addr, rkey, .. } | Frame::Read { addr, rkey, .. } => {
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
            Frame::AtomicResp { orig, .. } => e[0..8].copy_from_slice(&orig.to_le_bytes()),
            _ => {}
        }
        BASE_LEN + ext_len(opcode).expect("encoder only emits known opcodes")
    }

    /// Decodes one header from the front of `buf`. `Ok(None)`: more bytes are needed.
    /// `Ok(Some((frame, n)))`: the header took `n` bytes (its payload, if any, follows).
    #[inline]
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
        if buf.len() < BASE_LEN {
            return Ok(None);
        }
        let opcode = buf[0];
        let ext = ext_len(opcode).ok_or(WireError::UnknownOpcode(opcode))?;
        if buf.len() < BASE_LEN + ext {
            return Ok(None);
        }
        let flags = buf[1];
        let aux = u16_at(buf, 2);
        let psn = u32_at(buf, 4);
        let len = u32_at(buf, 8);
        let imm_raw = u32_at(buf, 12);
        let allowed = match opcode {
            op::SEND => F_IMM | F_SOLICITED | F_ACK_REQ | F_INV,
            op::WRITE => F_IMM | F_SOLICITED | F_ACK_REQ,
            op::DATAGRAM => F_IMM | F_SOLICITED | F_GRH,
            _ => 0,
        };
        if flags & !allowed != 0 || flags & (F_IMM | F_INV) == F_IMM | F_INV {
            return Err(WireError::BadField("flags"));
        }
        if psn > 0xff_ffff {
            return Err(WireError::BadField("PSN"));
        }
        if len > MAX_MSG {
            return Err(WireError::TooLong(len));
        }
        let imm = (flags & F_IMM != 0).then_some(imm_raw);
        let solicited = flags & F_SOLICITED != 0;
        let ack_req = flags & F_ACK_REQ != 0;
        let e = &buf[BASE_LEN..];
        let frame = match opcode {
            op::HELLO => {
                if u32_at(e, 0) != HELLO_MAGIC {
                    return Err(WireError::BadField("hello magic"));
                }
                if aux != VERSION {
                    return Err(WireError::Version(aux));
                }
                let src_qpn = u32_at(e, 8);
                let dst_qpn = u32_at(e, 12);
                if src_qpn > 0xff_ffff || dst_qpn > 0xff_ffff {
                    return Err(WireError::BadField("QPN"));
                }
                let mut src_gid = [0u8; 16];
                src_gid.copy_from_slice(&e[16..32]);
                let mut token = [0u8; TOKEN_LEN];
                token.copy_from_slice(&e[32..48]);
                let qp_type = match u16_at(e, 6) {
                    2 => QpType::Rc,
                    3 => QpType::Uc,
                    _ => return Err(WireError::BadField("QP type")),
                };
                Frame::Hello {
                    src_gid,
                    src_lid: u16_at(e, 4),
                    qp_type,
                    src_qpn,
                    dst_qpn,
                    token,
                }
            }
            op::VERIFY => {
                if u32_at(e, 0) != HELLO_MAGIC {
                    return Err(WireError::BadField("verify magic"));
                }
                if aux != VERSION {
                    return Err(WireError::Version(aux));
                }
                let src_qpn = u32_at(e, 4);
                let dst_qpn = u32_at(e, 8);
                if src_qpn > 0xff_ffff || dst_qpn > 0xff_ffff {
                    return Err(WireError::BadField("QPN"));
                }
                if u32_at(e, 12) != 0 {
                    return Err(WireError::BadField("reserved field"));
                }
                let mut token = [0u8; TOKEN_LEN];
                token.copy_from_slice(&e[16..32]);
                Frame::Verify {
                    src_qpn,
                    dst_qpn,
                    token,
                }
            }
            op::LINK_HELLO | op::LINK_VERIFY => {
                if u32_at(e, 0) != HELLO_MAGIC {
                    return Err(WireError::BadField("link magic"));
                }
                if aux != VERSION {
                    return Err(WireError::Version(aux));
                }
                if u16_at(e, 6) != 0 {
                    return Err(WireError::BadField("reserved field"));
                }
                let mut addr = [0u8; 16];
                addr.copy_from_slice(&e[8..24]);
                let mut token = [0u8; TOKEN_LEN];
                token.copy_from_slice(&e[24..40]);
                if opcode == op::LINK_HELLO {
                    Frame::LinkHello {
                        src_gid: addr,
                        src_lid: u16_at(e, 4),
                        token,
                    }
                } else {
                    Frame::LinkVerify {
                        at_ip: addr,
                        at_port: u16_at(e, 4),
                        token,
                    }
                }
            }
            op::CM_LOOKUP | op::CM_ADDRESS => {
                if u32_at(e, 0) != HELLO_MAGIC {
                    return Err(WireError::BadField("CM rendezvous magic"));
                }
                if aux != VERSION {
                    return Err(WireError::Version(aux));
                }
                if opcode == op::CM_LOOKUP {
                    Frame::CmLookup {
                        port_space: u16_at(e, 4),
                        port: u16_at(e, 6),
                    }
                } else {
                    if u16_at(e, 6) != 0 {
                        return Err(WireError::BadField("reserved field"));
                    }
                    let mut gid = [0u8; 16];
                    gid.copy_from_slice(&e[8..24]);
                    Frame::CmAddress {
                        gid,
                        lid: u16_at(e, 4),
                    }
                }
            }
            op::DATAGRAM => {
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
                Frame::Datagram {
                    psn,
                    len,
                    dst_qpn,
                    src_qpn,
                    qkey: u32_at(e, 8),
                    imm,
                    solicited,
                    grh,
                }
            }
            op::HELLO_ACK => Frame::HelloAck,
            op::HELLO_NAK => Frame::HelloNak {
                reason: HelloReject::from_raw(aux)?,
            },
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
            op::ACK => Frame::Ack { psn },
            op::NAK => {
                let code = NakCode::from_raw(aux)?;
                let reason = match imm_raw {
                    0 => None,
                    v => match NakReason::from_vendor_err(v) {
                        Some(r) if r.may_carry(code) => Some(r),
                        _ => return Err(WireError::BadField("NAK reason")),
                    },
                };
                Frame::Nak { psn, code, reason }
            }
            op::READ_RESP => Frame::ReadResp { psn, len },
            op::ATOMIC_RESP => Frame::AtomicResp {
                psn,
                orig: u64_at(e, 0),
            },
            other => return Err(WireError::UnknownOpcode(other)),
        };
        // Fields that the frame kind does not use must be zero, so that every frame has
        // exactly one encoding (the property tests rely on it).
        let uses_len = matches!(
            opcode,
            op::SEND | op::WRITE | op::READ | op::READ_RESP | op::DATAGRAM
        );
        let setup = matches!(
            opcode,
            op::HELLO
                | op::VERIFY
                | op::HELLO_ACK
                | op::HELLO_NAK
                | op::LINK_HELLO
                | op::LINK_VERIFY
                | op::CM_LOOKUP
                | op::CM_ADDRESS
        );
        let uses_aux = (setup && opcode != op::HELLO_ACK)
            || matches!(opcode, op::NAK | op::READ | op::CMP_SWAP | op::FETCH_ADD);
        if (!uses_len && len != 0)
            || (!uses_aux && aux != 0)
            || (setup && psn != 0)
            || (imm.is_none() && imm_raw != 0 && opcode != op::NAK && flags & F_INV == 0)
        {
            return Err(WireError::BadField("reserved field"));
        }
        if opcode == op::FETCH_ADD && u64_at(e, 20) != 0 {
            return Err(WireError::BadField("reserved field"));
        }
        Ok(Some((frame, BASE_LEN + ext)))
    }
}

fn flags_of(imm: Option<u32>, solicited: bool, ack_req: bool) -> u8 {
    (if imm.is_some() { F_IMM } else { 0 })
        | (if solicited { F_SOLICITED } else { 0 })
        | (if ack_req { F_ACK_REQ } else { 0 })
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The frames in `bytes` as a side sent them (payloads skipped); the bytes must end
    /// on a frame boundary. For the unit tests of the requester and the responder.
    pub(crate) fn decode_all(bytes: &[u8]) -> Vec<Frame> {
        let (mut at, mut out) = (0, Vec::new());
        while let Some((f, n)) = Frame::decode(&bytes[at..]).unwrap() {
            out.push(f);
            at += n + f.payload_len() as usize;
        }
        assert_eq!(at, bytes.len());
        out
    }

    fn arb_grh() -> impl Strategy<Value = Grh> {
        (
            any::<[u8; 16]>(),
            0u32..=0xf_ffff,
            any::<u8>(),
            any::<u8>(),
            any::<bool>(),
        )
            .prop_map(|(dgid, flow_label, traffic_class, hop_limit, src_default)| Grh {
                dgid,
                flow_label,
                traffic_class,
                hop_limit,
                src_default,
            })
    }

    pub fn arb_frame() -> impl Strategy<Value = Frame> {
        let psn = 0u32..=0xff_ffff;
        let len = 0u32..=MAX_MSG;
        prop_oneof![
            (
                any::<[u8; 16]>(),
                any::<u16>(),
                prop_oneof![Just(QpType::Rc), Just(QpType::Uc)],
                0u32..=0xff_ffff,
                0u32..=0xff_ffff,
                any::<[u8; TOKEN_LEN]>()
            )
                .prop_map(
                    |(src_gid, src_lid, qp_type, src_qpn, dst_qpn, token)| Frame::Hello {
                        src_gid,
                        src_lid,
                        qp_type,
                        src_qpn,
                        dst_qpn,
                        token
                    }
                ),
            (0u32..=0xff_ffff, 0u32..=0xff_ffff, any::<[u8; TOKEN_LEN]>()).prop_map(
                |(src_qpn, dst_qpn, token)| Frame::Verify {
                    src_qpn,
                    dst_qpn,
                    token
                }
            ),
            (any::<[u8; 16]>(), any::<u16>(), any::<[u8; TOKEN_LEN]>()).prop_map(
                |(src_gid, src_lid, token)| Frame::LinkHello {
                    src_gid,
                    src_lid,
                    token
                }
            ),
            (any::<[u8; 16]>(), any::<u16>(), any::<[u8; TOKEN_LEN]>()).prop_map(
                |(at_ip, at_port, token)| Frame::LinkVerify {
                    at_ip,
                    at_port,
                    token
                }
            ),
            (any::<u16>(), any::<u16>()).prop_map(|(port_space, port)| Frame::CmLookup { port_space, port }),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(gid, lid)| Frame::CmAddress { gid, lid }),
            (
                psn.clone(),
                0u32..=MAX_DATAGRAM,
                (0u32..=0xff_ffff, 0u32..=0xff_ffff, any::<u32>()),
                any::<Option<u32>>(),
                any::<bool>(),
                proptest::option::of(arb_grh())
            )
                .prop_map(|(psn, len, (dst_qpn, src_qpn, qkey), imm, solicited, grh)| {
                    Frame::Datagram {
                        psn,
                        len,
                        dst_qpn,
                        src_qpn,
                        qkey,
                        imm,
                        solicited,
                        grh,
                    }
                }),
            Just(Frame::HelloAck),
            prop_oneof![Just(HelloReject::Refused), Just(HelloReject::Version)]
                .prop_map(|reason| Frame::HelloNak { reason }),
            (
                psn.clone(),
                len.clone(),
                any::<Option<u32>>(),
                any::<bool>(),
                any::<bool>(),
                any::<Option<u32>>(),
            )
                .prop_map(|(psn, len, imm, solicited, ack_req, inv)| Frame::Send {
                    psn,
                    len,
                    // A SEND carries an immediate or an rkey to invalidate, not both.
                    imm: imm.filter(|_| inv.is_none()),
                    solicited,
                    ack_req,
                    inv,
                }),
            (
                psn.clone(),
                len.clone(),
                any::<u64>(),
                any::<u32>(),
                any::<Option<u32>>(),
                any::<bool>(),
                any::<bool>()
            )
                .prop_map(|(psn, len, addr, rkey, imm, solicited, ack_req)| Frame::Write {
                    psn,
                    len,
                    addr,
                    rkey,
                    imm,
                    solicited,
                    ack_req
                }),
            (psn.clone(), len.clone(), any::<u64>(), any::<u32>(), any::<u16>()).prop_map(
                |(psn, len, addr, rkey, inflight)| Frame::Read {
                    psn,
                    len,
                    addr,
                    rkey,
                    inflight
                }
            ),
            (
                psn.clone(),
                any::<u16>(),
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>()
            )
                .prop_map(|(psn, inflight, addr, rkey, compare, swap)| Frame::CmpSwap {
                    psn,
                    inflight,
                    addr,
                    rkey,
                    compare,
                    swap
                }),
            (
                psn.clone(),
                any::<u16>(),
                any::<u64>(),
                any::<u32>(),
                any::<u64>()
            )
                .prop_map(|(psn, inflight, addr, rkey, add)| Frame::FetchAdd {
                    psn,
                    inflight,
                    addr,
                    rkey,
                    add
                }),
            psn.clone().prop_map(|psn| Frame::Ack { psn }),
            (
                psn.clone(),
                prop_oneof![
                    (0u8..32).prop_map(|timer| (NakCode::Rnr { timer }, None)),
                    Just((NakCode::PsnSeq, None)),
                    Just((NakCode::InvalidRequest, None)),
                    Just((NakCode::RemoteAccess, None)),
                    Just((NakCode::RemoteOperational, None)),
                    proptest::sample::select(NakReason::ALL.to_vec()).prop_map(|r| (r.code(), Some(r)))
                ]
            )
                .prop_map(|(psn, (code, reason))| Frame::Nak { psn, code, reason }),
            (psn.clone(), len).prop_map(|(psn, len)| Frame::ReadResp { psn, len }),
            (psn, any::<u64>()).prop_map(|(psn, orig)| Frame::AtomicResp { psn, orig }),
        ]
    }

    proptest! {
        #[test]
        fn roundtrip(f in arb_frame()) {
            let mut b = [0u8; MAX_HDR_LEN];
            let n = f.encode(&mut b);
            prop_assert_eq!(Frame::decode(&b[..n]).unwrap(), Some((f, n)));
            // every strict prefix asks for more bytes
            for k in 0..n {
                prop_assert_eq!(Frame::decode(&b[..k]).unwrap(), None);
            }
        }

        /// Any bytes: no panic; whatever decodes re-encodes to the same bytes.
        #[test]
        fn hostile_bytes(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            if let Ok(Some((f, n))) = Frame::decode(&b) {
                prop_assert!(n <= b.len());
                prop_assert!(f.payload_len() <= MAX_MSG);
                let mut out = [0u8; MAX_HDR_LEN];
                let m = f.encode(&mut out);
                prop_assert_eq!(&out[..m], &b[..n]);
            }
        }

        /// Mutating one byte of a valid header never panics the decoder.
        #[test]
        fn single_byte_mutations(f in arb_frame(), i in 0usize..MAX_HDR_LEN, v in any::<u8>()) {
            let mut b = [0u8; MAX_HDR_LEN];
            let n = f.encode(&mut b);
            b[i % n] = v;
            let _ = Frame::decode(&b[..n]);
        }
    }

    /// A NAK's reason travels in the immediate field: a code of the table, of the NAK's
    /// kind, or 0 (none). Anything else is malformed, and a reason on a NAK of another
    /// kind too (so each NAK has one encoding).
    #[test]
    fn nak_reasons_are_checked() {
        let mut b = [0u8; MAX_HDR_LEN];
        for r in NakReason::ALL {
            assert_eq!(NakReason::from_vendor_err(r.vendor_err()), Some(r));
            let f = Frame::Nak {
                psn: 9,
                code: r.code(),
                reason: Some(r),
            };
            let n = f.encode(&mut b);
            assert_eq!(u32_at(&b, 12), r.vendor_err());
            assert_eq!(Frame::decode(&b[..n]), Ok(Some((f, n))));
        }
        let n = Frame::Nak {
            psn: 9,
            code: NakCode::RemoteAccess,
            reason: None,
        }
        .encode(&mut b);
        for bad in [
            1,
            0x100,
            0x10c,
            NakReason::MisalignedAtomic.vendor_err(),
            u32::MAX,
        ] {
            b[12..16].copy_from_slice(&bad.to_le_bytes());
            assert_eq!(
                Frame::decode(&b[..n]),
                Err(WireError::BadField("NAK reason")),
                "{bad:#x}"
            );
        }
        let n = Frame::Nak {
            psn: 9,
            code: NakCode::PsnSeq,
            reason: None,
        }
        .encode(&mut b);
        b[12..16].copy_from_slice(&NakReason::OutOfBounds.vendor_err().to_le_bytes());
        assert_eq!(Frame::decode(&b[..n]), Err(WireError::BadField("NAK reason")));
        assert_eq!(NakReason::from_vendor_err(0), None);
        // The errno values that IBV_WC_RETRY_EXC_ERR carries are no reasons.
        for errno in [libc::ECONNREFUSED, libc::EMFILE, libc::ETIMEDOUT, libc::ENOTCONN] {
            assert_eq!(NakReason::from_vendor_err(errno as u32), None);
        }
    }

    #[test]
    fn only_setup_frames_of_this_version_are_read_during_setup() {
        let base = |opcode: u8, version: u16| {
            let mut b = [0u8; BASE_LEN];
            b[0] = opcode;
            b[2..4].copy_from_slice(&version.to_le_bytes());
            b
        };
        for op in [
            op::HELLO,
            op::VERIFY,
            op::LINK_HELLO,
            op::LINK_VERIFY,
            op::CM_LOOKUP,
            op::CM_ADDRESS,
        ] {
            assert_eq!(setup_header_len(&base(op, VERSION)).ok(), header_len(op));
            assert_eq!(
                setup_header_len(&base(op, VERSION - 1)),
                Err(WireError::Version(VERSION - 1))
            );
        }
        for op in [op::HELLO_ACK, op::HELLO_NAK] {
            assert_eq!(setup_header_len(&base(op, 0)).ok(), header_len(op));
        }
        for op in [
            op::SEND,
            op::WRITE,
            op::READ,
            op::ACK,
            op::NAK,
            op::DATAGRAM,
            0x99,
        ] {
            assert_eq!(setup_header_len(&base(op, 0)), Err(WireError::UnknownOpcode(op)));
        }
    }

    #[test]
    fn rejects_unknown_and_oversized() {
        let mut b = [0u8; MAX_HDR_LEN];
        b[0] = 0x99;
        assert_eq!(Frame::decode(&b), Err(WireError::UnknownOpcode(0x99)));
        let n = Frame::Send {
            psn: 1,
            len: 4,
            imm: None,
            solicited: false,
            ack_req: false,
            inv: None,
        }
        .encode(&mut b);
        b[8..12].copy_from_slice(&(MAX_MSG + 1).to_le_bytes());
        assert_eq!(Frame::decode(&b[..n]), Err(WireError::TooLong(MAX_MSG + 1)));
        b[8..12].copy_from_slice(&4u32.to_le_bytes());
        b[4..8].copy_from_slice(&0x0100_0000u32.to_le_bytes());
        assert_eq!(Frame::decode(&b[..n]), Err(WireError::BadField("PSN")));
    }

    /// A hello names RC (2) or UC (3), `ibv_qp_type`'s numbers; anything else is refused.
    #[test]
    fn a_hello_names_rc_or_uc() {
        let mut b = [0u8; MAX_HDR_LEN];
        let hello = Frame::Hello {
            src_gid: [1; 16],
            src_lid: 7,
            qp_type: QpType::Uc,
            src_qpn: 2,
            dst_qpn: 3,
            token: [9; TOKEN_LEN],
        };
        let n = hello.encode(&mut b);
        assert_eq!(u16_at(&b, BASE_LEN + 6), 3);
        assert_eq!(Frame::decode(&b[..n]), Ok(Some((hello, n))));
        for bad in [0u16, 1, 4, 0xffff] {
            b[BASE_LEN + 6..BASE_LEN + 8].copy_from_slice(&bad.to_le_bytes());
            assert_eq!(
                Frame::decode(&b[..n]),
                Err(WireError::BadField("QP type")),
                "{bad}"
            );
        }
    }

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
