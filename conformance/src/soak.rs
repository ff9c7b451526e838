//! Soak: many RC QPs across two devices, mixed traffic with many work requests
//! outstanding on every QP, and exact accounting of everything that happened.
//!
//! Two contexts are opened (two devices, or the same device twice) and `qps` QPs are
//! created, half on each, connected pairwise across the two: QP `j` of device A talks to
//! QP `j` of device B. Every QP is a requester *and* a responder. Each posts
//! `ops_per_qp` signaled send WRs, keeping up to `depth` outstanding, drawn from a mix
//! of SEND_WITH_IMM, RDMA WRITE, RDMA READ, FETCH_AND_ADD and CMP_AND_SWP. What each WR
//! does is a pure function of `(seed, device, qp, seq)`, so both ends know it without
//! talking, and what it must produce is checked exactly:
//!
//! - **completions**: every send WR has exactly one completion, in posting order, with
//!   its QP number and opcode and `IBV_WC_SUCCESS` (a missing, duplicated or reordered
//!   `wr_id` fails); every receive completes once, with the right `byte_len` and
//!   immediate, and the immediates of a QP (the sender's sequence numbers) strictly
//!   increase and are exactly the sender's SENDs;
//! - **data**: payloads are derived from `(device, qp, seq)`; the receiver checks every
//!   SEND; every READ is checked against what the remote slot must hold at that point of
//!   the QP's request stream (the initial pattern, or the last WRITE posted before it on
//!   the same QP, which the responder executes first); a WRITE goes to a slot whose
//!   previous WRITE has been read back, so every WRITE is verified by a READ through the
//!   fabric or, for the last one per slot, by the final check of the target memory. A
//!   WRITE to a slot with a READ still outstanding carries `IBV_SEND_FENCE`: without it
//!   the responder may execute the WRITE before it has read out the READ's data (IBA's
//!   relaxed ordering of RDMA READ responses; the sim does this too, as it gathers large
//!   READ responses from memory only when it sends them);
//! - **atomics**: every QP of one device adds 1 to shared counters on the other device:
//!   the final value of each counter is its initial value plus the number of adds, and
//!   the old values returned are exactly `initial..final`, each once (a bitmap). Every QP
//!   runs a CMP_AND_SWP chain on a word of its own (each CAS must hit and return the
//!   previous link), and all QPs of a device race CMP_AND_SWP(guess, guess + 1) on one
//!   shared word: the hits must be exactly the values `initial..final`, each once;
//! - **memory**: RSS (`/proc/self/statm`) is sampled after a warm-up and at the end; the
//!   run fails if it grew by more than `max_rss_growth`. Every buffer the soak itself
//!   uses is allocated and touched before the first sample.
//!
//! The code is generic over [`Backend`], so the same soak runs on the sim (`cargo test`,
//! `soak --backend sim`) and on a real HCA (`soak --backend ibverbs`).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use verbs_api::{
    connect_rc, local_endpoint, AccessFlags, AtomicCap, Backend, CompletionQueue, Context, MemoryRegion,
    ProtectionDomain, QpCap, QpInitAttr, QueuePair, RcParams, RecvWr, RemoteMr, SendWr, Sge, WcOpcode,
    WcStatus, WorkCompletion, WrOp,
};

/// Relative weights of the operations a QP posts (a CMP_AND_SWP goes to the QP's own
/// chain word or to the shared word, half and half).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Mix {
    /// SEND_WITH_IMM (consumes a receive at the peer).
    pub send: u32,
    /// RDMA WRITE.
    pub write: u32,
    /// RDMA READ.
    pub read: u32,
    /// ATOMIC_FETCH_AND_ADD on a shared counter.
    pub fetch_add: u32,
    /// ATOMIC_CMP_AND_SWP on the QP's chain word or the shared word.
    pub cmp_swap: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            send: 3,
            write: 3,
            read: 2,
            fetch_add: 1,
            cmp_swap: 1,
        }
    }
}

impl Mix {
    fn total(&self) -> u64 {
        [self.send, self.write, self.read, self.fetch_add, self.cmp_swap]
            .iter()
            .map(|&w| w as u64)
            .sum()
    }

    /// Parses `send=3,write=3,read=2,fetch_add=1,cmp_swap=1` (names may be shortened to
    /// `faa` and `cas`; omitted operations keep their default weight).
    pub fn parse(s: &str) -> Result<Mix, String> {
        let mut m = Mix::default();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected name=weight"))?;
            let v: u32 = v.trim().parse().map_err(|_| format!("{part:?}: bad weight"))?;
            match k.trim() {
                "send" => m.send = v,
                "write" => m.write = v,
                "read" => m.read = v,
                "fetch_add" | "faa" => m.fetch_add = v,
                "cmp_swap" | "cas" => m.cmp_swap = v,
                other => return Err(format!("unknown operation {other:?}")),
            }
        }
        if m.total() == 0 {
            return Err("every weight is 0".into());
        }
        Ok(m)
    }
}

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct SoakConfig {
    /// QPs in total, half on each device (an even number, at least 2).
    pub qps: usize,
    /// Signaled send WRs each QP posts.
    pub ops_per_qp: u64,
    /// Send WRs each QP keeps outstanding (also the receives each QP keeps posted).
    pub depth: usize,
    /// Payload sizes of SEND, WRITE and READ (one is picked per WR).
    pub sizes: Vec<u32>,
    /// Seed of every choice (operation, size, slot, counter, PSNs).
    pub seed: u64,
    /// Operation weights.
    pub mix: Mix,
    /// Remote WRITE/READ slots per QP (each `max(sizes)` bytes).
    pub slots: usize,
    /// Shared FETCH_AND_ADD counters per device.
    pub counters: usize,
    /// QPs sharing one CQ (send and receive completions).
    pub qps_per_cq: usize,
    /// Fraction of all operations completed before the first RSS sample.
    pub warmup: f64,
    /// The run fails if RSS grows by more than this many bytes after the warm-up.
    pub max_rss_growth: u64,
    /// The run fails if no completion arrives for this long.
    pub stall_timeout: Duration,
    /// GID index for the connections (1 for RoCE v2 over IPv4 on rxe).
    pub gid_index: u8,
}

impl Default for SoakConfig {
    /// The size `cargo test` runs on the sim: 256 QPs (128 per device), 1000 WRs each.
    fn default() -> Self {
        SoakConfig {
            qps: 256,
            ops_per_qp: 1000,
            depth: 16,
            sizes: vec![1, 8, 61, 512, 1500, 4096],
            seed: 0x5eed_50a4,
            mix: Mix::default(),
            slots: 8,
            counters: 8,
            qps_per_cq: 32,
            warmup: 0.2,
            max_rss_growth: 64 << 20,
            stall_timeout: Duration::from_secs(30),
            gid_index: 0,
        }
    }
}

