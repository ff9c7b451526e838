//! The harness behind the `responder` fuzz target: a hostile peer on one connection of a
//! simulated HCA, driven sans-IO through the same [`engine::drive`] the TCP transport
//! (`progress.rs`) uses, with the clock passed in by hand.
//!
//! The QP under attack has both halves, as in the real transport: its responder answers
//! the peer's requests (SEND, WRITE, READ, atomics, with fuzzed PSNs, keys, addresses and
//! lengths) and its requester has WQEs of its own outstanding, so the peer's forged ACKs,
//! NAKs, READ and atomic responses reach it too. Five regions live in one buffer, each
//! surrounded by canary bytes:
//!
//! | region | PD | rights | what may change it |
//! |---|---|---|---|
//! | `TARGET` | 1 | all | the peer's WRITEs and atomics (if the QP grants them) |
//! | `READONLY` | 1 | REMOTE_READ only | nothing |
//! | `LOCAL` | 1 | LOCAL_WRITE | receives, our READ/atomic results |
//! | `FOREIGN` | 2 | all | nothing (another PD) |
//! | `DEAD` | 1 | all, deregistered before the input | nothing |
//!
//! After every step the harness asserts:
//!
//! - the canaries around every region are intact;
//! - `READONLY`, `FOREIGN`, `DEAD` and every region deregistered during the input are
//!   unchanged; `TARGET` is unchanged if the QP grants neither REMOTE_WRITE nor
//!   REMOTE_ATOMIC;
//! - once the QP is in ERR (and the payload in flight at that moment, if any, has
//!   landed) no byte of any region changes and nothing more is queued for the peer;
//! - the bytes queued for a peer that never reads stay bounded, however many frames it
//!   sends: at most the unread responses (each at most one READ of a region, and the
//!   engine cuts off a peer that leaves more than 1024 unread) plus a constant;
//! - receive completions are exactly the posted receives, in order, each once; send
//!   completions come in order, each at most once, none after the flush;
//! - whatever the QP sends is a sequence of well-formed frames with their payloads.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use backend_sim_proto::engine::{drive, DriveState, Sides, Stop};
use backend_sim_proto::memory::{MrShared, MrTable};
use backend_sim_proto::psn;
use backend_sim_proto::requester::{ReqAttrs, Requester};
use backend_sim_proto::responder::{RespAttrs, Responder};
use backend_sim_proto::rx::Reader;
use backend_sim_proto::tx::TxQueue;
use backend_sim_proto::wire::{Frame, HelloReject, NakCode, NakReason, MAX_HDR_LEN};
use verbs_api::timers::local_ack_timeout;
use verbs_api::{AccessFlags, QpCap, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, PSN_MASK};

/// The PD of the QP.
pub const PD: u32 = 1;
/// Same bound as `progress.rs` passes to `drive` (`MAX_UNSENT_READS`).
pub const MAX_UNSENT_READS: usize = 1024;
/// Bytes the QP may queue for the peer beyond its unread READ/atomic responses (ACKs,
/// NAKs): 4096 frames. A peer that never reads must not grow this side's memory beyond
/// a constant, however many requests it sends.
pub const NON_REPLY_SLACK: usize = 64 * 1024;
/// Stop an input after this many bytes have been sent by the peer.
pub const MAX_STREAM: usize = 1 << 20;
/// Most bytes one `Repeat` step sends.
pub const MAX_REPEAT_BYTES: usize = 256 << 10;
/// Most steps of one input.
pub const MAX_STEPS: usize = 256;

/// Region indices.
pub const TARGET: usize = 0;
/// Remote read only: never changes.
pub const READONLY: usize = 1;
/// Receive buffers and landing zone of our READs/atomics.
pub const LOCAL: usize = 2;
/// Another PD: never changes.
pub const FOREIGN: usize = 3;
/// Deregistered before the input: never changes.
pub const DEAD: usize = 4;
const NREG: usize = 5;
const REGION_LEN: [usize; NREG] = [4096, 1024, 4096, 1024, 1024];
const KEYS: [u32; NREG] = [0x7a11_0e01, 0x7a11_0e02, 0x7a11_0e03, 0x7a11_0e04, 0x7a11_0e05];
/// Largest region: bounds a READ response.
pub const MR_MAX: usize = 4096;
const GUARD: usize = 512;
const CANARY: u8 = 0xc5;

fn region_pd(r: usize) -> u32 {
    if r == FOREIGN {
        2
    } else {
        PD
    }
}

fn region_access(r: usize) -> AccessFlags {
    match r {
        READONLY => AccessFlags::REMOTE_READ,
        LOCAL => AccessFlags::LOCAL_WRITE,
        _ => AccessFlags::ALL,
    }
}

// ------------------------------------------------------------------------ the input

