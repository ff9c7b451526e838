//! A random model check of the simulated HCA at the verbs level, through the public API
//! over real TCP (issue 6, item 4). `src/link_tests.rs` checks the sans-IO protocol core
//! against a model; this checks what an application sees.
//!
//! proptest generates sequences of verbs calls on two RC QPs, A and B, connected to each
//! other (on one device in one PD, or on two devices): `post_recv` (0 to 4 SGEs, some
//! with bad lkeys, out of bounds or in regions without `LOCAL_WRITE`), `post_send` of
//! batches of SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ,
//! CMP_AND_SWP and FETCH_AND_ADD (in-bounds, crossing the end, past the end, before the
//! start, wrong rkey, regions of another PD or without the remote right, misaligned
//! atomics, zero-length, inline, fenced, signaled or not, more WRs or SGEs than the QP
//! takes), moving a QP to ERR, changing its `qp_access_flags` (RTS -> RTS), deregistering
//! a region, destroying a QP, and resetting and reconnecting the pair. A small reference
//! model of RC semantics ([`Model`]) predicts, for every step, the result of each verb
//! (including `bad_wr` index and errno), the exact completion stream of each of the four
//! CQs (A send, A recv, B send, B recv: wr_id, status, opcode, byte_len, immediate, QP
//! number, in order), the state of both QPs and the bytes of every registered region.
//!
//! The rules the model encodes (`man ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_modify_qp`; IBA 9.7, 10.3.1, 10.6.3; the conformance cases in
//! `conformance/src/cases/`):
//!
//! - WRs execute in order; completions of one queue arrive in order; an unsignaled WR
//!   that succeeds produces no completion, any WR that fails produces one.
//! - A local protection error (bad lkey, another PD, out of the region, an HCA write into
//!   a region without `LOCAL_WRITE`) completes with `LOC_PROT_ERR` and moves the
//!   requester to ERR; the responder is not involved.
//! - A SEND (or WRITE_WITH_IMM) that finds no receive is refused with RNR; the pair runs
//!   with `rnr_retry` 0, so that is `RNR_RETRY_EXC_ERR` at once and the requester goes to
//!   ERR (the responder stays in RTS).
//! - A remote access violation (rkey, PD, region or QP access flags, bounds) completes
//!   with `REM_ACCESS_ERR`, a misaligned atomic with `REM_INV_REQ_ERR`; a receive too
//!   small is `LOC_LEN_ERR` at the responder and `REM_INV_REQ_ERR` at the requester; a
//!   receive with a bad SGE is `LOC_PROT_ERR` there and `REM_OP_ERR` here; the receive a
//!   refused WRITE_WITH_IMM took is `LOC_ACCESS_ERR` there (unless the QP's access flags
//!   refused it, before any receive was taken). In all these
//!   cases *both* QPs go to ERR (IBA 9.9: a responder error is fatal to the responder QP
//!   too) and nothing is written. A zero-length READ or WRITE checks no rkey (IBA 9.4.1.1).
//! - A QP whose peer is in ERR (or destroyed) gets no answer: its WR completes with
//!   `RETRY_EXC_ERR` after `retry_cnt` retries of the local ACK timeout, after the local
//!   checks of the WR have passed.
//! - In ERR, every outstanding and every newly posted WR (signaled or not, send or
//!   receive) completes with `WR_FLUSH_ERR`, in order; moving to RESET discards the
//!   queues without completions, as does destroying the QP.
//! - `post_send`/`post_recv` past the queue capacity fail with ENOMEM, with more SGEs than
//!   the QP takes with EINVAL, naming the first WR not posted; those before it execute.
//!   Inline data is copied at post time (the sim also requires inline SGEs to lie in a
//!   registered region of the device, of any PD, as an HCA checks no inline lkey:
//!   EINVAL otherwise, as its docs say).
//!
//! ## Determinism over real TCP
//!
//! The model is only compared at quiescent points: after each step the harness waits
//! (bounded) until every CQ holds what the model expects, then compares. To keep every
//! step's outcome fixed whatever the thread timing, the harness never creates a situation
//! whose outcome a real HCA leaves to timing:
//!
//! - the last WR a batch posts is always signaled, so at the end of a step no WR is
//!   waiting for an ACK that a later step could race with (a flush would otherwise
//!   catch a WRITE whose ACK is still on the way);
//! - a WR that will fail a *local* check is only posted first in its batch: an HCA
//!   checks the WQEs behind earlier ones while those are in flight, so whether the earlier
//!   ones complete or are flushed is timing (the batch is cut before such a WR);
//! - a batch is cut before a WR whose memory accesses race with an earlier WR of the same
//!   batch: the requester gathers a SEND/WRITE payload when it transmits (possibly
//!   before earlier READ responses, atomics or remote writes have landed), and the
//!   responder reads the data of a READ response when it sends it (possibly after later
//!   WRITEs of the batch executed). Accesses are ordered by a small happens-before
//!   relation (see [`ordered`]), including `IBV_SEND_FENCE`;
//! - RNR is made deterministic with `rnr_retry` 0, and the ACK timeout (67 ms x 4
//!   tries) is long enough that a loaded machine does not exhaust it spuriously.
//!
//! Posts on a pair with a QP in ERR or destroyed are kept rare (each one towards a dead
//! peer waits out the retries), so that most steps run on a live pair; an occasional
//! reset and reconnect brings the pair back.
//!
//! Left out: UD/UC/SRQ (the sim refuses them), CQ overflow and completion channels
//! (conformance covers them), SQD, RNR retries > 0 (timing), fault injection
//! (tests/faults.rs), concurrent posts from several threads, a CQ shared by several
//! queues (the order between two queues' completions on one CQ is not defined), zero-
//! length SGEs (mlx5 reads a length of 0 as 2 GiB), `IBV_SEND_SOLICITED`.
//!
//! Found so far: a QP without a connection (its peer destroyed, or in ERR before the
//! connection was set up) did not run the local checks of its WQEs, so a bad lkey ended
//! as `RETRY_EXC_ERR` after the retries instead of `LOC_PROT_ERR` at once (fixed in
//! `src/qp.rs`, regression test there).
//!
//! `PROPTEST_CASES` sets the number of cases (default [`DEFAULT_CASES`], sized for CI in
//! debug), `PROPTEST_MAX_SHRINK_ITERS`/`PROPTEST_MAX_SHRINK_TIME` the shrinking;
//! `MODEL_STATS=1` prints what ran (steps, statuses seen, time), `MODEL_LOG=1` every
//! passing case's steps.

// Sides (0, 1) and CQs (0..4) are indices into several parallel arrays.
#![allow(clippy::needless_range_loop)]

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backend_sim::{SimBackend, SimConfig, SimContext, SimCq, SimMr, SimPd, SimQp};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use verbs_api::{
    connect_rc, local_endpoint, AccessFlags as A, Backend, CompletionQueue, Context, MemoryRegion,
    ProtectionDomain, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair, RcParams, RecvWr,
    RemoteAddr, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOp, PSN_MASK,
};

/// Cases per run unless `PROPTEST_CASES` says otherwise (CI runs debug builds).
const DEFAULT_CASES: u32 = 64;
/// Bound on every wait for the completions the model expects.
const WAIT: Duration = Duration::from_secs(5);

/// The regions registered on each side: (length, access). The last one lies in a second
/// PD. Lengths are multiples of 8 and the buffers page-aligned (atomics need 8-byte
/// alignment).
const REGIONS: [(usize, A); 8] = [
    (4096, A::ALL),
    (512, A::LOCAL_WRITE.union(A::REMOTE_WRITE)),
    (512, A::LOCAL_WRITE.union(A::REMOTE_READ)),
    (256, A::REMOTE_READ),
    (256, A::LOCAL_WRITE.union(A::REMOTE_ATOMIC)),
    (256, A::empty()),
    (65536, A::LOCAL_WRITE.union(A::REMOTE_WRITE).union(A::REMOTE_READ)),
    (512, A::ALL),
];
const OTHER_PD_REGION: usize = 7;
const PER_SIDE: usize = REGIONS.len();

