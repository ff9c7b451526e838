//! One fuzz input ([`Input`]): how the QP is set up ([`Setup`]), then the steps
//! ([`Step`]): frames from the peer (with fuzzed fields: [`FrameSpec`] and its selectors
//! of PSNs, keys, addresses and lengths), the application's work requests ([`WrSpec`]),
//! time, reconnections and deregistrations. Everything derives `Arbitrary`, so the
//! fuzzer gets past the decoder into the responder.

use arbitrary::Arbitrary;

/// One fuzz input: how the QP is set up, then what the peer and the application do.
#[derive(Arbitrary, Debug)]
pub struct Input {
    /// QP attributes and initial work requests.
    pub setup: Setup,
    /// Steps, in order (at most [`MAX_STEPS`](crate::limits::MAX_STEPS)).
    pub steps: Vec<Step>,
}

/// QP attributes (zeros give the friendliest QP: every remote right granted).
#[derive(Arbitrary, Debug)]
pub struct Setup {
    /// Remote rights the QP refuses: bit 0 WRITE, bit 1 READ, bit 2 ATOMIC; bit 3: no
    /// responder resources for READs and atomics (`max_dest_rd_atomic` 0).
    pub qp_refuses: u8,
    /// Responder's first expected PSN.
    pub rq_psn: u32,
    /// Requester's first PSN.
    pub sq_psn: u32,
    /// RNR timer code advertised in RNR NAKs.
    pub min_rnr_timer: u8,
    /// Local ACK timeout code (0: infinite).
    pub ack_timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Outstanding READ/atomics of our requester.
    pub max_rd_atomic: u8,
    /// Receives posted before the peer speaks (0..=8, 512 bytes each in `LOCAL`).
    pub recvs: u8,
    /// Send WRs posted (and transmitted) before the peer speaks.
    pub wrs: Vec<WrSpec>,
    /// The QP is a UD QP with Q_Key [`QKEY`](crate::QKEY), and the peer a device at the
    /// other end of a link: its bytes go through a link's reader, each datagram to the
    /// QP's responder (the remote rights, PSNs and timers above do not apply).
    pub ud: bool,
}

/// A PSN, usually near the one the other side expects.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum PsnSel {
    /// The expected PSN plus a small signed distance (duplicates, gaps).
    Near(i8),
    /// Any 24-bit PSN.
    Raw(u32),
}

/// A key: one of the harness's regions, or anything.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum KeySel {
    /// The key of region `n % 5`.
    Region(u8),
    /// Any key.
    Raw(u32),
}

/// An address: near one of the regions (mostly inside it), or anything.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum AddrSel {
    /// Region `region % 5`, offset `off % (len + 1024) - 512`.
    Region {
        /// Which region.
        region: u8,
        /// Offset (see above).
        off: u16,
    },
    /// Any address.
    Raw(u64),
}

/// A length: small (with payload bytes sent), or anything (payload cut at 4 KiB).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum LenSel {
    /// `n % 5000`.
    Small(u16),
    /// Any length up to 2^31 (beyond that the frame does not decode).
    Raw(u32),
}

/// A well-formed frame from the peer, with fuzzed fields.
#[derive(Arbitrary, Debug, Clone)]
pub enum FrameSpec {
    /// SEND / SEND_WITH_IMM with its payload.
    Send {
        /// PSN, relative to the responder's expected PSN.
        psn: PsnSel,
        /// Length.
        len: LenSel,
        /// Immediate.
        imm: Option<u32>,
        /// Solicited bit.
        solicited: bool,
        /// AckReq bit.
        ack_req: bool,
        /// First payload byte (then counting up).
        fill: u8,
    },
    /// RDMA WRITE (with immediate) with its payload.
    Write {
        /// PSN.
        psn: PsnSel,
        /// Length.
        len: LenSel,
        /// Target address.
        at: AddrSel,
        /// Key.
        key: KeySel,
        /// Immediate.
        imm: Option<u32>,
        /// Solicited bit.
        solicited: bool,
        /// AckReq bit.
        ack_req: bool,
        /// First payload byte.
        fill: u8,
    },
    /// RDMA READ request.
    Read {
        /// PSN.
        psn: PsnSel,
        /// Length.
        len: LenSel,
        /// Source address.
        at: AddrSel,
        /// Key.
        key: KeySel,
    },
    /// CMP_AND_SWP.
    CmpSwap {
        /// PSN.
        psn: PsnSel,
        /// Word address.
        at: AddrSel,
        /// Key.
        key: KeySel,
        /// Compare.
        compare: u64,
        /// Swap.
        swap: u64,
    },
    /// FETCH_AND_ADD.
    FetchAdd {
        /// PSN.
        psn: PsnSel,
        /// Word address.
        at: AddrSel,
        /// Key.
        key: KeySel,
        /// Addend.
        add: u64,
    },
    /// ACK, PSN relative to our requester's first PSN.
    Ack {
        /// PSN.
        psn: PsnSel,
    },
    /// NAK (syndrome chosen by `code`).
    Nak {
        /// PSN.
        psn: PsnSel,
        /// Syndrome selector.
        code: u8,
    },
    /// READ response with its payload.
    ReadResp {
        /// PSN.
        psn: PsnSel,
        /// Length.
        len: LenSel,
        /// First payload byte.
        fill: u8,
    },
    /// Atomic response.
    AtomicResp {
        /// PSN.
        psn: PsnSel,
        /// Original value.
        orig: u64,
    },
    /// An answer to one of the requests our QP has sent (the peer reads them): the
    /// right one, a NAK, or a mismatched one, so that the requester's deeper paths run.
    Reply {
        /// Which of the last 64 requests sent (modulo how many there are).
        which: u8,
        /// 0: the matching response, 1: a NAK, 2: a READ response of another length,
        /// 3: an atomic response.
        how: u8,
        /// Original value of an atomic response; NAK syndrome selector.
        orig: u64,
        /// First payload byte.
        fill: u8,
    },
    /// A UD datagram with its payload (on a UD QP's link; a protocol error on a QP
    /// pair's connection).
    Datagram {
        /// PSN (ignored by a UD responder).
        psn: PsnSel,
        /// To the QP under attack (else to `other_qpn`).
        to_us: bool,
        /// Another destination QPN.
        other_qpn: u32,
        /// The QPN it claims to come from.
        src_qpn: u32,
        /// The Q_Key: the QP's (`None`) or any.
        qkey: Option<u32>,
        /// Length (above the MTU the frame does not decode: the link closes).
        len: LenSel,
        /// Immediate.
        imm: Option<u32>,
        /// Solicited bit.
        solicited: bool,
        /// GRH fields: flow label, traffic class, hop limit.
        grh: Option<(u32, u8, u8)>,
        /// First payload byte.
        fill: u8,
    },
    /// A link's setup frames (never valid once connected, nor on an established link).
    LinkHello {
        /// Source GID.
        src_gid: [u8; 16],
        /// Source LID.
        src_lid: u16,
        /// Or the check of one (with this port as the address it arrived at).
        verify: bool,
    },
    /// Connection setup frames (never valid once connected).
    Hello {
        /// Source GID.
        src_gid: [u8; 16],
        /// Source LID.
        src_lid: u16,
        /// Source QPN.
        src_qpn: u32,
        /// Destination QPN.
        dst_qpn: u32,
    },
    /// Connection accepted (never valid once connected).
    HelloAck,
    /// Connection refused (never valid once connected).
    HelloNak {
        /// Reason selector.
        reason: u8,
    },
}

