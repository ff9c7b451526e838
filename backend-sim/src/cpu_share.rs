//! Keeps the progress thread from sharing a CPU with the thread it waits for.
//!
//! A socket wake-up (`sock_def_readable`, a synchronous wake-up) lets the kernel place the
//! woken thread on the waker's CPU, and once the woken thread last ran there too and the
//! scheduler finds the cache busy (Linux's `SIS_UTIL`: on a 2-CPU machine one busy-polling
//! thread is enough), it does not look for an idle CPU. So a progress thread woken by a
//! busy-polling application thread of another process (a requester posting small WRITEs,
//! READs or atomics with a shallow send queue) can stay on that thread's CPU while the
//! other CPU idles. Then each spin window of the progress thread starves the very thread
//! whose next request it waits for: the request comes only after the window is over and
//! the thread has blocked, a few microseconds later, and every round trip costs a spin
//! window (about 200 µs) instead of a few microseconds. Measured on a 2-CPU VM, `perf
//! write_bw -s 64 -n 2000 -t 16`: about one run in ten ran at 0.07 M messages/s instead
//! of 1.3 M.
//!
//! The sign is cheap to see from the progress thread alone: it spun a whole window
//! without work, blocked, and was woken by a connection almost at once
//! ([`ShareWatch::after_wake`]). Then it moves itself to another CPU it may run on
//! ([`move_off_this_cpu`]: `man 2 sched_setaffinity`), keeping its affinity mask, and
//! later wake-ups find it there (a wake-up prefers the woken thread's last CPU when that
//! one is idle).

use std::time::{Duration, Instant};

/// A sleep shorter than this, after a spin window that found nothing, means the thread
/// that woke the progress thread could not run while it spun.
pub const SHORT_SLEEP: Duration = Duration::from_micros(25);
/// At most one move per this interval: when every CPU is busy, moving does not help, and
/// each move costs a migration.
pub const MOVE_INTERVAL: Duration = Duration::from_millis(1);

/// Watches the progress thread's sleeps for the sign of a shared CPU.
#[derive(Debug, Default)]
pub struct ShareWatch {
    last_move: Option<Instant>,
}

impl ShareWatch {
    /// Called when a blocking wait ended because a connection became readable: `idle` is
    /// how long the thread had gone without work when it blocked (its spin window, if
    /// `idle >= min_spin`), `slept` how long it blocked, `now` the time of waking.
    /// Returns whether the thread should move to another CPU (and records the move).
    pub fn after_wake(&mut self, idle: Duration, min_spin: Duration, slept: Duration, now: Instant) -> bool {
        let spun_empty = !min_spin.is_zero() && idle >= min_spin;
        let recent = self
            .last_move
            .is_some_and(|at| now.saturating_duration_since(at) < MOVE_INTERVAL);
        if spun_empty && slept < SHORT_SLEEP && !recent {
            self.last_move = Some(now);
            true
        } else {
            false
        }
    }
}

/// Moves the calling thread to another CPU of its affinity mask and leaves the mask as it
/// was: narrowing the mask to exclude the CPU the thread runs on migrates it at once
/// (`man 2 sched_setaffinity`); the mask is then restored. Returns whether it moved
/// (false when the mask holds one CPU, or a call failed).
pub fn move_off_this_cpu() -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `cpu_set_t` is plain bits; all-zero is the empty set.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: writes one `cpu_set_t` of `size` bytes into a live local.
    if unsafe { libc::sched_getaffinity(0, size, &mut mask) } != 0 {
        return false;
    }
    // SAFETY: no arguments; returns the CPU or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    let Ok(cpu) = usize::try_from(cpu) else {
        return false;
    };
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: the libc macros read and write a live `cpu_set_t`; `cpu` is below
    // `CPU_SETSIZE` (checked above).
    let others = unsafe {
        if libc::CPU_COUNT(&mask) < 2 || !libc::CPU_ISSET(cpu, &mask) {
            return false;
        }
        let mut others = mask;
        libc::CPU_CLR(cpu, &mut others);
        others
    };
    // SAFETY: reads `size` bytes of a live `cpu_set_t`.
    let moved = unsafe { libc::sched_setaffinity(0, size, &others) } == 0;
    // SAFETY: as above. The mask the thread had is a valid one: it ran under it.
    unsafe { libc::sched_setaffinity(0, size, &mask) };
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: Duration = Duration::from_micros(50);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_quick_wake_after_an_empty_spin_moves_once_per_interval() {
        let mut w = ShareWatch::default();
        let t0 = Instant::now();
        assert!(w.after_wake(us(200), SPIN, us(5), t0));
        assert!(!w.after_wake(us(200), SPIN, us(5), t0 + MOVE_INTERVAL / 2));
        assert!(w.after_wake(us(200), SPIN, us(5), t0 + MOVE_INTERVAL));
    }

    #[test]
    fn long_sleeps_short_spins_and_no_spin_do_not_move() {
        let mut w = ShareWatch::default();
        let t0 = Instant::now();
        // The peer simply took its time.
        assert!(!w.after_wake(us(200), SPIN, SHORT_SLEEP, t0));
        // Woken soon after work, without having spun a window: a plain stream.
        assert!(!w.after_wake(us(49), SPIN, us(5), t0));
        // With spinning off, every sleep follows work at once.
        assert!(!w.after_wake(us(200), Duration::ZERO, us(5), t0));
    }

    fn mask_of_this_thread() -> libc::cpu_set_t {
        // SAFETY: as in `move_off_this_cpu`.
        let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: writes one `cpu_set_t` into a live local.
        assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut mask) }, 0);
        mask
    }

    #[test]
    fn moving_keeps_the_mask_and_needs_a_second_cpu() {
        // In a thread of its own: the test changes its affinity.
        std::thread::spawn(|| {
            let before = mask_of_this_thread();
            // SAFETY: reads a live `cpu_set_t`.
            let cpus = unsafe { libc::CPU_COUNT(&before) };
            assert_eq!(move_off_this_cpu(), cpus >= 2);
            // SAFETY: reads two live `cpu_set_t`s.
            assert!(
                unsafe { libc::CPU_EQUAL(&mask_of_this_thread(), &before) },
                "the mask is restored"
            );

            // Pinned to one CPU, the thread cannot move and stays pinned.
            // SAFETY: no arguments.
            let cpu = unsafe { libc::sched_getcpu() } as usize;
            // SAFETY: as in `move_off_this_cpu`.
            let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `cpu` is a CPU the thread runs on, below `CPU_SETSIZE`.
            unsafe { libc::CPU_SET(cpu, &mut one) };
            let size = std::mem::size_of::<libc::cpu_set_t>();
            // SAFETY: reads a live `cpu_set_t`.
            assert_eq!(unsafe { libc::sched_setaffinity(0, size, &one) }, 0);
            assert!(!move_off_this_cpu());
            // SAFETY: reads two live `cpu_set_t`s.
            assert!(unsafe { libc::CPU_EQUAL(&mask_of_this_thread(), &one) });
        })
        .join()
        .unwrap();
    }
}