/// Counts by operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    /// SEND_WITH_IMM.
    pub send: u64,
    /// RDMA WRITE.
    pub write: u64,
    /// Of those, the ones posted with IBV_SEND_FENCE (a READ of their slot was outstanding).
    pub write_fenced: u64,
    /// RDMA READ.
    pub read: u64,
    /// FETCH_AND_ADD.
    pub fetch_add: u64,
    /// CMP_AND_SWP on a QP's own chain word (all must hit).
    pub cmp_swap_chain: u64,
    /// CMP_AND_SWP on the shared word.
    pub cmp_swap_shared: u64,
    /// Of those, the ones that swapped.
    pub cmp_swap_shared_hits: u64,
}

impl OpCounts {
    fn add(&mut self, o: &OpCounts) {
        self.send += o.send;
        self.write += o.write;
        self.write_fenced += o.write_fenced;
        self.read += o.read;
        self.fetch_add += o.fetch_add;
        self.cmp_swap_chain += o.cmp_swap_chain;
        self.cmp_swap_shared += o.cmp_swap_shared;
        self.cmp_swap_shared_hits += o.cmp_swap_shared_hits;
    }
}

/// What a soak did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SoakReport {
    /// Backend name.
    pub backend: String,
    /// The two devices (possibly the same one opened twice).
    pub devices: [String; 2],
    /// QPs in total.
    pub qps: usize,
    /// Signaled send WRs per QP.
    pub ops_per_qp: u64,
    /// Outstanding send WRs per QP.
    pub depth: usize,
    /// Payload sizes.
    pub sizes: Vec<u32>,
    /// Seed.
    pub seed: u64,
    /// Whether atomics ran (a device with `IBV_ATOMIC_NONE` runs without them).
    pub atomics: bool,
    /// Send WRs completed successfully (each exactly once).
    pub ops: u64,
    /// Receive completions (each checked).
    pub recv_completions: u64,
    /// By operation.
    pub by_op: OpCounts,
    /// Payload bytes moved by SEND, WRITE and READ (all verified).
    pub bytes: u64,
    /// Seconds to create and connect everything.
    pub setup_secs: f64,
    /// Seconds of traffic.
    pub elapsed_secs: f64,
    /// Send WRs per second over the whole run.
    pub ops_per_sec: f64,
    /// Send WRs per second after the warm-up.
    pub steady_ops_per_sec: f64,
    /// Payload MiB per second over the whole run.
    pub mib_per_sec: f64,
    /// RSS after the warm-up, bytes (0 where `/proc/self/statm` is missing).
    pub rss_before: u64,
    /// RSS at the end, bytes.
    pub rss_after: u64,
    /// Largest RSS sampled during the run, bytes.
    pub rss_peak: u64,
    /// The growth allowed, bytes.
    pub max_rss_growth: u64,
}

impl SoakReport {
    /// `rss_after - rss_before` (negative if it shrank).
    pub fn rss_growth(&self) -> i64 {
        self.rss_after as i64 - self.rss_before as i64
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(
            f,
            "backend {} devices {} + {}: {} QPs ({} per device, {} connections), depth {}, sizes {:?}, seed {:#x}",
            self.backend,
            self.devices[0],
            self.devices[1],
            self.qps,
            self.qps / 2,
            self.qps / 2,
            self.depth,
            self.sizes,
            self.seed
        )?;
        let o = &self.by_op;
        writeln!(
            f,
            "ops {} ({} per QP): send {} write {} ({} fenced) read {} fetch_add {} cmp_swap chain {} shared {} ({} hits){}",
            self.ops,
            self.ops_per_qp,
            o.send,
            o.write,
            o.write_fenced,
            o.read,
            o.fetch_add,
            o.cmp_swap_chain,
            o.cmp_swap_shared,
            o.cmp_swap_shared_hits,
            if self.atomics { "" } else { " (device without atomics)" }
        )?;
        writeln!(
            f,
            "receives {}, payload {:.1} MiB verified",
            self.recv_completions,
            mib(self.bytes)
        )?;
        writeln!(
            f,
            "setup {:.2} s, traffic {:.2} s: {:.0} ops/s ({:.0} ops/s after warm-up), {:.1} MiB/s",
            self.setup_secs, self.elapsed_secs, self.ops_per_sec, self.steady_ops_per_sec, self.mib_per_sec
        )?;
        write!(
            f,
            "RSS after warm-up {:.1} MiB, at the end {:.1} MiB (growth {:+.1} MiB, limit {:.0} MiB), peak {:.1} MiB",
            mib(self.rss_before),
            mib(self.rss_after),
            self.rss_growth() as f64 / (1 << 20) as f64,
            mib(self.max_rss_growth),
            mib(self.rss_peak)
        )
    }
}

/// A failed soak: what went wrong (the first problems found) and, once traffic ran, the
/// figures so far.
#[derive(Debug)]
pub struct SoakFailure {
    /// The problems, most important first.
    pub problems: Vec<String>,
    /// The figures, if traffic ran.
    pub report: Option<Box<SoakReport>>,
}

impl fmt::Display for SoakFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "soak failed: {}", self.problems.join("; "))
    }
}

impl std::error::Error for SoakFailure {}

impl From<verbs_api::Error> for SoakFailure {
    fn from(e: verbs_api::Error) -> Self {
        SoakFailure::setup(format!("setup: {e}"))
    }
}

impl SoakFailure {
    fn setup(msg: impl Into<String>) -> Self {
        SoakFailure {
            problems: vec![msg.into()],
            report: None,
        }
    }
}

/// Keeps at most this many problems per worker (the first ones matter).
const MAX_PROBLEMS: usize = 20;
/// `wr_id` bit of receives.
const RECV_BIT: u64 = 1 << 63;
/// `wr_id` bits: QP index at 40..60, sequence number or receive slot below.
const SEQ_MASK: u64 = (1 << 40) - 1;
/// Sequence number that stands for a slot's initial pattern.
const INIT: u64 = u64::MAX;

/// The resident set size in bytes, from `/proc/self/statm` (0 where it is missing).
pub fn rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(1) as u64
}

// ------------------------------------------------------------------ the plan

/// splitmix64's finalizer: a bijective 64-bit mix.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of what QP `j` of device `side` does at `seq` (also its payload's seed).
fn key(seed: u64, side: usize, j: usize, seq: u64) -> u64 {
    mix64(mix64(seed ^ ((side as u64) << 62) ^ ((j as u64) << 40)) ^ seq)
}

/// Key of the initial pattern of slot `k` of QP `j` of `side` (on the peer's target).
fn init_key(seed: u64, side: usize, j: usize, k: usize) -> u64 {
    key(seed ^ 0x1a17, side, j, k as u64)
}

