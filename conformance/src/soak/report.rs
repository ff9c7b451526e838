//! What a soak reports: its figures ([`SoakReport`], by operation [`OpCounts`]), or
//! what went wrong ([`SoakFailure`]).

use std::fmt;

use serde::Serialize;

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
    /// Adds another worker's counts.
    pub(super) fn add(&mut self, o: &OpCounts) {
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
    /// A failure before any traffic ran.
    pub(super) fn setup(msg: impl Into<String>) -> Self {
        SoakFailure {
            problems: vec![msg.into()],
            report: None,
        }
    }
}