/// Queue sizes asked for (the model uses what `query` says was granted).
const CAP: QpCap = QpCap {
    max_send_wr: 6,
    max_recv_wr: 12,
    max_send_sge: 3,
    max_recv_sge: 3,
    max_inline_data: 64,
};

/// Connection attributes of both QPs: RNR fails at once; the ACK timeout is 67 ms
/// (code 14) with 3 retries, so a dead peer costs ~268 ms and a spurious failure needs a
/// 268 ms stall of all progress (134 ms was seen beside CPU hogs on a 2-CPU machine).
fn params() -> RcParams {
    RcParams {
        rnr_retry: 0,
        timeout: 14,
        retry_cnt: 3,
        min_rnr_timer: 1,
        ..RcParams::default()
    }
}

const SIDE_NAME: [&str; 2] = ["A", "B"];
const CQ_NAME: [&str; 4] = ["A.send", "A.recv", "B.send", "B.recv"];

// ------------------------------------------------------------------ generated operations

/// Where in a region an address points.
#[derive(Clone, Copy, Debug)]
enum Pos {
    /// In bounds (the selector picks the offset).
    In(u32),
    /// Starts inside, ends past the end.
    CrossEnd,
    /// Past the end.
    PastEnd,
    /// Before the start.
    BeforeStart,
    /// The region's address with a key that names no region.
    BadKey,
}

/// A length, relative to the region it lies in.
#[derive(Clone, Copy, Debug)]
enum Len {
    Small(u32),
    /// Per mille of the region.
    Frac(u16),
    /// Longer than the region.
    Over(u16),
}

/// Which region an address lies in.
#[derive(Clone, Copy, Debug)]
enum Pick {
    /// A live region of the side, in the QP's PD, with the access the use needs (the
    /// selector picks one).
    Fit(u8),
    /// Any region of the side (or of the other side with `far`), live or not.
    Any { far: bool, region: u8 },
}

/// A local SGE (in a region of the poster's side).
#[derive(Clone, Copy, Debug)]
struct SgeGen {
    pick: Pick,
    pos: Pos,
    len: Len,
}

/// A remote address (in a region of the peer's side).
#[derive(Clone, Copy, Debug)]
struct RemoteGen {
    pick: Pick,
    pos: Pos,
    /// Added to atomic addresses (non-zero: misaligned).
    misalign: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    Faa,
}

#[derive(Clone, Debug)]
struct WrGen {
    kind: Kind,
    sges: Vec<SgeGen>,
    remote: RemoteGen,
    signaled: bool,
    fence: bool,
    inline: bool,
    imm: u32,
    value: u64,
    /// CMP_AND_SWP's compare value; `None`: the word's current value (a hit).
    compare: Option<u64>,
}

#[derive(Clone, Debug)]
enum Op {
    PostRecv {
        side: u8,
        wrs: Vec<Vec<SgeGen>>,
    },
    /// `to_dead`: post even if this QP or its peer is in ERR or destroyed (all flushed,
    /// or waiting out the retries: kept rare so that most steps run on a live pair).
    PostSend {
        side: u8,
        wrs: Vec<WrGen>,
        to_dead: bool,
    },
    ToErr {
        side: u8,
    },
    SetAccess {
        side: u8,
        flags: u8,
    },
    Dereg {
        side: u8,
        region: u8,
    },
    Destroy {
        side: u8,
    },
    Reconnect {
        psn: [u32; 2],
    },
}

#[derive(Clone, Debug)]
struct Setup {
    two_devices: bool,
    sq_sig_all: [bool; 2],
    psn: [u32; 2],
}

fn pos() -> impl Strategy<Value = Pos> {
    prop_oneof![
        8 => any::<u32>().prop_map(Pos::In),
        1 => Just(Pos::CrossEnd),
        1 => Just(Pos::PastEnd),
        1 => Just(Pos::BeforeStart),
        1 => Just(Pos::BadKey),
    ]
}

fn len() -> impl Strategy<Value = Len> {
    prop_oneof![
        8 => (1u32..=48).prop_map(Len::Small),
        4 => (1u16..=1000).prop_map(Len::Frac),
        1 => (1u16..=64).prop_map(Len::Over),
    ]
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        1 => any::<u8>().prop_map(Pick::Fit),
        1 => (prop::bool::weighted(0.3), 0u8..PER_SIDE as u8).prop_map(|(far, region)| Pick::Any { far, region }),
    ]
}

/// An SGE that passes every check when posted (unless the state changed: a region
/// deregistered, ...), with lengths drawn from `len`.
fn clean_sge(len: impl Strategy<Value = Len>) -> impl Strategy<Value = SgeGen> {
    (any::<u8>(), any::<u32>(), len).prop_map(|(sel, at, len)| SgeGen {
        pick: Pick::Fit(sel),
        pos: Pos::In(at),
        len,
    })
}

/// Any SGE: other regions (another PD, another device, without the access, deregistered),
/// out of bounds, bad keys, longer than the region.
fn dirty_sge() -> impl Strategy<Value = SgeGen> {
    (pick(), pos(), len()).prop_map(|(pick, pos, len)| SgeGen { pick, pos, len })
}

/// Gather lists of sends: small, some up to a tenth of the region.
fn send_len() -> impl Strategy<Value = Len> {
    prop_oneof![
        8 => (1u32..=64).prop_map(Len::Small),
        1 => (1u16..=100).prop_map(Len::Frac),
    ]
}

/// Receive buffers: mostly a good part of the region.
fn recv_len() -> impl Strategy<Value = Len> {
    prop_oneof![
        1 => (1u32..=64).prop_map(Len::Small),
        3 => (100u16..=1000).prop_map(Len::Frac),
    ]
}

fn sge_count() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 12 => 1usize..=3]
}

/// A clean gather/scatter list of 0 to 3 SGEs, or (one time in `dirty_in`) a dirty one
/// of 0 to 4 (the QPs take 3).
fn sges(len: fn() -> BoxedStrategy<Len>, dirty_in: u32) -> impl Strategy<Value = Vec<SgeGen>> {
    prop_oneof![
        dirty_in - 1 => sge_count().prop_flat_map(move |n| prop::collection::vec(clean_sge(len()), n)),
        1 => prop_oneof![12 => sge_count(), 1 => Just(4usize)]
            .prop_flat_map(|n| prop::collection::vec(dirty_sge(), n)),
    ]
}

fn remote() -> impl Strategy<Value = RemoteGen> {
    prop_oneof![
        9 => (any::<u8>(), any::<u32>()).prop_map(|(sel, at)| RemoteGen {
            pick: Pick::Fit(sel),
            pos: Pos::In(at),
            misalign: 0,
        }),
        1 => (pick(), pos(), prop_oneof![2 => Just(0u8), 1 => 1u8..8])
            .prop_map(|(pick, pos, misalign)| RemoteGen { pick, pos, misalign }),
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Send),
        2 => Just(Kind::SendImm),
        3 => Just(Kind::Write),
        2 => Just(Kind::WriteImm),
        3 => Just(Kind::Read),
        2 => Just(Kind::Cas),
        2 => Just(Kind::Faa),
    ]
}

fn wr() -> impl Strategy<Value = WrGen> {
    (
        kind(),
        sges(|| send_len().boxed(), 12),
        remote(),
        prop::bool::weighted(0.6),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.15),
        any::<u32>(),
        prop_oneof![3 => 0u64..16, 1 => any::<u64>()],
        prop::option::weighted(0.5, any::<u64>()),
    )
        .prop_map(
            |(kind, sges, remote, signaled, fence, inline, imm, value, compare)| WrGen {
                kind,
                sges,
                remote,
                signaled,
                fence,
                inline,
                imm,
                value,
                compare,
            },
        )
}