/// Word `i` of the payload with `key`.
fn word(key: u64, i: usize) -> [u8; 8] {
    mix64(key ^ (i as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)).to_le_bytes()
}

fn fill_payload(buf: &mut [u8], key: u64) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let w = word(key, i);
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// The first byte of `got` that differs from the payload with `key`.
fn payload_mismatch(got: &[u8], key: u64) -> Option<usize> {
    for (i, c) in got.chunks(8).enumerate() {
        let w = word(key, i);
        if c != &w[..c.len()] {
            let b = c.iter().zip(w.iter()).position(|(a, b)| a != b).unwrap_or(0);
            return Some(i * 8 + b);
        }
    }
    None
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    Read,
    FetchAdd,
    CasChain,
    CasShared,
}

#[derive(Clone, Copy, Debug)]
struct Plan {
    kind: Kind,
    len: u32,
    slot: usize,
    counter: usize,
}

fn plan(cfg: &SoakConfig, mix: &Mix, side: usize, j: usize, seq: u64) -> Plan {
    let h = key(cfg.seed, side, j, seq);
    let h2 = mix64(h);
    let mut r = h % mix.total();
    let mut kind = Kind::Send;
    for (w, k) in [
        (mix.send, Kind::Send),
        (mix.write, Kind::Write),
        (mix.read, Kind::Read),
        (mix.fetch_add, Kind::FetchAdd),
        (mix.cmp_swap, Kind::CasChain),
    ] {
        if r < w as u64 {
            kind = k;
            break;
        }
        r -= w as u64;
    }
    if kind == Kind::CasChain && h2 & (1 << 63) != 0 {
        kind = Kind::CasShared;
    }
    Plan {
        kind,
        len: cfg.sizes[(h2 % cfg.sizes.len() as u64) as usize],
        slot: ((h2 >> 20) % cfg.slots as u64) as usize,
        counter: ((h2 >> 40) % cfg.counters as u64) as usize,
    }
}

/// What the plan of one device adds up to (computed before the run, so every buffer the
/// checks need is allocated up front).
#[derive(Default)]
struct Tally {
    /// SENDs per QP (the receives its peer must see).
    sends: Vec<u64>,
    /// FETCH_AND_ADDs per counter.
    adds: Vec<u64>,
    /// CMP_AND_SWPs on the shared word.
    shared: u64,
}

fn tally(cfg: &SoakConfig, mix: &Mix, side: usize, n: usize) -> Tally {
    let mut t = Tally {
        sends: vec![0; n],
        adds: vec![0; cfg.counters],
        shared: 0,
    };
    for j in 0..n {
        for seq in 0..cfg.ops_per_qp {
            let p = plan(cfg, mix, side, j, seq);
            match p.kind {
                Kind::Send => t.sends[j] += 1,
                Kind::FetchAdd => t.adds[p.counter] += 1,
                Kind::CasShared => t.shared += 1,
                _ => {}
            }
        }
    }
    t
}

/// A bitmap, allocated and touched up front.
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: u64) -> Bits {
        let mut v = vec![0u64; n.div_ceil(64) as usize + 1];
        // Touch every page now (a zeroed allocation is mapped lazily).
        for w in v.iter_mut() {
            *w = std::hint::black_box(0);
        }
        Bits(v)
    }
    fn capacity(&self) -> u64 {
        (self.0.len() as u64 - 1) * 64
    }
    /// Sets bit `i`; false if it was set already.
    fn set(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, 1u64 << (i % 64));
        let was = self.0[w] & b != 0;
        self.0[w] |= b;
        !was
    }
    fn all_set_below(&self, n: u64) -> bool {
        (0..n).all(|i| self.0[(i / 64) as usize] & (1 << (i % 64)) != 0)
    }
}

// ------------------------------------------------------------------ layout

/// Where things are in the memory regions of one device.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// QPs per device.
    n: usize,
    depth: usize,
    slots: usize,
    counters: usize,
    /// Bytes per buffer slot (largest size, rounded up to 8).
    max: usize,
}

impl Layout {
    /// Target MR: slot `k` of the peer's QP `j`.
    fn target(&self, j: usize, k: usize) -> usize {
        (j * self.slots + k) * self.max
    }
    fn target_len(&self) -> usize {
        self.n * self.slots * self.max
    }
    /// Local MR: the buffer of the WR with `seq` of QP `j` (unique among its outstanding WRs).
    fn local(&self, j: usize, seq: u64) -> usize {
        (j * self.depth + (seq % self.depth as u64) as usize) * self.max
    }
    fn local_len(&self) -> usize {
        self.n * self.depth * self.max
    }
    /// Receive MR: receive slot `r` of QP `j`.
    fn recv(&self, j: usize, r: usize) -> usize {
        (j * self.depth + r) * self.max
    }
    /// Atomics MR: the chain word of the peer's QP `j`.
    fn chain(&self, j: usize) -> usize {
        j * 8
    }
    /// Atomics MR: shared counter `c`.
    fn counter(&self, c: usize) -> usize {
        (self.n + c) * 8
    }
    /// Atomics MR: the shared CAS word.
    fn shared(&self) -> usize {
        (self.n + self.counters) * 8
    }
    fn atomics_len(&self) -> usize {
        (self.n + self.counters + 1) * 8
    }
}

fn chain_init(seed: u64, side: usize, j: usize) -> u64 {
    key(seed ^ 0xc4a1, side, j, 0)
}
fn chain_next(v: u64) -> u64 {
    mix64(v ^ 0xc4a1_c4a1)
}
fn counter_init(c: usize) -> u64 {
    ((c as u64 + 1) << 40) + 17
}
const SHARED_INIT: u64 = 5000;

// ------------------------------------------------------------------ one device

struct Device<B: Backend> {
    name: String,
    ctx: B::Context,
    _pd: B::Pd,
    cqs: Vec<B::Cq>,
    qps: Vec<B::Qp>,
    target: B::Mr,
    atomics: B::Mr,
    local: B::Mr,
    recv: B::Mr,
}

