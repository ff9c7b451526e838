//! The data path's clock: `CLOCK_MONOTONIC` in nanoseconds since the engine started,
//! read once per round of service and turned into an [`Instant`] (what the protocol's
//! timers take) only when a round processes frames.

use std::time::{Duration, Instant};

use crate::sys;

/// The engine's time base.
pub(super) struct Clock {
    base: Instant,
    /// `CLOCK_MONOTONIC` (the clock of [`Instant`]) in nanoseconds, read just after
    /// `base`: a reading less this is at most the time since `base`, never more, so a
    /// timer never fires early (see [`Clock::now_ns`]).
    base_ns: u64,
}

/// A clock reading in nanoseconds since the engine's `base`, read once per round: one
/// message's round uses the same reading for the driving window, the requester's timers
/// and when its bytes left. Read from `CLOCK_MONOTONIC` as nanoseconds
/// ([`Clock::now_ns`]) rather than as an [`Instant`] converted to nanoseconds (about 50
/// instructions per conversion); the [`Instant`] that the protocol's timers take is made
/// from it only when a round processes frames ([`Clock::instant`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Stamp {
    pub ns: u64,
}

impl Clock {
    pub fn new() -> Clock {
        // `base_ns` right after `base` (see the field).
        let base = Instant::now();
        Clock {
            base,
            base_ns: sys::monotonic_ns(),
        }
    }

    /// `t` in nanoseconds since the base.
    pub fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Nanoseconds since the base, read without an [`Instant`]. `base_ns` was read just
    /// after `base`, so this lags [`Clock::nanos`] of the same moment by the time between
    /// those two reads (tens of nanoseconds): a clock read that much earlier.
    pub fn now_ns(&self) -> u64 {
        sys::monotonic_ns().saturating_sub(self.base_ns)
    }

    /// The [`Instant`] of a reading of [`Clock::now_ns`] (not later than the moment it
    /// was read).
    pub fn instant(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    /// Reads the clock (see [`Stamp`]).
    pub fn stamp(&self) -> Stamp {
        Stamp { ns: self.now_ns() }
    }
}
