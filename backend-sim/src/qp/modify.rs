//! `ibv_modify_qp` and `ibv_query_qp`: the transition checks of
//! [`verbs_api::transitions::check_modify`], each attribute value checked against the
//! device as `ib_modify_qp` does (each failure an EINVAL that names it), and what each
//! transition sets in motion: RTR starts the active side's connection setup (a UD QP has
//! none: it receives from RTR on, from anyone with its Q_Key), RTS arms the
//! requester, RTS -> SQD stops starting WQEs (and with `en_sqd_async_notify` raises
//! `IBV_EVENT_SQ_DRAINED` once those in flight are complete), SQD -> RTS resumes the send
//! queue, SQE -> RTS (a UC or UD QP after a send error, IBA 10.3.1) lets it send again,
//! RESET empties both queues without completions, ERR flushes them. No modify leads to
//! SQE: only a send error does ([`QpShared::send_failed`]).

use std::sync::Arc;

use parking_lot::MutexGuard;
use verbs_api::timers::local_ack_timeout;
use verbs_api::transitions::check_modify;
use verbs_api::{Error, QpAttr, QpAttrMask as M, QpState, QpType, Result, PSN_MASK};

use super::{QpInner, QpShared};
use crate::requester::ReqAttrs;
use crate::responder::RespAttrs;

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

    fn check_values(&self, attr: &QpAttr, mask: M) -> Result<()> {
        let bad = |name: &'static str, reason: String| Err(Error::InvalidAttr { name, reason });
        let d = &self.dev.attr;
        if mask.contains(M::PORT) && attr.port_num != 1 {
            return bad(
                "port_num",
                format!("port {} does not exist (the device has port 1)", attr.port_num),
            );
        }
        if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
            return bad(
                "pkey_index",
                format!("index {} is outside the P_Key table of 1 entry", attr.pkey_index),
            );
        }
        if mask.contains(M::AV) {
            let ah = &attr.ah_attr;
            if ah.port_num > 1 {
                return bad("ah_attr.port_num", format!("port {} does not exist", ah.port_num));
            }
            if ah.is_global {
                if let Err((name, reason)) = self.dev.addr.check_sgid_index(ah.grh.sgid_index) {
                    return bad(name, reason);
                }
            }
            if let Err((name, reason)) = self.dev.addr.check_av(ah.is_global, ah.dlid) {
                return bad(name, reason);
            }
        }
        if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
            return bad("timeout", format!("{} exceeds 31", attr.timeout));
        }
        if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
            return bad("retry_cnt", format!("{} exceeds 7", attr.retry_cnt));
        }
        if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
            return bad("rnr_retry", format!("{} exceeds 7", attr.rnr_retry));
        }
        if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return bad("min_rnr_timer", format!("{} exceeds 31", attr.min_rnr_timer));
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic as u32 > d.max_qp_init_rd_atom {
            return bad(
                "max_rd_atomic",
                format!(
                    "{} exceeds the device's max_qp_init_rd_atom {}",
                    attr.max_rd_atomic, d.max_qp_init_rd_atom
                ),
            );
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic as u32 > d.max_qp_rd_atom {
            return bad(
                "max_dest_rd_atomic",
                format!(
                    "{} exceeds the device's max_qp_rd_atom {}",
                    attr.max_dest_rd_atomic, d.max_qp_rd_atom
                ),
            );
        }
        if mask.contains(M::DEST_QPN) && attr.dest_qp_num > PSN_MASK {
            return bad("dest_qp_num", format!("{:#x} exceeds 24 bits", attr.dest_qp_num));
        }
        if mask.contains(M::CAP) {
            return bad(
                "cap",
                "resizing queues with ibv_modify_qp is not supported".into(),
            );
        }
        Ok(())
    }

    /// `ibv_modify_qp`.
    pub fn modify(self: &Arc<Self>, attr: &QpAttr, mask: M) -> Result<()> {
        let mut g = self.inner.lock();
        let cur = g.state;
        let next = check_modify(cur, self.qp_type, attr, mask)?;
        self.check_values(attr, mask)?;
        let a = &mut g.attr;
        if mask.contains(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(M::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(M::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn & PSN_MASK;
        }
        if mask.contains(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn & PSN_MASK;
        }
        if mask.contains(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        // rxe and mlx5 grant the next power of two (`Switches::rd_atomic_pow2`); 0 stays
        // 0 (no resources).
        let rd_atomic = |n: u8| {
            if n > 0 && self.dev.profile.switches().rd_atomic_pow2 {
                n.checked_next_power_of_two().unwrap_or(n)
            } else {
                n
            }
        };
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = rd_atomic(attr.max_rd_atomic);
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = rd_atomic(attr.max_dest_rd_atomic);
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if mask.contains(M::QKEY) {
            a.qkey = attr.qkey;
        }
        if next != QpState::Err && next != cur {
            // (ERR is logged by `enter_error`, which every path to it takes.)
            tracing::debug!(qpn = self.qpn, from = ?cur, to = ?next, "QP state change");
            if let Some(cap) = self.dev.capture.get() {
                crate::capture::notes::state(cap, self.qpn, cur, next);
            }
        }
        let a = g.attr;
        g.resp.access = a.qp_access_flags;
        g.resp.max_dest_rd_atomic = a.max_dest_rd_atomic;
        g.resp.min_rnr_timer = a.min_rnr_timer;
        g.resp.qkey = a.qkey;
        g.req.qkey = a.qkey;
        match next {
            QpState::Reset => {
                g = self.flush_owed_acks(g);
                g.req.reset();
                g.resp.reset();
                self.clean_cqs("RESET");
                g.faults.force_rnr = 0;
                self.note_busy(&mut g);
                g.epoch += 1;
                g.remote = None;
                g.timer_at = None;
                self.close_conns(&mut g);
                g.attr = QpAttr {
                    cap: self.cap,
                    ..Default::default()
                };
                self.req_wake.notify_one();
            }
            QpState::Err => {
                g = self.flush_owed_acks(g);
                self.enter_error(&mut g);
            }
            // A UD QP has no peer: RTR only lets it receive.
            QpState::Rtr if cur == QpState::Init && self.qp_type != QpType::Ud => {
                g.remote = Some(self.dev.addr.remote_addr(&a));
                g.req.dest_qpn = a.dest_qp_num;
                // Not connected yet (see `Requester::link_error`).
                g.req.link_error = libc::ENOTCONN as u32;
                g.resp.connect(RespAttrs {
                    rq_psn: a.rq_psn,
                    min_rnr_timer: a.min_rnr_timer,
                });
                // A message takes a PSN per packet of the path MTU, on both ends.
                g.resp.set_path_mtu(a.path_mtu.bytes());
                g.req.set_path_mtu(a.path_mtu.bytes());
                // One connection per QP pair, set up by the side with the smaller
                // (GID, LID, QPN), from RTR on (the responder needs it too).
                g.active = self.dev.addr.local_id(self.qpn, &a) <= self.dev.addr.remote_id(&a);
                if g.active {
                    let epoch = g.epoch;
                    self.dev.path.connect(self.clone(), epoch);
                }
            }
            QpState::Rts if cur == QpState::Rtr => {
                g.req.connect(ReqAttrs {
                    sq_psn: a.sq_psn,
                    timeout: local_ack_timeout(a.timeout),
                    retry_cnt: a.retry_cnt,
                    rnr_retry: a.rnr_retry,
                    max_rd_atomic: a.max_rd_atomic,
                });
                g.req.draining = false;
            }
            QpState::Rts => {
                g.req.draining = false;
                self.req_wake.notify_one();
            }
            QpState::Sqd => {
                g.req.draining = true;
                if cur == QpState::Rts {
                    // IBA 11.6.3.1 and `man ibv_modify_qp`: the event only when asked
                    // for with this transition; rxe raises it whatever the flag says
                    // (`Switches::sq_drained_unasked`).
                    g.sqd_event_due = (mask.contains(M::EN_SQD_ASYNC_NOTIFY) && attr.en_sqd_async_notify)
                        || g.req.switches().sq_drained_unasked;
                }
            }
            _ => {}
        }
        if next != QpState::Sqd {
            g.sqd_event_due = false;
        }
        if next != QpState::Err {
            g.state = next;
        }
        self.note_link(&mut g);
        if g.sqd_event_due {
            // Nothing in flight: drained at once.
            self.check_drained(&mut g);
        }
        // (`Switches::sqd_rts_resumes` off, as on rxe: they wait for the next post.)
        if cur == QpState::Sqd
            && next == QpState::Rts
            && g.req.has_unsent()
            && g.req.switches().sqd_rts_resumes
        {
            self.start_send_queue(g, None);
        }
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> QpAttr {
        let g = self.inner.lock();
        let mut a = g.attr;
        a.qp_state = g.state;
        a.cur_qp_state = g.state;
        a.cap = self.cap;
        // The PSNs as they stand, as rxe (`rxe_qp_to_attr`: the requester's and
        // responder's current PSNs) and mlx5 (next_send_psn, next_rcv_psn) report them:
        // the next PSN to send and the next expected, once the QP has them.
        if !matches!(g.state, QpState::Reset | QpState::Init) {
            if self.qp_type != QpType::Ud {
                a.rq_psn = g.resp.expected_psn();
            }
            if g.state != QpState::Rtr {
                a.sq_psn = g.req.next_psn();
            }
        }
        // Draining: in SQD with WQEs sent and not yet complete (those posted in SQD wait
        // to be started and are no part of it).
        a.sq_draining = g.req.draining && !g.req.drained();
        a
    }
}