impl<B: Backend> Device<B> {
    fn open(backend: &B, name: &str, cfg: &SoakConfig, lay: &Layout) -> Result<Self, SoakFailure> {
        let ctx = backend.open(name)?;
        let attr = ctx.query_device()?;
        if lay.n > attr.max_qp as usize {
            return Err(SoakFailure::setup(format!(
                "{name}: {} QPs exceed max_qp {}",
                lay.n, attr.max_qp
            )));
        }
        let pd = ctx.alloc_pd()?;
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let target = pd.reg_mr(lay.target_len(), remote)?;
        let atomics = pd.reg_mr(
            lay.atomics_len(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        )?;
        let local = pd.reg_mr(lay.local_len(), AccessFlags::LOCAL_WRITE)?;
        let recv = pd.reg_mr(lay.local_len(), AccessFlags::LOCAL_WRITE)?;
        // Every page resident before the run (the RSS baseline must not include them).
        local.fill(0x5a);
        recv.fill(0xa5);
        let per_cq = cfg.qps_per_cq.max(1).min(lay.n);
        let cqe = (per_cq * 2 * lay.depth) as u32;
        if cqe > attr.max_cqe {
            return Err(SoakFailure::setup(format!(
                "{name}: a CQ for {per_cq} QPs needs {cqe} entries, max_cqe is {} (lower qps_per_cq)",
                attr.max_cqe
            )));
        }
        let cqs = (0..lay.n.div_ceil(per_cq))
            .map(|_| ctx.create_cq(cqe, None))
            .collect::<Result<Vec<_>, _>>()?;
        let cap = QpCap::new(lay.depth as u32, lay.depth as u32);
        let qps = (0..lay.n)
            .map(|j| {
                let cq = &cqs[j / per_cq];
                pd.create_qp(&QpInitAttr::rc(cq, cq, cap))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Device {
            name: name.to_string(),
            ctx,
            _pd: pd,
            cqs,
            qps,
            target,
            atomics,
            local,
            recv,
        })
    }
}

// ------------------------------------------------------------------ a worker

/// What a sent WR must produce, checked at its completion.
#[derive(Clone, Copy, Debug)]
enum Pending {
    Free,
    Send {
        len: u32,
    },
    Write {
        len: u32,
    },
    /// The payload (key, length) the READ must return.
    Read {
        key: u64,
        len: u32,
    },
    FetchAdd {
        counter: usize,
    },
    CasChain {
        compare: u64,
    },
    CasShared {
        compare: u64,
    },
}

struct QpTrack {
    next_post: u64,
    next_done: u64,
    pending: Vec<Pending>,
    /// Per slot on the peer's target: (seq of the last WRITE posted, or INIT; its length).
    slot_last: Vec<(u64, u32)>,
    /// Whether the last WRITE to the slot has not been read back yet.
    slot_dirty: Vec<bool>,
    /// Per slot: the seq of the last READ posted (outstanding while >= `next_done`).
    slot_read: Vec<Option<u64>>,
    /// The chain word's value once every CAS posted so far has run.
    chain_value: u64,
    /// The value this QP believes the shared word holds.
    shared_guess: u64,
    /// Receives: the last immediate seen, how many.
    last_imm: Option<u64>,
    recvs: u64,
}

struct Worker<'a, B: Backend> {
    side: usize,
    cfg: &'a SoakConfig,
    mix: Mix,
    lay: Layout,
    dev: &'a Device<B>,
    peer_target: RemoteMr,
    peer_atomics: RemoteMr,
    qs: Vec<QpTrack>,
    /// Receives each QP must get (the peer's SENDs).
    recv_expect: Vec<u64>,
    adds_planned: Vec<u64>,
    adds_done: Vec<u64>,
    add_bits: Vec<Bits>,
    shared_bits: Bits,
    counts: OpCounts,
    recv_done: u64,
    bytes: u64,
    progress: &'a AtomicU64,
    abort: &'a AtomicBool,
    problems: Vec<String>,
    scratch: Vec<u8>,
}

impl<'a, B: Backend> Worker<'a, B> {
    fn problem(&mut self, msg: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(format!("{}: {msg}", self.dev.name));
        }
        self.abort.store(true, Ordering::Release);
    }

    fn qp_done(&self, j: usize) -> bool {
        let q = &self.qs[j];
        q.next_done == self.cfg.ops_per_qp && q.recvs == self.recv_expect[j]
    }

    /// Posts what QP `j` may post now (as one `ibv_post_send` list).
    fn post(&mut self, j: usize, sges: &mut Vec<Sge>, ops: &mut Vec<(u64, WrOp, bool)>) {
        let cfg = self.cfg;
        let lay = self.lay;
        let q = &mut self.qs[j];
        let room = lay.depth as u64 - (q.next_post - q.next_done);
        let until = (q.next_post + room).min(cfg.ops_per_qp);
        if until == q.next_post {
            return;
        }
        sges.clear();
        ops.clear();
        let local = &self.dev.local;
        let first = q.next_post;
        for seq in first..until {
            let p = plan(cfg, &self.mix, self.side, j, seq);
            let off = lay.local(j, seq);
            let wr_id = ((j as u64) << 40) | seq;
            let slot_addr = |k: usize| self.peer_target.at(lay.target(j, k) as u64);
            let k = p.slot;
            let mut fence = false;
            let (pending, op, len) = match p.kind {
                Kind::Send => {
                    let len = p.len as usize;
                    fill_payload(&mut self.scratch[..len], key(cfg.seed, self.side, j, seq));
                    local
                        .write(off, &self.scratch[..len])
                        .expect("slot inside the MR");
                    (
                        Pending::Send { len: p.len },
                        WrOp::SendWithImm { imm_data: seq as u32 },
                        p.len,
                    )
                }
                // A WRITE goes to a slot whose last WRITE was read back; otherwise this WR
                // reads it back instead.
                Kind::Write if !q.slot_dirty[k] => {
                    let len = p.len as usize;
                    fill_payload(&mut self.scratch[..len], key(cfg.seed, self.side, j, seq));
                    local
                        .write(off, &self.scratch[..len])
                        .expect("slot inside the MR");
                    q.slot_last[k] = (seq, p.len);
                    q.slot_dirty[k] = true;
                    // The responder may execute a WRITE before it has read out the data of
                    // an earlier READ (IBA "RDMA Read relaxed ordering": only a fence keeps
                    // a READ's data from reflecting later WRITEs to the same place).
                    if q.slot_read[k].is_some_and(|r| r >= q.next_done) {
                        fence = true;
                    }
                    (
                        Pending::Write { len: p.len },
                        WrOp::RdmaWrite { remote: slot_addr(k) },
                        p.len,
                    )
                }
                Kind::Write | Kind::Read => {
                    let (last, last_len) = q.slot_last[k];
                    let (key, len) = if last == INIT {
                        (init_key(cfg.seed, self.side, j, k), p.len)
                    } else {
                        (key(cfg.seed, self.side, j, last), last_len)
                    };
                    q.slot_dirty[k] = false;
                    q.slot_read[k] = Some(seq);
                    (
                        Pending::Read { key, len },
                        WrOp::RdmaRead { remote: slot_addr(k) },
                        len,
                    )
                }
                Kind::FetchAdd => (
                    Pending::FetchAdd { counter: p.counter },
                    WrOp::AtomicFetchAndAdd {
                        remote: self.peer_atomics.at(lay.counter(p.counter) as u64),
                        add: 1,
                    },
                    8,
                ),
                Kind::CasChain => {
                    let compare = q.chain_value;
                    q.chain_value = chain_next(compare);
                    (
                        Pending::CasChain { compare },
                        WrOp::AtomicCmpAndSwp {
                            remote: self.peer_atomics.at(lay.chain(j) as u64),
                            compare,
                            swap: q.chain_value,
                        },
                        8,
                    )
                }
                Kind::CasShared => {
                    let compare = q.shared_guess;
                    (
                        Pending::CasShared { compare },
                        WrOp::AtomicCmpAndSwp {
                            remote: self.peer_atomics.at(lay.shared() as u64),
                            compare,
                            swap: compare + 1,
                        },
                        8,
                    )
                }
            };
            if op.is_atomic() {
                // A sentinel where the old value must land.
                local
                    .write_u64(off, 0xdead_beef_dead_beef)
                    .expect("slot inside the MR");
            }
            q.pending[(seq % lay.depth as u64) as usize] = pending;
            sges.push(local.sge(off, len as usize).expect("slot inside the MR"));
            ops.push((wr_id, op, fence));
            if fence {
                self.counts.write_fenced += 1;
            }
        }
        q.next_post = until;
        let wrs: Vec<SendWr<'_>> = ops
            .iter()
            .zip(sges.iter())
            .map(|(&(wr_id, op, fence), sge)| {
                let wr = SendWr::new(wr_id, op, std::slice::from_ref(sge)).signaled();
                if fence {
                    wr.fence()
                } else {
                    wr
                }
            })
            .collect();
        if let Err(e) = self.dev.qps[j].post_send(&wrs) {
            self.problem(format!("QP {j}: post_send of seq {first}..{until}: {e}"));
        }
    }