fn psn() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => any::<u32>().prop_map(|v| v & PSN_MASK),
        1 => (PSN_MASK - 4)..=PSN_MASK,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        24 => (0u8..2, prop_oneof![
            9 => prop::collection::vec(wr(), 1..=4),
            1 => prop::collection::vec(wr(), 5..=8),
        ], prop::bool::weighted(0.2))
            .prop_map(|(side, wrs, to_dead)| Op::PostSend { side, wrs, to_dead }),
        30 => (0u8..2, prop_oneof![
            12 => prop::collection::vec(sges(|| recv_len().boxed(), 10), 1..=5),
            1 => prop::collection::vec(sges(|| recv_len().boxed(), 10), 8..=14),
        ])
            .prop_map(|(side, wrs)| Op::PostRecv { side, wrs }),
        1 => (0u8..2).prop_map(|side| Op::ToErr { side }),
        2 => (0u8..2, 0u8..8).prop_map(|(side, flags)| Op::SetAccess { side, flags }),
        3 => (0u8..2, 0u8..PER_SIDE as u8).prop_map(|(side, region)| Op::Dereg { side, region }),
        1 => (0u8..2).prop_map(|side| Op::Destroy { side }),
        8 => (psn(), psn()).prop_map(|(a, b)| Op::Reconnect { psn: [a, b] }),
    ]
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        any::<bool>(),
        [prop::bool::weighted(0.2), prop::bool::weighted(0.2)],
        psn(),
        psn(),
    )
        .prop_map(|(two_devices, sq_sig_all, a, b)| Setup {
            two_devices,
            sq_sig_all,
            psn: [a, b],
        })
}

// ------------------------------------------------------------------ completions

/// The comparable part of a work completion. As `man ibv_poll_cq` says, only `wr_id`,
/// `status` and `qp_num` are meaningful when the status is not success; `byte_len` is
/// meaningful for receives, READ and atomics.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Wc {
    wr_id: u64,
    status: WcStatus,
    qp_num: u32,
    opcode: Option<WcOpcode>,
    byte_len: Option<u32>,
    imm: Option<u32>,
}

impl fmt::Debug for Wc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {:?}", self.wr_id, self.status)?;
        if let Some(o) = self.opcode {
            write!(f, " {o:?}")?;
        }
        if let Some(l) = self.byte_len {
            write!(f, " len={l}")?;
        }
        if let Some(i) = self.imm {
            write!(f, " imm={i:#x}")?;
        }
        write!(f, " qp={:#x}", self.qp_num)
    }
}

fn norm(w: &WorkCompletion) -> Wc {
    if w.status != WcStatus::Success {
        return Wc {
            wr_id: w.wr_id,
            status: w.status,
            qp_num: w.qp_num,
            opcode: None,
            byte_len: None,
            imm: None,
        };
    }
    let has_len = matches!(
        w.opcode,
        WcOpcode::Recv
            | WcOpcode::RecvRdmaWithImm
            | WcOpcode::RdmaRead
            | WcOpcode::CompSwap
            | WcOpcode::FetchAdd
    );
    Wc {
        wr_id: w.wr_id,
        status: w.status,
        qp_num: w.qp_num,
        opcode: Some(w.opcode),
        byte_len: has_len.then_some(w.byte_len),
        imm: w.imm(),
    }
}

// ------------------------------------------------------------------ the reference model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Rts,
    Err,
    /// Destroyed.
    Gone,
}

#[derive(Clone, Debug)]
struct RecvM {
    wr_id: u64,
    sges: Vec<Sge>,
}

#[derive(Clone, Debug)]
struct QpM {
    dev: usize,
    pd: usize,
    qpn: u32,
    st: St,
    rq: VecDeque<RecvM>,
    access: A,
    sig_all: bool,
    cap: QpCap,
}

#[derive(Clone, Debug)]
struct MrM {
    name: String,
    dev: usize,
    pd: usize,
    key: u32,
    addr: u64,
    len: usize,
    access: A,
    live: bool,
    img: Vec<u8>,
}

/// A byte range of a region: (region index, offset, length).
type Seg = (usize, usize, usize);

/// What the model predicts a post returns: `Err((bad_wr index, errno))`.
type PostRes = Result<(), (usize, i32)>;

/// A send WR with everything resolved.
#[derive(Clone, Debug)]
struct CWr {
    wr_id: u64,
    op: WrOp,
    sges: Vec<Sge>,
    flags: SendFlags,
}

/// RC semantics over the model's state: two QPs (index 0 = A, 1 = B), the regions of
/// both sides with their bytes, and the completions each CQ must have delivered so far
/// (index `2 * side` the send CQ, `2 * side + 1` the receive CQ).
#[derive(Clone, Debug)]
struct Model {
    mrs: Vec<MrM>,
    qps: [QpM; 2],
    exp: [Vec<Wc>; 4],
}

fn inside(m: &MrM, addr: u64, len: u64) -> Option<usize> {
    let off = addr.checked_sub(m.addr)?;
    let end = off.checked_add(len)?;
    (end <= m.len as u64).then_some(off as usize)
}

fn total(segs: &[Seg]) -> usize {
    segs.iter().map(|s| s.2).sum()
}

/// The first `len` bytes of a scatter list.
fn prefix(segs: &[Seg], len: usize) -> Vec<Seg> {
    let mut left = len;
    let mut out = Vec::new();
    for &(m, off, l) in segs {
        if left == 0 {
            break;
        }
        let n = l.min(left);
        out.push((m, off, n));
        left -= n;
    }
    out
}

impl Model {
    /// The live region with `key` on device `dev`.
    fn find(&self, dev: usize, key: u32) -> Option<usize> {
        self.mrs
            .iter()
            .position(|m| m.live && m.dev == dev && m.key == key)
    }

    /// The local check of QP `q` on a gather/scatter list (`write`: the HCA writes).
    /// Zero-length SGEs are not generated.
    fn local(&self, q: usize, sges: &[Sge], write: bool) -> Option<Vec<Seg>> {
        self.local_of(q, sges, write, true)
    }

    /// The segments of an inline WR's gather list: each in a region of the QP's device,
    /// of any PD (`man ibv_post_send`: the L_Key of inline data is not checked).
    fn inline_local(&self, q: usize, sges: &[Sge]) -> Option<Vec<Seg>> {
        self.local_of(q, sges, false, false)
    }

    fn local_of(&self, q: usize, sges: &[Sge], write: bool, check_pd: bool) -> Option<Vec<Seg>> {
        let qp = &self.qps[q];
        let mut out = Vec::new();
        for s in sges {
            if s.length == 0 {
                continue;
            }
            let i = self.find(qp.dev, s.lkey)?;
            let m = &self.mrs[i];
            if (check_pd && m.pd != qp.pd) || (write && !m.access.contains(A::LOCAL_WRITE)) {
                return None;
            }
            out.push((i, inside(m, s.addr, s.length as u64)?, s.length as usize));
        }
        Some(out)
    }

    /// The responder QP `q`'s check of a remote access: the error status the requester
    /// sees, or the range (none for a zero-length READ/WRITE, which checks no key). When
    /// several checks fail at once, which one is reported is the HCA's choice; the model
    /// follows the sim's order (QP access flags, length, alignment, key, PD, region access
    /// flags, bounds), which only matters for the status (misaligned: REM_INV_REQ_ERR).
    fn remote(&self, q: usize, rkey: u32, addr: u64, len: u64, need: A) -> Result<Option<Seg>, WcStatus> {
        let qp = &self.qps[q];
        let atomic = need == A::REMOTE_ATOMIC;
        if !qp.access.contains(need) {
            return Err(WcStatus::RemAccessErr);
        }
        if len == 0 && !atomic {
            return Ok(None);
        }
        if atomic && addr % 8 != 0 {
            return Err(WcStatus::RemInvReqErr);
        }
        let i = self.find(qp.dev, rkey).ok_or(WcStatus::RemAccessErr)?;
        let m = &self.mrs[i];
        if m.pd != qp.pd || !m.access.contains(need) {
            return Err(WcStatus::RemAccessErr);
        }
        let off = inside(m, addr, len).ok_or(WcStatus::RemAccessErr)?;
        Ok(Some((i, off, len as usize)))
    }

    fn gather(&self, segs: &[Seg]) -> Vec<u8> {
        let mut v = Vec::new();
        for &(m, off, l) in segs {
            v.extend_from_slice(&self.mrs[m].img[off..off + l]);
        }
        v
    }

    fn scatter(&mut self, segs: &[Seg], data: &[u8]) {
        let mut at = 0;
        for &(m, off, l) in segs {
            let n = l.min(data.len() - at);
            self.mrs[m].img[off..off + n].copy_from_slice(&data[at..at + n]);
            at += n;
            if at == data.len() {
                break;
            }
        }
    }

