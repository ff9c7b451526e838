//! Bounded waiting: every loop that waits for a completion, for a byte in memory or for
//! a peer goes through a [`Waiter`], which spins briefly, then yields the CPU, then
//! sleeps in short naps, and fails with a clear error once nothing has happened for the
//! whole timeout. A lost completion therefore becomes an error, never a hang.
//!
//! The spin / yield / nap ladder matters on small machines: on 2 cores a pure busy-poll
//! starves the sim's progress threads (and the peer process) and collapses into
//! scheduler-tick stalls; pure blocking pays a wake-up per message.

use std::time::{Duration, Instant};

use verbs_api::{CompletionQueue, WorkCompletion};

use crate::Res;

/// Polls before the first clock read.
const SPINS: u32 = 64;
/// Idle time after which the waiter naps instead of yielding.
const YIELD_FOR: Duration = Duration::from_millis(2);
/// One nap.
const NAP: Duration = Duration::from_micros(50);

/// A bounded wait for progress. Call [`Waiter::idle`] each time a check found nothing
/// and [`Waiter::progress`] each time it found something: the timeout counts from the
/// last progress.
#[derive(Debug)]
pub struct Waiter {
    timeout: Duration,
    idle: u32,
    since: Option<Instant>,
    /// Whether long waits nap (else they keep yielding).
    naps: bool,
}

impl Waiter {
    /// A waiter that gives up after `timeout` without progress.
    pub fn new(timeout: Duration) -> Self {
        Waiter {
            timeout,
            idle: 0,
            since: None,
            naps: true,
        }
    }

    /// A waiter that never naps, only spins and yields: for a loop that always has work
    /// outstanding and must keep driving it, as a bandwidth test with its send queue
    /// full does (perftest busy-polls there too). A nap would leave the device's
    /// connection unserviced and hand it to the progress thread and back.
    pub fn busy(timeout: Duration) -> Self {
        Waiter {
            naps: false,
            ..Waiter::new(timeout)
        }
    }

    /// Something happened: restart the clock (lazily: no clock read here).
    #[inline]
    pub fn progress(&mut self) {
        self.idle = 0;
        self.since = None;
    }

    /// Nothing happened: spin, yield or nap, or fail with "timed out ... waiting for
    /// `what`" once the timeout has passed since the last progress.
    #[inline]
    pub fn idle(&mut self, what: &dyn Fn() -> String) -> Res<()> {
        self.idle += 1;
        if self.idle < SPINS {
            std::hint::spin_loop();
            return Ok(());
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        let waited = now - since;
        if waited >= self.timeout {
            anyhow::bail!(
                "timed out after {:.1} s waiting for {} (nothing arrived: a lost completion or a dead peer)",
                self.timeout.as_secs_f64(),
                what()
            );
        }
        if waited < YIELD_FOR || !self.naps {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
        Ok(())
    }
}

/// Polls `cq` until at least one completion is in `buf` (returns how many), or fails after
/// `timeout` without one. `what` names what is awaited, for the error message.
pub fn poll_some<C: CompletionQueue>(
    cq: &C,
    buf: &mut [WorkCompletion],
    timeout: Duration,
    what: &dyn Fn() -> String,
) -> Res<usize> {
    let mut w = Waiter::new(timeout);
    loop {
        let n = cq.poll(buf)?;
        if n > 0 {
            return Ok(n);
        }
        w.idle(what)?;
    }
}

/// Polls `cq` for exactly one completion and returns it.
pub fn poll_one<C: CompletionQueue>(
    cq: &C,
    timeout: Duration,
    what: &dyn Fn() -> String,
) -> Res<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    poll_some(cq, &mut wc, timeout, what)?;
    Ok(wc[0])
}

/// Polls `cq` for exactly one completion and fails unless it succeeded.
pub fn poll_one_ok<C: CompletionQueue>(
    cq: &C,
    timeout: Duration,
    what: &dyn Fn() -> String,
) -> Res<WorkCompletion> {
    let wc = poll_one(cq, timeout, what)?;
    check_wc(&wc, what)?;
    Ok(wc)
}

/// Collects what is left on `cq` (the flushed WRs of a QP in ERR, say) until nothing
/// has come for `quiet`, for at most `limit`; `each` sees every completion.
pub fn drain<C: CompletionQueue>(
    cq: &C,
    quiet: Duration,
    limit: Duration,
    mut each: impl FnMut(&WorkCompletion),
) -> Res<()> {
    let mut wcs = [WorkCompletion::default(); 32];
    let mut w = Waiter::new(quiet);
    let hard = Instant::now() + limit;
    while Instant::now() < hard {
        let n = cq.poll(&mut wcs)?;
        if n == 0 {
            if w.idle(&String::new).is_err() {
                break;
            }
            continue;
        }
        w.progress();
        for wc in &wcs[..n] {
            each(wc);
        }
    }
    Ok(())
}

/// Fails with the status (`ibv_wc_status_str` text and number) of an unsuccessful
/// completion.
pub fn check_wc(wc: &WorkCompletion, what: &dyn Fn() -> String) -> Res<()> {
    if wc.is_ok() {
        Ok(())
    } else {
        anyhow::bail!(
            "{} completed with {} ({}, wr_id {:#x}, vendor_err {:#x})",
            what(),
            status_name(wc.status),
            wc.status.as_str(),
            wc.wr_id,
            wc.vendor_err
        )
    }
}

/// libibverbs' constant name of a completion status (`IBV_WC_RNR_RETRY_EXC_ERR`, ...).
pub fn status_name(s: verbs_api::WcStatus) -> &'static str {
    use verbs_api::WcStatus as S;
    match s {
        S::Success => "IBV_WC_SUCCESS",
        S::LocLenErr => "IBV_WC_LOC_LEN_ERR",
        S::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
        S::LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
        S::LocProtErr => "IBV_WC_LOC_PROT_ERR",
        S::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
        S::MwBindErr => "IBV_WC_MW_BIND_ERR",
        S::BadRespErr => "IBV_WC_BAD_RESP_ERR",
        S::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
        S::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
        S::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
        S::RemOpErr => "IBV_WC_REM_OP_ERR",
        S::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
        S::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
        S::LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
        S::RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
        S::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
        S::InvEecnErr => "IBV_WC_INV_EECN_ERR",
        S::InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
        S::FatalErr => "IBV_WC_FATAL_ERR",
        S::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
        S::GeneralErr => "IBV_WC_GENERAL_ERR",
        S::TmErr => "IBV_WC_TM_ERR",
        S::TmRndvIncomplete => "IBV_WC_TM_RNDV_INCOMPLETE",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiter_times_out() {
        let mut w = Waiter::new(Duration::from_millis(20));
        let t = Instant::now();
        let e = loop {
            if let Err(e) = w.idle(&|| "nothing".into()) {
                break e;
            }
        };
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert!(e.to_string().contains("waiting for nothing"), "{e}");
    }
}
