//! [`Frame`], one decoded header of any kind, what a frame says about itself (its PSN,
//! its payload, its direction), and [`WireError`], why bytes are no frame.

use std::fmt;

use verbs_api::QpType;

use super::datagram::Grh;
use super::nak::{NakCode, NakReason};
use super::part::PartKind;
use super::setup::{HelloReject, TOKEN_LEN, VERSION};

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
    /// (at most [`MAX_DATAGRAM`](super::MAX_DATAGRAM)). Travels on a link, never on a QP
    /// pair's connection.
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
        /// The GRH fields, when the sender's address handle had a GRH ([`F_GRH`](super::F_GRH)).
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
        /// The requester asks for an ACK ([`F_ACK_REQ`](super::F_ACK_REQ)).
        ack_req: bool,
        /// SEND_WITH_INV: the rkey of the memory window the responder invalidates
        /// ([`F_INV`](super::F_INV); never with `imm`).
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
        /// The requester asks for an ACK ([`F_ACK_REQ`](super::F_ACK_REQ)).
        ack_req: bool,
    },
    /// An RDMA WRITE / WRITE_WITH_IMM of `len` bytes that the requester already placed
    /// in the responder's memory itself (a same-host peer's one-sided fast path, see
    /// docs/sim.md): no payload follows. The responder runs every rule of a WRITE on it
    /// (PSN, duplicates, the access check, a receive for the immediate, RNR, MSN, ACK)
    /// and only skips moving data, so one from a hostile peer moves no memory.
    WritePlaced {
        /// Packet sequence number.
        psn: u32,
        /// The message's length (no payload follows).
        len: u32,
        /// Remote virtual address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: Option<u32>,
        /// Solicited event.
        solicited: bool,
        /// The requester asks for an ACK ([`F_ACK_REQ`](super::F_ACK_REQ)).
        ack_req: bool,
    },
    /// An RDMA READ of `len` bytes that the requester already executed itself (a
    /// same-host peer's one-sided fast path, see docs/sim.md): it ran the responder's
    /// access check on the state the responder publishes and copied the bytes. A notice
    /// of what was executed: it takes the READ's PSNs, and the responder answers it with
    /// an ACK of its last PSN, moving no data and checking no key, so one from a hostile
    /// peer is as harmless as a READ of nothing.
    ReadPlaced {
        /// PSN of the READ (it takes as many as its response would).
        psn: u32,
        /// Bytes read (no payload follows, none is sent back).
        len: u32,
        /// Remote virtual address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// The requester asks for an ACK ([`F_ACK_REQ`](super::F_ACK_REQ)).
        ack_req: bool,
    },
    /// An atomic that the requester already executed itself on memory both processes map
    /// (the same-host fast path): a notice of one PSN, answered with an ACK; the
    /// responder executes nothing for it.
    AtomicPlaced {
        /// PSN of the atomic.
        psn: u32,
        /// Remote virtual address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// CMP_AND_SWP: the compare operand; `None` for FETCH_AND_ADD.
        compare: Option<u64>,
        /// The swap operand (CMP_AND_SWP) or the addend (FETCH_AND_ADD).
        swap_add: u64,
        /// The requester asks for an ACK ([`F_ACK_REQ`](super::F_ACK_REQ)).
        ack_req: bool,
    },
    /// A run of consecutive operations (READs and atomics) that the
    /// same-host requester executed itself and whose completions went early: one notice
    /// for them all, taking their PSNs. The responder advances its expected PSN over
    /// the run, counts its messages in the MSN and answers it with an ACK of its last
    /// PSN; it moves no data and checks no key, so one from a hostile peer is as harmless
    /// as that many READs of nothing.
    PlacedRun {
        /// PSN of the run's first operation.
        psn: u32,
        /// The PSNs the run takes (at least 1).
        pkts: u32,
        /// The operations in the run (at least 1, at most `pkts`).
        msgs: u32,
        /// How many of them are READs or atomics (a responder without responder
        /// resources refuses the run if any).
        rd_atomic: u32,
        /// The requester asks for an ACK ([`F_ACK_REQ`](super::F_ACK_REQ)).
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
    /// Some packets of a SEND, a WRITE or a READ response, cut at packet boundaries
    /// (IBA's FIRST, MIDDLE and LAST packets, see [`part`](super::part)), followed by
    /// `len` payload bytes: the packets from PSN `psn`, at byte `(psn - first PSN) *
    /// path_mtu` of the message.
    Part {
        /// PSN of its first packet.
        psn: u32,
        /// Payload length (whole packets of the path MTU, but for the last part).
        len: u32,
        /// The message's kind.
        kind: PartKind,
        /// It holds the message's first packet (IBA's FIRST).
        first: bool,
        /// It holds the message's last packet (IBA's LAST).
        last: bool,
        /// A WRITE's first part: the RETH's remote address (0 otherwise).
        addr: u64,
        /// A WRITE's first part: the RETH's remote key (0 otherwise).
        rkey: u32,
        /// The whole message's length.
        total: u32,
        /// Immediate data (SEND or WRITE with immediate; on every part of the message).
        imm: Option<u32>,
        /// Solicited event.
        solicited: bool,
        /// The requester asks for an ACK.
        ack_req: bool,
        /// SEND_WITH_INV: the rkey the responder invalidates.
        inv: Option<u32>,
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

impl Frame {
    /// Payload bytes that follow this frame's header on the stream.
    pub fn payload_len(&self) -> u32 {
        match *self {
            Frame::Send { len, .. }
            | Frame::Write { len, .. }
            | Frame::ReadResp { len, .. }
            | Frame::Part { len, .. }
            | Frame::Datagram { len, .. } => len,
            _ => 0,
        }
    }

    /// Whether the frame is a SEND, a WRITE or a notice of a placed operation that asks for an ACK ([`F_ACK_REQ`](super::F_ACK_REQ)).
    pub fn ack_req(&self) -> bool {
        matches!(
            self,
            Frame::Send { ack_req: true, .. }
                | Frame::Write { ack_req: true, .. }
                | Frame::WritePlaced { ack_req: true, .. }
                | Frame::ReadPlaced { ack_req: true, .. }
                | Frame::AtomicPlaced { ack_req: true, .. }
                | Frame::PlacedRun { ack_req: true, .. }
                | Frame::Part { ack_req: true, .. }
        )
    }

    /// The PSN, for request and response frames.
    pub fn psn(&self) -> Option<u32> {
        match *self {
            Frame::Send { psn, .. }
            | Frame::Write { psn, .. }
            | Frame::WritePlaced { psn, .. }
            | Frame::ReadPlaced { psn, .. }
            | Frame::AtomicPlaced { psn, .. }
            | Frame::PlacedRun { psn, .. }
            | Frame::Read { psn, .. }
            | Frame::CmpSwap { psn, .. }
            | Frame::FetchAdd { psn, .. }
            | Frame::Ack { psn }
            | Frame::Nak { psn, .. }
            | Frame::ReadResp { psn, .. }
            | Frame::AtomicResp { psn, .. }
            | Frame::Part { psn, .. }
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
                | Frame::WritePlaced { .. }
                | Frame::ReadPlaced { .. }
                | Frame::AtomicPlaced { .. }
                | Frame::PlacedRun { .. }
                | Frame::Read { .. }
                | Frame::CmpSwap { .. }
                | Frame::FetchAdd { .. }
                | Frame::Part {
                    kind: PartKind::Send | PartKind::Write,
                    ..
                }
        )
    }

    /// Whether this frame travels responder → requester.
    pub fn is_response(&self) -> bool {
        matches!(
            self,
            Frame::Ack { .. }
                | Frame::Nak { .. }
                | Frame::ReadResp { .. }
                | Frame::AtomicResp { .. }
                | Frame::Part {
                    kind: PartKind::ReadResp,
                    ..
                }
        )
    }
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}
