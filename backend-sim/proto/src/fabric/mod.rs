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
//! (header and payload), each fed to the receiving reader in one piece.

pub mod faults;
pub mod workload;

#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

use verbs_api::{AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, WorkCompletion};

use crate::engine::{drive, DriveState, Stop};
use crate::memory::MrTable;
use crate::qp::{AvCheck, Qp, QpLimits};
use crate::requester::Requester;
use crate::responder::Responder;
use crate::rx::Reader;
use crate::switches::Switches;
use crate::tx::TxQueue;
use crate::wire::Frame;

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
}

impl Default for Attrs {
    fn default() -> Self {
        Attrs {
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            path_mtu: 1024,
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

/// One end of the connection: a QP, its memory, its byte streams.
pub struct End {
    /// The QP: state machine, both halves, their completions.
    pub qp: Qp,
    /// Its registered memory.
    pub mrs: MrTable,
    reader: Reader,
    tx: TxQueue,
    st: DriveState,
    /// Its send completions, in the order they were produced (all of the run's, taken
    /// from the QP after each step).
    pub send_wc: Vec<WorkCompletion>,
    /// Its receive completions, with the solicited bit (the same).
    pub recv_wc: Vec<(WorkCompletion, bool)>,
    force_rnr: u32,
    last_tx: Option<Instant>,
    last_rx: Option<Instant>,
}

impl End {
    fn new(qpn: u32, dest_qpn: u32, attrs: &Attrs) -> End {
        let cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 1024,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        };
        let req = Requester::new(qpn, PD, &cap, false);
        let resp = Responder::new(qpn, PD, cap.max_recv_wr, 4);
        let mut qp = Qp::new(QpType::Rc, cap, Switches::default(), req, resp);
        // RESET -> INIT -> RTR -> RTS through `ibv_modify_qp`'s state machine, as an
        // application brings an RC QP up.
        let steps = [
            (
                QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    qp_access_flags: AccessFlags::REMOTE,
                    ..Default::default()
                },
                M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rtr,
                    path_mtu: Mtu::from_raw(attrs.path_mtu.trailing_zeros().saturating_sub(7))
                        .unwrap_or(Mtu::Mtu1024),
                    dest_qp_num: dest_qpn,
                    rq_psn: 0,
                    max_dest_rd_atomic: 16,
                    min_rnr_timer: attrs.min_rnr_timer,
                    ..Default::default()
                },
                M::STATE
                    | M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rts,
                    sq_psn: 0,
                    timeout: attrs.timeout,
                    retry_cnt: attrs.retry_cnt,
                    rnr_retry: attrs.rnr_retry,
                    max_rd_atomic: 4,
                    ..Default::default()
                },
                M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
            ),
        ];
        for (attr, mask) in steps {
            qp.handle_modify(&attr, mask, &LIMITS, &Wired)
                .expect("the fabric's attributes are legal");
        }
        // The fabric's connection is up from the start.
        qp.handle_connection_up();
        End {
            qp,
            mrs: MrTable::default(),
            reader: Reader::new(),
            tx: TxQueue::new(),
            st: DriveState::default(),
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
            force_rnr: 0,
            last_tx: None,
            last_rx: None,
        }
    }

    /// `ibv_post_send` on this end's QP (in ERR the WR completes flushed).
    pub fn post(&mut self, wr: &verbs_api::SendWr<'_>) -> Result<(), crate::requester::PostCheck> {
        self.qp.handle_post_send(wr, &self.mrs, None)?;
        self.qp.flush_posted_sends();
        self.take_completions();
        Ok(())
    }

    /// `ibv_post_recv` on this end's QP (in ERR the WR completes flushed where the
    /// device does so).
    pub fn post_recv(&mut self, wr: &verbs_api::RecvWr<'_>) -> Result<(), crate::recv_queue::PostRecvError> {
        self.qp.handle_post_recv(wr)?;
        self.qp.flush_posted_recvs();
        self.take_completions();
        Ok(())
    }

    /// Whether the QP went to ERR.
    pub fn in_error(&self) -> bool {
        self.qp.state() == QpState::Err
    }

    /// Appends the completions the QP produced to this end's record of them.
    fn take_completions(&mut self) {
        let c = self.qp.poll_completions();
        self.send_wc.append(c.send);
        self.recv_wc.append(c.recv);
    }

    /// A fatal completion: the QP goes to ERR and both halves flush.
    fn fail(&mut self) {
        self.qp.enter_error();
    }

    /// Builds what the requester may send now.
    fn transmit(&mut self, now: Instant) {
        if !self.in_error() && self.qp.transmit_into(&self.mrs, now, &mut self.tx, 64).is_err() {
            self.fail();
        }
        self.take_completions();
    }

    /// Runs the engine over `bytes` (one whole frame) with both halves.
    fn receive(&mut self, bytes: &[u8], now: Instant) -> Result<(), String> {
        self.last_rx = Some(now);
        let mut off = 0;
        loop {
            off += self.reader.feed(&bytes[off..]);
            let mut sides = self.qp.sides(&mut self.force_rnr);
            let r = drive(
                &mut sides,
                &mut self.reader,
                &self.mrs,
                &mut self.tx,
                now,
                &mut self.st,
                usize::MAX,
                0,
            );
            match r {
                Ok(()) => {}
                Err(Stop::Fatal(_)) => self.fail(),
                Err(Stop::Protocol(m)) => {
                    self.take_completions();
                    return Err(m);
                }
            }
            self.take_completions();
            if off >= bytes.len() {
                return Ok(());
            }
        }
    }

    /// The connection broke: new byte streams, each half recovering.
    fn lose_connection(&mut self) {
        self.reader = Reader::new();
        self.st = DriveState::default();
        let mut gone = Vec::new();
        self.tx.drain_into(&mut gone);
        self.qp.handle_connection_lost();
        // The new byte streams are there at once.
        self.qp.handle_connection_up();
        self.take_completions();
    }

    /// The requester's timers, if due.
    fn on_timer(&mut self, now: Instant) -> u64 {
        if self.in_error() {
            return 0;
        }
        let r = self.qp.handle_timeout(now, self.last_tx, self.last_rx);
        let timeouts = self.qp.take_ack_timeouts();
        if r.is_err() {
            self.fail();
        }
        self.take_completions();
        timeouts
    }

    fn next_deadline(&self) -> Option<Instant> {
        if self.in_error() {
            None
        } else {
            self.qp.poll_timeout()
        }
    }
}

/// The device limits of the fabric's QPs.
const LIMITS: QpLimits = QpLimits {
    max_qp_init_rd_atom: 16,
    max_qp_rd_atom: 16,
};

/// The fabric's addressing: the two ends are wired to each other, any address vector
/// names the peer.
struct Wired;

impl AvCheck for Wired {
    fn check_av(&self, _: &AhAttr) -> Result<(), (&'static str, String)> {
        Ok(())
    }
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
                return;
            }
            if self.log {
                eprintln!(
                    "{:>10?} send {dir:?} {frame} lost={} delay={:?}",
                    self.now, d.lost, d.delay
                );
            }
            if d.lost {
                self.stats.lost += 1;
                continue;
            }
            if let Some(extra) = d.duplicate_after {
                self.stats.duplicated += 1;
                self.schedule(self.now + d.delay + extra, dir, unit.clone());
            }
            self.schedule(self.now + d.delay, dir, unit);
        }
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
        | Frame::FetchAdd { addr, rkey, .. } = &mut frame
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
