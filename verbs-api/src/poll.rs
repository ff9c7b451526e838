//! Waiting for completions with a bound: the loop every verbs program writes around
//! `ibv_poll_cq`. Polls, spins briefly, then yields the CPU, and gives up at a deadline so
//! that a lost completion shows up as an error instead of a hang.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::traits::CompletionQueue;
use crate::wc::WorkCompletion;

/// Polls `cq` until `n` completions have arrived or `timeout` passes; returns them in
/// order. On timeout the error says how many arrived.
pub fn poll_n(cq: &impl CompletionQueue, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
    let mut out = Vec::with_capacity(n);
    let mut buf = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + timeout;
    let mut idle = 0u32;
    // On a virtual clock every empty poll is a step of the device: no back-off, which
    // would cost wall time per step; the wall-clock deadline is still read now and then.
    let backoff = !cq.empty_poll_moves_time();
    while out.len() < n {
        let want = (n - out.len()).min(buf.len());
        let got = cq.poll(&mut buf[..want])?;
        if got > 0 {
            out.extend_from_slice(&buf[..got]);
            idle = 0;
            continue;
        }
        idle += 1;
        if !backoff {
            if idle % 1024 == 0 && Instant::now() >= deadline {
                return Err(timed_out(timeout, n, &out));
            }
            continue;
        }
        if idle > 64 {
            if Instant::now() >= deadline {
                return Err(timed_out(timeout, n, &out));
            }
            if idle > 1024 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(out)
}

/// The error of a [`poll_n`] whose `timeout` passed with only `out` of `n` arrived.
fn timed_out(timeout: Duration, n: usize, out: &[WorkCompletion]) -> Error {
    Error::timeout(
        timeout,
        format!(
            "{} of {n} completions arrived ({:?})",
            out.len(),
            out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>()
        ),
    )
}

/// Polls `cq` once more after waiting `quiet` and returns whatever is there (used to
/// check that *no* completion arrives).
pub fn poll_quiet(cq: &impl CompletionQueue, quiet: Duration) -> Result<Vec<WorkCompletion>> {
    std::thread::sleep(quiet);
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    loop {
        let got = cq.poll(&mut buf)?;
        out.extend_from_slice(&buf[..got]);
        if got < buf.len() {
            return Ok(out);
        }
    }
}
