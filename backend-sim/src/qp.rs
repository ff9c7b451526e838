//! The queue pair: its state machine and attributes (`man ibv_create_qp`,
//! `man ibv_modify_qp`, `man ibv_query_qp`), and the post verbs (`man ibv_post_send`,
//! `man ibv_post_recv`). It owns one [`Requester`] and one [`Responder`] behind a mutex
//! that the transport tasks take briefly (never across I/O).
//!
//! Transition checks come from [`verbs_api::transitions::check_modify`]; attribute values
//! are checked against the device (port 1, one P_Key, two GIDs, `max_qp_rd_atom`, 5-bit
//! timer codes, 3-bit retry counts) as `ib_modify_qp` does, each failure an EINVAL that
//! names the attribute. Moving to ERR flushes both queues; to RESET empties them without
//! completions.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use verbs_api::timers::local_ack_timeout;
use verbs_api::transitions::check_modify;
use verbs_api::{
    Error, PostError, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, QueueKind, RecvWr, Result, SendWr,
    WorkCompletion, PSN_MASK,
};

use crate::addressing::Addressing;
use crate::cq::CqShared;
use crate::fault_state::QpFaults;
use crate::memory::MrTable;
use crate::requester::{PostCheck, ReqAttrs, Requester};
use crate::responder::{RespAttrs, Responder};
use crate::tx::TxQueue;

/// Everything about a QP that changes, under one lock.
pub struct QpInner {
    /// Current state.
    pub state: QpState,
    /// Attributes as last set.
    pub attr: QpAttr,
    /// Send side.
    pub req: Requester,
    /// Receive side.
    pub resp: Responder,
    /// Bumped on RESET and destroy: transport tasks of an older epoch stop.
    pub epoch: u64,
    /// Bumped for every connection: only the newest one serves.
    pub conn_gen: u64,
    /// Whether this side sets the connection up (its (GID, LID, QPN) is the smaller).
    pub active: bool,
    /// Where the peer device listens (from the address vector).
    pub remote: Option<SocketAddr>,
    /// The established connection of the QP pair (both directions).
    pub conn: Option<Arc<Conn>>,
    /// For a QP connected to itself: the accepting end of its own connection.
    pub self_conn: Option<Arc<Conn>>,
    /// The deadline last pushed to the device's timer heap.
    pub timer_at: Option<Instant>,
    /// Armed fault injection.
    pub faults: QpFaults,
    /// Whether the send queue holds WQEs and is counted in the device's
    /// count of busy send queues (kept in step by
    /// [`QpShared::note_busy`]).
    pub busy: bool,
    send_wc: Vec<WorkCompletion>,
    recv_wc: Vec<(WorkCompletion, bool)>,
}

/// An established connection of a QP.
pub type Conn = crate::link::Conn<QpShared>;

/// The QPs of a device, by number.
pub type QpTable = Mutex<std::collections::HashMap<u32, std::sync::Weak<QpShared>>>;

/// What a QP asks of its device's data path and connection setup. The device implements
/// it; the QP's state machine calls it, never the reverse, so this module knows neither.
pub trait DataPath: Send + Sync {
    /// Closes a connection: no thread services it afterwards.
    fn close(&self, conn: &Conn);
    /// Writes what a connection owes (ACKs left for later) before its QP resets or goes.
    fn flush_final(&self, conn: &Arc<Conn>);
    /// The QP's send queue became busy (`true`) or idle.
    fn count_busy(&self, busy: bool);
    /// Schedules the QP's next timer check (with its lock held).
    fn rearm(&self, qp: &Arc<QpShared>, g: &mut QpInner);
    /// WRs were posted to a connected QP in RTS: transmit them, now or soon.
    fn kick(&self, qp: &Arc<QpShared>, conn: &Arc<Conn>, idle: bool, wrs: usize);
    /// The QP has work for its connection: service it soon.
    fn schedule(&self, qp: &Arc<QpShared>);
    /// The QP (the active side of its pair) needs a connection for `epoch`.
    fn connect(&self, qp: Arc<QpShared>, epoch: u64);
}

/// What a QP takes from its device.
#[derive(Clone)]
pub struct QpDevice {
    /// The data path and connection setup.
    pub path: Arc<dyn DataPath>,
    /// Registered memory.
    pub mrs: Arc<MrTable>,
    /// The device's addresses.
    pub addr: Arc<Addressing>,
    /// Its attributes (the limits a QP's attributes are checked against).
    pub attr: Arc<verbs_api::DeviceAttr>,
}

/// The parts of a QP's state that one connection's frames move ([`QpShared::scratch`]).
pub struct Parts<'a> {
    /// The send side.
    pub req: &'a mut Requester,
    /// The receive side.
    pub resp: &'a mut Responder,
    /// Completions of the send side, to deliver.
    pub send_wc: &'a mut Vec<WorkCompletion>,
    /// Completions of the receive side (with the solicited bit), to deliver.
    pub recv_wc: &'a mut Vec<(WorkCompletion, bool)>,
    /// Requests still to be answered with a forced RNR NAK (fault injection).
    pub force_rnr: &'a mut u32,
}

