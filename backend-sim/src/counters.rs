//! A device's counters of what its responders dropped without a completion or a NAK to
//! say so: messages an unreliable (UC) QP dropped, and the PSN gaps it met (IBA 9.8.3:
//! a UC responder drops what it cannot execute and tells nobody). Like an HCA's hardware
//! counters (rxe's `hw_counters`, `rdma statistic`), they are the one place such a loss
//! shows; each drop is also a debug event naming the QP and why.

use std::sync::atomic::{AtomicU64, Ordering};

/// The live counters, updated by the QPs.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    uc_dropped: AtomicU64,
    uc_psn_gaps: AtomicU64,
}

impl DeviceCounters {
    /// Adds what one QP's responder counted.
    pub fn add_uc(&self, dropped: u64, gaps: u64) {
        if dropped > 0 {
            self.uc_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        if gaps > 0 {
            self.uc_psn_gaps.fetch_add(gaps, Ordering::Relaxed);
        }
    }

    /// A snapshot.
    pub fn snapshot(&self) -> Counters {
        Counters {
            uc_dropped: self.uc_dropped.load(Ordering::Relaxed),
            uc_psn_gaps: self.uc_psn_gaps.load(Ordering::Relaxed),
        }
    }
}

/// What a device's responders dropped silently (a snapshot, from
/// [`SimContext::counters`](crate::SimContext::counters)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Messages a UC QP dropped: no receive posted, a failed remote access check (rkey,
    /// PD, access flags, bounds), a receive too short (which also completes it with
    /// `IBV_WC_LOC_LEN_ERR`), an operation UC does not have, fault injection's forced
    /// RNR, or a connection that broke in the middle of the payload.
    pub uc_dropped: u64,
    /// Times a UC QP received a message whose PSN was not the one it expected: messages
    /// before it were lost on the way (the one that came is received).
    pub uc_psn_gaps: u64,
}
