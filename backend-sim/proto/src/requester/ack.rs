//! Responses: ACKs complete WQEs up to their PSN, READ and atomic responses complete
//! theirs, RNR NAKs rewind and wait `min_rnr_timer`, other NAKs fail the WQE with the
//! responder's reason; completions retire strictly in order (IBA 9.7.5.2, 9.7.5.2.8).

use super::*;
use crate::wire::PartKind;

/// Stores an atomic's original value into its WQE's scatter list `local` (8 bytes, as
/// far as the list holds them); false if a region there was deregistered meanwhile.
pub(super) fn store_orig(local: &[Seg], orig: u64) -> bool {
    let bytes = orig.to_ne_bytes();
    let mut written = 0;
    let mut stored = true;
    for s in local {
        let n = (8 - written).min(s.len);
        stored &= s.copy_in(0, &bytes[written..written + n]);
        written += n;
        if written == 8 {
            break;
        }
    }
    stored
}

impl Requester {
    /// Handles a response frame. For a READ response, returns where its payload goes.
    pub fn on_response(
        &mut self,
        frame: &Frame,
        now: Instant,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<ReadSink, Fatal> {
        match *frame {
            Frame::Ack { psn } => {
                // Acknowledges every SEND/WRITE up to `psn`.
                // (A message is acknowledged by its last packet's PSN.)
                let mut upto = self.sq.iter().take(self.next).rposition(|w| {
                    let last = psn::add(w.psn, w.pkts.max(1) - 1);
                    w.sent && psn::diff(last, psn) <= 0 && psn::diff(last, psn) > -(1 << 22)
                });
                if crate::plant::active(crate::plant::Plant::AckOffByOne) {
                    upto = upto.map(|i| (i + 1).min(self.next.saturating_sub(1)));
                }
                let mut progressed = self.ack_inside(upto.map_or(0, |i| i + 1), psn);
                if let Some(i) = upto {
                    progressed |= self.ack_through(i, true);
                }
                if progressed {
                    self.progress(now);
                }
                self.retire(out);
                Ok(ReadSink::Discard)
            }
            Frame::ReadResp { psn, len } => self.on_read_data(psn, len, true, now, out),
            Frame::Part {
                psn,
                len,
                kind: PartKind::ReadResp,
                last,
                ..
            } => self.on_read_data(psn, len, last, now, out),
            Frame::AtomicResp { psn, orig } => {
                let Some(i) = self.find_sent(psn) else {
                    return Ok(ReadSink::Discard);
                };
                if !self.sq[i].op.is_atomic() {
                    return self.fail(i, WcStatus::BadRespErr, out);
                }
                self.ack_through(i, false);
                if !store_orig(&self.sq[i].local, orig) {
                    // The local buffer was deregistered: the old value has nowhere to go.
                    return self.fail(i, WcStatus::LocProtErr, out);
                }
                self.sq[i].status = Some(WcStatus::Success);
                self.progress(now);
                self.retire(out);
                Ok(ReadSink::Discard)
            }
            Frame::Nak { psn, code, reason } => {
                let Some((i, off)) = self.containing(psn) else {
                    return Ok(ReadSink::Discard);
                };
                if let Some(j) = self.unanswered_before(i) {
                    // The responder got past a READ or atomic whose response has not
                    // come: the response was lost. Resend from it, as for a timeout
                    // (rxe's completer retries from the oldest WQE when a NAK's PSN is
                    // beyond it); the NAK, if it still holds, comes again.
                    return self.nak_retry(j, out);
                }
                // A NAK acknowledges everything before its PSN (IBA 9.7.5.1.2), packets of
                // its own message included: that is progress, which renews the retry
                // counts as an ACK's does.
                let inside = code == NakCode::PsnSeq && self.nak_inside(i, off);
                if self.ack_through(i, false) | inside {
                    self.progress(now);
                }
                match code {
                    NakCode::Rnr { timer } => {
                        self.note_rnr(psn, timer, now);
                        let planted = self.rnr_left == 1
                            && self.attrs.rnr_retry != RNR_RETRY_INFINITE
                            && crate::plant::active(crate::plant::Plant::RnrOffByOne);
                        if self.rnr_left == 0 || planted {
                            return self.fail(i, WcStatus::RnrRetryExcErr, out);
                        }
                        if self.attrs.rnr_retry != RNR_RETRY_INFINITE {
                            self.rnr_left -= 1;
                        }
                        self.rewind(i);
                        self.rnr_wait = Some(now + rnr_timer(timer));
                        self.retire(out);
                        Ok(ReadSink::Discard)
                    }
                    NakCode::PsnSeq => {
                        tracing::debug!(
                            qpn = self.qpn,
                            dest_qpn = self.dest_qpn,
                            psn,
                            retries_left = self.retry_left,
                            resending = !self.nak_retrying,
                            "PSN sequence error NAK: resending from the PSN the responder expects"
                        );
                        self.nak_retry(i, out)
                    }
                    NakCode::InvalidRequest | NakCode::RemoteAccess => {
                        // The responder's reason goes to `vendor_err` (0: none given).
                        self.sq[i].vendor_err = reason.map_or(0, NakReason::vendor_err);
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            _ => WcStatus::RemAccessErr,
                        };
                        self.fail(i, status, out)
                    }
                    NakCode::RemoteOperational => self.fail(i, WcStatus::RemOpErr, out),
                }
            }
            _ => Ok(ReadSink::Discard),
        }
    }

