//! perftest's clock: the CPU's cycle counter (`get_cycles()`, the `rdtsc` instruction on
//! x86-64) and its rate in MHz chosen as perftest's `get_cpu_mhz()` chooses it.
//!
//! `perf --perftest` stamps its iterations with this clock rather than with
//! [`std::time::Instant`]: reading the counter is one unprivileged instruction, while
//! `clock_gettime` on a machine whose clock source is not the TSC (a VM on HPET, for
//! one) is a system call that reads a device register, several microseconds under
//! emulation. Timestamps of the same cost as perftest's are what makes the two tools'
//! figures comparable.
//!
//! The rate: perftest samples the counter against `gettimeofday` over a few short
//! intervals and reads "cpu MHz" from `/proc/cpuinfo`; it uses the latter unless the two
//! differ by more than 2%. [`cpu_mhz`] does the same (the sample over 10 ms with the
//! monotonic clock). On other architectures the counter is the monotonic clock in
//! nanoseconds and the rate 1000 "cycles" per microsecond.

use std::time::{Duration, Instant};

/// A reading of the cycle counter.
pub type Cycles = u64;

/// The cycle counter now (perftest's `get_cycles()`).
#[inline(always)]
pub fn now() -> Cycles {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` has no preconditions; every x86-64 CPU has it and user space
        // may execute it unless the kernel set CR4.TSD, which Linux does only for
        // processes that asked for it (prctl PR_SET_TSC).
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        fallback_ns()
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn fallback_ns() -> Cycles {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Counter ticks per microsecond, chosen as perftest's `get_cpu_mhz()` does (see the
/// module docs).
pub fn cpu_mhz() -> f64 {
    if !cfg!(target_arch = "x86_64") {
        return 1000.0;
    }
    let sample = sample_mhz();
    match proc_mhz() {
        Some(p) if p > 0.0 && ((p - sample).abs() / p) <= 0.02 => p,
        _ => sample,
    }
}

/// The counter's rate measured against the monotonic clock: the median of three 10 ms
/// intervals.
fn sample_mhz() -> f64 {
    let mut r: Vec<f64> = (0..3)
        .map(|_| {
            let (t0, c0) = (Instant::now(), now());
            while t0.elapsed() < Duration::from_millis(10) {
                std::hint::spin_loop();
            }
            let (c1, dt) = (now(), t0.elapsed());
            c1.wrapping_sub(c0) as f64 / (dt.as_nanos() as f64 / 1000.0)
        })
        .collect();
    r.sort_by(f64::total_cmp);
    r[1]
}

/// The first "cpu MHz" of `/proc/cpuinfo`, if any.
fn proc_mhz() -> Option<f64> {
    parse_proc_mhz(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
}

fn parse_proc_mhz(cpuinfo: &str) -> Option<f64> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "cpu MHz").then(|| v.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_cpu_mhz_line() {
        let s =
            "processor\t: 0\nmodel name\t: X\ncpu MHz\t\t: 2995.123\n\nprocessor\t: 1\ncpu MHz\t\t: 1200.0\n";
        assert_eq!(parse_proc_mhz(s), Some(2995.123));
        assert_eq!(parse_proc_mhz("processor : 0\n"), None);
    }

    #[test]
    fn the_counter_advances_at_the_rate_found() {
        let mhz = cpu_mhz();
        assert!(mhz > 1.0, "{mhz}");
        let (c0, t0) = (now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let us = (now() - c0) as f64 / mhz;
        let real = t0.elapsed().as_secs_f64() * 1e6;
        // loose: the point is the unit (ticks per microsecond), not the precision
        assert!(
            us > real * 0.5 && us < real * 2.0,
            "{us} us by the counter, {real} us by the clock"
        );
    }
}
