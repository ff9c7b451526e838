//! A worker: one device's side of the traffic ([`Worker`]), its per-QP bookkeeping
//! ([`QpTrack`]) and what each outstanding WR must produce ([`Pending`]). Posting is in
//! [`post`](super::post), the checks of completions in [`check`](super::check).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use verbs_api::{Backend, CompletionQueue, QueuePair, RemoteMr, WorkCompletion};

use super::bits::Bits;
use super::config::{Mix, SoakConfig};
use super::device::Device;
use super::layout::Layout;
use super::report::OpCounts;

/// Keeps at most this many problems per worker (the first ones matter).
pub(super) const MAX_PROBLEMS: usize = 20;
/// `wr_id` bit of receives.
pub(super) const RECV_BIT: u64 = 1 << 63;
/// `wr_id` bits: QP index at 40..60, sequence number or receive slot below.
pub(super) const SEQ_MASK: u64 = (1 << 40) - 1;
/// Sequence number that stands for a slot's initial pattern.
pub(super) const INIT: u64 = u64::MAX;

/// What a sent WR must produce, checked at its completion.
#[derive(Clone, Copy, Debug)]
pub(super) enum Pending {
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

/// One QP's progress and what the checks of its completions need.
pub(super) struct QpTrack {
    pub(super) next_post: u64,
    pub(super) next_done: u64,
    pub(super) pending: Vec<Pending>,
    /// Per slot on the peer's target: (seq of the last WRITE posted, or INIT; its length).
    pub(super) slot_last: Vec<(u64, u32)>,
    /// Whether the last WRITE to the slot has not been read back yet.
    pub(super) slot_dirty: Vec<bool>,
    /// Per slot: the seq of the last READ posted (outstanding while >= `next_done`).
    pub(super) slot_read: Vec<Option<u64>>,
    /// The chain word's value once every CAS posted so far has run.
    pub(super) chain_value: u64,
    /// The value this QP believes the shared word holds.
    pub(super) shared_guess: u64,
    /// Receives: the last immediate seen, how many.
    pub(super) last_imm: Option<u64>,
    pub(super) recvs: u64,
}

/// One device's side of the traffic: posts every QP's WRs and checks every completion
/// of its CQs (one thread).
pub(super) struct Worker<'a, B: Backend> {
    pub(super) side: usize,
    pub(super) cfg: &'a SoakConfig,
    pub(super) mix: Mix,
    pub(super) lay: Layout,
    pub(super) dev: &'a Device<B>,
    pub(super) peer_target: RemoteMr,
    pub(super) peer_atomics: RemoteMr,
    pub(super) qs: Vec<QpTrack>,
    /// Receives each QP must get (the peer's SENDs).
    pub(super) recv_expect: Vec<u64>,
    pub(super) adds_planned: Vec<u64>,
    pub(super) adds_done: Vec<u64>,
    pub(super) add_bits: Vec<Bits>,
    pub(super) shared_bits: Bits,
    pub(super) counts: OpCounts,
    pub(super) recv_done: u64,
    pub(super) bytes: u64,
    pub(super) progress: &'a AtomicU64,
    pub(super) abort: &'a AtomicBool,
    pub(super) problems: Vec<String>,
    pub(super) scratch: Vec<u8>,
}

impl<'a, B: Backend> Worker<'a, B> {
    /// Records a problem (the first [`MAX_PROBLEMS`]) and stops both workers.
    pub(super) fn problem(&mut self, msg: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(format!("{}: {msg}", self.dev.name));
        }
        self.abort.store(true, Ordering::Release);
    }

    /// Whether QP `j` has completed every send WR and received every SEND.
    fn qp_done(&self, j: usize) -> bool {
        let q = &self.qs[j];
        q.next_done == self.cfg.ops_per_qp && q.recvs == self.recv_expect[j]
    }

    /// Posts and polls until every QP is done, a problem stops it, or nothing completes
    /// for the stall timeout.
    pub(super) fn run(&mut self) {
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