    fn word(&self, seg: Seg) -> u64 {
        let (m, off, _) = seg;
        u64::from_ne_bytes(self.mrs[m].img[off..off + 8].try_into().expect("8 bytes"))
    }

    fn push(&mut self, cq: usize, wc: Wc) {
        self.exp[cq].push(wc);
    }

    fn err_wc(&mut self, q: usize, recv: bool, wr_id: u64, status: WcStatus) {
        let qp_num = self.qps[q].qpn;
        self.push(
            2 * q + recv as usize,
            Wc {
                wr_id,
                status,
                qp_num,
                opcode: None,
                byte_len: None,
                imm: None,
            },
        );
    }

    /// QP `q` to ERR: its receives are flushed (its send queue is handled by the caller).
    fn enter_err(&mut self, q: usize) {
        if self.qps[q].st != St::Rts {
            return;
        }
        self.qps[q].st = St::Err;
        self.flush_rq(q);
    }

    fn flush_rq(&mut self, q: usize) {
        while let Some(r) = self.qps[q].rq.pop_front() {
            self.err_wc(q, true, r.wr_id, WcStatus::WrFlushErr);
        }
    }

    /// What `ibv_post_recv` returns, and its effects.
    fn post_recv(&mut self, q: usize, wrs: &[(u64, Vec<Sge>)]) -> PostRes {
        let cap = self.qps[q].cap;
        let mut res = Ok(());
        for (i, (wr_id, sges)) in wrs.iter().enumerate() {
            if self.qps[q].rq.len() >= cap.max_recv_wr as usize {
                res = Err((i, libc::ENOMEM));
                break;
            }
            if sges.len() > cap.max_recv_sge as usize {
                res = Err((i, libc::EINVAL));
                break;
            }
            self.qps[q].rq.push_back(RecvM {
                wr_id: *wr_id,
                sges: sges.clone(),
            });
        }
        if self.qps[q].st == St::Err {
            self.flush_rq(q);
        }
        res
    }

    /// The checks `ibv_post_send` makes: how many WRs are posted, the result, and the
    /// inline data copied at post time.
    fn post_checks(&self, q: usize, wrs: &[CWr]) -> (usize, PostRes, Vec<Option<Vec<u8>>>) {
        let cap = self.qps[q].cap;
        let mut inl = Vec::new();
        for (i, w) in wrs.iter().enumerate() {
            let errno = if i >= cap.max_send_wr as usize {
                libc::ENOMEM
            } else if w.sges.len() > cap.max_send_sge as usize {
                libc::EINVAL
            } else if !w.flags.contains(SendFlags::INLINE) {
                inl.push(None);
                continue;
            } else if w.op.is_read_or_atomic()
                || w.sges.iter().map(|s| s.length as u64).sum::<u64>() > cap.max_inline_data as u64
            {
                libc::EINVAL
            } else if let Some(segs) = self.inline_local(q, &w.sges) {
                inl.push(Some(self.gather(&segs)));
                continue;
            } else {
                libc::EINVAL
            };
            return (i, Err((i, errno)), inl);
        }
        (wrs.len(), Ok(()), inl)
    }

    /// What `ibv_post_send` on QP `x` returns, and its effects (executed in order, at
    /// once: the step is quiescent before and after).
    fn post_send(&mut self, x: usize, wrs: &[CWr]) -> PostRes {
        let (n, res, inl) = self.post_checks(x, wrs);
        let y = 1 - x;
        for (w, data) in wrs[..n].iter().zip(inl) {
            let signaled = self.qps[x].sig_all || w.flags.contains(SendFlags::SIGNALED);
            if self.qps[x].st != St::Rts {
                self.err_wc(x, false, w.wr_id, WcStatus::WrFlushErr);
                continue;
            }
            let rd = w.op.is_read_or_atomic();
            let segs = if data.is_some() {
                Vec::new()
            } else {
                match self.local(x, &w.sges, rd) {
                    Some(s) => s,
                    None => {
                        self.fail(x, w, WcStatus::LocProtErr);
                        continue;
                    }
                }
            };
            if w.op.is_atomic() && total(&segs) < 8 {
                self.fail(x, w, WcStatus::LocLenErr);
                continue;
            }
            if self.qps[y].st != St::Rts {
                self.fail(x, w, WcStatus::RetryExcErr);
                continue;
            }
            match self.execute(y, w, &segs, data) {
                Ok(byte_len) => {
                    if signaled {
                        let qp_num = self.qps[x].qpn;
                        self.push(
                            2 * x,
                            Wc {
                                wr_id: w.wr_id,
                                status: WcStatus::Success,
                                qp_num,
                                opcode: Some(WcOpcode::of_send(w.op.opcode())),
                                byte_len,
                                imm: None,
                            },
                        );
                    }
                }
                Err(status) => self.fail(x, w, status),
            }
        }
        res
    }

    fn fail(&mut self, x: usize, w: &CWr, status: WcStatus) {
        self.err_wc(x, false, w.wr_id, status);
        self.enter_err(x);
    }

    /// Executes `w` at responder `y` (in RTS). Returns the requester's `byte_len` on
    /// success, or the requester's error status (the responder's own completions and
    /// state are handled here).
    fn execute(
        &mut self,
        y: usize,
        w: &CWr,
        segs: &[Seg],
        inline: Option<Vec<u8>>,
    ) -> Result<Option<u32>, WcStatus> {
        let imm = w.op.imm_data();
        match w.op {
            WrOp::Send | WrOp::SendWithImm { .. } => {
                let data = inline.unwrap_or_else(|| self.gather(segs));
                let Some(r) = self.qps[y].rq.pop_front() else {
                    return Err(WcStatus::RnrRetryExcErr);
                };
                let Some(dst) = self.local(y, &r.sges, true) else {
                    self.err_wc(y, true, r.wr_id, WcStatus::LocProtErr);
                    self.enter_err(y);
                    return Err(WcStatus::RemOpErr);
                };
                if total(&dst) < data.len() {
                    self.err_wc(y, true, r.wr_id, WcStatus::LocLenErr);
                    self.enter_err(y);
                    return Err(WcStatus::RemInvReqErr);
                }
                self.scatter(&dst, &data);
                self.recv_ok(y, r.wr_id, WcOpcode::Recv, data.len(), imm);
                Ok(None)
            }
            WrOp::RdmaWrite { remote } | WrOp::RdmaWriteWithImm { remote, .. } => {
                let data = inline.unwrap_or_else(|| self.gather(segs));
                if imm.is_some() && self.qps[y].rq.is_empty() {
                    return Err(WcStatus::RnrRetryExcErr);
                }
                match self.remote(y, remote.rkey, remote.addr, data.len() as u64, A::REMOTE_WRITE) {
                    Err(s) => {
                        // The receive the immediate took completes LOC_ACCESS_ERR (IBA's
                        // status, portable's `write_imm_bad_rkey`), unless the QP's
                        // access flags refused the opcode before any receive was taken.
                        if imm.is_some() && self.qps[y].access.contains(A::REMOTE_WRITE) {
                            let r = self.qps[y].rq.pop_front().expect("checked above");
                            self.err_wc(y, true, r.wr_id, WcStatus::LocAccessErr);
                        }
                        self.enter_err(y);
                        Err(s)
                    }
                    Ok(seg) => {
                        if let Some(seg) = seg {
                            self.scatter(&[seg], &data);
                        }
                        if imm.is_some() {
                            let r = self.qps[y].rq.pop_front().expect("checked above");
                            self.recv_ok(y, r.wr_id, WcOpcode::RecvRdmaWithImm, data.len(), imm);
                        }
                        Ok(None)
                    }
                }
            }
            WrOp::RdmaRead { remote } => {
                let len = total(segs);
                match self.remote(y, remote.rkey, remote.addr, len as u64, A::REMOTE_READ) {
                    Err(s) => {
                        self.enter_err(y);
                        Err(s)
                    }
                    Ok(seg) => {
                        let data = seg.map(|s| self.gather(&[s])).unwrap_or_default();
                        self.scatter(segs, &data);
                        Ok(Some(len as u32))
                    }
                }
            }
            WrOp::AtomicCmpAndSwp { remote, .. } | WrOp::AtomicFetchAndAdd { remote, .. } => {
                match self.remote(y, remote.rkey, remote.addr, 8, A::REMOTE_ATOMIC) {
                    Err(s) => {
                        self.enter_err(y);
                        Err(s)
                    }
                    Ok(seg) => {
                        let seg = seg.expect("atomics name 8 bytes");
                        let old = self.word(seg);
                        let new = match w.op {
                            WrOp::AtomicCmpAndSwp { compare, swap, .. } => {
                                if old == compare {
                                    swap
                                } else {
                                    old
                                }
                            }
                            WrOp::AtomicFetchAndAdd { add, .. } => old.wrapping_add(add),
                            _ => unreachable!(),
                        };
                        self.scatter(&[seg], &new.to_ne_bytes());
                        self.scatter(segs, &old.to_ne_bytes());
                        Ok(Some(8))
                    }
                }
            }
            WrOp::LocalInv { .. } | WrOp::BindMw | WrOp::SendWithInv { .. } => {
                unreachable!("the model posts no memory-window operations")
            }
        }
    }

