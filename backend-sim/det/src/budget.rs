//! The virtual-time budget of a wait: how far the world may run while the program waits
//! and does nothing else (no post, no modify, no completion or event taken), and the
//! error that names what keeps the world busy when it would run past it.
//!
//! A world can stay busy for ever without the program's help: a requester behind a lost
//! fatal NAK resends to a responder that is in ERR and answers nothing, and with
//! `retry_cnt` 7 on a device that retries those without end (rxe, see
//! `Switches::retry_cnt_7_infinite`), or with `rnr_retry` 7 (IBA 9.7.5.2.8: infinite)
//! against a receive queue nobody fills, no completion ever comes. A polling loop bounded
//! by the wall clock (`verbs_api::poll_n`) would then end after as many polls as the
//! machine made meanwhile, so its trace would depend on the machine's speed. The budget
//! ends such a wait at the same virtual time on every run instead: the wait fails with
//! [`verbs_api::Error::Timeout`] naming each QP that keeps a timer armed and why.

use std::fmt::Write as _;
use std::time::Duration;

use verbs_api::{Error, Result};

use crate::world::World;

/// How long a wait may run the world past the program's last step, by default: far
/// beyond any `retry_cnt` of 7 at the largest common local ACK timeouts (IBA timeout 18,
/// about 1 s, times 8 attempts) and any finite `rnr_retry`.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(60);

impl World {
    /// Moves the world to its next point in time for a wait of `what` (until `until` at
    /// the latest, see [`World::advance`]), unless that point lies beyond the budget
    /// counted from the program's last step: then the error saying what is stuck.
    pub(crate) fn wait_step(
        &mut self,
        what: impl FnOnce() -> String,
        until: Option<Duration>,
    ) -> Result<bool> {
        let horizon = self.last_step + self.budget;
        let bounded = until.is_some_and(|u| u <= horizon);
        if !bounded && self.next_event().is_some_and(|t| t > horizon) {
            return Err(self.stuck(&what()));
        }
        Ok(self.advance(until))
    }

    /// The error of a wait of `what` that ran out of budget.
    fn stuck(&self, what: &str) -> Error {
        let mut m = format!(
            "{what}: the deterministic world ran {:?} of virtual time (its budget, \
             `DetBuilder::budget`) since the program's last post, modify or completion \
             taken, and would run on: ",
            self.budget
        );
        let mut busy = 0;
        for (qpn, slot) in &self.qps {
            if slot.port.next_deadline().is_none() {
                continue;
            }
            busy += 1;
            let qp = &slot.port.qp;
            let a = qp.attr();
            let _ = write!(
                m,
                "QP {qpn:#x} ({:?}, {} WRs outstanding, next PSN {:#x}, timeout {}, retry_cnt {}, \
                 rnr_retry {}) keeps retrying",
                qp.state(),
                qp.sq_outstanding(),
                qp.sq_psn(),
                a.timeout,
                a.retry_cnt,
                a.rnr_retry
            );
            if a.retry_cnt == 7 && self.sw.retry_cnt_7_infinite {
                m.push_str(
                    ": retry_cnt 7 retries for ever on rxe (this world's profile): a lost \
                     fatal NAK or a responder in ERR is resent to without end; build the \
                     world with a profile whose retry_cnt 7 is seven retries \
                     (`DetBuilder::profile(Switches::PORTABLE)` or `MLX5`) or use retry_cnt \
                     6 or less",
                );
            } else if a.rnr_retry == 7 {
                m.push_str(
                    ": rnr_retry 7 retries RNR NAKs for ever (IBA 9.7.5.2.8): post the \
                     receive the peer waits for, or use rnr_retry 6 or less",
                );
            }
            m.push_str("; ");
        }
        if busy == 0 {
            let _ = write!(
                m,
                "{} frames in flight and no timer armed; ",
                self.net.in_flight()
            );
        }
        let _ = write!(
            m,
            "{} local ACK timeouts fired meanwhile; the completion waited for is not coming",
            self.net.stats.timeouts - self.timeouts_at_step
        );
        Error::timeout(self.budget, m)
    }
}
