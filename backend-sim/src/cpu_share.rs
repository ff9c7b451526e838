//! Keeps the progress thread from sharing a CPU with the thread it waits for.
//!
//! A socket wake-up (`sock_def_readable`, a synchronous wake-up) lets the kernel place the
//! woken thread on the waker's CPU, and on a small machine it may keep doing so while
//! another CPU idles (Linux skips its search for an idle CPU when the cache domain looks
//! busy, `SIS_UTIL`, and on two CPUs one spinning thread is half of it). A progress
//! thread woken by a busy-polling application thread then spins on that thread's CPU and
//! starves the very thread whose next request it waits for: the request comes only after
//! the spin window is over, and every round trip costs a window (up to 200 µs) instead of
//! a few microseconds. `perf-compare`'s row of short small-WRITE runs shows such stalls.
//!
//! The sign is cheap to see from the progress thread alone: it spun a whole window (the
//! longest, which a stalled stream's gaps make it use) without work, blocked, and was
//! woken by a connection almost at once, three times in a row
//! ([`ShareWatch::after_wake`]). Then it moves itself to another CPU it may run on
//! ([`move_off_this_cpu`]: `man 2 sched_setaffinity`), keeping its affinity mask, and
//! later wake-ups find it there (a wake-up prefers the woken thread's last CPU when that
//! one is idle).

use std::time::{Duration, Instant};

use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};

/// A sleep shorter than this, after a whole spin window that found nothing, means the
/// thread that woke the progress thread could not run while it spun.
pub const SHORT_SLEEP: Duration = Duration::from_micros(25);
/// Sleeps in a row that must show the sign before the thread moves: a sender that only
/// paused once as long as the window, then sent, shows it once.
pub const STREAK: u32 = 3;
/// The shortest time between two moves. A move that did not help (the sign again within
/// four times the time waited before it) doubles the time to the next one, up to
/// [`MAX_BACKOFF`]: when every CPU is busy, or the sign came from something else, moving
/// only costs migrations.
pub const MOVE_INTERVAL: Duration = Duration::from_millis(1);
/// The longest time between two moves.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Watches the progress thread's sleeps for the sign of a shared CPU.
#[derive(Debug)]
pub struct ShareWatch {
    streak: u32,
    last_move: Option<Instant>,
    backoff: Duration,
}

impl Default for ShareWatch {
    fn default() -> Self {
        ShareWatch {
            streak: 0,
            last_move: None,
            backoff: MOVE_INTERVAL,
        }
    }
}

impl ShareWatch {
    /// Called when a blocking wait that began right after a spin ended because a
    /// connection became readable: `idle` is how long the thread had gone without work
    /// when it blocked, `window` the longest spin window (the sign needs a whole one spun
    /// for nothing: a shorter window means the last gaps were short, and they are what
    /// sizes it), `slept` how long it blocked, `now` the time of waking. Returns whether
    /// the thread should move to another CPU now (and records the move).
    pub fn after_wake(&mut self, idle: Duration, window: Duration, slept: Duration, now: Instant) -> bool {
        if window.is_zero() || idle < window || slept >= SHORT_SLEEP {
            self.streak = 0;
            return false;
        }
        self.streak += 1;
        if self.streak < STREAK {
            return false;
        }
        let since = self.last_move.map(|at| now.saturating_duration_since(at));
        if since.is_some_and(|s| s < self.backoff) {
            return false;
        }
        self.backoff = match since {
            Some(s) if s < self.backoff * 4 => (self.backoff * 2).min(MAX_BACKOFF),
            _ => MOVE_INTERVAL,
        };
        self.last_move = Some(now);
        self.streak = 0;
        true
    }
}