    fn recv_ok(&mut self, y: usize, wr_id: u64, opcode: WcOpcode, len: usize, imm: Option<u32>) {
        let qp_num = self.qps[y].qpn;
        self.push(
            2 * y + 1,
            Wc {
                wr_id,
                status: WcStatus::Success,
                qp_num,
                opcode: Some(opcode),
                byte_len: Some(len as u32),
                imm,
            },
        );
    }

    /// How many WRs of a batch (posted on QP `x`, of which `posted` pass the post checks)
    /// can be posted without an outcome that depends on timing (see the module docs):
    /// the batch is cut before a WR that would fail a local check behind other WRs, and
    /// before a WR whose memory accesses race with an earlier one's (or with its own).
    fn safe_prefix(&self, x: usize, wrs: &[CWr], posted: usize, inl: &[Option<Vec<u8>>]) -> usize {
        if self.qps[x].st != St::Rts {
            return wrs.len();
        }
        let y = 1 - x;
        let mut acc: Vec<Access> = Vec::new();
        let mut recv_k = 0;
        let mut rd_seen: Option<usize> = None;
        let mut barrier: Option<usize> = None;
        for j in 0..posted {
            let w = &wrs[j];
            let rd = w.op.is_read_or_atomic();
            if w.flags.contains(SendFlags::FENCE) {
                barrier = barrier.max(rd_seen);
            }
            let inline = inl[j].as_ref();
            let segs = match inline {
                Some(_) => Some(Vec::new()),
                None => self.local(x, &w.sges, rd),
            };
            let Some(segs) = segs.filter(|s| !w.op.is_atomic() || total(s) >= 8) else {
                // A local error: deterministic first in the batch (nothing else runs),
                // timing-dependent behind other WRs.
                return if j == 0 { wrs.len() } else { j };
            };
            let len = inline.map_or(total(&segs), |d| d.len());
            let mut mine = Vec::new();
            let mut add = |stage: u8, seg: Seg, write: bool| {
                mine.push(Access {
                    wr: j,
                    stage,
                    seg,
                    write,
                })
            };
            if inline.is_none() && !rd {
                for &s in &segs {
                    add(G, s, false);
                }
            }
            match w.op {
                WrOp::Send | WrOp::SendWithImm { .. } => {
                    if let Some(r) = self.qps[y].rq.get(recv_k) {
                        recv_k += 1;
                        if let Some(dst) = self.local(y, &r.sges, true) {
                            if total(&dst) >= len {
                                for s in prefix(&dst, len) {
                                    add(E, s, true);
                                }
                            }
                        }
                    }
                }
                WrOp::RdmaWrite { remote } | WrOp::RdmaWriteWithImm { remote, .. } => {
                    if w.op.imm_data().is_some() {
                        recv_k += 1;
                    }
                    if let Ok(Some(s)) = self.remote(y, remote.rkey, remote.addr, len as u64, A::REMOTE_WRITE)
                    {
                        add(E, s, true);
                    }
                }
                WrOp::RdmaRead { remote } => {
                    if let Ok(Some(s)) = self.remote(y, remote.rkey, remote.addr, len as u64, A::REMOTE_READ)
                    {
                        add(R, s, false);
                        for &d in &segs {
                            add(L, d, true);
                        }
                    }
                }
                WrOp::AtomicCmpAndSwp { remote, .. } | WrOp::AtomicFetchAndAdd { remote, .. } => {
                    if let Ok(Some(s)) = self.remote(y, remote.rkey, remote.addr, 8, A::REMOTE_ATOMIC) {
                        add(E, s, true);
                        for d in prefix(&segs, 8) {
                            add(L, d, true);
                        }
                    }
                }
                WrOp::LocalInv { .. } | WrOp::BindMw | WrOp::SendWithInv { .. } => {
                    unreachable!("the model posts no memory-window operations")
                }
            }
            let racy = mine.iter().enumerate().any(|(k, b)| {
                acc.iter().any(|a| conflict(a, b, barrier))
                    || mine[..k].iter().any(|a| conflict(a, b, barrier))
            });
            if racy {
                return j;
            }
            acc.extend(mine);
            if rd {
                rd_seen = Some(j);
            }
        }
        wrs.len()
    }

    fn reconnect(&mut self) {
        for q in 0..2 {
            let qp = &mut self.qps[q];
            qp.st = St::Rts;
            qp.rq.clear();
            qp.access = params().access;
        }
    }
}

/// Stages of a WR's memory accesses, in the order they happen for that WR: the requester
/// gathers a SEND/WRITE payload (G), the responder executes the request (E: writes the
/// receive or the target, runs the atomic), the responder reads the data of a READ
/// response (R), the requester writes a READ response or atomic result (L).
const G: u8 = 0;
const E: u8 = 1;
const R: u8 = 2;
const L: u8 = 3;

#[derive(Clone, Copy, Debug)]
struct Access {
    wr: usize,
    stage: u8,
    seg: Seg,
    write: bool,
}

/// Whether access `a` (of an earlier or the same WR) happens before `b`, whatever the
/// timing. Each stage happens in WR order (the requester transmits in order, the
/// responder executes and answers in order, responses are processed in order), and each
/// WR's stages in order; nothing else is ordered except through a fence: a fenced WR is
/// not started before every READ/atomic before it (up to `barrier`) has completed, and
/// with them everything before them.
fn ordered(a: &Access, b: &Access, barrier: Option<usize>) -> bool {
    if a.wr == b.wr {
        // The payload streams through: gather and remote write of one SEND/WRITE, or the
        // responder's read and the requester's write of one READ, overlap in time.
        return !matches!((a.stage, b.stage), (G, E) | (E, G) | (R, L) | (L, R));
    }
    a.stage <= b.stage || barrier.is_some_and(|k| a.wr <= k)
}

fn conflict(a: &Access, b: &Access, barrier: Option<usize>) -> bool {
    let ((ma, oa, la), (mb, ob, lb)) = (a.seg, b.seg);
    let overlap = ma == mb && oa < ob + lb && ob < oa + la;
    overlap && (a.write || b.write) && !ordered(a, b, barrier)
}

// ------------------------------------------------------------------ the rig (the sim)

struct SideRig {
    dev: usize,
    scq: SimCq,
    rcq: SimCq,
    qp: Option<SimQp>,
}

struct Rig {
    ctxs: Vec<SimContext>,
    _pds: Vec<SimPd>,
    mrs: Vec<Option<SimMr>>,
    sides: Vec<SideRig>,
}

fn ck<T>(r: verbs_api::Result<T>, what: &str) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(97)) as u8)
        .collect()
}

impl Rig {
    fn cq(&self, c: usize) -> &SimCq {
        let s = &self.sides[c / 2];
        if c % 2 == 0 {
            &s.scq
        } else {
            &s.rcq
        }
    }

    fn qp(&self, s: usize) -> &SimQp {
        self.sides[s].qp.as_ref().expect("live QP")
    }