/// One QP, shared by the user's handle and the transport tasks.
pub struct QpShared {
    /// QP number.
    pub qpn: u32,
    /// What it takes from its device.
    pub dev: QpDevice,
    /// Handle of its PD.
    pub pd: u32,
    /// Send CQ.
    pub send_cq: Arc<CqShared>,
    /// Receive CQ.
    pub recv_cq: Arc<CqShared>,
    /// Granted capacities.
    pub cap: QpCap,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
    /// Mutable state.
    pub inner: Mutex<QpInner>,
    /// Wakes the requester's connection-setup task (work without a connection, a lost
    /// connection, a state change).
    pub req_wake: Notify,
    /// Set when the user destroyed the QP.
    pub destroyed: AtomicBool,
    /// Set while the QP waits in the progress engine's transmit queue.
    pub tx_queued: AtomicBool,
    /// Set once any fault was armed on this QP (keeps the fault checks off the fast path).
    pub fault_armed: AtomicBool,
}

impl QpShared {
    /// A new QP in RESET.
    pub fn new(
        qpn: u32,
        dev: QpDevice,
        pd: u32,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Self {
        let attr = QpAttr {
            cap,
            ..Default::default()
        };
        QpShared {
            qpn,
            inner: Mutex::new(QpInner {
                state: QpState::Reset,
                attr,
                req: Requester::new(qpn, pd, &cap, sq_sig_all),
                resp: Responder::new(qpn, pd, cap.max_recv_wr, cap.max_recv_sge),
                epoch: 0,
                conn_gen: 0,
                active: false,
                remote: None,
                conn: None,
                self_conn: None,
                timer_at: None,
                faults: QpFaults::default(),
                busy: false,
                send_wc: Vec::new(),
                recv_wc: Vec::new(),
            }),
            dev,
            pd,
            send_cq,
            recv_cq,
            cap,
            sq_sig_all,
            req_wake: Notify::new(),
            destroyed: AtomicBool::new(false),
            tx_queued: AtomicBool::new(false),
            fault_armed: AtomicBool::new(false),
        }
    }

    /// Closes both connections (RESET, destroy).
    fn close_conns(&self, g: &mut QpInner) {
        for c in [g.conn.take(), g.self_conn.take()].into_iter().flatten() {
            self.dev.path.close(&c);
        }
    }

    /// Whether a task of `epoch` must stop.
    pub fn is_stale(&self, g: &QpInner, epoch: u64) -> bool {
        g.epoch != epoch || self.destroyed.load(Ordering::Acquire)
    }

    /// Moves the QP to ERR (with the lock held): flushes both queues.
    pub fn enter_error(&self, g: &mut QpInner) {
        if g.state == QpState::Err {
            return;
        }
        tracing::debug!(qpn = self.qpn, from = ?g.state, "QP to ERR");
        g.state = QpState::Err;
        let QpInner {
            req,
            resp,
            send_wc,
            recv_wc,
            ..
        } = g;
        req.flush(send_wc);
        resp.flush(recv_wc);
        self.deliver(g);
        self.req_wake.notify_one();
    }

    /// Pushes the completions gathered in `g` to the CQs. A CQ overflow moves the QP to
    /// ERR (its completions are lost; the CQ reports the overflow).
    pub fn deliver(&self, g: &mut QpInner) {
        // Counted before the completions become visible: a poller that sees the last one
        // also sees the send queue empty.
        self.note_busy(g);
        loop {
            let ok_s = g.send_wc.is_empty() || self.send_cq.push_all(g.send_wc.drain(..).map(|w| (w, false)));
            let ok_r = g.recv_wc.is_empty() || self.recv_cq.push_all(g.recv_wc.drain(..));
            if (ok_s && ok_r) || g.state == QpState::Err {
                g.send_wc.clear();
                g.recv_wc.clear();
                // (Again: an overflow's flush may have emptied it.)
                self.note_busy(g);
                return;
            }
            tracing::warn!(qpn = self.qpn, "completion queue overflow: QP to ERR");
            self.enter_error_inner(g);
        }
    }

    /// Brings the device's count of busy send queues in line with this QP's (call after
    /// the send queue changed: a post, completions, a flush, a reset). Every path that
    /// completes or flushes WQEs ends in [`QpShared::deliver`], which calls it before it
    /// pushes the completions.
    pub fn note_busy(&self, g: &mut QpInner) {
        let busy = g.req.outstanding() > 0;
        if busy != g.busy {
            g.busy = busy;
            self.dev.path.count_busy(busy);
        }
    }

    fn enter_error_inner(&self, g: &mut QpInner) {
        g.state = QpState::Err;
        let QpInner {
            req,
            resp,
            send_wc,
            recv_wc,
            ..
        } = g;
        req.flush(send_wc);
        resp.flush(recv_wc);
        self.req_wake.notify_one();
    }

    /// The protocol halves, their completions, and fault injection's count of forced RNR
    /// NAKs: what the data path hands the protocol core for one connection's frames.
    pub fn scratch(g: &mut QpInner) -> Parts<'_> {
        Parts {
            req: &mut g.req,
            resp: &mut g.resp,
            send_wc: &mut g.send_wc,
            recv_wc: &mut g.recv_wc,
            force_rnr: &mut g.faults.force_rnr,
        }
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
            if ah.is_global && ah.grh.sgid_index as usize >= self.dev.addr.gids.len() {
                return bad(
                    "ah_attr.grh.sgid_index",
                    format!(
                        "index {} is outside the GID table of {} entries",
                        ah.grh.sgid_index,
                        self.dev.addr.gids.len()
                    ),
                );
            }
            if ah.dlid == 0 {
                return bad(
                    "ah_attr.dlid",
                    "LID 0 is not a valid destination (on the sim the LID is the peer device's TCP port)"
                        .into(),
                );
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
        let next = check_modify(cur, QpType::Rc, attr, mask)?;
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
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if next != QpState::Err && next != cur {
            // (ERR is logged by `enter_error`, which every path to it takes.)
            tracing::debug!(qpn = self.qpn, from = ?cur, to = ?next, "QP state change");
        }
        let a = g.attr;
        g.resp.access = a.qp_access_flags;
        g.resp.max_dest_rd_atomic = a.max_dest_rd_atomic;
        g.resp.min_rnr_timer = a.min_rnr_timer;
        match next {
            QpState::Reset => {
                if let Some(c) = g.conn.clone() {
                    // As in `destroy`: what was executed is acknowledged first.
                    drop(g);
                    self.dev.path.flush_final(&c);
                    g = self.inner.lock();
                }
                g.req.reset();
                g.resp.reset();
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
                self.enter_error(&mut g);
            }
            QpState::Rtr if cur == QpState::Init => {
                g.remote = Some(self.dev.addr.remote_addr(&a));
                g.req.dest_qpn = a.dest_qp_num;
                // Not connected yet (see `Requester::link_error`).
                g.req.link_error = libc::ENOTCONN as u32;
                g.resp.connect(RespAttrs {
                    rq_psn: a.rq_psn,
                    min_rnr_timer: a.min_rnr_timer,
                });
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
            }
            _ => {}
        }
        if next != QpState::Err {
            g.state = next;
        }
        if cur == QpState::Sqd && next == QpState::Rts && g.req.has_unsent() {
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
        a.sq_draining = g.req.draining && g.req.outstanding() > 0;
        a
    }

    /// `ibv_post_send`.
    pub fn post_send(self: &Arc<Self>, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let mut g = self.inner.lock();
        let mut posted = false;
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |error: Error| PostError {
                index,
                wr_id: wr.wr_id,
                error,
            };
            if matches!(g.state, QpState::Reset | QpState::Init | QpState::Rtr) {
                result = Err(fail(Error::InvalidQpState {
                    call: "ibv_post_send",
                    qpn: self.qpn,
                    state: g.state,
                    reason: "send work requests need RTS (or SQD/ERR)",
                }));
                break;
            }
            if let Err(c) = g.req.post(wr, &self.dev.mrs) {
                let error = match c {
                    PostCheck::Full => Error::QueueFull {
                        queue: QueueKind::Send,
                        qpn: self.qpn,
                        capacity: self.cap.max_send_wr,
                    },
                    PostCheck::TooManySge => Error::invalid(
                        "ibv_post_send",
                        format!(
                            "{} SGEs exceed max_send_sge {}",
                            wr.sg_list.len(),
                            self.cap.max_send_sge
                        ),
                    ),
                    PostCheck::InlineTooLong => Error::invalid(
                        "ibv_post_send",
                        format!(
                            "{} bytes of inline data exceed max_inline_data {}",
                            wr.total_len(),
                            self.cap.max_inline_data
                        ),
                    ),
                    PostCheck::InlineNotAllowed => Error::invalid(
                        "ibv_post_send",
                        "IBV_SEND_INLINE is only valid for SEND and RDMA WRITE",
                    ),
                    PostCheck::BadInlineSge => Error::invalid(
                        "ibv_post_send",
                        "an inline SGE is not inside a registered memory region of this QP's PD",
                    ),
                };
                result = Err(fail(error));
                break;
            }
            posted = true;
        }
        if posted {
            self.note_busy(&mut g);
            if g.state == QpState::Err {
                let QpInner { req, send_wc, .. } = &mut *g;
                req.flush(send_wc);
                self.deliver(&mut g);
            } else if g.state == QpState::Rts {
                self.start_send_queue(g, Some(wrs.len()));
            }
        }
        result
    }

    /// Starts sending what the send queue holds, now that it may: after `post_send` in
    /// RTS (`posted`: the number of WRs of the call), and after SQD -> RTS (`None`), which
    /// resumes the WQEs posted while the queue drained: nothing else starts them, and
    /// without this they would wait for the next post. Releases the lock.
    fn start_send_queue(self: &Arc<Self>, mut g: MutexGuard<'_, QpInner>, posted: Option<usize>) {
        let conn = g.conn.clone();
        let idle = g.req.nothing_in_flight();
        if conn.is_none() {
            // No connection (not yet, or the peer is gone). An HCA processes the
            // WQEs anyway, whether anything answers or not: build the frames (the
            // local checks run, so a bad lkey is LOC_PROT_ERR now, not a transport
            // error after the retries) and lose them on the way. They are resent
            // once connected; until then the ACK timer runs.
            let now = Self::now();
            let QpInner { req, send_wc, .. } = &mut *g;
            let mut void = TxQueue::new();
            let built = req.poll_transmit(&self.dev.mrs, now, &mut void, usize::MAX, send_wc);
            req.on_connection_lost();
            if built.is_err() {
                self.enter_error(&mut g);
            } else {
                g.req.arm_timer(now);
                self.dev.path.rearm(self, &mut g);
            }
        }
        drop(g);
        match (conn, posted) {
            (Some(c), Some(wrs)) => self.dev.path.kick(self, &c, idle, wrs),
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
            if g.state == QpState::Reset {
                result = Err(fail(Error::InvalidQpState {
                    call: "ibv_post_recv",
                    qpn: self.qpn,
                    state: g.state,
                    reason: "receives can be posted from INIT on",
                }));
                break;
            }
            match g.resp.post(wr) {
                Ok(()) => posted = true,
                Err(full) => {
                    result = Err(fail(if full {
                        Error::QueueFull {
                            queue: QueueKind::Recv,
                            qpn: self.qpn,
                            capacity: self.cap.max_recv_wr,
                        }
                    } else {
                        Error::invalid(
                            "ibv_post_recv",
                            format!(
                                "{} SGEs exceed max_recv_sge {}",
                                wr.sg_list.len(),
                                self.cap.max_recv_sge
                            ),
                        )
                    }));
                    break;
                }
            }
        }
        if posted && g.state == QpState::Err {
            let QpInner { resp, recv_wc, .. } = &mut *g;
            resp.flush(recv_wc);
            self.deliver(&mut g);
        }
        result
    }

    /// The user destroyed the QP: stop its tasks, forget its queues.
    pub fn destroy(&self) {
        // An HCA acknowledged what it executed long before the application could
        // destroy the QP: write ACKs still owed (delayed ACK) first.
        let conn = self.inner.lock().conn.clone();
        if let Some(c) = conn {
            self.dev.path.flush_final(&c);
        }
        self.destroyed.store(true, Ordering::Release);
        let mut g = self.inner.lock();
        g.epoch += 1;
        g.req.reset();
        g.resp.reset();
        self.note_busy(&mut g);
        self.close_conns(&mut g);
        drop(g);
        self.req_wake.notify_one();
    }

    /// Current time, in one place so tests can see where time enters.
    pub fn now() -> Instant {
        Instant::now()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use verbs_api::{
        connect_rc, local_endpoint, poll_n, AccessFlags, Context, Endpoint, MemoryRegion, ProtectionDomain,
        QpCap, QpInitAttr, QpState, QueuePair, RcParams, SendWr, Sge, WcStatus,
    };

    use crate::SimBackend;

    /// An HCA processes a WQE whether or not anything answers at the other end, so a
    /// local protection error completes at once, also on a QP without a connection (its
    /// peer unreachable, not yet connected, or gone). Found by the verbs-level model
    /// check (tests/model.rs): the sim built WQEs only once a connection existed, so a
    /// bad lkey towards a peer in ERR or destroyed ended as RETRY_EXC_ERR after the
    /// retries instead of LOC_PROT_ERR.
    #[test]
    fn local_errors_complete_without_a_connection() {
        use verbs_api::Backend;
        let sim = SimBackend::default();
        let ctx = sim.open("sim0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let cap = QpCap::new(4, 4);
        let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        // 67 ms x 8 tries: the old outcome took half a second.
        let p = RcParams {
            timeout: 14,
            retry_cnt: 7,
            ..RcParams::default()
        };
        let me = local_endpoint(&ctx, &qp, &p, 1).unwrap();
        // A peer that does not exist: no connection ever forms.
        let nobody = Endpoint {
            qpn: qp.qp_num() ^ 0x80_0000,
            ..me
        };
        connect_rc(&qp, &p, me.psn, &nobody).unwrap();
        let bad = [Sge::new(mr.addr(), 8, mr.lkey() ^ 0x5a5a_0000)];
        let good = [mr.sge(0, 8).unwrap()];
        let t0 = Instant::now();
        qp.post_send(&[
            SendWr::write(1, &good, mr.remote().at(0)).signaled(),
            SendWr::send(2, &bad),
        ])
        .unwrap();
        let wc = poll_n(&cq, 2, Duration::from_secs(10)).unwrap();
        let took = t0.elapsed();
        assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::WrFlushErr), "{wc:?}");
        assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::LocProtErr), "{wc:?}");
        assert!(
            took < Duration::from_millis(300),
            "took {took:?}: waited for transport retries"
        );
        assert_eq!(qp.state().unwrap(), QpState::Err);
    }

    /// The device's count of QPs with WQEs in their send queues (which decides whether a
    /// lone WR on an idle connection may wait for the ones posted after it, see
    /// `Progress::kick`) follows posts, completions, flushes, RESET and destroy. A
    /// count left too high would make the device hold WRs for nothing; too low, never.
    #[test]
    fn the_busy_send_queue_count_follows_posts_completions_flushes_and_resets() {
        use verbs_api::{Backend, QpAttr, QpAttrMask};
        let sim = SimBackend::default();
        let ctx = sim.open("sim0").unwrap();
        let peer = sim.open("sim1").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let ppd = peer.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let pcq = peer.create_cq(64, None).unwrap();
        let cap = QpCap::new(8, 8);
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let pmr = ppd
            .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let busy = || ctx.dev.progress.busy_send_queues();
        // WQEs towards a peer that does not exist stay outstanding (resent after a
        // timeout of 4.3 s, far beyond this test).
        let p = RcParams {
            timeout: 20,
            ..RcParams::default()
        };
        let lonely = |ctx: &crate::SimContext| {
            let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
            let me = local_endpoint(ctx, &qp, &p, 1).unwrap();
            let nobody = Endpoint {
                qpn: qp.qp_num() ^ 0x80_0000,
                ..me
            };
            connect_rc(&qp, &p, me.psn, &nobody).unwrap();
            qp
        };
        let sge = [mr.sge(0, 8).unwrap()];
        let write = |id| SendWr::write(id, &sge, pmr.remote().at(0)).signaled();
        assert_eq!(busy(), 0);

        // Posts: each QP counts once, however many WQEs it holds.
        let q1 = lonely(&ctx);
        let q2 = lonely(&ctx);
        let q3 = lonely(&ctx);
        q1.post_send(&[write(1), write(2)]).unwrap();
        assert_eq!(busy(), 1);
        q1.post_send(&[write(3)]).unwrap();
        q2.post_send(&[write(4)]).unwrap();
        q3.post_send(&[write(5)]).unwrap();
        assert_eq!(busy(), 3);
        // A flush (the QP to ERR), RESET and destroy each empty a send queue.
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        q1.modify(&err, QpAttrMask::STATE).unwrap();
        assert_eq!(busy(), 2);
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        q2.modify(&reset, QpAttrMask::STATE).unwrap();
        assert_eq!(busy(), 1);
        drop(q3);
        assert_eq!(busy(), 0);
        let flushed = poll_n(&cq, 3, Duration::from_secs(5)).unwrap();
        assert!(
            flushed.iter().all(|w| w.status == WcStatus::WrFlushErr),
            "{flushed:?}"
        );

        // Completions: a connected QP is busy until its WRITEs are acknowledged.
        let qa = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
        let qb = ppd.create_qp(&QpInitAttr::rc(&pcq, &pcq, cap)).unwrap();
        let p = RcParams::default();
        let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
        let eb = local_endpoint(&peer, &qb, &p, 2).unwrap();
        connect_rc(&qa, &p, 1, &eb).unwrap();
        connect_rc(&qb, &p, 2, &ea).unwrap();
        for round in 0..3 {
            qa.post_send(&[write(10), write(11)]).unwrap();
            let wc = poll_n(&cq, 2, Duration::from_secs(10)).unwrap();
            assert!(wc.iter().all(|w| w.is_ok()), "round {round}: {wc:?}");
            assert_eq!(busy(), 0, "round {round}");
        }
    }

    /// Every ACK a receiver owes is sent, whether it polls now and then or in a tight
    /// loop, and the delayed-ACK list keeps a connection once (no adding and removing per
    /// message): a one-way stream of SENDs, each acknowledged before the next, whose
    /// receiver only polls (it posts no SEND that could carry the ACK). With an infinite
    /// local ACK timeout no resend can complete a SEND whose ACK stayed behind. A receiver
    /// polling once a millisecond does not drive progress, and its ACK used to wait for
    /// its next call, which here never comes before the sender's completion: the stream
    /// hung at its first SEND. A receiver that polls in a tight loop and then stops
    /// leaves its ACK to the progress thread. Each device's list holds its one connection
    /// at most, and none once the QPs are destroyed.
    #[test]
    fn each_owed_ack_is_sent_and_the_delayed_ack_list_keeps_a_connection_once() {
        use verbs_api::{Backend, CompletionQueue, RecvWr, WcOpcode, WorkCompletion};
        let sim = SimBackend::default();
        let (ctx, peer) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
        let (pd, ppd) = (ctx.alloc_pd().unwrap(), peer.alloc_pd().unwrap());
        let (cq, pcq) = (
            ctx.create_cq(16, None).unwrap(),
            peer.create_cq(16, None).unwrap(),
        );
        let cap = QpCap::new(8, 8);
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let pmr = ppd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let qa = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
        let qb = ppd.create_qp(&QpInitAttr::rc(&pcq, &pcq, cap)).unwrap();
        // Local ACK timeout 0: infinite.
        let p = RcParams {
            timeout: 0,
            ..RcParams::default()
        };
        let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
        let eb = local_endpoint(&peer, &qb, &p, 2).unwrap();
        connect_rc(&qa, &p, 1, &eb).unwrap();
        connect_rc(&qb, &p, 2, &ea).unwrap();
        let sge = [mr.sge(0, 8).unwrap()];
        // The first 10 received by polling once a millisecond, the rest in a tight loop:
        // 10 by a thread that stops polling then, 20 by this thread, which moves on to the
        // sender's device.
        let nap_poll = || {
            let mut wc = [WorkCompletion::default()];
            let deadline = Instant::now() + Duration::from_secs(10);
            while pcq.poll(&mut wc).unwrap() == 0 {
                assert!(Instant::now() < deadline, "no receive completion");
                std::thread::sleep(Duration::from_millis(1));
            }
            wc.to_vec()
        };
        for i in 0..40u64 {
            qb.post_recv(&[RecvWr::new(i, &[pmr.sge(0, 8).unwrap()])])
                .unwrap();
            let send = || qa.post_send(&[SendWr::send(i, &sge).signaled()]).unwrap();
            let got = match i {
                0..10 => {
                    send();
                    nap_poll()
                }
                // Polled in a tight loop (it has been polling for a while when the SEND
                // comes) by a thread that then stops polling: it neither polls again nor
                // moves to another device. The progress thread sends the ACK once the
                // driving window and grace period are over.
                10..20 => std::thread::scope(|s| {
                    let receiver = s.spawn(|| poll_n(&pcq, 1, Duration::from_secs(10)).unwrap());
                    std::thread::sleep(Duration::from_millis(1));
                    send();
                    receiver.join().unwrap()
                }),
                _ => {
                    send();
                    poll_n(&pcq, 1, Duration::from_secs(10)).unwrap()
                }
            };
            assert_eq!((got[0].opcode, got[0].wr_id), (WcOpcode::Recv, i), "{got:?}");
            let done = poll_n(&cq, 1, Duration::from_secs(10)).unwrap();
            assert!(done[0].is_ok() && done[0].wr_id == i, "SEND {i}: {done:?}");
            assert!(peer.dev.progress.acks_listed() <= 1, "SEND {i}");
            assert!(peer.dev.progress.acks_owed() <= 1, "SEND {i}");
        }
        assert_eq!(ctx.dev.progress.acks_listed(), 0, "the sender never owed an ACK");
        assert_eq!(ctx.dev.progress.acks_owed(), 0, "the sender never owed an ACK");
        drop((qa, qb));
        // The receiver's connection may be closed by its progress thread (it saw the
        // sender's end close first) rather than by `destroy`: wait for that close.
        let deadline = Instant::now() + Duration::from_secs(10);
        while peer.dev.progress.acks_listed() > 0 {
            assert!(Instant::now() < deadline, "a closed connection leaves the list");
            std::thread::sleep(Duration::from_millis(1));
        }
        // A count left above zero would keep the progress thread from ever sleeping.
        assert_eq!(
            peer.dev.progress.acks_owed(),
            0,
            "a closed connection owes nothing"
        );
    }

    /// The device's count of owed ACKs ends at zero, and its delayed-ACK list empty,
    /// however a connection's close and a round that leaves an ACK for later interleave:
    /// a round that finishes after the close (it held the I/O lock while `close` ran)
    /// counts and lists the connection, then sees it closed and takes both back. A count
    /// stuck above zero would keep the progress thread from sleeping for as long as the
    /// device lives; a closed connection kept in the list would keep its socket open.
    #[test]
    fn a_close_leaves_no_owed_ack_counted_whichever_comes_first() {
        use verbs_api::Backend;
        let sim = SimBackend::default();
        let ctx = sim.open("sim0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let cap = QpCap::new(8, 8);
        let progress = &ctx.dev.progress;
        for close_first in [false, true] {
            let (qa, qb) = (
                pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap(),
                pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap(),
            );
            let p = RcParams::default();
            let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
            let eb = local_endpoint(&ctx, &qb, &p, 2).unwrap();
            connect_rc(&qa, &p, 1, &eb).unwrap();
            connect_rc(&qb, &p, 2, &ea).unwrap();
            // The connection comes up in the background.
            let deadline = Instant::now() + Duration::from_secs(10);
            let conn = loop {
                if let Some(c) = qa.qp.inner.lock().conn.clone() {
                    break c;
                }
                assert!(Instant::now() < deadline, "no connection");
                std::thread::sleep(Duration::from_millis(1));
            };
            if close_first {
                progress.close(&conn);
                progress.owe_ack(&conn);
            } else {
                // (Not checked in between: the progress thread may service the
                // connection and find nothing owed.)
                progress.owe_ack(&conn);
                progress.owe_ack(&conn);
                progress.close(&conn);
            }
            assert_eq!(progress.acks_owed(), 0, "close_first: {close_first}");
            assert_eq!(progress.acks_listed(), 0, "close_first: {close_first}");
        }
    }

    /// A lone WR posted to an idle QP while this thread drives progress, after another
    /// post, and another QP of the device has work outstanding waits for the WRs posted
    /// after it (`Progress::kick`). A thread that posts it and then stops polling (it computes)
    /// must still have it executed: the progress thread takes it when the driving window
    /// and the grace period end (about 2.1 ms; checked here with a wide margin). Without
    /// that hand-over the WRITE would wait for a poll that never comes.
    #[test]
    fn a_lone_write_that_waits_while_the_thread_drives_is_executed_without_another_poll() {
        use verbs_api::{Backend, CompletionQueue, WorkCompletion};
        let sim = SimBackend::default();
        let c0 = sim.open("sim0").unwrap();
        let c1 = sim.open("sim1").unwrap();
        let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
        let (cq0, cq1) = (c0.create_cq(64, None).unwrap(), c1.create_cq(64, None).unwrap());
        let cap = QpCap::new(8, 8);
        // A timeout of 1.07 s: the stalled WRITE below is not resent meanwhile.
        let p = RcParams {
            timeout: 18,
            ..RcParams::default()
        };
        let pair = || {
            let a = pd0.create_qp(&QpInitAttr::rc(&cq0, &cq0, cap)).unwrap();
            let b = pd1.create_qp(&QpInitAttr::rc(&cq1, &cq1, cap)).unwrap();
            let ea = local_endpoint(&c0, &a, &p, 1).unwrap();
            let eb = local_endpoint(&c1, &b, &p, 2).unwrap();
            connect_rc(&a, &p, 1, &eb).unwrap();
            connect_rc(&b, &p, 2, &ea).unwrap();
            (a, b)
        };
        let (a1, b1) = pair();
        let (a2, _b2) = pair();
        let (a3, _b3) = pair();
        let src = pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let dst = pd1
            .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        src.write_u64(0, 0x1111).unwrap();
        src.write_u64(8, 0x2222).unwrap();
        let first = [src.sge(0, 8).unwrap()];
        let lone = [src.sge(8, 8).unwrap()];
        let write = |qp: &crate::SimQp, id, sge, at| {
            qp.post_send(&[SendWr::write(id, sge, dst.remote().at(at)).signaled()])
                .unwrap()
        };
        // All connections up (one WRITE each, completed).
        write(&a1, 1, &first, 0);
        write(&a2, 2, &lone, 8);
        write(&a3, 3, &first, 16);
        let wc = poll_n(&cq0, 3, Duration::from_secs(10)).unwrap();
        assert!(wc.iter().all(|w| w.is_ok()), "{wc:?}");

        // a1's next WRITE stays outstanding: its peer processes nothing for 1 s.
        c1.faults()
            .stall_responder(b1.qp_num(), Duration::from_secs(1))
            .unwrap();
        write(&a1, 9, &first, 0);
        let joined = || c0.dev.progress.joined.load(std::sync::atomic::Ordering::Relaxed);
        let mut wcs = [WorkCompletion::default(); 8];
        let mut done = Vec::new();
        // Whether this thread still drives when it posts depends on the scheduler (a
        // thread preempted for longer than the driving window between its last poll and
        // its posts no longer drives, and its WRITE leaves at once): try until one waits.
        for attempt in 0.. {
            assert!(attempt < 50, "no lone WRITE waited in 50 attempts");
            dst.write_u64(8, 0).unwrap();
            // Drive: polls in a tight loop for 2 ms.
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(2) {
                let n = cq0.poll(&mut wcs).unwrap();
                done.extend_from_slice(&wcs[..n]);
            }
            let before = joined();
            // The first post after a poll leaves at once (a ping-pong's post)...
            write(&a3, 100 + attempt, &first, 16);
            assert_eq!(joined(), before);
            // ...the next one, to an idle QP while a1 is busy, waits for more.
            write(&a2, 200 + attempt, &lone, 8);
            let waited = joined() == before + 1;
            // Then compute: no more polls until the WRITE has landed.
            let t = Instant::now();
            while dst.read_u64(8).unwrap() != 0x2222 {
                assert!(
                    t.elapsed() < Duration::from_secs(1),
                    "the lone WRITE never left without a poll (it waited: {waited})"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
            if waited {
                break;
            }
        }
        // Everything completes, a1's WRITE once the stall is over.
        let t = Instant::now();
        while !done.iter().any(|w| w.wr_id == 9) {
            assert!(t.elapsed() < Duration::from_secs(10), "{done:?}");
            let n = cq0.poll(&mut wcs).unwrap();
            done.extend_from_slice(&wcs[..n]);
        }
        assert!(done.iter().all(|w| w.is_ok()), "{done:?}");
    }

    /// One thread ping-pongs SENDs between two QPs of one device (a test with both ends
    /// in one process, or `perf-compare`'s one-thread cost row). Each QP looks busy while
    /// it owes the other an ACK (delayed until the thread's next call), so "other QPs
    /// have work outstanding" holds at every post; the posts must still leave at once,
    /// as every one of them is the first after a poll. (Holding them cost about 1 us of
    /// CPU per message.)
    #[test]
    fn a_ping_pong_between_two_qps_of_one_device_never_waits() {
        use verbs_api::{Backend, CompletionQueue, RecvWr, WcOpcode, WorkCompletion};
        let sim = SimBackend::default();
        let ctx = sim.open("sim0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cqs = [ctx.create_cq(64, None).unwrap(), ctx.create_cq(64, None).unwrap()];
        let cap = QpCap::new(16, 16).with_inline(64);
        let qps = [
            pd.create_qp(&QpInitAttr::rc(&cqs[0], &cqs[0], cap)).unwrap(),
            pd.create_qp(&QpInitAttr::rc(&cqs[1], &cqs[1], cap)).unwrap(),
        ];
        let p = RcParams::default();
        let ends = [
            local_endpoint(&ctx, &qps[0], &p, 1).unwrap(),
            local_endpoint(&ctx, &qps[1], &p, 1).unwrap(),
        ];
        connect_rc(&qps[0], &p, 1, &ends[1]).unwrap();
        connect_rc(&qps[1], &p, 1, &ends[0]).unwrap();
        let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        for qp in &qps {
            for _ in 0..8 {
                qp.post_recv(&[RecvWr::new(0, &[mr.sge(0, 64).unwrap()])])
                    .unwrap();
            }
        }
        let mut wc = [WorkCompletion::default(); 8];
        let mut busy_seen = 0;
        for i in 0..400 {
            let (from, to) = (i % 2, 1 - i % 2);
            busy_seen += usize::from(ctx.dev.progress.busy_send_queues() > 0);
            qps[from]
                .post_send(&[SendWr::send(1, &[mr.sge(64, 8).unwrap()]).signaled().inline()])
                .unwrap();
            let t = Instant::now();
            'wait: loop {
                let n = cqs[to].poll(&mut wc).unwrap();
                for w in &wc[..n] {
                    assert!(w.is_ok(), "hop {i}: {w:?}");
                    if w.opcode == WcOpcode::Recv {
                        break 'wait;
                    }
                }
                assert!(t.elapsed() < Duration::from_secs(10), "hop {i}: SEND lost");
            }
            qps[to]
                .post_recv(&[RecvWr::new(0, &[mr.sge(0, 64).unwrap()])])
                .unwrap();
        }
        assert!(busy_seen > 100, "the other QP was busy at only {busy_seen} posts");
        let joined = ctx.dev.progress.joined.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            joined, 0,
            "{joined} of 400 SENDs waited for a post that never came"
        );
    }

    /// QP state changes and the loss of a connection are debug events, on the thread that
    /// causes them: the modify, and here the fault injection that breaks the connection.
    #[test]
    fn state_changes_and_a_lost_connection_are_logged() {
        use backend_sim_proto::trace_capture::Capture;
        use tracing::Level;
        use verbs_api::Backend;
        let sim = SimBackend::default();
        let ctx = sim.open("sim0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let cap = QpCap::new(4, 4);
        let qa = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
        let qb = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
        let mr = pd
            .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let p = RcParams::default();
        let ea = local_endpoint(&ctx, &qa, &p, 1).unwrap();
        let eb = local_endpoint(&ctx, &qb, &p, 2).unwrap();
        let log = Capture::default();
        log.run(|| {
            connect_rc(&qa, &p, 1, &eb).unwrap();
            connect_rc(&qb, &p, 2, &ea).unwrap();
            // Connected once this WRITE has completed.
            qa.post_send(&[SendWr::write(1, &[mr.sge(0, 8).unwrap()], mr.remote().at(8)).signaled()])
                .unwrap();
            assert!(poll_n(&cq, 1, Duration::from_secs(10)).unwrap()[0].is_ok());
            ctx.faults().drop_connections(qa.qp_num()).unwrap();
        });
        let qpn = qa.qp_num().to_string();
        let changes: Vec<(String, String)> = log
            .find(Level::DEBUG, "QP state change")
            .iter()
            .filter(|e| e.field("qpn") == Some(qpn.as_str()))
            .map(|e| {
                (
                    e.field("from").unwrap().to_string(),
                    e.field("to").unwrap().to_string(),
                )
            })
            .collect();
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            changes,
            [pair("Reset", "Init"), pair("Init", "Rtr"), pair("Rtr", "Rts")]
        );
        let lost = log.find(Level::DEBUG, "connection lost");
        assert!(
            lost.iter().any(|e| e.field("qpn") == Some(qpn.as_str())
                && e.field("dest_qpn") == Some(qb.qp_num().to_string().as_str())),
            "{:?}",
            log.events()
        );
    }
}
