//! The deterministic backend's handle and how one is made: [`Det`], a world of devices
//! on one seeded network, and [`DetBuilder`], its seed, faults, devices, profile and
//! budget; what a world can be asked as a whole (its trace, its schedule, its network's
//! counts, its virtual time), and running it until it settles. The verbs on it are
//! `backend.rs`'s (`Backend for Det`), the in-memory rendezvous' are
//! [`crate::rendezvous`]'s.

use std::sync::Arc;
use std::time::Duration;

use backend_sim_proto::fabric::{FaultMix, Schedule, Stats};
use backend_sim_proto::switches::Switches;
use verbs_api::Result;

use crate::budget::DEFAULT_BUDGET;
use crate::shared::Shared;

/// The deterministic backend: a world of devices on one seeded network (see the crate
/// documentation). Cloning it gives another handle to the same world.
#[derive(Clone)]
pub struct Det {
    pub(crate) shared: Arc<Shared>,
}

/// How a [`Det`] world is made: its seed, its network's faults, its devices.
#[derive(Clone, Debug)]
pub struct DetBuilder {
    seed: u64,
    mix: FaultMix,
    hosts: Vec<String>,
    schedule: Option<Schedule>,
    sw: Switches,
    budget: Duration,
}

impl Default for DetBuilder {
    fn default() -> Self {
        DetBuilder {
            seed: 0,
            mix: FaultMix::clean(Duration::from_micros(2)),
            hosts: vec!["det0".into(), "det1".into()],
            schedule: None,
            sw: Switches::RXE,
            budget: DEFAULT_BUDGET,
        }
    }
}

/// A rate in percent as parts per million: clamped to 0..=100, NaN as 0.
fn ppm(pct: impl Into<f64>) -> u32 {
    let p = pct.into();
    if p.is_nan() {
        0
    } else {
        (p.clamp(0.0, 100.0) * 10_000.0).round() as u32
    }
}

impl DetBuilder {
    /// The seed every random choice of the run comes from.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The network's faults (default: none, 2 us one way), all at once; the methods
    /// below set one each.
    pub fn mix(mut self, mix: FaultMix) -> Self {
        self.mix = mix;
        self
    }

    /// Frames lost, in percent (`.loss(5)`, `.loss(0.5)`).
    pub fn loss(mut self, pct: impl Into<f64>) -> Self {
        self.mix.loss_ppm = ppm(pct);
        self
    }

    /// Frames delivered twice, in percent; the copy comes up to [`DetBuilder::dup_gap`]
    /// after the first.
    pub fn dup(mut self, pct: impl Into<f64>) -> Self {
        self.mix.dup_ppm = ppm(pct);
        self
    }

    /// The longest gap between a frame and its duplicate (default 0: right after it).
    pub fn dup_gap(mut self, gap: Duration) -> Self {
        self.mix.dup_gap = gap;
        self
    }

    /// The shortest one-way delay of a frame (default 2 us).
    pub fn latency(mut self, latency: Duration) -> Self {
        self.mix.latency = latency;
        self
    }

    /// Extra delay of up to `jitter`, drawn per frame: frames overtake each other (are
    /// reordered) when it exceeds the gap between them.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.mix.jitter = jitter;
        self
    }

    /// Frames of more than one packet cut into their packets, in percent, each packet
    /// then lost, duplicated and delayed on its own.
    pub fn split(mut self, pct: impl Into<f64>) -> Self {
        self.mix.split_ppm = ppm(pct);
        self
    }

    /// Frames at which the connection breaks, in percent: what is in flight is lost and
    /// both ends recover as after a reconnection.
    pub fn reset(mut self, pct: impl Into<f64>) -> Self {
        self.mix.reset_ppm = ppm(pct);
        self
    }

    /// Frames decided by `schedule` instead of the seed: the faults it lists, and a
    /// clean delivery after the latency for every other frame (the seed still chooses
    /// QPNs and keys, which the schedule's links name). A schedule comes from
    /// [`Det::schedule`] or a printed one read back (`str::parse`); see [`crate::shrink`].
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = Some(schedule);
        self
    }

    /// The network's faults as set so far.
    pub fn fault_mix(&self) -> FaultMix {
        self.mix
    }

    /// The devices, by name (default `det0` and `det1`); device `n` has LID `n + 1`.
    pub fn hosts<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.hosts = names.into_iter().map(Into::into).collect();
        self
    }

    /// How the devices behave where HCAs differ: the sim's profiles, `Switches::RXE`
    /// (the default), `Switches::PORTABLE` or `Switches::MLX5`. Under loss, rxe's
    /// `retry_cnt` 7 retries a lost fatal NAK for ever; `PORTABLE` and `MLX5` make it
    /// seven retries, ending in `IBV_WC_RETRY_EXC_ERR`.
    pub fn profile(mut self, sw: Switches) -> Self {
        self.sw = sw;
        self
    }

    /// How much virtual time a wait (a CQ poll that finds nothing, `get_cq_event`,
    /// `get_async_event`) may run the world past the program's last step (a post, a
    /// modify, a completion or an event taken) before it fails with
    /// `verbs_api::Error::Timeout` naming what keeps the world busy (default
    /// [`DEFAULT_BUDGET`]): a wait that would otherwise run for ever, the same on every
    /// run of a seed.
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The world, owned by the calling thread.
    pub fn build(self) -> Det {
        let shared = Shared::new(self.seed, self.mix, self.hosts, self.sw, self.budget);
        {
            let mut w = shared.lock_any();
            w.net.record_faults();
            if let Some(s) = &self.schedule {
                w.net.force(s);
            }
        }
        Det { shared }
    }
}

impl Det {
    /// A world to make ([`DetBuilder`]).
    pub fn builder() -> DetBuilder {
        DetBuilder::default()
    }

    /// The hash of every delivery and completion so far: the same seed and program give
    /// the same trace.
    pub fn trace(&self) -> u64 {
        self.shared.lock_any().net.trace()
    }

    /// Every fault the network applied so far, in order: the run's schedule, which
    /// [`DetBuilder::schedule`] replays.
    pub fn schedule(&self) -> Schedule {
        Schedule::from(self.shared.lock_any().net.faults().to_vec())
    }

    /// What the network did so far.
    pub fn stats(&self) -> Stats {
        self.shared.lock_any().net.stats
    }

    /// The virtual time since the world was made (inside the paused tokio runtime the
    /// world is attached to, tokio's time: see [`crate::IDLE_WAIT`]'s module).
    pub fn now(&self) -> Duration {
        let world = self.shared.lock_any().net.now();
        self.shared.rt.virtual_now().map_or(world, |t| t.max(world))
    }

    /// Runs the world until nothing is left to happen (no frame in flight, no timer
    /// armed) or virtual time `limit` has passed; whether it settled.
    pub fn settle(&self, limit: Duration) -> Result<bool> {
        let mut w = self.shared.enter("settle")?;
        let until = w.net.now() + limit;
        while w.advance(Some(until)) {}
        Ok(w.idle())
    }
}