    fn connect(&self, psn: [u32; 2]) -> Result<(), TestCaseError> {
        let p = params();
        let ea = ck(
            local_endpoint(&self.ctxs[self.sides[0].dev], self.qp(0), &p, psn[0]),
            "endpoint A",
        )?;
        let eb = ck(
            local_endpoint(&self.ctxs[self.sides[1].dev], self.qp(1), &p, psn[1]),
            "endpoint B",
        )?;
        ck(connect_rc(self.qp(0), &p, ea.psn, &eb), "connect A")?;
        ck(connect_rc(self.qp(1), &p, eb.psn, &ea), "connect B")?;
        Ok(())
    }
}

fn build(setup: &Setup) -> Result<(Rig, Model), TestCaseError> {
    // Not from the environment: two devices on loopback whatever RDMA_SIM_* say.
    let sim = SimBackend::new(SimConfig::default());
    let ndev = if setup.two_devices { 2 } else { 1 };
    let dev_of = |s: usize| if setup.two_devices { s } else { 0 };
    let mut ctxs = Vec::new();
    for d in 0..ndev {
        ctxs.push(ck(sim.open(&format!("sim{d}")), "open")?);
    }
    // PDs: the main PD of each device, then a second PD per side.
    let mut pds = Vec::new();
    for ctx in &ctxs {
        pds.push(ck(ctx.alloc_pd(), "alloc_pd")?);
    }
    for s in 0..2 {
        pds.push(ck(ctxs[dev_of(s)].alloc_pd(), "alloc_pd")?);
    }
    let mut mrs = Vec::new();
    let mut mms = Vec::new();
    for s in 0..2 {
        for (k, &(len, access)) in REGIONS.iter().enumerate() {
            let pd = if k == OTHER_PD_REGION { ndev + s } else { dev_of(s) };
            let mr = ck(pds[pd].reg_mr(len, access), "reg_mr")?;
            let img = pattern(len, s * PER_SIDE + k);
            ck(mr.write(0, &img), "fill region")?;
            mms.push(MrM {
                name: format!("{}{k}", SIDE_NAME[s]),
                dev: dev_of(s),
                pd,
                key: mr.lkey(),
                addr: mr.addr(),
                len,
                access,
                live: true,
                img,
            });
            mrs.push(Some(mr));
        }
    }
    let mut sides = Vec::new();
    let mut qms = Vec::new();
    for s in 0..2 {
        let ctx = &ctxs[dev_of(s)];
        let scq = ck(ctx.create_cq(4096, None), "create_cq")?;
        let rcq = ck(ctx.create_cq(4096, None), "create_cq")?;
        let qp = ck(
            pds[dev_of(s)].create_qp(&QpInitAttr {
                send_cq: &scq,
                recv_cq: &rcq,
                srq: None,
                cap: CAP,
                qp_type: QpType::Rc,
                sq_sig_all: setup.sq_sig_all[s],
                create_flags: 0,
            }),
            "create_qp",
        )?;
        let cap = ck(qp.query(), "query_qp")?.cap;
        qms.push(QpM {
            dev: dev_of(s),
            pd: dev_of(s),
            qpn: qp.qp_num(),
            st: St::Rts,
            rq: VecDeque::new(),
            access: params().access,
            sig_all: setup.sq_sig_all[s],
            cap,
        });
        sides.push(SideRig {
            dev: dev_of(s),
            scq,
            rcq,
            qp: Some(qp),
        });
    }
    let rig = Rig {
        ctxs,
        _pds: pds,
        mrs,
        sides,
    };
    rig.connect(setup.psn)?;
    let qps: [QpM; 2] = qms.try_into().expect("two QPs");
    Ok((
        rig,
        Model {
            mrs: mms,
            qps,
            exp: Default::default(),
        },
    ))
}

// ------------------------------------------------------------------ resolving generated ops

/// Turns generated operations into concrete verbs calls.
struct Resolver {
    next_id: u64,
    bad_key: u32,
}

impl Resolver {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn region(side: usize, far: bool, region: u8) -> usize {
        let s = if far { 1 - side } else { side };
        s * PER_SIDE + region as usize % PER_SIDE
    }

    /// The region `p` names for a use that needs `need` (`LOCAL_WRITE` for the HCA
    /// writing, a remote right, or nothing), among the regions of `side`.
    fn pick(model: &Model, side: usize, p: Pick, need: A) -> usize {
        match p {
            Pick::Any { far, region } => Self::region(side, far, region),
            Pick::Fit(sel) => {
                let fit: Vec<usize> = (0..OTHER_PD_REGION)
                    .map(|k| side * PER_SIDE + k)
                    .filter(|&i| model.mrs[i].live && model.mrs[i].access.contains(need))
                    .collect();
                fit.get(sel as usize % fit.len().max(1))
                    .copied()
                    .unwrap_or(side * PER_SIDE)
            }
        }
    }

    /// Address and key for `len` bytes at `pos` of region `m`.
    fn place(&self, m: &MrM, pos: Pos, len: u64, align8: bool) -> (u64, u32) {
        let l = m.len as u64;
        let off = match pos {
            Pos::In(sel) if align8 => (sel as u64 % (l / 8)) * 8,
            Pos::In(sel) if len <= l => sel as u64 % (l - len + 1),
            Pos::In(_) => 0,
            Pos::CrossEnd if align8 => l,
            Pos::CrossEnd => l.saturating_sub(len / 2),
            Pos::PastEnd => l + 64,
            Pos::BeforeStart => return (m.addr.wrapping_sub(64), m.key),
            Pos::BadKey => return (m.addr, self.bad_key),
        };
        (m.addr + off, m.key)
    }

    fn sge(&self, model: &Model, side: usize, g: &SgeGen, need: A, force8: bool) -> Sge {
        let m = &model.mrs[Self::pick(model, side, g.pick, need)];
        let len = if force8 {
            8
        } else {
            match g.len {
                Len::Small(n) => n,
                Len::Frac(p) => ((m.len * p as usize) / 1000).max(1) as u32,
                Len::Over(n) => (m.len + n as usize) as u32,
            }
        };
        let (addr, lkey) = self.place(m, g.pos, len as u64, force8);
        Sge {
            addr,
            length: len,
            lkey,
        }
    }

    fn recvs(&mut self, model: &Model, side: usize, wrs: &[Vec<SgeGen>]) -> Vec<(u64, Vec<Sge>)> {
        wrs.iter()
            .map(|g| {
                let sges = g
                    .iter()
                    .map(|s| self.sge(model, side, s, A::LOCAL_WRITE, false))
                    .collect();
                (self.id(), sges)
            })
            .collect()
    }

    fn send(&mut self, model: &Model, side: usize, g: &WrGen) -> CWr {
        let atomic = matches!(g.kind, Kind::Cas | Kind::Faa);
        let (local_need, remote_need) = match g.kind {
            Kind::Send | Kind::SendImm => (A::empty(), A::empty()),
            Kind::Write | Kind::WriteImm => (A::empty(), A::REMOTE_WRITE),
            Kind::Read => (A::LOCAL_WRITE, A::REMOTE_READ),
            Kind::Cas | Kind::Faa => (A::LOCAL_WRITE, A::REMOTE_ATOMIC),
        };
        let sges: Vec<Sge> = if atomic {
            // One 8-byte result buffer.
            let first = g.sges.first().copied().unwrap_or(SgeGen {
                pick: Pick::Fit(0),
                pos: Pos::In(0),
                len: Len::Small(8),
            });
            vec![self.sge(model, side, &first, local_need, true)]
        } else {
            g.sges
                .iter()
                .map(|s| self.sge(model, side, s, local_need, false))
                .collect()
        };
        let len: u64 = sges.iter().map(|s| s.length as u64).sum();
        let rm = &model.mrs[Self::pick(model, 1 - side, g.remote.pick, remote_need)];
        let (addr, rkey) = if atomic {
            let (a, k) = self.place(rm, g.remote.pos, 8, true);
            (a.wrapping_add(g.remote.misalign as u64), k)
        } else {
            self.place(rm, g.remote.pos, len, false)
        };
        let remote = RemoteAddr::new(addr, rkey);
        let op = match g.kind {
            Kind::Send => WrOp::Send,
            Kind::SendImm => WrOp::SendWithImm { imm_data: g.imm },
            Kind::Write => WrOp::RdmaWrite { remote },
            Kind::WriteImm => WrOp::RdmaWriteWithImm {
                remote,
                imm_data: g.imm,
            },
            Kind::Read => WrOp::RdmaRead { remote },
            Kind::Cas => {
                // A hit when asked for: the target's current value, if it resolves.
                let current = model
                    .remote(1 - side, rkey, addr, 8, A::REMOTE_ATOMIC)
                    .ok()
                    .flatten()
                    .map(|s| model.word(s))
                    .unwrap_or(0);
                WrOp::AtomicCmpAndSwp {
                    remote,
                    compare: g.compare.unwrap_or(current),
                    swap: g.value,
                }
            }
            Kind::Faa => WrOp::AtomicFetchAndAdd { remote, add: g.value },
        };
        let mut flags = SendFlags::empty();
        if g.signaled {
            flags |= SendFlags::SIGNALED;
        }
        if g.fence {
            flags |= SendFlags::FENCE;
        }
        // Inline is for SEND and WRITE; on READ/atomics (EINVAL) only now and then.
        if g.inline && (remote_need != A::REMOTE_READ && !atomic || g.imm % 8 == 0) {
            flags |= SendFlags::INLINE;
        }
        CWr {
            wr_id: self.id(),
            op,
            sges,
            flags,
        }
    }
}