/// A send WR of our requester (the peer answers it, or forges answers).
#[derive(Arbitrary, Debug, Clone)]
pub enum WrSpec {
    /// SEND of `len % 4096` bytes from `LOCAL` (inline if short enough and asked).
    Send {
        /// Length.
        len: u16,
        /// Immediate.
        imm: Option<u32>,
        /// Inline.
        inline: bool,
    },
    /// RDMA WRITE of `len % 4096` bytes to any remote address.
    Write {
        /// Length.
        len: u16,
        /// Remote address.
        addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA READ of `len % 4096` bytes into `LOCAL` at `off`, in one or two SGEs.
    Read {
        /// Length.
        len: u16,
        /// Offset in `LOCAL`.
        off: u16,
        /// Two SGEs.
        split: bool,
        /// Remote address.
        addr: u64,
    },
    /// CMP_AND_SWP, result into `LOCAL` at `off`.
    CmpSwap {
        /// Offset of the 8-byte result.
        off: u16,
        /// Compare.
        compare: u64,
        /// Swap.
        swap: u64,
    },
    /// FETCH_AND_ADD, result into `LOCAL` at `off`.
    FetchAdd {
        /// Offset of the 8-byte result.
        off: u16,
        /// Addend.
        add: u64,
    },
    /// A SEND whose SGE names `key` (a local protection error unless it is valid).
    BadSge {
        /// lkey.
        key: KeySel,
        /// Offset.
        off: u16,
        /// Length.
        len: u16,
    },
}

/// One thing that happens.
#[derive(Arbitrary, Debug, Clone)]
pub enum Step {
    /// The peer sends one frame (and its payload).
    Frame(FrameSpec),
    /// The peer sends a frame many times without reading anything (a flood).
    Repeat {
        /// The frame.
        frame: FrameSpec,
        /// Copies (the bytes are capped at [`MAX_REPEAT_BYTES`](crate::limits::MAX_REPEAT_BYTES)).
        count: u16,
        /// Each copy gets the next PSN (a stream of new requests, not duplicates).
        next_psn: bool,
    },
    /// The peer sends a frame and only the first `keep` bytes of its payload: the rest
    /// comes from the bytes of the next steps (a deregistration may come in between).
    Partial {
        /// The frame.
        frame: FrameSpec,
        /// Payload bytes sent now.
        keep: u16,
    },
    /// The peer sends a frame with one byte of its header changed.
    Corrupt {
        /// The frame.
        frame: FrameSpec,
        /// Which header byte.
        at: u8,
        /// XOR mask.
        xor: u8,
    },
    /// The peer sends raw bytes.
    Raw(Vec<u8>),
    /// Bytes reach the QP in pieces of this size (0: all at once).
    Chunk(u16),
    /// The application posts a receive.
    PostRecv {
        /// lkey of the SGEs (region 0 is replaced by `LOCAL`).
        key: KeySel,
        /// Offset.
        off: u16,
        /// Length.
        len: u16,
        /// Two SGEs.
        split: bool,
    },
    /// The application posts a send WR.
    PostSend(WrSpec),
    /// Our side transmits, and the peer reads everything queued for it.
    PeerReads,
    /// Time passes (requester timers run).
    Tick(u32),
    /// The connection breaks and the peer connects again.
    Reconnect,
    /// The application deregisters a region.
    Deregister(u8),
}
