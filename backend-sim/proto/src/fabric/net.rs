//! The network of a deterministic run: frames on their way between QPs on a virtual
//! clock, each frame's fate (lost, delayed, duplicated, the connection reset) decided by
//! the seed from what the frame is ([`Decider`]), and the trace that hashes every
//! delivery and completion so that two runs compare in one number.
//!
//! The two-QP [`Fabric`](super::Fabric) and the verbs-level deterministic backend
//! (`backend-sim-det`) both schedule their frames here: a frame travels on a *link*, a
//! number the caller chooses for one direction of one connection (the fabric's two
//! directions are 0 and 1; the backend's are its QPs' numbers), which keys its decisions
//! with the frame's opcode, PSN and how many times it was sent before. The network may
//! cut a frame of several packets into one frame per packet at the sender's path MTU
//! ([`super::split`]); each packet is then decided on its own, keyed by its own PSN.
//! The faults applied can be listed as the run goes ([`Net::record_faults`]), and a
//! run can take its faults from such a list instead of the seed ([`Net::force`]): see
//! [`super::schedule`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::schedule::{self, Fault, FrameKey, Schedule, What};
use super::split;
use crate::faults::network::{self, Decider, Decision, FaultMix};
use crate::memory::MrTable;
use crate::wire::Frame;

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
    /// Times a connection broke.
    pub resets: u64,
    /// Frames cut into their packets.
    pub split: u64,
}

/// A frame (header and payload) on its way.
pub struct InFlight {
    /// When it arrives (virtual time since the start).
    pub at: Duration,
    seq: u64,
    /// The link it travels on.
    pub link: u64,
    /// The frame's bytes.
    pub bytes: Vec<u8>,
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

/// What became of the bytes a sender queued ([`Net::send`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Each frame was lost, or scheduled (once or twice).
    Scheduled,
    /// The seed broke the connection as a frame was sent: it and the frames after it
    /// are gone, and the caller resets the connection ([`Net::drop_links`] and each
    /// end's `handle_connection_lost`).
    Reset,
}

/// The network: the frames in flight, the virtual clock, the seed's decisions, the trace.
pub struct Net {
    mix: FaultMix,
    decide: Decider,
    /// Times each (link, opcode, PSN) was sent: the attempt a decision is keyed by.
    attempts: FxHashMap<(u64, u8, u32), u32>,
    base: Instant,
    now: Duration,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    trace: u64,
    /// What the network did so far.
    pub stats: Stats,
    log: bool,
    /// Packets (parts) to lose the first time they are sent, whatever the seed says.
    lose_once: Vec<(u64, u32)>,
    /// Every frame sent, with its link and whether it was lost, when recording.
    recorded: Option<Vec<(u64, Frame, bool)>>,
    /// The faults applied so far, when recording them ([`Net::record_faults`]).
    faults: Option<Vec<Fault>>,
    /// The schedule that decides instead of the seed ([`Net::force`]).
    forced: Option<schedule::Forced>,
}

/// The setting that has a run print every frame it carries to stderr, with its fate
/// (lost, delayed) and the virtual time: set it when replaying a failing seed.
pub const LOG_SETTING: &str = "RDMA_FABRIC_LOG";

impl Net {
    /// An empty network at virtual time 0, deciding by `seed` with `mix`'s faults.
    pub fn new(seed: u64, mix: FaultMix) -> Net {
        Net {
            mix,
            decide: Decider::new(seed),
            attempts: FxHashMap::default(),
            base: Instant::now(),
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            trace: network::FNV_OFFSET,
            stats: Stats::default(),
            log: std::env::var_os(LOG_SETTING).is_some(),
            lose_once: Vec::new(),
            recorded: None,
            faults: None,
            forced: None,
        }
    }

    /// The seed's decisions (for the other random choices of a run: keys, QPNs).
    pub fn decider(&self) -> &Decider {
        &self.decide
    }