// ------------------------------------------------------------------ describing steps

impl Model {
    fn at(&self, addr: u64, key: u32) -> String {
        match self.mrs.iter().find(|m| m.key == key) {
            Some(m) => {
                let dead = if m.live { "" } else { "(dereg)" };
                let d = addr.wrapping_sub(m.addr) as i64;
                format!("{}{dead}{d:+}", m.name)
            }
            None => format!("badkey:{addr:#x}"),
        }
    }

    fn sges_str(&self, sges: &[Sge]) -> String {
        let v: Vec<String> = sges
            .iter()
            .map(|s| format!("{}/{}", self.at(s.addr, s.lkey), s.length))
            .collect();
        format!("[{}]", v.join(" "))
    }

    fn wr_str(&self, w: &CWr) -> String {
        let mut s = format!("#{} {:?}", w.wr_id, w.op.opcode());
        if let Some(r) = w.op.remote() {
            s += &format!(" ->{}", self.at(r.addr, r.rkey));
        }
        match w.op {
            WrOp::AtomicCmpAndSwp { compare, swap, .. } => s += &format!(" cmp={compare:#x} swp={swap:#x}"),
            WrOp::AtomicFetchAndAdd { add, .. } => s += &format!(" add={add:#x}"),
            _ => {}
        }
        if let Some(i) = w.op.imm_data() {
            s += &format!(" imm={i:#x}");
        }
        s += &format!(" {}", self.sges_str(&w.sges));
        for (f, n) in [
            (SendFlags::SIGNALED, "sig"),
            (SendFlags::FENCE, "fence"),
            (SendFlags::INLINE, "inline"),
        ] {
            if w.flags.contains(f) {
                s += &format!(" {n}");
            }
        }
        s
    }
}

// ------------------------------------------------------------------ running a case

#[derive(Default)]
struct Stats {
    cases: u64,
    steps: u64,
    skipped: u64,
    cut: u64,
    wrs: u64,
    statuses: BTreeMap<String, u64>,
}

static STATS: Mutex<Option<Stats>> = Mutex::new(None);

fn stat(f: impl FnOnce(&mut Stats)) {
    f(STATS.lock().unwrap().get_or_insert_with(Stats::default));
}

struct Run {
    rig: Rig,
    model: Model,
    res: Resolver,
    got: [Vec<Wc>; 4],
    log: Vec<String>,
}

impl Run {
    fn fail(&self, what: String) -> TestCaseError {
        let mut s = String::from("the sim diverged from the RC model\nsteps:\n");
        for (i, l) in self.log.iter().enumerate() {
            s += &format!("  {i:3}: {l}\n");
        }
        s += &format!("at the last step: {what}\n");
        for c in 0..4 {
            let (e, g) = (&self.model.exp[c], &self.got[c]);
            let first = e
                .iter()
                .zip(g)
                .position(|(a, b)| a != b)
                .unwrap_or(e.len().min(g.len()));
            if e.len() != g.len() || first < e.len() {
                s += &format!(
                    "{} differs from entry {first}:\n  expected {:?}\n  got      {:?}\n",
                    CQ_NAME[c],
                    &e[first..],
                    &g[first..]
                );
            }
        }
        TestCaseError::fail(s)
    }