/// One fuzz input: how the QP is set up, then what the peer and the application do.
#[derive(Arbitrary, Debug)]
pub struct Input {
    /// QP attributes and initial work requests.
    pub setup: Setup,
    /// Steps, in order (at most [`MAX_STEPS`]).
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
        /// Copies (the bytes are capped at [`MAX_REPEAT_BYTES`]).
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

// ------------------------------------------------------------------------ the harness

/// One QP under attack.
pub struct Harness {
    base: *mut u8,
    total: usize,
    offs: [usize; NREG],
    initial: Vec<u8>,
    regions: Vec<Arc<MrShared>>,
    mrs: MrTable,
    /// Regions deregistered during the input, with their bytes at that moment.
    frozen: Vec<(usize, Vec<u8>)>,
    req: Requester,
    resp: Responder,
    rx: Reader,
    tx: TxQueue,
    st: DriveState,
    now: Instant,
    send_wc: Vec<WorkCompletion>,
    recv_wc: Vec<(WorkCompletion, bool)>,
    target_writable: bool,
    sq_psn: u32,
    err: bool,
    /// The connection was closed (protocol error) or cannot come back (QP in ERR).
    closed: bool,
    /// Memory once the QP is in ERR and nothing is landing any more.
    err_snapshot: Option<Vec<u8>>,
    /// Bytes queued for the peer when the QP entered ERR.
    err_pending: usize,
    next_id: u64,
    last_send_id: u64,
    send_ids_done: bool,
    recvs: VecDeque<(u64, u64)>,
    /// The last requests the QP sent (what a peer could answer).
    sent: VecDeque<Frame>,
    chunk: usize,
    streamed: usize,
    out: Vec<u8>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for r in &self.regions {
            r.kill();
        }
        // Segments still queued hold Arcs of the regions, but every copy after `kill`
        // is skipped, so the buffer can go.
        let words = self.total / 8;
        // SAFETY: allocated in `new` as a boxed slice of `words` u64s; nothing reads it
        // any more (every region is killed).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base.cast::<u64>(), words)) });
    }
}

fn nak_code(code: u8) -> NakCode {
    match code % 6 {
        0 => NakCode::Rnr { timer: code / 6 % 32 },
        1 => NakCode::PsnSeq,
        2 => NakCode::InvalidRequest,
        3 => NakCode::RemoteAccess,
        _ => NakCode::RemoteOperational,
    }
}