    fn on_wc(&mut self, wc: &WorkCompletion) {
        let j = ((wc.wr_id & !RECV_BIT) >> 40) as usize;
        if j >= self.lay.n {
            return self.problem(format!("completion with an unknown wr_id {:#x}", wc.wr_id));
        }
        let qpn = self.dev.qps[j].qp_num();
        if wc.qp_num != qpn {
            return self.problem(format!(
                "wr_id {:#x} (QP {j}, qp_num {qpn:#x}) completed on qp_num {:#x}",
                wc.wr_id, wc.qp_num
            ));
        }
        if wc.status != WcStatus::Success {
            return self.problem(format!(
                "QP {j}: wr_id {:#x} completed with {:?} ({})",
                wc.wr_id, wc.status, wc.status
            ));
        }
        if wc.wr_id & RECV_BIT != 0 {
            self.on_recv(j, wc);
        } else {
            self.on_send(j, wc);
        }
    }

    fn on_send(&mut self, j: usize, wc: &WorkCompletion) {
        let seq = wc.wr_id & SEQ_MASK;
        let lay = self.lay;
        let q = &mut self.qs[j];
        if seq != q.next_done || seq >= q.next_post {
            let what = if seq < q.next_done {
                "duplicate"
            } else {
                "out of order or never posted"
            };
            let expect = q.next_done;
            return self.problem(format!(
                "QP {j}: {what} completion of seq {seq} (expected seq {expect})"
            ));
        }
        q.next_done += 1;
        let i = (seq % lay.depth as u64) as usize;
        let pending = std::mem::replace(&mut q.pending[i], Pending::Free);
        let off = lay.local(j, seq);
        let want_opcode = match pending {
            Pending::Send { .. } => WcOpcode::Send,
            Pending::Write { .. } => WcOpcode::RdmaWrite,
            Pending::Read { .. } => WcOpcode::RdmaRead,
            Pending::FetchAdd { .. } => WcOpcode::FetchAdd,
            Pending::CasChain { .. } | Pending::CasShared { .. } => WcOpcode::CompSwap,
            Pending::Free => return self.problem(format!("QP {j}: seq {seq} has no pending record")),
        };
        if wc.opcode != want_opcode {
            return self.problem(format!(
                "QP {j} seq {seq}: opcode {:?}, expected {want_opcode:?}",
                wc.opcode
            ));
        }
        self.progress.fetch_add(1, Ordering::Relaxed);
        let old = || self.dev.local.read_u64(off).expect("slot inside the MR");
        match pending {
            Pending::Send { len } => {
                self.counts.send += 1;
                self.bytes += len as u64;
            }
            Pending::Write { len } => {
                self.counts.write += 1;
                self.bytes += len as u64;
            }
            Pending::Read { key, len } => {
                self.counts.read += 1;
                self.bytes += len as u64;
                if wc.byte_len != len {
                    return self.problem(format!(
                        "QP {j} seq {seq}: READ byte_len {}, expected {len}",
                        wc.byte_len
                    ));
                }
                let buf = &mut self.scratch[..len as usize];
                self.dev.local.read(off, buf).expect("slot inside the MR");
                if let Some(at) = payload_mismatch(buf, key) {
                    self.problem(format!(
                        "QP {j} seq {seq}: READ of {len} B returned wrong data from byte {at}"
                    ));
                }
            }
            Pending::FetchAdd { counter } => {
                self.counts.fetch_add += 1;
                let old = old();
                let base = counter_init(counter);
                let i = old.wrapping_sub(base);
                if i >= self.adds_planned[counter] || !self.add_bits[counter].set(i) {
                    return self.problem(format!(
                        "QP {j} seq {seq}: FETCH_AND_ADD on counter {counter} returned {old:#x}: \
                         {} (counter starts at {base:#x}, {} adds planned)",
                        if i >= self.adds_planned[counter] {
                            "out of range"
                        } else {
                            "returned twice"
                        },
                        self.adds_planned[counter]
                    ));
                }
                self.adds_done[counter] += 1;
            }
            Pending::CasChain { compare } => {
                self.counts.cmp_swap_chain += 1;
                let old = old();
                if old != compare {
                    self.problem(format!(
                        "QP {j} seq {seq}: chain CMP_AND_SWP missed: returned {old:#x}, the chain was at {compare:#x}"
                    ));
                }
            }
            Pending::CasShared { compare } => {
                self.counts.cmp_swap_shared += 1;
                let old = old();
                let cap = self.shared_bits.capacity();
                if old < SHARED_INIT || old - SHARED_INIT > cap {
                    return self.problem(format!(
                        "QP {j} seq {seq}: shared CMP_AND_SWP returned {old}, outside {SHARED_INIT}..={}",
                        SHARED_INIT + cap
                    ));
                }
                if old == compare {
                    self.counts.cmp_swap_shared_hits += 1;
                    if !self.shared_bits.set(compare - SHARED_INIT) {
                        return self.problem(format!(
                            "QP {j} seq {seq}: shared CMP_AND_SWP swapped {compare} -> {} a second time",
                            compare + 1
                        ));
                    }
                    q.shared_guess = q.shared_guess.max(compare + 1);
                } else {
                    q.shared_guess = q.shared_guess.max(old);
                }
            }
            Pending::Free => unreachable!("checked above"),
        }
    }