    /// Waits (bounded) until every CQ has delivered what the model expects, then
    /// compares completions, QP states and memory.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        let deadline = Instant::now() + WAIT;
        let mut buf = [WorkCompletion::default(); 32];
        // `ibv_poll_cq` with room for 1, 3, 16 or 32 completions, changing every step.
        let room = [1, 3, 16, 32][self.log.len() % 4];
        let buf = &mut buf[..room];
        let mut idle = 0u32;
        loop {
            let mut done = true;
            for c in 0..4 {
                loop {
                    let n = self
                        .rig
                        .cq(c)
                        .poll(buf)
                        .map_err(|e| self.fail(format!("poll {}: {e}", CQ_NAME[c])))?;
                    self.got[c].extend(buf[..n].iter().map(norm));
                    if n < buf.len() {
                        break;
                    }
                }
                done &= self.got[c].len() >= self.model.exp[c].len();
            }
            if done {
                break;
            }
            if Instant::now() >= deadline {
                return Err(self.fail(format!("completions missing after {WAIT:?}")));
            }
            idle += 1;
            if idle > 256 {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                std::thread::yield_now();
            }
        }
        self.compare()
    }

    fn compare(&self) -> Result<(), TestCaseError> {
        if self.got != self.model.exp {
            return Err(self.fail("completion streams differ".into()));
        }
        for s in 0..2 {
            let want = match self.model.qps[s].st {
                St::Rts => QpState::Rts,
                St::Err => QpState::Err,
                St::Gone => continue,
            };
            let st = self
                .rig
                .qp(s)
                .state()
                .map_err(|e| self.fail(format!("query {}: {e}", SIDE_NAME[s])))?;
            if st != want {
                return Err(self.fail(format!(
                    "QP {} is in {st:?}, the model says {want:?}",
                    SIDE_NAME[s]
                )));
            }
        }
        for (i, m) in self.model.mrs.iter().enumerate() {
            if !m.live {
                continue;
            }
            let mem = self.rig.mrs[i].as_ref().expect("live region").to_vec();
            if let Some(off) = mem.iter().zip(&m.img).position(|(a, b)| a != b) {
                let end = (off + 16).min(m.len);
                return Err(self.fail(format!(
                    "region {} differs at offset {off}: memory {:02x?}, model {:02x?}",
                    m.name,
                    &mem[off..end],
                    &m.img[off..end]
                )));
            }
        }
        Ok(())
    }

    fn check_post(
        &self,
        what: &str,
        want: PostRes,
        got: Result<(), verbs_api::PostError>,
    ) -> Result<(), TestCaseError> {
        let got_s = got.as_ref().map(|_| ()).map_err(|e| (e.index, e.errno()));
        if got_s != want {
            return Err(self.fail(format!(
                "{what} returned {:?}, the model says {want:?} (index, errno)",
                got.map_err(|e| e.to_string())
            )));
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let live = |m: &Model, s: usize| m.qps[s].st != St::Gone;
        match op {
            Op::PostRecv { side, wrs } => {
                let s = *side as usize % 2;
                if !live(&self.model, s) {
                    return self.skip();
                }
                let recvs = self.res.recvs(&self.model, s, wrs);
                let desc: Vec<String> = recvs
                    .iter()
                    .map(|(id, sg)| format!("#{id} {}", self.model.sges_str(sg)))
                    .collect();
                let want = self.model.post_recv(s, &recvs);
                self.log.push(format!(
                    "{} post_recv {} => {want:?}",
                    SIDE_NAME[s],
                    desc.join(", ")
                ));
                let rwrs: Vec<RecvWr<'_>> = recvs.iter().map(|(id, sg)| RecvWr::new(*id, sg)).collect();
                let got = self.rig.qp(s).post_recv(&rwrs);
                self.check_post("post_recv", want, got)?;
            }
            Op::PostSend { side, wrs, to_dead } => {
                let s = *side as usize % 2;
                let dead = self.model.qps[s].st != St::Rts || self.model.qps[1 - s].st != St::Rts;
                if !live(&self.model, s) || (dead && !to_dead) {
                    return self.skip();
                }
                let mut cwrs: Vec<CWr> = wrs.iter().map(|g| self.res.send(&self.model, s, g)).collect();
                let (posted, _, inl) = self.model.post_checks(s, &cwrs);
                let keep = self.model.safe_prefix(s, &cwrs, posted, &inl);
                if keep < cwrs.len() {
                    stat(|st| st.cut += 1);
                    cwrs.truncate(keep);
                }
                if cwrs.is_empty() {
                    return self.skip();
                }
                // The last WR posted is signaled: its completion tells that every WR
                // before it has finished too.
                let posted = posted.min(cwrs.len());
                if posted > 0 {
                    cwrs[posted - 1].flags |= SendFlags::SIGNALED;
                }
                let desc: Vec<String> = cwrs.iter().map(|w| self.model.wr_str(w)).collect();
                let before = self.model.exp.clone();
                let want = self.model.post_send(s, &cwrs);
                self.log.push(format!(
                    "{} post_send {} => {want:?}",
                    SIDE_NAME[s],
                    desc.join(", ")
                ));
                stat(|st| {
                    st.wrs += posted as u64;
                    for (c, e) in self.model.exp.iter().enumerate() {
                        for w in &e[before[c].len()..] {
                            let k = match w.opcode {
                                Some(o) => format!("{:?} {o:?}", w.status),
                                None => format!("{:?}", w.status),
                            };
                            *st.statuses.entry(k).or_default() += 1;
                        }
                    }
                });
                let swrs: Vec<SendWr<'_>> = cwrs
                    .iter()
                    .map(|w| SendWr {
                        wr_id: w.wr_id,
                        sg_list: &w.sges,
                        op: w.op,
                        send_flags: w.flags,
                        ud: None,
                        bind: None,
                    })
                    .collect();
                let got = self.rig.qp(s).post_send(&swrs);
                self.check_post("post_send", want, got)?;
            }
            Op::ToErr { side } => {
                let s = *side as usize % 2;
                if !live(&self.model, s) {
                    return self.skip();
                }
                self.log.push(format!("{} modify -> ERR", SIDE_NAME[s]));
                self.model.enter_err(s);
                let attr = QpAttr {
                    qp_state: QpState::Err,
                    ..Default::default()
                };
                let r = self.rig.qp(s).modify(&attr, QpAttrMask::STATE);
                r.map_err(|e| self.fail(format!("modify to ERR: {e}")))?;
            }
            Op::SetAccess { side, flags } => {
                let s = *side as usize % 2;
                if !live(&self.model, s) {
                    return self.skip();
                }
                let mut access = A::empty();
                for (bit, f) in [(1, A::REMOTE_WRITE), (2, A::REMOTE_READ), (4, A::REMOTE_ATOMIC)] {
                    if flags & bit != 0 {
                        access |= f;
                    }
                }
                // RTS -> RTS may change qp_access_flags; ERR -> ERR takes no attribute.
                let want = if self.model.qps[s].st == St::Rts {
                    self.model.qps[s].access = access;
                    Ok(())
                } else {
                    Err(libc::EINVAL)
                };
                self.log.push(format!(
                    "{} modify qp_access_flags={access:?} => {want:?}",
                    SIDE_NAME[s]
                ));
                let attr = QpAttr {
                    qp_access_flags: access,
                    ..Default::default()
                };
                let got = self.rig.qp(s).modify(&attr, QpAttrMask::ACCESS_FLAGS);
                let got_s = got.as_ref().map(|_| ()).map_err(|e| e.errno());
                if got_s != want {
                    return Err(self.fail(format!("modify returned {got:?}, the model says {want:?}")));
                }
            }
            Op::Dereg { side, region } => {
                let i = Resolver::region(*side as usize % 2, false, *region);
                if !self.model.mrs[i].live {
                    return self.skip();
                }
                self.log.push(format!("dereg {}", self.model.mrs[i].name));
                self.model.mrs[i].live = false;
                self.rig.mrs[i] = None;
            }
            Op::Destroy { side } => {
                let s = *side as usize % 2;
                if !live(&self.model, s) {
                    return self.skip();
                }
                self.log.push(format!("destroy QP {}", SIDE_NAME[s]));
                self.model.qps[s].st = St::Gone;
                self.model.qps[s].rq.clear();
                self.rig.sides[s].qp = None;
            }
            Op::Reconnect { psn } => {
                if !live(&self.model, 0) || !live(&self.model, 1) {
                    return self.skip();
                }
                self.log.push(format!(
                    "both QPs -> RESET, reconnect (PSNs {:#x}, {:#x})",
                    psn[0], psn[1]
                ));
                self.model.reconnect();
                let attr = QpAttr {
                    qp_state: QpState::Reset,
                    ..Default::default()
                };
                for s in 0..2 {
                    let r = self.rig.qp(s).modify(&attr, QpAttrMask::STATE);
                    r.map_err(|e| self.fail(format!("modify to RESET: {e}")))?;
                }
                self.rig.connect(*psn)?;
            }
        }
        stat(|st| st.steps += 1);
        self.settle()
    }

    /// A step that does not apply (a destroyed QP, a region already deregistered, a
    /// batch cut to nothing, a post on a dead pair without `to_dead`).
    fn skip(&mut self) -> Result<(), TestCaseError> {
        stat(|st| st.skipped += 1);
        Ok(())
    }
}

fn run_case(setup: &Setup, ops: &[Op]) -> Result<(), TestCaseError> {
    let (rig, model) = build(setup)?;
    let mut bad_key = 0x0bad_0001u32;
    while model.mrs.iter().any(|m| m.key == bad_key) {
        bad_key = bad_key.wrapping_add(0x0001_0001);
    }
    let mut run = Run {
        rig,
        model,
        res: Resolver { next_id: 0, bad_key },
        got: Default::default(),
        log: vec![format!(
            "setup: {} device(s), sq_sig_all {:?}, PSNs {:#x} {:#x}",
            if setup.two_devices { 2 } else { 1 },
            setup.sq_sig_all,
            setup.psn[0],
            setup.psn[1]
        )],
    };
    for op in ops {
        run.step(op)?;
    }
    // Nothing more arrives later.
    std::thread::sleep(Duration::from_millis(5));
    run.settle()?;
    stat(|st| st.cases += 1);
    if std::env::var_os("MODEL_LOG").is_some() {
        eprintln!("case:\n  {}", run.log.join("\n  "));
    }
    Ok(())
}

#[test]
fn verbs_match_the_rc_model() {
    let env = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    // A failing case that waits out WAIT at each shrink step must not shrink for hours.
    let max_shrink_iters = env("PROPTEST_MAX_SHRINK_ITERS", 400);
    let max_shrink_time = env("PROPTEST_MAX_SHRINK_TIME", 120_000);
    let mut runner = TestRunner::new(Config {
        cases: env("PROPTEST_CASES", DEFAULT_CASES),
        max_shrink_iters,
        max_shrink_time,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/model.txt",
        ))),
        ..Config::default()
    });
    let t0 = Instant::now();
    let result = runner.run(&(setup(), prop::collection::vec(op(), 1..48)), |(setup, ops)| {
        run_case(&setup, &ops)
    });
    if std::env::var_os("MODEL_STATS").is_some() {
        if let Some(st) = STATS.lock().unwrap().as_ref() {
            eprintln!(
                "model check: {} cases, {} steps ({} skipped, {} batches cut), {} WRs posted in {:.1?}",
                st.cases,
                st.steps,
                st.skipped,
                st.cut,
                st.wrs,
                t0.elapsed()
            );
            for (k, v) in &st.statuses {
                eprintln!("  {v:7}  {k}");
            }
        }
    }
    if let Err(e) = result {
        panic!("{e}");
    }
}
