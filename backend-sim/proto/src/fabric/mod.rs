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
//! opcode and PSN, and how many times that frame was sent before
//! ([`faults::network`](crate::faults::network)), not the order of draws. Removing one fault (or changing the workload after some point) leaves
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
pub mod net;
pub mod port;
pub mod schedule;
mod split;
pub mod workload;

#[cfg(test)]
mod lost_packets;

#[cfg(test)]
mod rnr_count;

#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::wire::Frame;

pub use crate::faults::network::{Decision, FaultMix};
pub use end::End;
pub use net::{Net, Sent, Stats, LOG_SETTING};
pub use port::Port;
pub use schedule::{Fault, FrameKey, Schedule, What};

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

impl Dir {
    /// The direction's link on the [`Net`].
    fn link(self) -> u64 {
        self as u64
    }

    /// The direction of a link of the fabric's [`Net`].
    fn of_link(link: u64) -> Dir {
        if link == Dir::AtoB.link() {
            Dir::AtoB
        } else {
            Dir::BtoA
        }
    }
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

/// The connection, the network between its ends, and the virtual clock.
pub struct Fabric {
    /// End A (QP 1).
    pub a: End,
    /// End B (QP 2).
    pub b: End,
    net: Net,
    broken: Option<Broken>,
}

impl Fabric {
    /// A connected pair of QPs (both directions from PSN `attrs.psn`) under `seed`, with
    /// `mix`'s faults and `attrs`.
    pub fn new(seed: u64, mix: FaultMix, attrs: Attrs) -> Fabric {
        Fabric {
            a: End::new(1, 2, &attrs),
            b: End::new(2, 1, &attrs),
            net: Net::new(seed, mix),
            broken: None,
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
        let d = self.net.decider();
        table.fresh_key(|| {
            n += 1;
            d.key(table_of_b, n)
        })
    }

    /// The virtual time since the start.
    pub fn now(&self) -> Duration {
        self.net.now()
    }

    /// What the network did so far.
    pub fn stats(&self) -> Stats {
        self.net.stats
    }

    /// What went wrong beyond the model, if anything.
    pub fn broken(&self) -> Option<&Broken> {
        self.broken.as_ref()
    }

    /// The hash of every delivery (time, direction, bytes) and completion so far.
    pub fn trace(&self) -> u64 {
        self.net.trace()
    }

    /// Loses the packet of PSN `psn` going `dir` (a part of a message, cut by the
    /// network) the first time it is sent, whatever the seed says: a test's way to lose
    /// one packet inside a message.
    pub fn lose_once(&mut self, dir: Dir, psn: u32) {
        self.net.lose_once(dir.link(), psn);
    }

    /// Records every frame sent from now on, with its fate ([`Fabric::recorded`]).
    pub fn record(&mut self) {
        self.net.record();
    }

    /// The frames sent since [`Fabric::record`], each with its direction and whether it
    /// was lost.
    pub fn recorded(&self) -> Vec<(Dir, Frame, bool)> {
        self.net
            .recorded()
            .iter()
            .map(|&(link, frame, lost)| (Dir::of_link(link), frame, lost))
            .collect()
    }

    /// Builds what each end may send now and puts it on the network.
    fn transmit(&mut self) {
        let now = self.net.instant();
        for dir in [Dir::AtoB, Dir::BtoA] {
            let end = if dir == Dir::AtoB {
                &mut self.a
            } else {
                &mut self.b
            };
            end.port.transmit(&end.mrs, now);
            end.take_completions();
            let mut bytes = Vec::new();
            if !end.port.take_frames(now, &mut bytes) {
                continue;
            }
            match self.net.send(dir.link(), end.port.path_mtu(), &bytes) {
                Ok(Sent::Scheduled) => {}
                Ok(Sent::Reset) => return self.reset(),
                Err(m) => {
                    self.broken = Some(Broken::Protocol(m));
                    return;
                }
            }
        }
    }

    /// The connection breaks: everything in flight or queued is lost, both ends start
    /// new byte streams, and each half recovers as after a lost connection (the
    /// requester resends from its oldest unacknowledged WQE).
    fn reset(&mut self) {
        self.net.drop_links(|_| true);
        for end in [&mut self.a, &mut self.b] {
            end.port.lose_connection();
            end.take_completions();
        }
    }

    /// Hands one frame to its receiver and runs the receiver's QP over it.
    fn deliver(&mut self, f: net::InFlight) {
        let now = self.net.instant();
        let dir = Dir::of_link(f.link);
        let to = if dir == Dir::AtoB {
            &mut self.b
        } else {
            &mut self.a
        };
        self.net.delivered(&f, &to.mrs);
        let r = to.port.receive(&f.bytes, &to.mrs, now);
        to.take_completions();
        if let Err(m) = r {
            self.broken = Some(Broken::Protocol(format!("{dir:?} receiver: {m}")));
        }
    }

    /// Folds the completions produced since the last call into the trace.
    fn trace_completions(&mut self, seen: &mut [usize; 4]) {
        for (k, end) in [&self.a, &self.b].into_iter().enumerate() {
            for w in &end.send_wc[seen[2 * k]..] {
                self.net.trace_completion(k as u64, false, w);
            }
            for (w, _) in &end.recv_wc[seen[2 * k + 1]..] {
                self.net.trace_completion(k as u64, true, w);
            }
        }
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
            let next_frame = self.net.next_at();
            let next_timer = [self.a.port.next_deadline(), self.b.port.next_deadline()]
                .into_iter()
                .flatten()
                .min()
                .map(|d| self.net.since_start(d));
            let next = match (next_frame, next_timer) {
                (Some(f), Some(t)) => f.min(t),
                (Some(f), None) => f,
                (None, Some(t)) => t,
                (None, None) => return,
            };
            if next > until {
                self.net.advance(until);
                return;
            }
            events += 1;
            if events > max_events {
                self.broken = Some(Broken::Stuck(format!(
                    "{max_events} events and not settled at {:?}: {} + {} WQEs outstanding",
                    self.net.now(),
                    self.a.qp().sq_outstanding(),
                    self.b.qp().sq_outstanding()
                )));
                return;
            }
            self.net.advance(next);
            if next_frame == Some(next) {
                let f = self.net.pop().expect("peeked");
                self.deliver(f);
            } else {
                let now = self.net.instant();
                for end in [&mut self.a, &mut self.b] {
                    self.net.stats.timeouts += end.port.on_timer(now);
                    end.take_completions();
                }
            }
        }
    }
}
