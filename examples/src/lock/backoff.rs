//! How a dist-lock client waits between two attempts: a pseudo-random number for
//! randomized backoff ([`xorshift`]) and a pause that leaves the CPU to the others
//! ([`backoff`]).

use std::time::{Duration, Instant};

/// Waits about `us` microseconds without hogging the CPU (yield below 50 us: on a
/// 2-core machine spinning starves the lock holder).
pub fn backoff(us: u64) {
    if us >= 50 {
        std::thread::sleep(Duration::from_micros(us));
    } else {
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(us) {
            std::thread::yield_now();
        }
    }
}

/// The next number of a xorshift64 sequence in `s` (which must not be 0).
pub fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}