    /// The payload of the READ with `psn` has been written into `segs` (given back so the
    /// WQE keeps its buffers).
    pub fn read_done(&mut self, psn: u32, segs: Vec<Seg>, now: Instant, out: &mut Vec<WorkCompletion>) {
        self.receiving = None;
        if let Some(i) = self.find_sent(psn) {
            if !self.read_placed(i, segs) {
                self.progress(now);
                return;
            }
            self.sq[i].status = Some(WcStatus::Success);
            self.progress(now);
            self.retire(out);
        }
    }

    /// The payload of the READ with `psn` could not be stored: its local buffer was
    /// deregistered while the data arrived. The READ completes with `IBV_WC_LOC_PROT_ERR`
    /// (`Some(Fatal)`: the QP must go to ERR); `None` if no such READ is outstanding.
    pub fn read_lost(&mut self, psn: u32, segs: Vec<Seg>, out: &mut Vec<WorkCompletion>) -> Option<Fatal> {
        self.receiving = None;
        let i = self.find_sent(psn)?;
        self.read_unplaced(i, segs);
        self.fail(i, WcStatus::LocProtErr, out).err()
    }

    /// A NAK asks to resend from the WQE at `idx`: spends a retry and rewinds, unless a
    /// resend a NAK started is already under way (then nothing: the responder NAKs a
    /// sequence error once until the PSN it expects comes, so a second NAK for the same
    /// loss is a stale or duplicated copy; the timer covers a resend that is lost again).
    pub(super) fn nak_retry(&mut self, idx: usize, out: &mut Vec<WorkCompletion>) -> Result<ReadSink, Fatal> {
        if self.nak_retrying {
            return Ok(ReadSink::Discard);
        }
        if self.retry_left == 0 {
            return self.fail(idx, WcStatus::RetryExcErr, out);
        }
        self.spend_retry();
        self.rewind(idx);
        self.nak_retrying = true;
        self.retire(out);
        Ok(ReadSink::Discard)
    }

    /// The first READ or atomic before `idx` that was sent and is still waiting for its
    /// response.
    fn unanswered_before(&self, idx: usize) -> Option<usize> {
        self.sq
            .iter()
            .take(idx)
            .position(|w| w.sent && w.status.is_none() && w.op.is_read_or_atomic() && !w.executed())
    }

    /// Position in `sq` of the sent WQE with `psn`.
    fn find_sent(&self, psn: u32) -> Option<usize> {
        self.sq
            .iter()
            .take(self.next)
            .position(|w| w.sent && w.status.is_none() && w.psn == psn && !w.executed())
    }

    /// Marks every sent, unfinished SEND/WRITE (or notice of a placed READ or atomic)
    /// strictly before `idx` (or up to and including `idx` when `inclusive`) as
    /// successful. Returns whether anything changed.
    pub(super) fn ack_through(&mut self, idx: usize, inclusive: bool) -> bool {
        let end = if inclusive { idx + 1 } else { idx };
        let mut progressed = false;
        for w in self.sq.iter_mut().take(end) {
            if w.sent && w.status.is_none() && (!w.op.is_read_or_atomic() || w.placed) {
                w.status = Some(WcStatus::Success);
                progressed = true;
            }
        }
        progressed
    }

    pub(super) fn progress(&mut self, now: Instant) {
        self.nak_retrying = false;
        self.retry_left = self.attrs.retry_cnt;
        self.rnr_left = self.attrs.rnr_retry;
        self.end_rnr_run();
        let unacked = self
            .sq
            .iter()
            .take(self.next)
            .any(|w| w.sent && w.status.is_none());
        self.ack_deadline = if unacked {
            self.attrs.timeout.map(|t| now + t)
        } else {
            None
        };
    }

