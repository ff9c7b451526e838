//! What dist-lock prints: the server's figures and its final line ([`FINAL`]), a client
//! process's summary over its threads and its read-back line ([`READ_BACK`]), and how
//! the demo reads both back ([`final_counter`], [`read_back`]).

use std::time::Duration;

use super::opts::{ClientTuning, Mode};
use crate::stats::{per_sec, si, Latencies};

/// The start of the line the server ends with (`final: counter=... lock=... ...`).
pub const FINAL: &str = "final:";
/// The start of a client process's read-back line.
pub const READ_BACK: &str = "client: counter read back with RDMA READ after this process's last release: ";

/// One client thread's result.
#[derive(Debug, Default)]
pub struct ThreadReport {
    /// Lock acquisitions (counter increments).
    pub acquisitions: u64,
    /// Time from the first attempt to the lock being held, per acquisition.
    pub lat: Latencies,
    /// CAS attempts that found the lock taken, or now-serving polls that were not my turn.
    pub contended: u64,
    /// How long the thread's acquisitions took in all.
    pub elapsed: Duration,
    /// The counter read back with RDMA READ after this thread's last release.
    pub counter_after: u64,
}

/// Prints the server's figures (`counter` increments in `elapsed`) and its final line
/// with the four words of the lock region.
pub fn print_server(elapsed: Duration, lock: u64, next: u64, serving: u64, counter: u64) {
    println!(
        "server: {counter} increments in {:.3} s: {}acquisitions/s across all clients",
        elapsed.as_secs_f64(),
        si(per_sec(counter as f64, elapsed))
    );
    println!("{FINAL} counter={counter} lock={lock} next_ticket={next} now_serving={serving}");
}

/// Prints a client process's summary over its threads `reps` and its read-back line.
pub fn print_clients(reps: &[ThreadReport], t: &ClientTuning) {
    let mut all = Latencies::default();
    let (mut acq, mut contended) = (0u64, 0u64);
    let mut busy = Duration::ZERO;
    for r in reps {
        all.merge(&r.lat);
        acq += r.acquisitions;
        contended += r.contended;
        busy = busy.max(r.elapsed);
    }
    let s = all.summary();
    let seen = reps.iter().map(|r| r.counter_after).max().unwrap_or(0);
    println!(
        "client ({} lock, {} threads x {} iters): {acq} acquisitions in {:.3} s: {}acq/s; acquire latency p50 {:.1} us, p99 {:.1} us (max {:.1} us); {} {}",
        t.mode.as_str(),
        reps.len(),
        t.iters,
        busy.as_secs_f64(),
        si(per_sec(acq as f64, busy)),
        s.p50_us,
        s.p99_us,
        s.max_us,
        contended,
        match t.mode {
            Mode::Cas => "CAS attempts found the lock taken",
            Mode::Ticket => "now-serving READs were not yet my turn",
        }
    );
    println!("{READ_BACK}{seen} (this process added {acq}; other processes may add more)");
}

/// The counter of the server's [`FINAL`] line.
pub fn final_counter(line: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("counter="))
        .and_then(|v| v.parse().ok())
}

/// The counter of a client's [`READ_BACK`] line.
pub fn read_back(line: &str) -> Option<u64> {
    line.strip_prefix(READ_BACK)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_reads_the_lines_back() {
        assert_eq!(
            final_counter("final: counter=200 lock=0 next_ticket=0 now_serving=0"),
            Some(200)
        );
        assert_eq!(final_counter("final: lock=0"), None);
        assert_eq!(
            read_back(&format!("{READ_BACK}42 (this process added 20; ...)")),
            Some(42)
        );
        assert_eq!(read_back("client: something else"), None);
    }
}
