//! `ibv_modify_qp` and `ibv_query_qp` on the driver's side: the protocol core's state
//! machine ([`backend_sim_proto::qp`]) decides whether a modify is legal (transition,
//! mask, values) and moves the state and both halves; this module gives it the device's
//! limits and address checks, and does what a transition asks of the device: RTR starts
//! the active side's connection setup, RESET forgets the connection and cleans the CQs,
//! ERR sends the ACKs the connection owes and then flushes both queues, SQD -> RTS may
//! start the send queue again, and `IBV_EVENT_SQ_DRAINED` is raised when owed.

use std::sync::Arc;

use backend_sim_proto::faults::ForcedRnr;
use backend_sim_proto::qp::{AvCheck, Effect, QpLimits};
use parking_lot::MutexGuard;
use verbs_api::{AhAttr, QpAttr, QpAttrMask as M, QpState, Result};

use super::{QpInner, QpShared};
use crate::addressing::Addressing;

impl QpShared {
    /// Before RESET, ERR or destroy forget the connection's state: what was executed is
    /// acknowledged first, as an HCA acknowledged it when it arrived. An ACK held back to
    /// leave with the application's answer (delayed ACK) would otherwise be forgotten by
    /// the flush, and the peer's SEND, received here, fail with RETRY_EXC_ERR there (an
    /// application that disconnects as soon as it has the last message). The QP's lock
    /// is let go meanwhile and taken again: `flush_final` takes the connection's I/O
    /// lock, then the QP's.
    pub(super) fn flush_owed_acks<'a>(&'a self, g: MutexGuard<'a, QpInner>) -> MutexGuard<'a, QpInner> {
        let Some(c) = g.conn.clone() else {
            return g;
        };
        drop(g);
        self.dev.path.flush_final(&c);
        self.inner.lock()
    }

    /// The device's limits on a modify's values.
    fn limits(&self) -> QpLimits {
        QpLimits {
            max_qp_init_rd_atom: self.dev.attr.max_qp_init_rd_atom,
            max_qp_rd_atom: self.dev.attr.max_qp_rd_atom,
        }
    }

    /// `ibv_modify_qp`.
    pub fn modify(self: &Arc<Self>, attr: &QpAttr, mask: M) -> Result<()> {
        let mut g = self.inner.lock();
        let (limits, av) = (self.limits(), &*self.dev.addr);
        let next = g.qp.check_modify(attr, mask, &limits, av)?;
        if matches!(next, QpState::Reset | QpState::Err) {
            // (RESET and ERR are legal from any state with the state alone: the check
            // holds again once the lock is back.)
            g = self.flush_owed_acks(g);
        }
        let t = g.qp.handle_modify(attr, mask, &limits, av)?;
        if t.to != QpState::Err && t.to != t.from {
            // (ERR is logged by `enter_error`, which every path to it takes.)
            tracing::debug!(qpn = self.qpn, from = ?t.from, to = ?t.to, "QP state change");
            if let Some(cap) = self.dev.capture.get() {
                crate::capture::notes::state(cap, self.qpn, t.from, t.to);
            }
        }
        self.sync_onesided(&mut g);
        match t.effect {
            Effect::Reset => {
                self.clean_cqs("RESET");
                g.faults.forced_rnr = ForcedRnr::NONE;
                self.note_busy(&mut g);
                g.epoch += 1;
                g.remote = None;
                g.timer_at = None;
                self.close_conns(&mut g);
                self.req_wake.notify_one();
            }
            Effect::Error => self.enter_error(&mut g),
            Effect::Connect => {
                let a = *g.qp.attr();
                g.remote = Some(self.dev.addr.remote_addr(&a));
                // One connection per QP pair, set up by the side with the smaller
                // (GID, LID, QPN), from RTR on (the responder needs it too).
                g.active = self.dev.addr.local_id(self.qpn, &a) <= self.dev.addr.remote_id(&a);
                if g.active {
                    // The attempt is under way from now, not from when the runtime first
                    // polls the connector: on a loaded host that can take longer than
                    // `retry_cnt` ACK timeouts, which would then fail the WRs before any
                    // attempt was made (`vendor_err` ENOTCONN, not why the peer cannot
                    // be reached).
                    g.qp.handle_connecting(Some(QpShared::now()));
                    let epoch = g.epoch;
                    self.dev.path.connect(self.clone(), epoch);
                }
            }
            Effect::Resume { .. } => self.req_wake.notify_one(),
            Effect::None => {}
        }
        if t.to != t.from {
            // A hello that arrived before RTR is looked at again.
            self.ready.notify_waiters();
        }
        self.note_link(&mut g);
        if g.qp.sqd_event_due() && g.qp.check_drained() {
            // Nothing in flight: drained at once.
            tracing::debug!(qpn = self.qpn, "send queue drained (SQD)");
            self.take_news(&mut g);
        }
        if t.effect == (Effect::Resume { start: true }) {
            self.start_send_queue(g, None);
        }
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> QpAttr {
        let g = self.inner.lock();
        g.qp.query()
    }
}

/// The address vector of a modify, checked against the device's GID table and link layer.
impl AvCheck for Addressing {
    fn check_av(&self, ah: &AhAttr) -> std::result::Result<(), (&'static str, String)> {
        if ah.is_global {
            self.check_sgid_index(ah.grh.sgid_index)?;
        }
        Addressing::check_av(self, ah.is_global, ah.dlid)
    }
}