/// A NAK's syndrome and, now and then, a reason of its kind (`vendor_err` at the
/// requester).
fn nak_of(code: u8) -> (NakCode, Option<NakReason>) {
    let c = nak_code(code);
    let reason = NakReason::ALL
        .get(code as usize / 6 % 16)
        .copied()
        .filter(|r| r.code() == c);
    (c, reason)
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

impl Harness {
    /// A connected QP with regions, receives and send WRs as `setup` says.
    pub fn new(setup: &Setup) -> Harness {
        let mut offs = [0usize; NREG];
        let mut at = GUARD;
        for (r, o) in offs.iter_mut().enumerate() {
            *o = at;
            at += REGION_LEN[r] + GUARD;
        }
        let total = at;
        debug_assert_eq!(total % 8, 0);
        // A u64 buffer, so that region addresses are 8-byte aligned (atomics).
        let base = Box::into_raw(vec![0u64; total / 8].into_boxed_slice()).cast::<u8>();
        let mut initial = vec![CANARY; total];
        for r in 0..NREG {
            for i in 0..REGION_LEN[r] {
                initial[offs[r] + i] = (i as u8).wrapping_mul(13) ^ (0x40 + r as u8);
            }
        }
        // SAFETY: `base` points to `total` bytes we own; nothing else refers to them yet.
        unsafe { std::ptr::copy_nonoverlapping(initial.as_ptr(), base, total) };
        let mrs = MrTable::default();
        let mut regions = Vec::new();
        for r in 0..NREG {
            // SAFETY: the range lies in our buffer, which outlives every use of the
            // region: `Drop` kills the regions before it frees the buffer.
            let mr = Arc::new(unsafe {
                MrShared::new_borrowed(
                    region_pd(r),
                    KEYS[r],
                    base.add(offs[r]),
                    REGION_LEN[r],
                    region_access(r),
                )
            });
            mrs.insert(mr.clone());
            regions.push(mr);
        }
        mrs.remove(KEYS[DEAD]);
        regions[DEAD].kill();

        let mut qp_access = AccessFlags::REMOTE;
        if setup.qp_refuses & 1 != 0 {
            qp_access.remove(AccessFlags::REMOTE_WRITE);
        }
        if setup.qp_refuses & 2 != 0 {
            qp_access.remove(AccessFlags::REMOTE_READ);
        }
        if setup.qp_refuses & 4 != 0 {
            qp_access.remove(AccessFlags::REMOTE_ATOMIC);
        }
        // Atomics write only with responder resources for them.
        let target_writable = qp_access.contains(AccessFlags::REMOTE_WRITE)
            || (qp_access.contains(AccessFlags::REMOTE_ATOMIC) && setup.qp_refuses & 8 == 0);
        let mut resp = Responder::new(2, PD, cap().max_recv_wr, cap().max_recv_sge);
        resp.connect(RespAttrs {
            rq_psn: setup.rq_psn & PSN_MASK,
            min_rnr_timer: setup.min_rnr_timer % 32,
        });
        resp.access = qp_access;
        resp.max_dest_rd_atomic = if setup.qp_refuses & 8 != 0 { 0 } else { 16 };
        let sq_psn = setup.sq_psn & PSN_MASK;
        let mut req = Requester::new(1, PD, &cap(), false);
        req.connect(ReqAttrs {
            sq_psn,
            timeout: local_ack_timeout(setup.ack_timeout % 32),
            retry_cnt: setup.retry_cnt % 8,
            rnr_retry: setup.rnr_retry % 8,
            max_rd_atomic: setup.max_rd_atomic % 17,
        });
        let mut h = Harness {
            base,
            total,
            offs,
            initial,
            regions,
            mrs,
            frozen: Vec::new(),
            req,
            resp,
            rx: Reader::new(),
            tx: TxQueue::new(),
            st: DriveState::default(),
            now: Instant::now(),
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
            target_writable,
            sq_psn,
            err: false,
            closed: false,
            err_snapshot: None,
            err_pending: 0,
            next_id: 1,
            last_send_id: 0,
            send_ids_done: false,
            recvs: VecDeque::new(),
            sent: VecDeque::new(),
            chunk: usize::MAX,
            streamed: 0,
            out: Vec::new(),
        };
        for k in 0..(setup.recvs % 9) as usize {
            let sge = Sge::new(h.addr(LOCAL, k * 512), 512, KEYS[LOCAL]);
            h.post_recv(&[sge]);
        }
        for w in setup.wrs.iter().take(8) {
            h.post_send(w);
        }
        h.peer_reads();
        h.check();
        h
    }

    /// Runs one input to the end.
    pub fn run(input: &Input) {
        let mut h = Harness::new(&input.setup);
        for s in input.steps.iter().take(MAX_STEPS) {
            if h.closed || h.streamed > MAX_STREAM {
                break;
            }
            h.step(s);
            h.check();
        }
        h.check();
    }

    fn addr(&self, r: usize, off: usize) -> u64 {
        self.regions[r].addr() + off as u64
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `base..base + total` is our buffer; only this thread touches it and no
        // copy is in progress while we look (the sans-IO core runs on this thread).
        unsafe { std::slice::from_raw_parts(self.base, self.total) }
    }

    fn key(&self, k: KeySel) -> u32 {
        match k {
            KeySel::Region(r) => KEYS[r as usize % NREG],
            KeySel::Raw(k) => k,
        }
    }

    fn at(&self, a: AddrSel) -> u64 {
        match a {
            AddrSel::Region { region, off } => {
                let r = region as usize % NREG;
                let span = REGION_LEN[r] + 2 * GUARD;
                let off = (off as usize % span) as i64 - GUARD as i64;
                self.regions[r].addr().wrapping_add(off as u64)
            }
            AddrSel::Raw(a) => a,
        }
    }

    fn len(l: LenSel) -> u32 {
        match l {
            LenSel::Small(n) => n as u32 % 5000,
            LenSel::Raw(n) => n,
        }
    }

    fn req_psn(&self, p: PsnSel) -> u32 {
        match p {
            PsnSel::Near(d) => psn::add(self.resp.expected_psn(), d as i32 as u32),
            PsnSel::Raw(p) => p & PSN_MASK,
        }
    }

    fn resp_psn(&self, p: PsnSel) -> u32 {
        match p {
            PsnSel::Near(d) => psn::add(self.sq_psn, d as i32 as u32),
            PsnSel::Raw(p) => p & PSN_MASK,
        }
    }

    /// The frame and the payload bytes the peer sends after it (at most 4 KiB).
    fn frame(&self, f: &FrameSpec) -> (Frame, u8) {
        match *f {
            FrameSpec::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                fill,
            } => (
                Frame::Send {
                    psn: self.req_psn(psn),
                    len: Self::len(len),
                    imm,
                    solicited,
                    ack_req,
                },
                fill,
            ),
            FrameSpec::Write {
                psn,
                len,
                at,
                key,
                imm,
                solicited,
                ack_req,
                fill,
            } => (
                Frame::Write {
                    psn: self.req_psn(psn),
                    len: Self::len(len),
                    addr: self.at(at),
                    rkey: self.key(key),
                    imm,
                    solicited,
                    ack_req,
                },
                fill,
            ),
            FrameSpec::Read { psn, len, at, key } => (
                Frame::Read {
                    psn: self.req_psn(psn),
                    len: Self::len(len),
                    addr: self.at(at),
                    rkey: self.key(key),
                },
                0,
            ),
            FrameSpec::CmpSwap {
                psn,
                at,
                key,
                compare,
                swap,
            } => (
                Frame::CmpSwap {
                    psn: self.req_psn(psn),
                    addr: self.at(at),
                    rkey: self.key(key),
                    compare,
                    swap,
                },
                0,
            ),
            FrameSpec::FetchAdd { psn, at, key, add } => (
                Frame::FetchAdd {
                    psn: self.req_psn(psn),
                    addr: self.at(at),
                    rkey: self.key(key),
                    add,
                },
                0,
            ),
            FrameSpec::Ack { psn } => (
                Frame::Ack {
                    psn: self.resp_psn(psn),
                },
                0,
            ),
            FrameSpec::Nak { psn, code } => {
                let (code, reason) = nak_of(code);
                (
                    Frame::Nak {
                        psn: self.resp_psn(psn),
                        code,
                        reason,
                    },
                    0,
                )
            }
            FrameSpec::Reply {
                which,
                how,
                orig,
                fill,
            } => {
                let Some(&req) = self.sent.get(which as usize % self.sent.len().max(1)) else {
                    return (Frame::Ack { psn: self.sq_psn }, 0);
                };
                let psn = req.psn().unwrap_or(0);
                let f = match (how % 4, req) {
                    (0, Frame::Read { len, .. }) => Frame::ReadResp { psn, len },
                    (0, Frame::CmpSwap { .. } | Frame::FetchAdd { .. }) | (3, _) => {
                        Frame::AtomicResp { psn, orig }
                    }
                    (0, _) => Frame::Ack { psn },
                    (1, _) => {
                        let (code, reason) = nak_of(orig as u8);
                        Frame::Nak { psn, code, reason }
                    }
                    (_, Frame::Read { len, .. }) => Frame::ReadResp {
                        psn,
                        len: len ^ (1 + orig as u32 % 64),
                    },
                    _ => Frame::ReadResp {
                        psn,
                        len: orig as u32 % 64,
                    },
                };
                (f, fill)
            }
            FrameSpec::ReadResp { psn, len, fill } => (
                Frame::ReadResp {
                    psn: self.resp_psn(psn),
                    len: Self::len(len),
                },
                fill,
            ),
            FrameSpec::AtomicResp { psn, orig } => (
                Frame::AtomicResp {
                    psn: self.resp_psn(psn),
                    orig,
                },
                0,
            ),
            FrameSpec::Hello {
                src_gid,
                src_lid,
                src_qpn,
                dst_qpn,
            } => (
                Frame::Hello {
                    src_gid,
                    src_lid,
                    src_qpn: src_qpn & PSN_MASK,
                    dst_qpn: dst_qpn & PSN_MASK,
                    token: [0; backend_sim_proto::wire::TOKEN_LEN],
                },
                0,
            ),
            FrameSpec::HelloAck => (Frame::HelloAck, 0),
            FrameSpec::HelloNak { reason } => (
                Frame::HelloNak {
                    reason: match reason % 2 {
                        0 => HelloReject::Refused,
                        _ => HelloReject::Version,
                    },
                },
                0,
            ),
        }
    }

    /// Appends a frame's header (with byte `corrupt.0` XORed by `corrupt.1`) and up to
    /// 4 KiB of its payload to `out`.
    fn encode(f: &Frame, fill: u8, corrupt: Option<(u8, u8)>, out: &mut Vec<u8>) {
        let mut h = [0u8; MAX_HDR_LEN];
        let n = f.encode(&mut h);
        if let Some((at, xor)) = corrupt {
            h[at as usize % n] ^= xor;
        }
        out.extend_from_slice(&h[..n]);
        let len = (f.payload_len() as usize).min(MR_MAX);
        out.extend((0..len).map(|i| fill.wrapping_add(i as u8)));
    }

    fn with_psn(f: Frame, psn: u32) -> Frame {
        match f {
            Frame::Send {
                len,
                imm,
                solicited,
                ack_req,
                ..
            } => Frame::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
            },
            Frame::Write {
                len,
                addr,
                rkey,
                imm,
                solicited,
                ack_req,
                ..
            } => Frame::Write {
                psn,
                len,
                addr,
                rkey,
                imm,
                solicited,
                ack_req,
            },
            Frame::Read { len, addr, rkey, .. } => Frame::Read { psn, len, addr, rkey },
            Frame::CmpSwap {
                addr,
                rkey,
                compare,
                swap,
                ..
            } => Frame::CmpSwap {
                psn,
                addr,
                rkey,
                compare,
                swap,
            },
            Frame::FetchAdd { addr, rkey, add, .. } => Frame::FetchAdd { psn, addr, rkey, add },
            Frame::Ack { .. } => Frame::Ack { psn },
            Frame::Nak { code, reason, .. } => Frame::Nak { psn, code, reason },
            Frame::ReadResp { len, .. } => Frame::ReadResp { psn, len },
            Frame::AtomicResp { orig, .. } => Frame::AtomicResp { psn, orig },
            other => other,
        }
    }

    /// Runs one step.
    pub fn step(&mut self, s: &Step) {
        match s {
            Step::Frame(f) => {
                let (f, fill) = self.frame(f);
                let mut b = Vec::new();
                Self::encode(&f, fill, None, &mut b);
                self.deliver(&b);
            }
            Step::Repeat {
                frame,
                count,
                next_psn,
            } => {
                let (f, fill) = self.frame(frame);
                let mut b = Vec::new();
                Self::encode(&f, fill, None, &mut b);
                let one = b.len();
                let n = (*count as usize).clamp(1, MAX_REPEAT_BYTES / one);
                b.clear();
                let first = f.psn().unwrap_or(0);
                for k in 0..n {
                    let f = if *next_psn {
                        Self::with_psn(f, psn::add(first, k as u32))
                    } else {
                        f
                    };
                    Self::encode(&f, fill, None, &mut b);
                }
                self.deliver(&b);
            }
            Step::Partial { frame, keep } => {
                let (f, fill) = self.frame(frame);
                let mut b = Vec::new();
                Self::encode(&f, fill, None, &mut b);
                let hdr = b.len() - (f.payload_len() as usize).min(MR_MAX);
                b.truncate(hdr + *keep as usize);
                self.deliver(&b);
            }
            Step::Corrupt { frame, at, xor } => {
                let (f, fill) = self.frame(frame);
                let mut b = Vec::new();
                Self::encode(&f, fill, Some((*at, *xor)), &mut b);
                self.deliver(&b);
            }
            Step::Raw(bytes) => self.deliver(bytes),
            Step::Chunk(n) => self.chunk = if *n == 0 { usize::MAX } else { *n as usize },
            Step::PostRecv { key, off, len, split } => {
                if self.err {
                    return;
                }
                // Receives never name TARGET, so that only remote writes change it.
                let key = match self.key(*key) {
                    k if k == KEYS[TARGET] => KEYS[LOCAL],
                    k => k,
                };
                let base = self.regions.iter().find(|m| m.key == key).map_or(0, |m| m.addr());
                let off = *off as u64 % 4608;
                let len = *len as u32 % 4608;
                if *split {
                    let a = len / 2;
                    self.post_recv(&[
                        Sge::new(base + off, a, key),
                        Sge::new(base + off + a as u64 + 8, len - a, key),
                    ]);
                } else {
                    self.post_recv(&[Sge::new(base + off, len, key)]);
                }
            }
            Step::PostSend(w) => {
                if !self.err {
                    self.post_send(w);
                }
            }
            Step::PeerReads => self.peer_reads(),
            Step::Tick(us) => {
                self.now += Duration::from_micros(*us as u64);
                if !self.err
                    && self
                        .req
                        .on_timer(self.now, None, None, &mut self.send_wc)
                        .is_err()
                {
                    self.enter_error();
                }
                self.check_completions();
            }
            Step::Reconnect => {
                if self.err {
                    // A QP in ERR refuses the new connection (HelloReject::Refused).
                    self.closed = true;
                    return;
                }
                // As `progress.rs` does when a connection is lost.
                self.resp.connection_lost();
                self.req.on_connection_lost();
                self.rx = Reader::new();
                self.st = DriveState::default();
                self.tx = TxQueue::new();
            }
            Step::Deregister(r) => {
                let r = *r as usize % NREG;
                if self.mrs.remove(KEYS[r]).is_some() {
                    self.regions[r].kill();
                    let o = self.offs[r];
                    let now = self.bytes()[o..o + REGION_LEN[r]].to_vec();
                    self.frozen.push((r, now));
                }
            }
        }
    }

    fn post_recv(&mut self, sges: &[Sge]) {
        let id = self.next_id;
        if self.resp.post(&RecvWr::new(id, sges)).is_ok() {
            self.next_id += 1;
            let cap = sges.iter().map(|s| s.length as u64).sum();
            self.recvs.push_back((id, cap));
        }
    }

    fn post_send(&mut self, w: &WrSpec) {
        let id = self.next_id;
        let local = |off: usize, len: usize| {
            let off = off % REGION_LEN[LOCAL];
            let len = len.min(REGION_LEN[LOCAL] - off);
            (off, len)
        };
        let sg: Vec<Sge>;
        let wr = match *w {
            WrSpec::Send { len, imm, inline } => {
                let (o, l) = local(0, len as usize % 4096);
                sg = vec![Sge::new(self.addr(LOCAL, o), l as u32, KEYS[LOCAL])];
                let wr = match imm {
                    Some(i) => SendWr::send_with_imm(id, &sg, i),
                    None => SendWr::send(id, &sg),
                };
                if inline && l <= 64 {
                    wr.inline()
                } else {
                    wr
                }
            }
            WrSpec::Write { len, addr, rkey } => {
                let (o, l) = local(0, len as usize % 4096);
                sg = vec![Sge::new(self.addr(TARGET, o), l as u32, KEYS[TARGET])];
                SendWr::write(id, &sg, (addr, rkey))
            }
            WrSpec::Read {
                len,
                off,
                split,
                addr,
            } => {
                let (o, l) = local(off as usize, len as usize % 4096);
                sg = if split && l >= 2 {
                    vec![
                        Sge::new(self.addr(LOCAL, o), (l / 2) as u32, KEYS[LOCAL]),
                        Sge::new(self.addr(LOCAL, o + l / 2), (l - l / 2) as u32, KEYS[LOCAL]),
                    ]
                } else {
                    vec![Sge::new(self.addr(LOCAL, o), l as u32, KEYS[LOCAL])]
                };
                SendWr::read(id, &sg, (addr, 0x1234))
            }
            WrSpec::CmpSwap { off, compare, swap } => {
                let o = (off as usize % (REGION_LEN[LOCAL] / 8)) * 8;
                sg = vec![Sge::new(self.addr(LOCAL, o), 8, KEYS[LOCAL])];
                SendWr::cmp_and_swp(id, &sg, (0x1000, 0x1234), compare, swap)
            }
            WrSpec::FetchAdd { off, add } => {
                let o = (off as usize % (REGION_LEN[LOCAL] / 8)) * 8;
                sg = vec![Sge::new(self.addr(LOCAL, o), 8, KEYS[LOCAL])];
                SendWr::fetch_and_add(id, &sg, (0x1000, 0x1234), add)
            }
            WrSpec::BadSge { key, off, len } => {
                let key = self.key(key);
                let base = self.regions.iter().find(|m| m.key == key).map_or(0, |m| m.addr());
                sg = vec![Sge::new(base + off as u64 % 4608, len as u32 % 4608, key)];
                SendWr::send(id, &sg)
            }
        };
        if self.req.post(&wr.signaled(), &self.mrs).is_ok() {
            self.next_id += 1;
        }
    }

    /// Our side transmits (as `process` does for a QP in RTS), and the peer reads
    /// everything queued for it; what it reads must be well-formed.
    fn peer_reads(&mut self) {
        if !self.err
            && self
                .req
                .poll_transmit(&self.mrs, self.now, &mut self.tx, 128, &mut self.send_wc)
                .is_err()
        {
            self.enter_error();
        }
        self.check_completions();
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        self.tx.drain_into(&mut out);
        let mut b = &out[..];
        while !b.is_empty() {
            let (f, n) = match Frame::decode(b) {
                Ok(Some(x)) => x,
                other => panic!("the QP sent a malformed or cut frame: {other:?}"),
            };
            assert!(f.is_request() || f.is_response(), "the QP sent {f}");
            if f.is_request() {
                if self.sent.len() == 64 {
                    self.sent.pop_front();
                }
                self.sent.push_back(f);
            }
            let skip = n + f.payload_len() as usize;
            assert!(skip <= b.len(), "the QP sent {f} without all of its payload");
            b = &b[skip..];
        }
        self.out = out;
        if self.err {
            self.err_pending = 0;
        }
    }

    /// The peer's bytes arrive, `chunk` bytes at a time, each piece fully processed.
    fn deliver(&mut self, bytes: &[u8]) {
        self.streamed += bytes.len();
        let mut off = 0;
        while off < bytes.len() && !self.closed {
            let end = off.saturating_add(self.chunk).min(bytes.len());
            while off < end && !self.closed {
                let n = self.rx.feed(&bytes[off..end]);
                assert!(n > 0, "the reader takes no bytes after a complete pass");
                off += n;
                self.pass();
            }
        }
    }

    /// One pass of the engine over the buffered bytes, as `progress.rs` runs it.
    fn pass(&mut self) {
        for _ in 0..8 {
            let mut sides = Sides {
                req: Some(&mut self.req),
                resp: Some(&mut self.resp),
                accepting: !self.err,
                send_wc: &mut self.send_wc,
                recv_wc: &mut self.recv_wc,
            };
            let r = drive(
                &mut sides,
                &mut self.rx,
                &self.mrs,
                &mut self.tx,
                self.now,
                &mut self.st,
                MAX_UNSENT_READS,
                0,
            );
            match r {
                Ok(()) => {
                    self.check_completions();
                    self.check_bounds();
                    return;
                }
                Err(Stop::Fatal(status)) => {
                    assert_ne!(status, WcStatus::Success);
                    self.check_completions();
                    self.enter_error();
                }
                Err(Stop::Protocol(_)) => {
                    // The connection is closed and the QP goes to ERR.
                    self.check_completions();
                    self.enter_error();
                    self.closed = true;
                    self.check_bounds();
                    return;
                }
            }
        }
        panic!("drive keeps stopping with Fatal on a QP in ERR");
    }

    fn enter_error(&mut self) {
        if self.err {
            return;
        }
        self.err = true;
        self.req.flush(&mut self.send_wc);
        self.resp.flush(&mut self.recv_wc);
        self.check_completions();
        assert!(
            self.recvs.is_empty(),
            "receives left after the flush: {:?}",
            self.recvs
        );
        assert_eq!(self.resp.posted(), 0);
        assert_eq!(self.req.outstanding(), 0, "send WQEs left after the flush");
        self.send_ids_done = true;
        self.err_pending = self.tx.pending();
    }

    /// Completions: receives exactly as posted and in order; sends in order, once.
    fn check_completions(&mut self) {
        for (wc, _) in self.recv_wc.drain(..) {
            let (id, cap) = self
                .recvs
                .pop_front()
                .unwrap_or_else(|| panic!("a receive completion with none posted: {wc:?}"));
            assert_eq!(wc.wr_id, id, "receive completions out of order");
            assert_eq!(wc.qp_num, 2);
            if wc.status == WcStatus::Success {
                assert!(matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm));
                if wc.opcode == WcOpcode::Recv {
                    assert!(
                        wc.byte_len as u64 <= cap,
                        "{} bytes into a {cap}-byte receive",
                        wc.byte_len
                    );
                }
            }
        }
        for wc in self.send_wc.drain(..) {
            assert!(
                !(self.send_ids_done && self.err),
                "a send completion after the QP was flushed: {wc:?}"
            );
            assert!(
                wc.wr_id > self.last_send_id && wc.wr_id < self.next_id,
                "send completion {} after {} (posted up to {})",
                wc.wr_id,
                self.last_send_id,
                self.next_id - 1
            );
            self.last_send_id = wc.wr_id;
        }
    }

    /// What is queued for the peer stays bounded.
    fn check_bounds(&mut self) {
        let replies = self.tx.unsent_replies();
        assert!(replies <= MAX_UNSENT_READS + 1, "{replies} responses queued");
        let bound = replies * (MR_MAX + MAX_HDR_LEN) + NON_REPLY_SLACK;
        assert!(
            self.tx.pending() <= bound,
            "{} bytes queued for a peer that does not read ({replies} responses)",
            self.tx.pending()
        );
        if self.err {
            assert!(
                self.tx.pending() <= self.err_pending,
                "a QP in ERR queued more for the peer"
            );
        }
    }

    /// Memory invariants.
    pub fn check(&mut self) {
        let now = self.bytes().to_vec();
        let mut at = 0;
        for (r, end) in self.offs.iter().copied().chain([self.total]).enumerate() {
            if let Some(i) = now[at..end].iter().position(|&b| b != CANARY) {
                panic!("canary at byte {} (before region {r}) overwritten", at + i);
            }
            at = end + REGION_LEN.get(r).copied().unwrap_or(0);
        }
        let same = |r: usize| {
            let o = self.offs[r];
            now[o..o + REGION_LEN[r]] == self.initial[o..o + REGION_LEN[r]]
        };
        assert!(same(READONLY), "a region without remote write access changed");
        assert!(same(FOREIGN), "a region of another PD changed");
        assert!(same(DEAD), "a deregistered region changed");
        if !self.target_writable {
            assert!(
                same(TARGET),
                "TARGET changed though the QP grants no remote write or atomic"
            );
        }
        for (r, was) in &self.frozen {
            let o = self.offs[*r];
            assert!(
                now[o..o + REGION_LEN[*r]] == was[..],
                "region {r} changed after it was deregistered"
            );
        }
        if self.err && !self.rx.in_payload() {
            match &self.err_snapshot {
                None => self.err_snapshot = Some(now),
                Some(s) => assert!(*s == now, "memory changed while the QP was in ERR"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(recvs: u8, wrs: Vec<WrSpec>) -> Setup {
        Setup {
            qp_refuses: 0,
            rq_psn: 10,
            sq_psn: 500,
            min_rnr_timer: 1,
            ack_timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
            recvs,
            wrs,
        }
    }

    fn region(h: &Harness, r: usize) -> Vec<u8> {
        h.bytes()[h.offs[r]..h.offs[r] + REGION_LEN[r]].to_vec()
    }

    fn sent_frames(h: &mut Harness) -> Vec<Frame> {
        h.peer_reads();
        let mut v = Vec::new();
        let mut b = &h.out[..];
        while let Ok(Some((f, n))) = Frame::decode(b) {
            v.push(f);
            b = &b[n + f.payload_len() as usize..];
        }
        v
    }

    #[test]
    fn write_read_and_atomic_reach_the_target() {
        let mut h = Harness::new(&setup(0, vec![]));
        let at = AddrSel::Region {
            region: 0,
            off: 512 + 64,
        };
        h.step(&Step::Frame(FrameSpec::Write {
            psn: PsnSel::Near(0),
            len: LenSel::Small(16),
            at,
            key: KeySel::Region(0),
            imm: None,
            solicited: false,
            ack_req: false,
            fill: 1,
        }));
        h.check();
        assert_eq!(&region(&h, TARGET)[64..80], &(1..17).collect::<Vec<u8>>()[..]);
        h.step(&Step::Frame(FrameSpec::FetchAdd {
            psn: PsnSel::Near(0),
            at,
            key: KeySel::Region(0),
            add: 1,
        }));
        h.step(&Step::Frame(FrameSpec::Read {
            psn: PsnSel::Near(0),
            len: LenSel::Small(16),
            at,
            key: KeySel::Region(0),
        }));
        h.check();
        assert_eq!(region(&h, TARGET)[64], 2, "the FETCH_AND_ADD ran");
        assert_eq!(
            sent_frames(&mut h),
            [
                Frame::Ack { psn: 10 },
                Frame::AtomicResp {
                    psn: 11,
                    orig: u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8])
                },
                Frame::ReadResp { psn: 12, len: 16 },
            ]
        );
        assert!(!h.err);
    }

    #[test]
    fn forged_responses_reach_the_requester() {
        let read = WrSpec::Read {
            len: 8,
            off: 16,
            split: true,
            addr: 0,
        };
        let mut h = Harness::new(&setup(1, vec![read]));
        h.step(&Step::Frame(FrameSpec::Reply {
            which: 0,
            how: 0,
            orig: 0,
            fill: 0x30,
        }));
        h.check();
        assert_eq!(&region(&h, LOCAL)[16..24], b"01234567");
        assert_eq!(h.last_send_id, 2, "the READ (wr_id 2, after receive 1) completed");
        // A response for nothing outstanding is ignored; a NAK fails the next WQE.
        h.step(&Step::PostSend(WrSpec::FetchAdd { off: 0, add: 1 }));
        h.step(&Step::PeerReads);
        h.step(&Step::Frame(FrameSpec::Nak {
            psn: PsnSel::Near(1),
            code: 3,
        }));
        assert!(h.err, "a remote access NAK moves the QP to ERR");
        assert!(h.recvs.is_empty());
        h.check();
    }

    #[test]
    fn a_region_deregistered_mid_payload_is_not_written() {
        let mut h = Harness::new(&setup(0, vec![]));
        let before = region(&h, TARGET);
        h.step(&Step::Partial {
            frame: FrameSpec::Write {
                psn: PsnSel::Near(0),
                len: LenSel::Small(3000),
                at: AddrSel::Region { region: 0, off: 512 },
                key: KeySel::Region(0),
                imm: None,
                solicited: false,
                ack_req: false,
                fill: 7,
            },
            keep: 1000,
        });
        h.check();
        assert_ne!(region(&h, TARGET)[..1000], before[..1000]);
        h.step(&Step::Deregister(0));
        h.step(&Step::Raw(vec![0xab; 2000]));
        h.check();
        assert!(h.err, "the WRITE whose region died mid-payload fails the QP");
        assert_eq!(
            region(&h, TARGET)[1000..],
            before[1000..],
            "written after deregistration"
        );
    }

    #[test]
    fn a_flood_of_duplicates_stays_bounded() {
        // The input the fuzzer found first: one SEND executed, then 63 Ki copies of it.
        let send = FrameSpec::Send {
            psn: PsnSel::Near(0),
            len: LenSel::Small(0),
            imm: None,
            solicited: false,
            ack_req: false,
            fill: 0,
        };
        Harness::run(&Input {
            setup: setup(2, vec![]),
            steps: vec![
                Step::Frame(send.clone()),
                Step::Repeat {
                    frame: FrameSpec::Send {
                        psn: PsnSel::Near(-1),
                        len: LenSel::Small(0),
                        imm: None,
                        solicited: false,
                        ack_req: false,
                        fill: 0,
                    },
                    count: 63744,
                    next_psn: false,
                },
                Step::Chunk(16),
                Step::Repeat {
                    frame: send,
                    count: 5000,
                    next_psn: false,
                },
            ],
        });
    }

    #[test]
    #[should_panic(expected = "canary")]
    fn an_overwritten_canary_is_caught() {
        let mut h = Harness::new(&setup(0, vec![]));
        // SAFETY: a byte of our own buffer, in the guard after TARGET.
        unsafe { *h.base.add(h.offs[TARGET] + REGION_LEN[TARGET]) = 0 };
        h.check();
    }

    #[test]
    #[should_panic(expected = "another PD")]
    fn a_changed_foreign_region_is_caught() {
        let mut h = Harness::new(&setup(0, vec![]));
        // SAFETY: a byte of our own buffer, inside FOREIGN.
        unsafe { *h.base.add(h.offs[FOREIGN]) ^= 1 };
        h.check();
    }
}
