//! A deterministic fabric: an RC connection's two ends driven in one thread on a virtual
//! clock, over a network that loses, duplicates, delays and reorders frames as a seed
//! decides.
//!
//! Over TCP the sim never loses or reorders a frame, so the protocol's recovery paths
//! (PSN sequence error NAKs, duplicate requests answered from the replay state, READs
//! executed again, resends after the local ACK timeout, IBA 9.7.5 and 9.9) run only
//! when a test forges the frames. Here they run whenever the seed says a frame is lost
//! or late, the way a real fabric exercises an HCA.
//!
//! Every decision is a hash of the seed and what is decided: the direction, the frame's
//! opcode and PSN, and how many times that frame was sent before ([`faults`]), not the
//! order of draws. Removing one fault (or changing the workload after some point) leaves
//! the other decisions as they were, and the same seed with the same workload gives the
//! same run: [`Fabric::trace`] hashes every delivery and every completion, so two runs
//! compare in one number. [`workload`] drives a seeded mix of SENDs, WRITEs, READs and
//! atomics through it and checks the result against a sequential model of RC.
//!
//! A bug planted on purpose ([`crate::plant`], the `planted-bugs` feature) must make some
//! seed's run differ from the model: the tests check that each is found within a stated
//! number of seeds. `cargo run --release -p backend-sim-proto --example fabric` runs a
//! range of seeds and prints the frames per second; a failure prints its seed and the
//! command that replays it ([`LOG_SETTING`] shows its frames).
//!
//! Each end is a QP as an application has it: a [`Qp`] brought to RTS
//! through `ibv_modify_qp`'s state machine, whose error rules a fatal completion follows
//! (ERR, both queues flushed, later posts flushed at once), so that a run whose retries
//! run out ([`workload::Spec::retries_exhausted`]) is checked against the model too. The
//! requester of end A talks to the responder of end B through the same
//! [`engine`](crate::engine) the TCP transport uses; frames travel as whole units
//! (header and payload), each fed to the receiving reader in one piece, but the network
//! may cut a frame of several packets into one frame per packet ([`split`]), so that a
//! packet inside a message is lost, duplicated or overtaken on its own.

mod end;
pub mod faults;
mod split;
pub mod workload;

#[cfg(test)]
mod lost_packets;

#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

use crate::wire::Frame;

pub use end::End;
pub use faults::{Decision, FaultMix};

/// The protection domain of both ends' regions.
pub const PD: u32 = 1;

/// Which way a frame travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// From A's requester to B's responder.
    AtoB,
    /// From B's responder back to A's requester.
    BtoA,
}