    /// The virtual time since the start.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// The virtual time as an `Instant`, the clock the protocol core's timers run on.
    pub fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// A deadline of the protocol core as virtual time since the start.
    pub fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.base)
    }

    /// Moves the clock forward to `to` (never back).
    pub fn advance(&mut self, to: Duration) {
        self.now = self.now.max(to);
    }

    /// Whether frames are printed ([`LOG_SETTING`]).
    pub fn logging(&self) -> bool {
        self.log
    }

    /// When the next frame arrives, if one is on its way.
    pub fn next_at(&self) -> Option<Duration> {
        self.queue.peek().map(|Reverse(f)| f.at)
    }

    /// Takes the next frame to arrive (the caller moves the clock to its time first).
    pub fn pop(&mut self) -> Option<InFlight> {
        self.queue.pop().map(|Reverse(f)| f)
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Loses every frame in flight on the links `gone` says (a connection that broke).
    pub fn drop_links(&mut self, gone: impl Fn(u64) -> bool) {
        self.stats.resets += 1;
        if self.log {
            eprintln!("{:>10?} connection reset", self.now);
        }
        let kept: Vec<_> = std::mem::take(&mut self.queue)
            .into_vec()
            .into_iter()
            .filter(|Reverse(f)| !gone(f.link))
            .collect();
        self.queue = BinaryHeap::from(kept);
    }

    /// Cuts `bytes` (whole frames a sender queued) into frames and schedules each on
    /// `link` as the seed decides; a frame of several packets the seed says to cut is
    /// cut at `mtu` (the sender's path MTU) and each packet decided on its own. `Err`:
    /// the bytes are not frames.
    pub fn send(&mut self, link: u64, mtu: u32, bytes: &[u8]) -> Result<Sent, String> {
        let mut off = 0;
        while off < bytes.len() {
            let (frame, hlen) = match Frame::decode(&bytes[off..]) {
                Ok(Some(x)) => x,
                other => {
                    return Err(format!(
                        "link {link:#x}: the sender queued bytes that are not a frame: {other:?}"
                    ))
                }
            };
            let end = (off + hlen + frame.payload_len() as usize).min(bytes.len());
            let unit = bytes[off..end].to_vec();
            off = end;
            let (Some(d), key) = self.decide_unit(link, &frame, &unit) else {
                return Ok(Sent::Reset);
            };
            if d.split {
                if let Some(parts) = split::packets(&frame, &unit, hlen, mtu) {
                    self.stats.split += 1;
                    self.note_fault(&key, &frame, What::Split);
                    for part in parts {
                        let Ok(Some((p, _))) = Frame::decode(&part) else {
                            continue;
                        };
                        let (Some(d), key) = self.decide_unit(link, &p, &part) else {
                            return Ok(Sent::Reset);
                        };
                        self.send_unit(&key, &p, part, d);
                    }
                    continue;
                }
            }
            self.send_unit(&key, &frame, unit, d);
        }
        Ok(Sent::Scheduled)
    }

    /// The fate of one frame `unit` (`frame`, decoded) on `link`, and which sending of
    /// which frame it is: `None` if the connection breaks as it is sent.
    fn decide_unit(&mut self, link: u64, frame: &Frame, unit: &[u8]) -> (Option<Decision>, FrameKey) {
        let opcode = unit[0];
        let psn = frame.psn().unwrap_or(0);
        let attempt = {
            let n = self.attempts.entry((link, opcode, psn)).or_insert(0);
            *n += 1;
            *n - 1
        };
        let key = FrameKey {
            link,
            opcode,
            psn,
            attempt,
        };
        let d = match &self.forced {
            Some(f) => f.decision(&key, self.mix.latency),
            None => self.decide.frame(&self.mix, link, opcode, psn, attempt),
        };
        if d.reset {
            self.note_fault(&key, frame, What::Reset);
        }
        ((!d.reset).then_some(d), key)
    }

    /// Puts `unit` on its link as `d` says (or loses it: [`Net::lose_once`]).
    fn send_unit(&mut self, key: &FrameKey, frame: &Frame, unit: Vec<u8>, mut d: Decision) {
        let link = key.link;
        if matches!(frame, Frame::Part { .. }) {
            let psn = frame.psn().unwrap_or(0);
            if let Some(i) = self.lose_once.iter().position(|&x| x == (link, psn)) {
                self.lose_once.swap_remove(i);
                d.lost = true;
            }
        }
        if let Some(r) = &mut self.recorded {
            r.push((link, *frame, d.lost));
        }
        if self.faults.is_some() {
            for what in schedule::applied(&d, self.mix.latency) {
                self.note_fault(key, frame, what);
            }
        }
        if self.log {
            eprintln!(
                "{:>10?} send {link:#x} {frame} lost={} delay={:?}",
                self.now, d.lost, d.delay
            );
        }
        if d.lost {
            self.stats.lost += 1;
            return;
        }
        if let Some(extra) = d.duplicate_after {
            self.stats.duplicated += 1;
            self.schedule(self.now + d.delay + extra, link, unit.clone());
        }
        self.schedule(self.now + d.delay, link, unit);
    }

    /// Loses the packet of PSN `psn` on `link` (a part of a message, cut by the
    /// network) the first time it is sent, whatever the seed says: a test's way to lose
    /// one packet inside a message.
    pub fn lose_once(&mut self, link: u64, psn: u32) {
        self.lose_once.push((link, psn));
    }

    /// Records every frame sent from now on, with its fate ([`Net::recorded`]).
    pub fn record(&mut self) {
        self.recorded = Some(Vec::new());
    }

    /// The frames sent since [`Net::record`], each with its link and whether it was
    /// lost.
    pub fn recorded(&self) -> &[(u64, Frame, bool)] {
        self.recorded.as_deref().unwrap_or(&[])
    }

    /// Lists every fault applied from now on ([`Net::faults`]): the run's schedule.
    pub fn record_faults(&mut self) {
        self.faults.get_or_insert_with(Vec::new);
    }

    /// The faults applied since [`Net::record_faults`], in the order applied.
    pub fn faults(&self) -> &[Fault] {
        self.faults.as_deref().unwrap_or(&[])
    }

    /// From now on each frame's fate comes from `schedule`, not from the seed: the
    /// faults it lists for that sending of that frame, and a clean delivery after the
    /// latency for every frame it does not name ([`super::schedule`]).
    pub fn force(&mut self, schedule: &Schedule) {
        self.forced = Some(schedule::Forced::new(schedule));
    }

    /// Notes fault `what` applied to `frame` (sent as `key`), when recording.
    fn note_fault(&mut self, key: &FrameKey, frame: &Frame, what: What) {
        if let Some(faults) = &mut self.faults {
            faults.push(Fault {
                at: self.now,
                key: *key,
                kind: schedule::kind(frame),
                what,
            });
        }
    }

    fn schedule(&mut self, at: Duration, link: u64, bytes: Vec<u8>) {
        self.seq += 1;
        self.queue.push(Reverse(InFlight {
            at,
            seq: self.seq,
            link,
            bytes,
        }));
    }

    /// Counts frame `f` delivered now and folds it into the trace, its remote addresses
    /// as offsets into the regions of `target` (the receiver's table): the regions'
    /// addresses are the allocator's, not the seed's.
    pub fn delivered(&mut self, f: &InFlight, target: &MrTable) {
        self.stats.delivered += 1;
        self.mix_trace(&f.link.to_le_bytes());
        self.mix_trace(&self.now.as_nanos().to_le_bytes());
        let Ok(Some((mut frame, hlen))) = Frame::decode(&f.bytes) else {
            return self.mix_trace(&f.bytes);
        };
        if self.log {
            eprintln!("{:>10?} {:#x} {frame}", self.now, f.link);
        }
        if let Frame::Write { addr, rkey, .. }
        | Frame::Read { addr, rkey, .. }
        | Frame::WritePlaced { addr, rkey, .. }
        | Frame::ReadPlaced { addr, rkey, .. }
        | Frame::AtomicPlaced { addr, rkey, .. }
        | Frame::CmpSwap { addr, rkey, .. }
        | Frame::FetchAdd { addr, rkey, .. }
        | Frame::Part { addr, rkey, .. } = &mut frame
        {
            // A key the receiver does not know (a bad rkey on purpose) makes the address
            // meaningless to it: left out.
            *addr = target.get(*rkey).map_or(0, |m| addr.wrapping_sub(m.addr()));
        }
        let mut h = [0u8; crate::wire::MAX_HDR_LEN];
        let n = frame.encode(&mut h);
        self.mix_trace(&h[..n]);
        // The payload's ends: its bytes are the application's, which it checks; a run
        // that went another way shows in headers and times first.
        let payload = &f.bytes[hlen.min(f.bytes.len())..];
        let k = payload.len().min(16);
        self.mix_trace(&payload[..k]);
        self.mix_trace(&payload[payload.len() - k..]);
    }

    /// Folds `bytes` into the trace.
    pub fn mix_trace(&mut self, bytes: &[u8]) {
        self.trace = network::fnv(self.trace, bytes);
    }

    /// Folds a completion of end `end` into the trace (`recv`: of its receive queue).
    pub fn trace_completion(&mut self, end: u64, recv: bool, w: &verbs_api::WorkCompletion) {
        let tag = if recv { b'R' } else { b'S' };
        self.mix_trace(&[tag, w.status as u8, w.opcode as u8]);
        self.mix_trace(&end.to_le_bytes());
        self.mix_trace(&w.wr_id.to_le_bytes());
        if recv {
            self.mix_trace(&w.byte_len.to_le_bytes());
        }
    }

    /// The hash of every delivery and completion so far.
    pub fn trace(&self) -> u64 {
        self.trace
    }
}