    fn on_recv(&mut self, j: usize, wc: &WorkCompletion) {
        let r = (wc.wr_id & SEQ_MASK) as usize;
        if r >= self.lay.depth {
            return self.problem(format!("QP {j}: receive with unknown wr_id {:#x}", wc.wr_id));
        }
        if wc.opcode != WcOpcode::Recv {
            return self.problem(format!("QP {j}: receive completed as {:?}", wc.opcode));
        }
        let Some(imm) = wc.imm() else {
            return self.problem(format!("QP {j}: receive without immediate data"));
        };
        let seq = imm as u64;
        let q = &mut self.qs[j];
        if q.last_imm.is_some_and(|l| seq <= l) {
            let last = q.last_imm;
            return self.problem(format!(
                "QP {j}: SEND {seq} received after SEND {last:?} (duplicate or reordered)"
            ));
        }
        q.last_imm = Some(seq);
        q.recvs += 1;
        let peer = 1 - self.side;
        let p = plan(self.cfg, &self.mix, peer, j, seq);
        if p.kind != Kind::Send || seq >= self.cfg.ops_per_qp {
            return self.problem(format!(
                "QP {j}: received immediate {seq}, which is not a SEND of the peer's plan"
            ));
        }
        if wc.byte_len != p.len {
            return self.problem(format!(
                "QP {j}: SEND {seq} received with byte_len {}, sent {}",
                wc.byte_len, p.len
            ));
        }
        let off = self.lay.recv(j, r);
        let buf = &mut self.scratch[..p.len as usize];
        self.dev.recv.read(off, buf).expect("slot inside the MR");
        if let Some(at) = payload_mismatch(buf, key(self.cfg.seed, peer, j, seq)) {
            return self.problem(format!(
                "QP {j}: SEND {seq} of {} B received with wrong data from byte {at}",
                p.len
            ));
        }
        self.recv_done += 1;
        // Scribble over the buffer so that a stale copy cannot pass the next check.
        self.scratch[..p.len as usize].fill(0xee);
        self.dev
            .recv
            .write(off, &self.scratch[..p.len as usize])
            .expect("slot inside the MR");
        let sge = [self.dev.recv.sge(off, self.lay.max).expect("slot inside the MR")];
        if let Err(e) = self.dev.qps[j].post_recv(&[RecvWr::new(wc.wr_id, &sge)]) {
            self.problem(format!("QP {j}: post_recv: {e}"));
        }
    }

    fn run(&mut self) {
        let mut wcs = vec![WorkCompletion::default(); 64];
        let mut sges = Vec::with_capacity(self.lay.depth);
        let mut ops = Vec::with_capacity(self.lay.depth);
        let mut last_progress = Instant::now();
        let mut idle = 0u32;
        let mut live: Vec<usize> = (0..self.lay.n).collect();
        while !self.abort.load(Ordering::Acquire) {
            for &j in &live {
                self.post(j, &mut sges, &mut ops);
            }
            let mut got_any = false;
            for c in 0..self.dev.cqs.len() {
                loop {
                    let n = match self.dev.cqs[c].poll(&mut wcs) {
                        Ok(n) => n,
                        Err(e) => {
                            self.problem(format!("CQ {c}: poll: {e}"));
                            return;
                        }
                    };
                    for wc in &wcs[..n] {
                        self.on_wc(wc);
                    }
                    got_any |= n > 0;
                    if n < wcs.len() {
                        break;
                    }
                }
            }
            live.retain(|&j| !self.qp_done(j));
            if live.is_empty() {
                return;
            }
            if got_any {
                last_progress = Instant::now();
                idle = 0;
                continue;
            }
            idle += 1;
            if idle % 64 == 0 {
                if last_progress.elapsed() > self.cfg.stall_timeout {
                    let stuck: Vec<String> = live
                        .iter()
                        .take(5)
                        .map(|&j| {
                            let q = &self.qs[j];
                            format!(
                                "QP {j} (qp_num {:#x}): {} of {} send WRs completed ({} posted), {} of {} receives",
                                self.dev.qps[j].qp_num(),
                                q.next_done,
                                self.cfg.ops_per_qp,
                                q.next_post,
                                q.recvs,
                                self.recv_expect[j]
                            )
                        })
                        .collect();
                    let msg = format!(
                        "no completion for {:?}; {} QPs unfinished, e.g. {}",
                        self.cfg.stall_timeout,
                        live.len(),
                        stuck.join("; ")
                    );
                    self.problem(msg);
                    return;
                }
                std::thread::yield_now();
            }
        }
    }
}

// ------------------------------------------------------------------ the run

