//! Where a responder's receives come from and go (`man ibv_post_recv`, `man
//! ibv_create_srq`): the QP's own receive queue or its SRQ, the receive a message takes
//! from it, its completion once the message is in (with the immediate, or the rkey a
//! SEND_WITH_INV invalidated) or in error (IBA 10.7.2.2), the flush of the receives when
//! the QP goes to ERR and their discard at RESET.

use std::sync::Arc;

use verbs_api::{AsyncElement, AsyncEventType, RecvWr, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::{Responder, Taken};
use crate::memory::MrTable;
use crate::recv_queue::{PostRecvError, RecvSource, SharedRecvQueue};
use crate::requester::Fatal;
use crate::switches::RecvError;
use crate::window::{Invalidator, OnQp};

impl Responder {
    /// Receives posted to the QP's own receive queue and not yet consumed (0 with an
    /// SRQ).
    pub fn posted(&self) -> usize {
        match &self.source {
            RecvSource::Own(q) => q.len(),
            RecvSource::Shared(_) => 0,
        }
    }

    /// Receives the next message could take: the QP's own, or its SRQ's.
    pub(super) fn available(&self) -> usize {
        match &self.source {
            RecvSource::Own(q) => q.len(),
            RecvSource::Shared(s) => s.len(),
        }
    }

    /// The SRQ the QP takes its receives from, if any.
    pub fn srq(&self) -> Option<&Arc<SharedRecvQueue>> {
        match &self.source {
            RecvSource::Own(_) => None,
            RecvSource::Shared(s) => Some(s),
        }
    }

    /// Queues a receive WQE on the QP's own receive queue (`ibv_post_recv`).
    pub fn post(&mut self, wr: &RecvWr<'_>) -> Result<(), PostRecvError> {
        match &mut self.source {
            RecvSource::Own(q) => q.post(wr),
            RecvSource::Shared(_) => Err(PostRecvError::HasSrq),
        }
    }

    /// QP to ERR: the receive taken (held, or consumed by a request still arriving) and,
    /// without an SRQ, every posted receive complete with `IBV_WC_WR_FLUSH_ERR`, in order.
    /// An SRQ keeps its receives for its other QPs; the QP raises
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` (once until the next reset).
    pub fn flush(&mut self, out: &mut Vec<(WorkCompletion, bool)>) {
        self.payload_psn = None;
        self.forget_partial();
        if self.taken.is_some() {
            self.fail_recv(WcStatus::WrFlushErr, out);
        }
        match &mut self.source {
            RecvSource::Own(q) => {
                let qpn = self.qpn;
                q.drain(|wr_id| out.push((flushed(qpn, wr_id), false)));
            }
            RecvSource::Shared(_) => {
                if self.sw.last_wqe_reached && !self.last_wqe_raised {
                    self.last_wqe_raised = true;
                    let qpn = self.qpn;
                    self.event(AsyncEventType::QpLastWqeReached, AsyncElement::Qp(qpn));
                }
            }
        }
        if !self.uc {
            // (A UC QP still owes the receipt of what it took in: see `uc`.)
            self.forget_ack();
        }
    }

    /// QP to RESET (or destroyed): its own receives are discarded without completions; a
    /// receive held from an SRQ goes back to the SRQ's head, for its other QPs.
    pub fn reset(&mut self) {
        if self.taken.take().is_some() {
            if let RecvSource::Shared(s) = &self.source {
                s.put_back(&mut self.wqe);
            }
        }
        self.payload_psn = None;
        self.forget_partial();
        if let RecvSource::Own(q) = &mut self.source {
            q.drain(|_| {});
        }
        self.forget_ack();
        self.nak_psn = None;
        self.last_wqe_raised = false;
        self.msn = 0;
    }

    /// The status of a receive the message could not be placed in: IBA's `iba`, or
    /// `IBV_WC_LOC_QP_OP_ERR` where the profile treats it as a malformed WQE
    /// ([`RecvError`]).
    pub(super) fn recv_error(choice: RecvError, iba: WcStatus) -> WcStatus {
        match choice {
            RecvError::Iba => iba,
            RecvError::MalformedWqe => WcStatus::LocQpOpErr,
        }
    }

    /// Takes the oldest receive (unless one is held already); false if there is none.
    pub(super) fn take_recv(&mut self) -> bool {
        if self.taken.is_some() {
            return true;
        }
        let got = match &mut self.source {
            RecvSource::Own(q) => q.take_into(&mut self.wqe),
            RecvSource::Shared(s) => match s.take_into(&mut self.wqe) {
                None => false,
                Some(reached) => {
                    if reached {
                        let h = s.handle();
                        self.event(AsyncEventType::SrqLimitReached, AsyncElement::Srq(h));
                    }
                    true
                }
            },
        };
        if got {
            self.taken = Some(Taken::Held);
        }
        got
    }

    /// Completes the receive taken with `status` (an error: only `wr_id`, `status` and
    /// `qp_num` are valid, as `man ibv_poll_cq` says).
    pub(super) fn fail_recv(&mut self, status: WcStatus, out: &mut Vec<(WorkCompletion, bool)>) {
        self.taken = None;
        out.push((self.recv_completion(self.wqe.wr_id, status), false));
    }

    pub(super) fn recv_completion(&self, wr_id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: self.qpn,
            ..Default::default()
        }
    }

    /// Whether a SEND_WITH_INV arriving on this QP may invalidate the window `rkey`.
    pub(super) fn may_invalidate(&self, rkey: u32, mrs: &MrTable) -> bool {
        let who = Invalidator::Remote(OnQp {
            pd: self.pd,
            qpn: self.qpn,
        });
        mrs.invalidate(rkey, who, self.sw.mw_owner_checks, false).is_ok()
    }

    /// Whether a SEND_WITH_INV arriving on this QP may invalidate the window `rkey`
    /// (checked when its header arrives; the invalidation itself happens once its
    /// payload is in, [`Responder::payload_done`]). A refusal completes the receive taken
    /// for it with `IBV_WC_REM_INV_REQ_ERR` and the QP must go to ERR, with no NAK
    /// (rxe_resp.c: `RESPST_ERR_INVALIDATE_RKEY`, class J).
    pub(super) fn check_invalidate(
        &mut self,
        rkey: u32,
        mrs: &MrTable,
        out: &mut Vec<(WorkCompletion, bool)>,
    ) -> Result<(), Fatal> {
        let who = Invalidator::Remote(OnQp {
            pd: self.pd,
            qpn: self.qpn,
        });
        match mrs.invalidate(rkey, who, self.sw.mw_owner_checks, false) {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(
                    qpn = self.qpn,
                    rkey = %format_args!("{rkey:#x}"),
                    "SEND_WITH_INV refused: {e}; the receive completes with REM_INV_REQ_ERR and the QP goes to ERR"
                );
                self.fail_recv(WcStatus::RemInvReqErr, out);
                Err(Fatal(WcStatus::RemInvReqErr))
            }
        }
    }

    /// The SEND_WITH_INV whose payload is now in invalidates its window (checked when
    /// its header arrived; one invalidated meanwhile, by another QP, stays so).
    pub(super) fn invalidate_filled(&mut self, mrs: &MrTable) {
        if let Some(Taken::Filling { inv: Some(rkey), .. }) = self.taken {
            let who = Invalidator::Remote(OnQp {
                pd: self.pd,
                qpn: self.qpn,
            });
            if let Err(e) = mrs.invalidate(rkey, who, self.sw.mw_owner_checks, true) {
                tracing::debug!(
                    qpn = self.qpn,
                    rkey = %format_args!("{rkey:#x}"),
                    "SEND_WITH_INV: the window changed while the message arrived: {e}"
                );
            }
        }
    }

    /// Completes the receive a request whose payload is now in consumed, if any.
    pub(super) fn complete_filled(&mut self, out: &mut Vec<(WorkCompletion, bool)>) {
        if let Some(Taken::Filling {
            opcode,
            byte_len,
            imm,
            inv,
            solicited,
        }) = self.taken
        {
            self.taken = None;
            let mut wc = self.recv_completion(self.wqe.wr_id, WcStatus::Success);
            wc.opcode = opcode;
            wc.byte_len = byte_len;
            if let Some(imm) = imm {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
            if let Some(rkey) = inv {
                wc.imm_data = rkey;
                wc.wc_flags |= match self.sw.inv_flag_kernel_bit {
                    true => WcFlags::IP_CSUM_OK,
                    false => WcFlags::WITH_INV,
                };
            }
            out.push((wc, solicited));
        }
    }
}

/// A receive flushed on QP `qpn`.
fn flushed(qpn: u32, wr_id: u64) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode: WcOpcode::Recv,
        qp_num: qpn,
        ..Default::default()
    }
}