    /// Moves finished WQEs off the front of the queue, producing completions in order
    /// (none for a placed READ or atomic whose completion went early, which is then
    /// produced for those now at the front: [`direct`]).
    pub(super) fn retire(&mut self, out: &mut Vec<WorkCompletion>) {
        while let Some(w) = self.sq.front() {
            let Some(status) = w.status else { break };
            self.retired += 1;
            if (w.signaled || status != WcStatus::Success) && !w.reported {
                if self.sw.sq_slot_release == SlotRelease::AtPoll {
                    self.marks.push(self.retired);
                }
                let mut wc = w.completion(self.qpn, status);
                wc.vendor_err = if status == WcStatus::RetryExcErr {
                    self.link_error
                } else {
                    w.vendor_err
                };
                out.push(wc);
            }
            let mut w = self.sq.pop_front().expect("front exists");
            if w.reported {
                self.early -= 1;
            }
            if w.holds_rd_atomic() {
                self.rd_inflight -= 1;
            }
            w.local.clear();
            self.spare.push(w);
            self.next = self.next.saturating_sub(1);
            self.started = self.started.saturating_sub(1);
        }
        self.report_placed(out);
    }

    /// Rewinds to the WQE at `idx`: it and everything after it will be sent again, from
    /// its PSN.
    pub(super) fn rewind(&mut self, idx: usize) {
        if idx >= self.next {
            return;
        }
        let psn = self.sq[idx].psn;
        for w in self.sq.iter_mut().skip(idx).take(self.next - idx) {
            if w.holds_rd_atomic() {
                self.rd_inflight -= 1;
            }
            w.sent = false;
        }
        self.next = idx;
        self.psn = psn;
        self.ack_deadline = None;
        // A new round of resends: a NAK about it may start the next.
        self.nak_retrying = false;
    }

    pub(super) fn fail(
        &mut self,
        idx: usize,
        status: WcStatus,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<ReadSink, Fatal> {
        self.sq[idx].status = Some(status);
        // WQEs behind it that an ACK already finished (a WRITE after a READ whose
        // response is still due), or that the driver executed and whose completion waits
        // for this one ([`direct`]), are flushed, not completed: completions come in
        // order, and after an error only flushes follow, whatever was executed.
        for w in self.sq.iter_mut().skip(idx + 1) {
            if w.status == Some(WcStatus::Success) || (w.executed() && !w.reported) {
                w.status = Some(WcStatus::WrFlushErr);
            }
        }
        self.retire(out);
        Err(Fatal(status))
    }

    /// The oldest WQE not yet finished fails with `status` (the driver's verdict: rxe's
    /// port that is down, `Switches::port_down_fails_sends`), and those behind it are
    /// flushed as after any error; `None` if there is none.
    pub fn fail_oldest(&mut self, status: WcStatus, out: &mut Vec<WorkCompletion>) -> Option<Fatal> {
        let i = self.oldest_unfinished()?;
        self.fail(i, status, out).err()
    }

    /// An RNR NAK for `psn` came at `now` (advertising timer code `timer`): a debug event,
    /// and a warning once the run of them has lasted [`RNR_WARN_AFTER`].
    fn note_rnr(&mut self, psn: u32, timer: u8, now: Instant) {
        let since = *self.rnr_since.get_or_insert(now);
        self.rnr_naks += 1;
        tracing::debug!(
            qpn = self.qpn,
            dest_qpn = self.dest_qpn,
            psn,
            timer,
            retries_left = self.rnr_left,
            "RNR NAK received: the peer has no receive posted"
        );
        let waited = now.saturating_duration_since(since);
        if waited >= RNR_WARN_AFTER && !self.rnr_warned {
            self.rnr_warned = true;
            let forever = if self.attrs.rnr_retry == RNR_RETRY_INFINITE {
                "; rnr_retry 7 retries for ever"
            } else {
                ""
            };
            tracing::warn!(
                qpn = self.qpn,
                dest_qpn = self.dest_qpn,
                waited_ms = waited.as_millis() as u64,
                rnr_naks = self.rnr_naks,
                "QP {:#x} has met RNR NAKs from QP {:#x} for {:.1} s ({} NAKs): the peer posts no \
                 receives{forever}",
                self.qpn,
                self.dest_qpn,
                waited.as_secs_f64(),
                self.rnr_naks
            );
        }
    }

    /// The RNR wait is over: the refused WQE and those after it go again.
    pub(super) fn end_rnr_wait(&mut self) {
        self.rnr_wait = None;
        tracing::debug!(
            qpn = self.qpn,
            dest_qpn = self.dest_qpn,
            psn = self.psn,
            "RNR wait over: resending"
        );
    }

    /// Forward progress (or a reset): a later RNR NAK starts a new run.
    pub(super) fn end_rnr_run(&mut self) {
        self.rnr_since = None;
        self.rnr_naks = 0;
        self.rnr_warned = false;
    }
}