/// Moves the calling thread to another CPU of its affinity mask and leaves the mask as it
/// was: narrowing the mask to exclude the CPU the thread runs on migrates it at once
/// (`man 2 sched_setaffinity`); the mask is then restored. Returns whether it moved
/// (false when the mask holds one CPU, or a call failed).
pub fn move_off_this_cpu() -> bool {
    let Ok(mask) = sched_getaffinity(None) else {
        return false;
    };
    let cpu = sched_getcpu();
    if cpu >= CpuSet::MAX_CPU || mask.count() < 2 || !mask.is_set(cpu) {
        return false;
    }
    let mut others = mask;
    others.unset(cpu);
    let moved = sched_setaffinity(None, &others).is_ok();
    // The mask the thread had is a valid one: it ran under it.
    if let Err(e) = sched_setaffinity(None, &mask) {
        // Only if the allowed CPUs changed meanwhile (a cpuset): the thread keeps the
        // narrower mask, a subset of what it was allowed.
        tracing::warn!("cannot restore the progress thread's CPU affinity: {e}");
    }
    tracing::debug!(from = cpu, moved, "progress thread moved off a shared CPU");
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_micros(200);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Feeds `n` sleeps with the sign at `at`; returns how many of them moved.
    fn signs(w: &mut ShareWatch, n: u32, at: Instant) -> u32 {
        (0..n)
            .map(|_| w.after_wake(us(210), WINDOW, us(5), at) as u32)
            .sum()
    }

    #[test]
    fn three_quick_wakes_in_a_row_after_whole_empty_windows_move() {
        let mut w = ShareWatch::default();
        let t0 = Instant::now();
        assert!(!w.after_wake(us(210), WINDOW, us(5), t0));
        assert!(!w.after_wake(us(210), WINDOW, us(5), t0));
        assert!(w.after_wake(us(210), WINDOW, us(5), t0));
        // A sleep without the sign starts the count again.
        assert_eq!(signs(&mut w, 2, t0 + MOVE_INTERVAL), 0);
        assert!(!w.after_wake(us(210), WINDOW, SHORT_SLEEP, t0 + MOVE_INTERVAL));
        assert_eq!(signs(&mut w, 2, t0 + MOVE_INTERVAL), 0);
    }

    #[test]
    fn long_sleeps_short_windows_and_no_spin_do_not_move() {
        let mut w = ShareWatch::default();
        let t0 = Instant::now();
        for _ in 0..10 {
            // The peer simply took its time.
            assert!(!w.after_wake(us(210), WINDOW, SHORT_SLEEP, t0));
            // Woken before a whole window went by: the gaps are shorter than it.
            assert!(!w.after_wake(us(150), WINDOW, us(5), t0));
            // No spin window at all.
            assert!(!w.after_wake(us(210), Duration::ZERO, us(5), t0));
        }
    }

    #[test]
    fn moves_that_do_not_help_come_ever_more_rarely() {
        let mut w = ShareWatch::default();
        let t0 = Instant::now();
        assert_eq!(signs(&mut w, 3, t0), 1);
        // The sign goes on: within the interval, nothing; then one move, and the
        // interval doubles because the sign came back soon.
        assert_eq!(signs(&mut w, 9, t0 + MOVE_INTERVAL / 2), 0);
        assert_eq!(signs(&mut w, 3, t0 + MOVE_INTERVAL), 1);
        assert_eq!(signs(&mut w, 9, t0 + MOVE_INTERVAL * 2), 0);
        assert_eq!(signs(&mut w, 3, t0 + MOVE_INTERVAL * 3), 1);
        // After a long quiet time the interval is back at its shortest.
        let later = t0 + MOVE_INTERVAL * 100;
        assert_eq!(signs(&mut w, 3, later), 1);
        assert_eq!(signs(&mut w, 3, later + MOVE_INTERVAL), 1);
        // A sign that comes back as soon as a move is allowed doubles the wait, up to the
        // longest and no further.
        let mut at = later + MOVE_INTERVAL;
        let mut wait = MOVE_INTERVAL * 2;
        for _ in 0..15 {
            assert_eq!(signs(&mut w, 3, at + wait - us(1)), 0, "before {wait:?}");
            at += wait;
            assert_eq!(signs(&mut w, 3, at), 1, "after {wait:?}");
            wait = (wait * 2).min(MAX_BACKOFF);
        }
        assert_eq!(wait, MAX_BACKOFF);
    }

    #[test]
    fn moving_keeps_the_mask_and_needs_a_second_cpu() {
        // In a thread of its own: the test changes its affinity.
        std::thread::spawn(|| {
            let before = sched_getaffinity(None).unwrap();
            assert_eq!(move_off_this_cpu(), before.count() >= 2);
            assert!(sched_getaffinity(None).unwrap() == before, "the mask is restored");

            // Pinned to one CPU, the thread cannot move and stays pinned.
            let mut one = CpuSet::new();
            one.set(sched_getcpu());
            sched_setaffinity(None, &one).unwrap();
            assert!(!move_off_this_cpu());
            assert!(sched_getaffinity(None).unwrap() == one);
        })
        .join()
        .unwrap();
    }
}
