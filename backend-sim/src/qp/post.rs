//! `ibv_post_send` and `ibv_post_recv` (`man ibv_post_send`, `man ibv_post_recv`): each
//! WR checked and queued, the first refused one named with its index, and the send queue
//! started when the QP may send; and what destroying a QP stops.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::MutexGuard;
use verbs_api::{
    AddressHandle, BindMw, Error, PostError, QpState, QpType, QueueKind, RecvWr, SendWr, WcStatus, WrOp,
};

use super::ud::{AhRoute, UdPostError};
use super::{QpInner, QpShared};
use backend_sim_proto::qp::{gather_shape, PostCheck};
use backend_sim_proto::recv_queue::PostRecvError;
use backend_sim_proto::window::BindReq;

impl QpShared {
    /// `ibv_post_send`. A UD send's address handle is resolved by `route_of` (`None`:
    /// not an address handle of this device, EINVAL), a BIND_MW's window by `bind_of`
    /// (an error refuses the WR). `inline`: empty, or for each WR the
    /// pieces of its inline data when the caller read them itself
    /// ([`Qp::handle_post_send`](backend_sim_proto::qp::Qp::handle_post_send)).
    ///
    /// Inlined into its few callers (`SimQp`'s posts, which the C library's
    /// `ibv_post_send` reaches too): it is on the path of every WR, where a call's
    /// set-up and the move of its result cost as much as the checks. The refusals'
    /// wording is out of line ([`QpShared::refusal`]), which keeps it small.
    #[inline(always)]
    pub fn post_send(
        self: &Arc<Self>,
        wrs: &[SendWr<'_>],
        inline: &[Option<&[&[u8]]>],
        route_of: &dyn Fn(&dyn AddressHandle) -> Option<AhRoute>,
        bind_of: &dyn Fn(&BindMw<'_>) -> verbs_api::Result<BindReq>,
    ) -> std::result::Result<(), PostError> {
        let mut g = self.inner.lock();
        // Before RTS the post is refused; on rxe the WRs are queued all the same and sent
        // once the QP is in RTS (`Switches::pre_rts_send_kept`).
        let not_ready = matches!(g.qp.state(), QpState::Reset | QpState::Init | QpState::Rtr);
        let keeps_queued =
            not_ready && g.qp.state() != QpState::Reset && self.dev.profile.switches().pre_rts_send_kept;
        let mut posted = false;
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |error: Error| PostError {
                index,
                wr_id: wr.wr_id,
                error,
            };
            if not_ready && !keeps_queued {
                result = Err(fail(self.not_ready(g.qp.state(), false)));
                break;
            }
            let pieces = inline.get(index).copied().flatten();
            let queued = if self.qp_type == QpType::Ud {
                self.post_ud(&mut g, wr, pieces, route_of)
            } else if let (WrOp::BindMw, Some(b)) = (wr.op, &wr.bind) {
                match bind_of(b) {
                    Ok(req) => g.qp.handle_post_bind(wr, req).map_err(UdPostError::Check),
                    Err(e) => {
                        result = Err(fail(e));
                        break;
                    }
                }
            } else {
                g.qp.handle_post_send(wr, &self.dev.mrs, pieces)
                    .map_err(UdPostError::Check)
            };
            if let Err(e) = queued {
                let c = match e {
                    UdPostError::Check(c) => c,
                    UdPostError::ForeignAh => {
                        result = Err(fail(self.foreign_ah()));
                        break;
                    }
                };
                let error = self.refusal(&g, c, wr, pieces);
                result = Err(fail(error));
                break;
            }
            posted = true;
        }
        if keeps_queued && result.is_ok() {
            if let Some(first) = wrs.first() {
                result = Err(PostError {
                    index: 0,
                    wr_id: first.wr_id,
                    error: self.not_ready(g.qp.state(), true),
                });
            }
        }
        if posted {
            if let Some(cap) = self.dev.capture.get() {
                let n = result.as_ref().err().map_or(wrs.len(), |e| e.index);
                crate::capture::notes::posted_sends(cap, self.qpn, &wrs[..n], inline);
            }
            self.note_busy(&mut g);
            if g.qp.flush_posted_sends() {
                self.deliver(&mut g);
            } else if g.qp.state() == QpState::Rts {
                let bytes = wrs.iter().map(SendWr::total_len).sum();
                self.start_send_queue(g, Some((wrs.len(), bytes)));
            }
        }
        result
    }

    /// Why a send WR was refused (`c`), in the words of the verbs. Out of line: the post
    /// path's callers inline [`QpShared::post_send`], which stays small without it.
    #[cold]
    #[inline(never)]
    fn refusal(&self, g: &QpInner, c: PostCheck, wr: &SendWr<'_>, pieces: Option<&[&[u8]]>) -> Error {
        match c {
            PostCheck::Full => Error::QueueFull {
                queue: QueueKind::Send,
                qpn: self.qpn,
                capacity: self.cap.max_send_wr,
            },
            PostCheck::FullUnpolled => {
                if self.dev.profile.warns() {
                    self.warned
                        .sq_full_unpolled(self.qpn, self.cap.max_send_wr, g.qp.held_unpolled());
                }
                Error::QueueFull {
                    queue: QueueKind::Send,
                    qpn: self.qpn,
                    capacity: self.cap.max_send_wr,
                }
            }
            PostCheck::MisalignedAtomic => Error::invalid(
                "ibv_post_send",
                "the atomic's remote address is not 8-byte aligned",
            ),
            PostCheck::TooManySge => self.invalid_wr(format!(
                "{} SGEs exceed max_send_sge {}",
                gather_shape(wr, pieces).0,
                self.cap.max_send_sge
            )),
            PostCheck::InlineTooLong => self.invalid_wr(format!(
                "{} bytes of inline data exceed max_inline_data {}",
                gather_shape(wr, pieces).1,
                self.cap.max_inline_data
            )),
            PostCheck::InlineNotAllowed => Error::invalid(
                "ibv_post_send",
                "IBV_SEND_INLINE is only valid for SEND and RDMA WRITE",
            ),
            PostCheck::BadInlineSge => Error::invalid(
                "ibv_post_send",
                "an inline SGE is not inside the memory region of this device that its lkey names",
            ),
            PostCheck::NotUc => Error::invalid(
                "ibv_post_send",
                format!(
                    "{:?} is not valid on UC QP {:#x}: UC has SEND and RDMA WRITE (with \
                     immediate) only",
                    wr.op.opcode(),
                    self.qpn
                ),
            ),
            PostCheck::NotUd => Error::invalid(
                "ibv_post_send",
                format!(
                    "{:?} is not valid on UD QP {:#x}: UD has SEND and SEND_WITH_IMM only",
                    wr.op.opcode(),
                    self.qpn
                ),
            ),
            PostCheck::NoUdDestination => Error::invalid(
                "ibv_post_send",
                format!(
                    "a send on UD QP {:#x} needs a destination (wr.ud: address handle, remote QPN, Q_Key)",
                    self.qpn
                ),
            ),
            PostCheck::UdDestination => Error::invalid(
                "ibv_post_send",
                format!(
                    "QP {:#x} is {:?}: wr.ud (a UD destination) is for UD QPs",
                    self.qpn, self.qp_type
                ),
            ),
            PostCheck::BadBind => Error::invalid(
                "ibv_post_send",
                "IBV_WR_BIND_MW needs its window and binding (wr.bind_mw) and no gather list",
            ),
        }
    }

    /// The refusal of a send WR that the QP's limits do not take (`reason`): EINVAL, or
    /// ENOMEM as the mlx5 provider answers (`Switches::post_send_enomem`). Read on the
    /// refusal only, not on every post.
    #[cold]
    fn invalid_wr(&self, reason: String) -> Error {
        if self.dev.profile.switches().post_send_enomem {
            Error::NoMemory {
                call: "ibv_post_send",
                reason,
            }
        } else {
            Error::invalid("ibv_post_send", reason)
        }
    }

    /// The refusal of a send WR posted in `state` (before RTS): EINVAL, or ENOMEM as the
    /// mlx5 provider answers; `kept`: the WRs were queued all the same.
    #[cold]
    fn not_ready(&self, state: QpState, kept: bool) -> Error {
        let reason = if kept {
            "send work requests need RTS (or SQD/ERR); as on rxe, they are queued all the same \
             and sent after RTS"
        } else {
            "send work requests need RTS (or SQD/ERR)"
        };
        if self.dev.profile.switches().post_send_enomem {
            Error::NoMemory {
                call: "ibv_post_send",
                reason: format!("QP {:#x} is in {state:?}: {reason}", self.qpn),
            }
        } else {
            Error::InvalidQpState {
                call: "ibv_post_send",
                qpn: self.qpn,
                state,
                reason,
            }
        }
    }

    /// An RC send queue without a connection (not yet, or the peer is gone) starts its
    /// WQEs anyway, as an HCA processes them whether anything answers or not: the frames
    /// are built (the local checks run, so a bad lkey is LOC_PROT_ERR now, not a
    /// transport error after the retries) and lost on the way. They are resent once
    /// connected (the connection's start rewinds the send queue, see `transport`);
    /// until then the ACK timer runs, so a peer that stays away costs `retry_cnt`
    /// timeouts and RETRY_EXC_ERR. Only WQEs not yet started are built: a program that
    /// posts right after RTS (perftest: a window of 128 WRITEs, one `ibv_post_send`
    /// each) while the connection is being set up pays for each WQE once, not for every
    /// earlier one again at each post.
    pub(crate) fn send_unconnected(self: &Arc<Self>, g: &mut QpInner) {
        if g.qp.transmit_unconnected(&self.dev.mrs, Self::now()).is_err() {
            self.enter_error(g);
        } else {
            self.dev.path.rearm(self, g);
        }
    }

    /// Where the profile says a send through a port that is down fails
    /// (`Switches::port_down_fails_sends`, rxe) and the port is down: the oldest WQE not
    /// yet finished completes with `IBV_WC_LOC_QP_OP_ERR` and the QP goes to ERR, as rxe's
    /// requester does when `rxe_prepare()` finds no route (with the lock held; whether it
    /// did).
    pub(crate) fn fails_for_port(&self, g: &mut QpInner) -> bool {
        if self.dev.port.is_up()
            || !self.dev.profile.switches().port_down_fails_sends
            || !matches!(g.qp.state(), QpState::Rts | QpState::Sqd)
        {
            return false;
        }
        if !g.qp.fail_oldest(WcStatus::LocQpOpErr) {
            return false;
        }
        tracing::debug!(
            qpn = self.qpn,
            "the port is down: the send fails (LOC_QP_OP_ERR), QP to ERR"
        );
        self.enter_error(g);
        true
    }

    /// Starts sending what the send queue holds, now that it may: after `post_send` in
    /// RTS (`posted`: the number of WRs of the call and their payload bytes), and after SQD -> RTS (`None`), which
    /// resumes the WQEs posted while the queue drained: nothing else starts them, and
    /// without this they would wait for the next post. Releases the lock.
    pub(super) fn start_send_queue(
        self: &Arc<Self>,
        mut g: MutexGuard<'_, QpInner>,
        posted: Option<(usize, u64)>,
    ) {
        if self.qp_type == QpType::Ud {
            // No connection: the device's links carry the datagrams.
            drop(g);
            return self.dev.path.send_datagrams(self);
        }
        if self.fails_for_port(&mut g) {
            return;
        }
        let conn = g.conn.clone();
        let idle = g.qp.nothing_in_flight();
        if conn.is_none() && g.qp.is_unreliable() {
            // UC without a connection: the WRs wait for one (a bounded time, see
            // `qp::LINK_WAIT`) instead of being sent into it, as there is no
            // resending them once it is up.
            g.qp.handle_link_wait(Self::now());
            self.dev.path.rearm(self, &mut g);
        } else if conn.is_none() {
            self.send_unconnected(&mut g);
        }
        drop(g);
        match (conn, posted) {
            (Some(c), Some((wrs, bytes))) => self.dev.path.kick(self, &c, idle, wrs, bytes),
            // Not a post (it must not count as one of a refill loop's, see
            // `Progress::kick`): queued for the driving thread or the progress thread.
            (Some(_), None) => self.dev.path.schedule(self),
            (None, _) => self.req_wake.notify_one(),
        }
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let mut g = self.inner.lock();
        let mut result = Ok(());
        let mut posted = false;
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |error: Error| PostError {
                index,
                wr_id: wr.wr_id,
                error,
            };
            if g.qp.state() == QpState::Reset {
                result = Err(fail(Error::InvalidQpState {
                    call: "ibv_post_recv",
                    qpn: self.qpn,
                    state: g.qp.state(),
                    reason: "receives can be posted from INIT on",
                }));
                break;
            }
            match g.qp.handle_post_recv(wr) {
                Ok(()) => posted = true,
                Err(e) => {
                    result = Err(fail(match e {
                        PostRecvError::Full => Error::QueueFull {
                            queue: QueueKind::Recv,
                            qpn: self.qpn,
                            capacity: self.cap.max_recv_wr,
                        },
                        PostRecvError::TooManySge => Error::invalid(
                            "ibv_post_recv",
                            format!(
                                "{} SGEs exceed max_recv_sge {}",
                                wr.sg_list.len(),
                                self.cap.max_recv_sge
                            ),
                        ),
                        PostRecvError::HasSrq => Error::invalid(
                            "ibv_post_recv",
                            format!(
                                "QP {:#x} takes its receives from an SRQ and has no receive queue of \
                                 its own: post them with ibv_post_srq_recv",
                                self.qpn
                            ),
                        ),
                    }));
                    break;
                }
            }
        }
        if posted {
            if let Some(cap) = self.dev.capture.get() {
                let n = result.as_ref().err().map_or(wrs.len(), |e| e.index);
                crate::capture::notes::posted_recvs(cap, self.qpn, &wrs[..n]);
            }
        }
        if posted && g.qp.flush_posted_recvs() {
            self.deliver(&mut g);
        }
        result
    }

    /// The user destroyed the QP: stop its tasks, forget its queues.
    pub fn destroy(&self) {
        // An HCA acknowledged what it executed long before the application could
        // destroy the QP: write ACKs still owed (delayed ACK) first.
        drop(self.flush_owed_acks(self.inner.lock()));
        self.destroyed.store(true, Ordering::Release);
        let mut g = self.inner.lock();
        self.sync_onesided(&mut g);
        g.epoch += 1;
        g.qp.handle_destroy();
        self.clean_cqs("destroy");
        self.note_busy(&mut g);
        self.close_conns(&mut g);
        self.note_link(&mut g);
        drop(g);
        self.req_wake.notify_one();
        self.ready.notify_waiters();
    }
}