/// Runs a soak on two contexts of `backend`: `devices.0` and `devices.1` (the same name
/// twice opens one device twice).
pub fn run<B: Backend>(
    backend: &B,
    devices: (&str, &str),
    cfg: &SoakConfig,
) -> Result<SoakReport, SoakFailure> {
    if cfg.qps < 2 || cfg.qps % 2 != 0 {
        return Err(SoakFailure::setup(format!(
            "qps must be even and at least 2, not {}",
            cfg.qps
        )));
    }
    if cfg.depth == 0 || cfg.ops_per_qp == 0 || cfg.slots == 0 || cfg.counters == 0 {
        return Err(SoakFailure::setup(
            "depth, ops, slots and counters must be positive",
        ));
    }
    if cfg.ops_per_qp > u32::MAX as u64 {
        return Err(SoakFailure::setup("ops per QP must fit the 32-bit immediate"));
    }
    if cfg.sizes.is_empty() || cfg.sizes.contains(&0) {
        return Err(SoakFailure::setup(
            "sizes must be a non-empty list of positive sizes",
        ));
    }
    let max = (*cfg.sizes.iter().max().expect("non-empty") as usize)
        .max(8)
        .next_multiple_of(8);
    let n = cfg.qps / 2;
    let lay = Layout {
        n,
        depth: cfg.depth,
        slots: cfg.slots,
        counters: cfg.counters,
        max,
    };
    let setup_start = Instant::now();
    let devs = [
        Device::<B>::open(backend, devices.0, cfg, &lay)?,
        Device::<B>::open(backend, devices.1, cfg, &lay)?,
    ];
    let atomics = devs
        .iter()
        .map(|d| d.ctx.query_device().map(|a| a.atomic_cap != AtomicCap::None))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .all(|a| a);
    let mut mix = cfg.mix;
    if !atomics {
        mix.fetch_add = 0;
        mix.cmp_swap = 0;
        if mix.total() == 0 {
            return Err(SoakFailure::setup(
                "the device has no atomics and the mix has nothing else",
            ));
        }
    }
    // Initial contents: the peer's slot patterns, atomic words.
    for (side, d) in devs.iter().enumerate() {
        let peer = 1 - side;
        let mut buf = vec![0u8; max];
        for j in 0..n {
            for k in 0..cfg.slots {
                fill_payload(&mut buf, init_key(cfg.seed, peer, j, k));
                d.target.write(lay.target(j, k), &buf)?;
            }
            d.atomics.write_u64(lay.chain(j), chain_init(cfg.seed, peer, j))?;
        }
        for c in 0..cfg.counters {
            d.atomics.write_u64(lay.counter(c), counter_init(c))?;
        }
        d.atomics.write_u64(lay.shared(), SHARED_INIT)?;
    }
    // Connect QP j of A with QP j of B.
    let max_rd = |d: &Device<B>| -> Result<(u8, u8), SoakFailure> {
        let a = d.ctx.query_device()?;
        Ok((
            a.max_qp_init_rd_atom.clamp(1, 16) as u8,
            a.max_qp_rd_atom.clamp(1, 16) as u8,
        ))
    };
    let (init_a, dest_a) = max_rd(&devs[0])?;
    let (init_b, dest_b) = max_rd(&devs[1])?;
    let params = |init: u8, dest: u8| RcParams {
        gid_index: cfg.gid_index,
        min_rnr_timer: 1,
        max_rd_atomic: init.min(dest_a).min(dest_b),
        max_dest_rd_atomic: dest,
        ..RcParams::default()
    };
    let pa = params(init_a, dest_a);
    let pb = params(init_b, dest_b);
    for j in 0..n {
        let psn_a = (mix64(cfg.seed ^ 0xa000 ^ j as u64) & 0xff_ffff) as u32;
        let psn_b = (mix64(cfg.seed ^ 0xb000 ^ j as u64) & 0xff_ffff) as u32;
        let ea = local_endpoint(&devs[0].ctx, &devs[0].qps[j], &pa, psn_a)?;
        let eb = local_endpoint(&devs[1].ctx, &devs[1].qps[j], &pb, psn_b)?;
        connect_rc(&devs[0].qps[j], &pa, ea.psn, &eb)?;
        connect_rc(&devs[1].qps[j], &pb, eb.psn, &ea)?;
    }
    // Every QP keeps `depth` receives posted.
    for d in &devs {
        for (j, qp) in d.qps.iter().enumerate() {
            let sges: Vec<[Sge; 1]> = (0..lay.depth)
                .map(|r| d.recv.sge(lay.recv(j, r), max).map(|s| [s]))
                .collect::<Result<_, _>>()?;
            let wrs: Vec<RecvWr<'_>> = sges
                .iter()
                .enumerate()
                .map(|(r, s)| RecvWr::new(RECV_BIT | ((j as u64) << 40) | r as u64, s))
                .collect();
            qp.post_recv(&wrs)
                .map_err(|e| SoakFailure::setup(format!("{}: QP {j}: post_recv: {e}", d.name)))?;
        }
    }
    let tallies = [tally(cfg, &mix, 0, n), tally(cfg, &mix, 1, n)];
    let progress = AtomicU64::new(0);
    let abort = AtomicBool::new(false);
    let mut workers: Vec<Worker<'_, B>> = (0..2)
        .map(|side| {
            let peer = 1 - side;
            let t = &tallies[side];
            Worker {
                side,
                cfg,
                mix,
                lay,
                dev: &devs[side],
                peer_target: devs[peer].target.remote(),
                peer_atomics: devs[peer].atomics.remote(),
                qs: (0..n)
                    .map(|j| QpTrack {
                        next_post: 0,
                        next_done: 0,
                        pending: vec![Pending::Free; lay.depth],
                        slot_last: vec![(INIT, 0); cfg.slots],
                        slot_dirty: vec![false; cfg.slots],
                        slot_read: vec![None; cfg.slots],
                        chain_value: chain_init(cfg.seed, side, j),
                        shared_guess: SHARED_INIT,
                        last_imm: None,
                        recvs: 0,
                    })
                    .collect(),
                recv_expect: tallies[peer].sends.clone(),
                adds_planned: t.adds.clone(),
                adds_done: vec![0; cfg.counters],
                add_bits: t.adds.iter().map(|&a| Bits::new(a)).collect(),
                shared_bits: Bits::new(t.shared),
                counts: OpCounts::default(),
                recv_done: 0,
                bytes: 0,
                progress: &progress,
                abort: &abort,
                problems: Vec::new(),
                scratch: vec![0u8; max],
            }
        })
        .collect();
    let setup_secs = setup_start.elapsed().as_secs_f64();

    let total_ops = cfg.qps as u64 * cfg.ops_per_qp;
    let warm_target = ((total_ops as f64 * cfg.warmup.clamp(0.0, 0.9)) as u64).max(1);
    let start = Instant::now();
    let mut rss_before = 0;
    let mut rss_peak = rss_bytes();
    let mut warm: Option<(Instant, u64)> = None;
    std::thread::scope(|s| {
        let handles: Vec<_> = workers.iter_mut().map(|w| s.spawn(move || w.run())).collect();
        let mut last_sample = Instant::now();
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(2));
            let done = progress.load(Ordering::Relaxed);
            if warm.is_none() && done >= warm_target {
                rss_before = rss_bytes();
                rss_peak = rss_peak.max(rss_before);
                warm = Some((Instant::now(), done));
            }
            if last_sample.elapsed() >= Duration::from_millis(50) {
                rss_peak = rss_peak.max(rss_bytes());
                last_sample = Instant::now();
            }
        }
        for h in handles {
            if h.join().is_err() {
                abort.store(true, Ordering::Release);
            }
        }
    });
    let elapsed = start.elapsed();
    let end = Instant::now();
    let rss_after = rss_bytes();
    rss_peak = rss_peak.max(rss_after);
    if warm.is_none() {
        // Finished before the first sample (tiny runs): the baseline is the end.
        rss_before = rss_after;
    }

    let mut problems: Vec<String> = workers.iter().flat_map(|w| w.problems.iter().cloned()).collect();
    let mut by_op = OpCounts::default();
    let mut ops = 0;
    let mut recvs = 0;
    let mut bytes = 0;
    for w in &workers {
        by_op.add(&w.counts);
        ops += w.qs.iter().map(|q| q.next_done).sum::<u64>();
        recvs += w.recv_done;
        bytes += w.bytes;
    }
    if problems.is_empty() && !abort.load(Ordering::Acquire) {
        final_checks(cfg, &lay, &devs, &workers, &mut problems);
    } else if problems.is_empty() {
        problems.push("a worker thread panicked".into());
    }
    let secs = elapsed.as_secs_f64().max(1e-9);
    let report = SoakReport {
        backend: backend.name().to_string(),
        devices: [devs[0].name.clone(), devs[1].name.clone()],
        qps: cfg.qps,
        ops_per_qp: cfg.ops_per_qp,
        depth: cfg.depth,
        sizes: cfg.sizes.clone(),
        seed: cfg.seed,
        atomics,
        ops,
        recv_completions: recvs,
        by_op,
        bytes,
        setup_secs,
        elapsed_secs: secs,
        ops_per_sec: ops as f64 / secs,
        steady_ops_per_sec: match warm {
            Some((t, done)) if end > t => (ops.saturating_sub(done)) as f64 / (end - t).as_secs_f64(),
            _ => ops as f64 / secs,
        },
        mib_per_sec: bytes as f64 / (1 << 20) as f64 / secs,
        rss_before,
        rss_after,
        rss_peak,
        max_rss_growth: cfg.max_rss_growth,
    };
    if problems.is_empty() && report.rss_growth() > cfg.max_rss_growth as i64 {
        problems.push(format!(
            "RSS grew by {} KiB after the warm-up ({} KiB -> {} KiB), more than the {} KiB allowed",
            report.rss_growth() / 1024,
            rss_before / 1024,
            rss_after / 1024,
            cfg.max_rss_growth / 1024
        ));
    }
    drop(workers);
    drop(devs);
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(SoakFailure {
            problems,
            report: Some(Box::new(report)),
        })
    }
}

