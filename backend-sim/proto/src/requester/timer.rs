//! Time and the link: the local ACK timer and its `retry_cnt`, the RNR wait, a
//! connection under way or lost, and the flush and reset a QP in ERR or RESET does
//! (IBA 9.7.6, 10.3.1).

use super::*;

impl Requester {
    /// The earliest time at which [`Requester::on_timer`] has work.
    pub fn next_deadline(&self) -> Option<Instant> {
        [self.rnr_wait, self.ack_deadline, self.link_wait]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether the local ACK timer's deadline has passed at `now` ([`Requester::on_timer`]
    /// has a timeout to look at).
    pub fn ack_deadline_passed(&self, now: Instant) -> bool {
        self.ack_deadline.is_some_and(|d| now >= d)
    }

    /// Timers: the RNR wait ends (sending resumes in `poll_transmit`), or the ACK timeout
    /// fires (rewind and resend, or `IBV_WC_RETRY_EXC_ERR` when retries are used up).
    /// Returns whether either happened, i.e. whether there is something to send now; a
    /// deadline that only moved (bytes left since it was set) is not.
    ///
    /// `last_tx` is when bytes last left for the peer. The timeout counts from the later
    /// of the last acknowledged progress and the last transmission, as rxe restarts its
    /// retransmit timer with every request packet it sends (`rxe_req.c`): a message
    /// still leaving (a 1 GiB window of 8 MiB WRITEs takes a quarter second to write on
    /// loopback) is not lost, and resending it would only queue it twice.
    ///
    /// `last_rx` is when bytes last arrived from the peer (the driver passes `now` while
    /// bytes it sent wait unread on this side), and the timeout counts from it too. The
    /// stream is ordered and frames are whole messages, so the answer the requester
    /// waits for may come after the rest of a message the peer is sending (an HCA
    /// interleaves its ACKs with the packets of its own messages): while bytes keep
    /// arriving, nothing has been lost. The same goes for a READ response's own payload:
    /// a large response still arriving is no lost request. If the payload stops for a
    /// whole timeout, the READ is not resent (its answer could only come after the rest
    /// of this payload, on the same ordered stream), but the timeout counts against
    /// `retry_cnt` all the same, so a peer that stops mid-payload still ends in
    /// `IBV_WC_RETRY_EXC_ERR`.
    pub fn on_timer(
        &mut self,
        now: Instant,
        last_tx: Option<Instant>,
        last_rx: Option<Instant>,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<bool, Fatal> {
        self.link_wait_over(now, out);
        let mut fired = false;
        if self.rnr_wait.is_some_and(|t| now >= t) {
            self.end_rnr_wait();
            fired = true;
        }
        let last_io = last_tx.max(last_rx);
        if let (Some(d), Some(t), Some(timeout)) = (self.ack_deadline, last_io, self.attrs.timeout) {
            if now >= d && t + timeout > now && t + timeout > d {
                self.ack_deadline = Some(t + timeout);
            }
        }
        if let Some(d) = self.ack_deadline {
            if now >= d {
                // Re-armed by the next send, or by the next failed connection attempt.
                self.ack_deadline = None;
                if let Some(i) = self.sq.iter().position(|w| w.status.is_none()) {
                    if self.link_setup.is_some_and(|t| now < t) {
                        tracing::debug!(
                            qpn = self.qpn,
                            dest_qpn = self.dest_qpn,
                            "local ACK timeout while the connection to the peer is set up: not counted"
                        );
                        self.ack_deadline = self.attrs.timeout.map(|t| now + t);
                        return Ok(fired);
                    }
                    self.ack_timeouts += 1;
                    if self.retry_left == 0 {
                        tracing::debug!(
                            qpn = self.qpn,
                            dest_qpn = self.dest_qpn,
                            "local ACK timeout, no retries left: IBV_WC_RETRY_EXC_ERR"
                        );
                        let i = self.oldest_unfinished().unwrap_or(i);
                        return self.fail(i, WcStatus::RetryExcErr, out).map(|_| true);
                    }
                    self.spend_retry();
                    if let Some(psn) = self.receiving {
                        tracing::debug!(
                            qpn = self.qpn,
                            dest_qpn = self.dest_qpn,
                            psn,
                            retries_left = self.retry_left,
                            "local ACK timeout while a READ response arrives: waiting for the rest"
                        );
                    } else {
                        self.rewind(i);
                        tracing::debug!(
                            qpn = self.qpn,
                            dest_qpn = self.dest_qpn,
                            psn = self.psn,
                            retries_left = self.retry_left,
                            "local ACK timeout: resending"
                        );
                        fired = true;
                    }
                    // The timer keeps running while anything is outstanding: a resend
                    // re-arms it anyway, but a requester that cannot resend (its
                    // connection is gone and the peer, not this side, would set it up
                    // again) must still give up after `retry_cnt`.
                    self.ack_deadline = self.attrs.timeout.map(|t| now + t);
                }
            }
        }
        Ok(fired)
    }

    /// The local ACK timeouts counted against `retry_cnt` since the last call (each
    /// spent a retry or ended in `IBV_WC_RETRY_EXC_ERR`): the device counts them, as an
    /// HCA's `local_ack_timeout_err`.
    pub fn take_ack_timeouts(&mut self) -> u64 {
        std::mem::take(&mut self.ack_timeouts)
    }

    /// One transport retry is used up, unless `retry_cnt` is 7 on a device that retries
    /// those for ever ([`Switches::retry_cnt_7_infinite`]).
    pub(super) fn spend_retry(&mut self) {
        if !(self.sw.retry_cnt_7_infinite && self.attrs.retry_cnt == 7) {
            self.retry_left -= 1;
        }
    }

    /// The transport lost everything in flight (the connection broke): resend from the
    /// oldest unacknowledged WQE once reconnected. The ACK timer keeps running, so a peer
    /// that stays away exhausts `retry_cnt`. (UC resends nothing: WRs whose frames were
    /// not written complete successfully, see [`Requester::take_done`].)
    pub fn on_connection_lost(&mut self) {
        if self.uc {
            return self.uc_connection_lost();
        }
        self.receiving = None;
        let deadline = self.ack_deadline;
        if let Some(i) = self
            .sq
            .iter()
            .take(self.next)
            .position(|w| w.sent && w.status.is_none())
        {
            self.rewind(i);
        }
        self.ack_deadline = deadline;
    }

    /// The transport starts (`Some(now)`) or ends (`None`) an attempt to connect to the
    /// peer. While one is under way, for at most [`LINK_SETUP_GRACE`], an ACK timeout
    /// re-arms the timer without using a retry: an HCA has no connection to set up, and
    /// the sim's hello and its check (a few milliseconds, far longer on a loaded machine)
    /// must not use up a small `retry_cnt` that the same program would not exhaust on
    /// the fabric. An attempt that fails ends the grace at once, so a peer that is gone
    /// or refuses still costs exactly `retry_cnt` timeouts.
    pub fn connecting(&mut self, now: Option<Instant>) {
        self.link_setup = now.map(|t| t + LINK_SETUP_GRACE);
    }

    /// Arms the ACK timer if unset (a connection attempt is outstanding).
    pub fn arm_timer(&mut self, now: Instant) {
        if self.ack_deadline.is_none() && self.has_unsent() {
            self.ack_deadline = self.attrs.timeout.map(|t| now + t);
        }
    }

    /// QP to ERR, or to SQE: every WQE not yet finished completes with
    /// `IBV_WC_WR_FLUSH_ERR` (those already finished keep their status), in order.
    pub fn flush(&mut self, out: &mut Vec<WorkCompletion>) {
        for w in self.sq.iter_mut() {
            if w.status.is_none() {
                w.status = Some(WcStatus::WrFlushErr);
            }
        }
        self.next = self.sq.len();
        self.retire(out);
        self.next = 0;
        self.started = 0;
        self.rnr_wait = None;
        self.end_rnr_run();
        self.ack_deadline = None;
        self.receiving = None;
        self.link_wait = None;
    }

    /// QP to RESET: the queue is emptied without completions, and every slot is free.
    pub fn reset(&mut self) {
        self.retired += self.sq.len() as u64;
        self.slots.release_through(self.retired);
        self.early = 0;
        self.marks.clear();
        while let Some(mut w) = self.sq.pop_front() {
            w.local.clear();
            self.spare.push(w);
        }
        self.next = 0;
        self.started = 0;
        self.rd_inflight = 0;
        self.rnr_wait = None;
        self.end_rnr_run();
        self.ack_deadline = None;
        self.receiving = None;
        self.draining = false;
        self.link_wait = None;
    }
}
