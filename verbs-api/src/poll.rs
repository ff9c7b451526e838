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
    while out.len() < n {
        let want = (n - out.len()).min(buf.len());
        let got = cq.poll(&mut buf[..want])?;
        if got > 0 {
            out.extend_from_slice(&buf[..got]);
            idle = 0;
            continue;
        }
        idle += 1;
        if idle > 64 {
            if Instant::now() >= deadline {
                return Err(Error::timeout(
                    timeout,
                    format!(
                        "{} of {n} completions arrived ({:?})",
                        out.len(),
                        out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>()
                    ),
                ));
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