/// After the traffic: totals, memory contents and atomic words, and no stray completion.
fn final_checks<B: Backend>(
    cfg: &SoakConfig,
    lay: &Layout,
    devs: &[Device<B>; 2],
    workers: &[Worker<'_, B>],
    problems: &mut Vec<String>,
) {
    let mut push = |p: String| {
        if problems.len() < MAX_PROBLEMS {
            problems.push(p);
        }
    };
    let mut buf = vec![0u8; lay.max];
    for (side, w) in workers.iter().enumerate() {
        let peer = &devs[1 - side];
        let me = &devs[side].name;
        for (j, q) in w.qs.iter().enumerate() {
            if q.next_done != cfg.ops_per_qp || q.recvs != w.recv_expect[j] {
                push(format!(
                    "{me}: QP {j}: {} of {} send WRs and {} of {} receives completed",
                    q.next_done, cfg.ops_per_qp, q.recvs, w.recv_expect[j]
                ));
            }
            // The last WRITE to every slot, in the target memory.
            for (k, &(seq, len)) in q.slot_last.iter().enumerate() {
                let (key, len) = if seq == INIT {
                    (init_key(cfg.seed, side, j, k), lay.max as u32)
                } else {
                    (key(cfg.seed, side, j, seq), len)
                };
                let b = &mut buf[..len as usize];
                if let Err(e) = peer.target.read(lay.target(j, k), b) {
                    push(format!("{}: reading slot {k} of QP {j}: {e}", peer.name));
                } else if let Some(at) = payload_mismatch(b, key) {
                    push(format!(
                        "{}: slot {k} of {me}'s QP {j} differs from its last WRITE (seq {seq}) at byte {at}",
                        peer.name
                    ));
                }
            }
            let chain = peer.atomics.read_u64(lay.chain(j)).unwrap_or(0);
            if chain != q.chain_value {
                push(format!(
                    "{}: chain word of {me}'s QP {j} is {chain:#x}, expected {:#x}",
                    peer.name, q.chain_value
                ));
            }
        }
        for c in 0..lay.counters {
            let v = peer.atomics.read_u64(lay.counter(c)).unwrap_or(0);
            let want = counter_init(c) + w.adds_done[c];
            if w.adds_done[c] != w.adds_planned[c] || v != want {
                push(format!(
                    "{}: counter {c} is {v:#x}, expected {want:#x} ({} of {} adds from {me} completed)",
                    peer.name, w.adds_done[c], w.adds_planned[c]
                ));
            }
        }
        let shared = peer.atomics.read_u64(lay.shared()).unwrap_or(0);
        let hits = w.counts.cmp_swap_shared_hits;
        if shared != SHARED_INIT + hits || !w.shared_bits.all_set_below(hits) {
            push(format!(
                "{}: shared CAS word is {shared}, expected {} after {hits} hits from {me} (each value once)",
                peer.name,
                SHARED_INIT + hits
            ));
        }
    }
    // Nothing more may complete.
    std::thread::sleep(Duration::from_millis(20));
    let mut wcs = [WorkCompletion::default(); 16];
    for d in devs {
        for (c, cq) in d.cqs.iter().enumerate() {
            match cq.poll(&mut wcs) {
                Ok(0) => {}
                Ok(k) => push(format!(
                    "{}: CQ {c}: {k} completions after the end, e.g. wr_id {:#x} {:?}",
                    d.name, wcs[0].wr_id, wcs[0].status
                )),
                Err(e) => push(format!("{}: CQ {c}: poll: {e}", d.name)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_prefixes_and_mismatches_are_found() {
        let mut a = vec![0u8; 100];
        let mut b = vec![0u8; 37];
        fill_payload(&mut a, 42);
        fill_payload(&mut b, 42);
        assert_eq!(&a[..37], &b[..]);
        assert_eq!(payload_mismatch(&a, 42), None);
        a[50] ^= 1;
        assert_eq!(payload_mismatch(&a, 42), Some(50));
        assert!(payload_mismatch(&b, 43).is_some());
    }

    #[test]
    fn plan_follows_the_mix() {
        let cfg = SoakConfig::default();
        let only_reads = Mix {
            send: 0,
            write: 0,
            read: 1,
            fetch_add: 0,
            cmp_swap: 0,
        };
        assert!((0..1000).all(|s| plan(&cfg, &only_reads, 0, 3, s).kind == Kind::Read));
        let t = tally(&cfg, &cfg.mix, 0, 4);
        let sends: u64 = t.sends.iter().sum();
        let total = 4 * cfg.ops_per_qp;
        // 3 of 10 are SENDs; allow a wide margin.
        assert!(sends > total / 5 && sends < total * 2 / 5, "{sends} of {total}");
    }

    #[test]
    fn bits_detect_twice() {
        let mut b = Bits::new(100);
        assert!(b.set(5));
        assert!(!b.set(5));
        assert!(!b.all_set_below(6));
        for i in 0..5 {
            b.set(i);
        }
        assert!(b.all_set_below(6));
    }

    #[test]
    fn mix_parses() {
        let m = Mix::parse("send=1,faa=0,cas=5").unwrap();
        assert_eq!((m.send, m.fetch_add, m.cmp_swap, m.write), (1, 0, 5, 3));
        assert!(Mix::parse("bogus=1").is_err());
        assert!(Mix::parse("send=0,write=0,read=0,faa=0,cas=0").is_err());
    }
}