/// The connection's attributes, as `ibv_modify_qp` would set them on both ends.
#[derive(Clone, Copy, Debug)]
pub struct Attrs {
    /// `timeout` (the local ACK timeout exponent).
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry` (7: forever).
    pub rnr_retry: u8,
    /// `min_rnr_timer`.
    pub min_rnr_timer: u8,
    /// `path_mtu` in bytes.
    pub path_mtu: u32,
    /// The first PSN of both directions (`sq_psn` and `rq_psn`).
    pub psn: u32,
}

impl Default for Attrs {
    fn default() -> Self {
        Attrs {
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            path_mtu: 1024,
            psn: 0,
        }
    }
}

/// Why a run went wrong, beyond what the workload's model checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Broken {
    /// An end broke the protocol on frames a correct peer sent.
    Protocol(String),
    /// The run did not settle within its bound of events.
    Stuck(String),
}

/// A frame (header and payload) on its way.
struct InFlight {
    at: Duration,
    seq: u64,
    dir: Dir,
    bytes: Vec<u8>,
}

// Ordered by delivery time, then by the order scheduled (the heap pops the least).
impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// The connection, the network between its ends, and the virtual clock.
pub struct Fabric {
    /// End A (QP 1).
    pub a: End,
    /// End B (QP 2).
    pub b: End,
    mix: FaultMix,
    decide: faults::Decider,
    /// Times each (direction, opcode, PSN) was sent: the attempt a decision is keyed by.
    attempts: FxHashMap<(Dir, u8, u32), u32>,
    base: Instant,
    now: Duration,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    trace: u64,
    /// Frames delivered, lost and duplicated so far.
    pub stats: Stats,
    broken: Option<Broken>,
    /// Print every frame sent and delivered ([`LOG_SETTING`]).
    log: bool,
    /// The connection's path MTU, at which frames are cut into packets.
    path_mtu: u32,
    /// Packets (parts) to lose the first time they are sent, whatever the seed says.
    lose_once: Vec<(Dir, u32)>,
    /// Every frame sent and whether it was lost, when recording ([`Fabric::record`]).
    recorded: Option<Vec<(Dir, Frame, bool)>>,
}

/// The setting that has a fabric print every frame it carries to stderr, with its fate
/// (lost, delayed) and the virtual time: set it when replaying a failing seed.
pub const LOG_SETTING: &str = "RDMA_FABRIC_LOG";

/// What the network did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames handed to the receiving end.
    pub delivered: u64,
    /// Frames lost.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Local ACK timeouts that fired.
    pub timeouts: u64,
    /// Times the connection broke.
    pub resets: u64,
    /// Frames cut into their packets.
    pub split: u64,
}

impl Fabric {
    /// A connected pair of QPs (both directions at PSN 0) under `seed`, with `mix`'s
    /// faults and `attrs`.
    pub fn new(seed: u64, mix: FaultMix, attrs: Attrs) -> Fabric {
        Fabric {
            a: End::new(1, 2, &attrs),
            b: End::new(2, 1, &attrs),
            mix,
            decide: faults::Decider::new(seed),
            attempts: FxHashMap::default(),
            base: Instant::now(),
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            trace: faults::FNV_OFFSET,
            stats: Stats::default(),
            broken: None,
            log: std::env::var_os(LOG_SETTING).is_some(),
            path_mtu: attrs.path_mtu,
            lose_once: Vec::new(),
            recorded: None,
        }
    }

    /// End A, or B.
    pub fn end(&mut self, b: bool) -> &mut End {
        if b {
            &mut self.b
        } else {
            &mut self.a
        }
    }

    /// A key for a new region, from the seed (keys are the fabric's choice, as a device's).
    pub fn fresh_key(&mut self, table_of_b: bool) -> u32 {
        let mut n = 0u32;
        let table = if table_of_b { &self.b.mrs } else { &self.a.mrs };
        let d = &self.decide;
        table.fresh_key(|| {
            n += 1;
            d.key(table_of_b, n)
        })
    }

    /// The virtual time since the start.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// What went wrong beyond the model, if anything.
    pub fn broken(&self) -> Option<&Broken> {
        self.broken.as_ref()
    }

    /// The hash of every delivery (time, direction, bytes) and completion so far.
    pub fn trace(&self) -> u64 {
        self.trace
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// Builds what each end may send now and puts it on the network.
    fn transmit(&mut self) {
        let now = self.instant();
        self.a.transmit(now);
        self.b.transmit(now);
        self.launch(Dir::AtoB);
        self.launch(Dir::BtoA);
    }

    /// Cuts what `dir`'s sender queued into frames and schedules each as the seed says.
    fn launch(&mut self, dir: Dir) {
        let mut bytes = Vec::new();
        match dir {
            Dir::AtoB => self.a.tx.drain_into(&mut bytes),
            Dir::BtoA => self.b.tx.drain_into(&mut bytes),
        }
        if bytes.is_empty() {
            return;
        }
        let now = self.instant();
        match dir {
            Dir::AtoB => self.a.last_tx = Some(now),
            Dir::BtoA => self.b.last_tx = Some(now),
        }
        let mut off = 0;
        while off < bytes.len() {
            let (frame, hlen) = match Frame::decode(&bytes[off..]) {
                Ok(Some(x)) => x,
                other => {
                    self.broken = Some(Broken::Protocol(format!(
                        "{dir:?}: the sender queued bytes that are not a frame: {other:?}"
                    )));
                    return;
                }
            };
            let end = off + hlen + frame.payload_len() as usize;
            let unit = bytes[off..end.min(bytes.len())].to_vec();
            off = end;
            let Some(d) = self.decide_unit(dir, &frame, &unit) else {
                return;
            };
            if d.split {
                if let Some(parts) = split::packets(&frame, &unit, hlen, self.path_mtu) {
                    self.stats.split += 1;
                    for part in parts {
                        let Ok(Some((p, _))) = Frame::decode(&part) else {
                            continue;
                        };
                        let Some(d) = self.decide_unit(dir, &p, &part) else {
                            return;
                        };
                        self.send_unit(dir, &p, part, d);
                    }
                    continue;
                }
            }
            self.send_unit(dir, &frame, unit, d);
        }
    }

    /// The fate of one frame `unit` (`frame`, decoded) going `dir`: `None` if the
    /// connection broke as it was sent.
    fn decide_unit(&mut self, dir: Dir, frame: &Frame, unit: &[u8]) -> Option<Decision> {
        let opcode = unit[0];
        let psn = frame.psn().unwrap_or(0);
        let attempt = {
            let n = self.attempts.entry((dir, opcode, psn)).or_insert(0);
            *n += 1;
            *n - 1
        };
        let d = self.decide.frame(&self.mix, dir, opcode, psn, attempt);
        if d.reset {
            self.reset();
            return None;
        }
        Some(d)
    }

    /// Loses the packet of PSN `psn` going `dir` (a part of a message, cut by the
    /// network) the first time it is sent, whatever the seed says: a test's way to lose
    /// one packet inside a message.
    pub fn lose_once(&mut self, dir: Dir, psn: u32) {
        self.lose_once.push((dir, psn));
    }

    /// Records every frame sent from now on, with its fate ([`Fabric::recorded`]).
    pub fn record(&mut self) {
        self.recorded = Some(Vec::new());
    }

    /// The frames sent since [`Fabric::record`], each with its direction and whether it
    /// was lost.
    pub fn recorded(&self) -> &[(Dir, Frame, bool)] {
        self.recorded.as_deref().unwrap_or(&[])
    }

    /// Puts `unit` on the network as `d` says.
    fn send_unit(&mut self, dir: Dir, frame: &Frame, unit: Vec<u8>, mut d: Decision) {
        if matches!(frame, Frame::Part { .. }) {
            if let Some(i) = self
                .lose_once
                .iter()
                .position(|&x| x == (dir, frame.psn().unwrap_or(0)))
            {
                self.lose_once.swap_remove(i);
                d.lost = true;
            }
        }
        if let Some(r) = &mut self.recorded {
            r.push((dir, *frame, d.lost));
        }
        if self.log {
            eprintln!(
                "{:>10?} send {dir:?} {frame} lost={} delay={:?}",
                self.now, d.lost, d.delay
            );
        }
        if d.lost {
            self.stats.lost += 1;
            return;
        }
        if let Some(extra) = d.duplicate_after {
            self.stats.duplicated += 1;
            self.schedule(self.now + d.delay + extra, dir, unit.clone());
        }
        self.schedule(self.now + d.delay, dir, unit);
    }

    /// The connection breaks: everything in flight or queued is lost, both ends start
    /// new byte streams, and each half recovers as after a lost connection (the
    /// requester resends from its oldest unacknowledged WQE).
    fn reset(&mut self) {
        self.stats.resets += 1;
        if self.log {
            eprintln!("{:>10?} connection reset", self.now);
        }
        self.queue.clear();
        self.a.lose_connection();
        self.b.lose_connection();
    }

    fn schedule(&mut self, at: Duration, dir: Dir, bytes: Vec<u8>) {
        self.seq += 1;
        self.queue.push(Reverse(InFlight {
            at,
            seq: self.seq,
            dir,
            bytes,
        }));
    }

    /// Hands one frame to its receiver and runs the receiver's engine over it.
    fn deliver(&mut self, f: InFlight) {
        self.stats.delivered += 1;
        let at = self.now.as_nanos().to_le_bytes();
        self.mix_trace(&[f.dir as u8]);
        self.mix_trace(&at);
        self.trace_frame(f.dir, &f.bytes);
        if self.log {
            if let Ok(Some((fr, _))) = Frame::decode(&f.bytes) {
                eprintln!("{:>10?} {:?} {fr}", self.now, f.dir);
            }
        }
        let now = self.instant();
        let to = match f.dir {
            Dir::AtoB => &mut self.b,
            Dir::BtoA => &mut self.a,
        };
        if let Err(m) = to.receive(&f.bytes, now) {
            self.broken = Some(Broken::Protocol(format!("{:?} receiver: {m}", f.dir)));
        }
    }

    /// Folds a frame into the trace with its remote addresses as offsets into their
    /// regions: the regions' addresses are the allocator's, not the seed's.
    fn trace_frame(&mut self, dir: Dir, unit: &[u8]) {
        let Ok(Some((mut frame, hlen))) = Frame::decode(unit) else {
            return self.mix_trace(unit);
        };
        if let Frame::Write { addr, rkey, .. }
        | Frame::Read { addr, rkey, .. }
        | Frame::CmpSwap { addr, rkey, .. }
        | Frame::FetchAdd { addr, rkey, .. }
        | Frame::Part { addr, rkey, .. } = &mut frame
        {
            let target = if dir == Dir::AtoB {
                &self.b.mrs
            } else {
                &self.a.mrs
            };
            let base = target.get(*rkey).map_or(0, |m| m.addr());
            *addr = addr.wrapping_sub(base);
        }
        let mut h = [0u8; crate::wire::MAX_HDR_LEN];
        let n = frame.encode(&mut h);
        self.mix_trace(&h[..n]);
        // The payload's ends: its bytes are the workload's, which the model checks; a
        // run that went another way shows in headers and times first.
        let payload = &unit[hlen.min(unit.len())..];
        let k = payload.len().min(16);
        self.mix_trace(&payload[..k]);
        self.mix_trace(&payload[payload.len() - k..]);
    }

    fn mix_trace(&mut self, bytes: &[u8]) {
        self.trace = faults::fnv(self.trace, bytes);
    }

    /// Folds the completions produced since the last call into the trace.
    fn trace_completions(&mut self, seen: &mut [usize; 4]) {
        let mut h = self.trace;
        for (k, end) in [&self.a, &self.b].into_iter().enumerate() {
            for w in &end.send_wc[seen[2 * k]..] {
                h = faults::fnv(h, &[b'S', k as u8, w.status as u8, w.opcode as u8]);
                h = faults::fnv(h, &w.wr_id.to_le_bytes());
            }
            for (w, _) in &end.recv_wc[seen[2 * k + 1]..] {
                h = faults::fnv(h, &[b'R', k as u8, w.status as u8, w.opcode as u8]);
                h = faults::fnv(h, &w.wr_id.to_le_bytes());
                h = faults::fnv(h, &w.byte_len.to_le_bytes());
            }
        }
        self.trace = h;
        *seen = self.completions_seen();
    }

    fn completions_seen(&self) -> [usize; 4] {
        [
            self.a.send_wc.len(),
            self.a.recv_wc.len(),
            self.b.send_wc.len(),
            self.b.recv_wc.len(),
        ]
    }

    /// Runs the network and both ends' timers until virtual time `until`, or until nothing is
    /// left to happen (no frame on its way, no timer armed, nothing A may send).
    /// At most `max_events` deliveries and timer firings; past that the run is
    /// [`Broken::Stuck`].
    pub fn run_until(&mut self, until: Duration, max_events: u64) {
        let mut seen = self.completions_seen();
        let mut events = 0u64;
        loop {
            if self.broken.is_some() {
                return;
            }
            self.transmit();
            self.trace_completions(&mut seen);
            let next_frame = self.queue.peek().map(|Reverse(f)| f.at);
            let next_timer = [self.a.next_deadline(), self.b.next_deadline()]
                .into_iter()
                .flatten()
                .min()
                .map(|d| d.saturating_duration_since(self.base));
            let next = match (next_frame, next_timer) {
                (Some(f), Some(t)) => f.min(t),
                (Some(f), None) => f,
                (None, Some(t)) => t,
                (None, None) => return,
            };
            if next > until {
                self.now = self.now.max(until);
                return;
            }
            events += 1;
            if events > max_events {
                self.broken = Some(Broken::Stuck(format!(
                    "{max_events} events and not settled at {:?}: {} + {} WQEs outstanding",
                    self.now,
                    self.a.qp.sq_outstanding(),
                    self.b.qp.sq_outstanding()
                )));
                return;
            }
            self.now = self.now.max(next);
            if next_frame == Some(next) {
                let Reverse(f) = self.queue.pop().expect("peeked");
                self.deliver(f);
            } else {
                let now = self.instant();
                self.stats.timeouts += self.a.on_timer(now) + self.b.on_timer(now);
            }
        }
    }
}
