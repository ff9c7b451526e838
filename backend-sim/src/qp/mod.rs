//! The queue pair (`man ibv_create_qp`): the protocol core's [`Qp`] (state machine, both
//! halves, their completions and events) behind a mutex that the data path takes briefly
//! (never across I/O), its connections, and what it asks of its device ([`DataPath`]). Its verbs are in [`modify`] (state machine
//! and attributes) and [`post`] (the post verbs); what a UD QP does otherwise, in [`ud`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use backend_sim_proto::qp::{Completions, Qp, QpConfig};
use parking_lot::Mutex;
use tokio::sync::Notify;
use verbs_api::event_queue::EventQueue;
use verbs_api::{AccessFlags, AsyncElement, AsyncEvent, AsyncEventType, QpCap, QpState, QpType};

use crate::addressing::Addressing;
use crate::counters::DeviceCounters;
use crate::cq::{CqShared, SlotMark};
use crate::fault_state::QpFaults;
use crate::profile::warnings::QpWarnings;
use backend_sim_proto::memory::MrTable;
use backend_sim_proto::recv_queue::SharedRecvQueue;

mod modify;
mod post;
#[cfg(test)]
mod tests;
pub mod ud;

/// Everything about a QP that changes, under one lock.
pub struct QpInner {
    /// The QP itself: state machine, both halves, what they owe
    /// ([`backend_sim_proto::qp`]).
    pub qp: Qp,
    /// Bumped on RESET and destroy: transport tasks of an older epoch stop.
    pub epoch: u64,
    /// Bumped for every connection set up for `conn`: only the newest one serves.
    pub conn_gen: u64,
    /// The same for `self_conn`: a QP connected to itself sets a connection up and
    /// accepts it, and each end counts its own (counted together, the end installed
    /// last would take the other's setup for a newer one of its own, and close itself).
    pub self_conn_gen: u64,
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
    /// Whether the QP waits for its connection and is counted in the device's count of
    /// links awaited (kept in step by [`QpShared::note_link`]).
    pub awaits_link: bool,
    /// Scratch for the marks of the send completions
    /// ([`Completions::take_marks`](backend_sim_proto::qp::Completions::take_marks)).
    marks: Vec<u64>,
    /// Where an RC QP that accepts requests is published for same-host peers' fast
    /// path, with the remote rights published ([`QpShared::sync_onesided`]).
    onesided: Option<(crate::onesided::table::QpSlot, verbs_api::AccessFlags)>,
}

pub use backend_sim_proto::qp::receives_in;

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
    /// The QP started (`true`) or stopped waiting for its connection.
    fn count_awaiting_link(&self, awaits: bool);
    /// Schedules the QP's next timer check (with its lock held).
    fn rearm(&self, qp: &Arc<QpShared>, g: &mut QpInner);
    /// WRs were posted to a connected QP in RTS (`wrs` of them, `bytes` of payload):
    /// transmit them, now or soon.
    fn kick(&self, qp: &Arc<QpShared>, conn: &Arc<Conn>, idle: bool, wrs: usize, bytes: u64);
    /// The QP has work for its connection: service it soon.
    fn schedule(&self, qp: &Arc<QpShared>);
    /// The QP (the active side of its pair) needs a connection for `epoch`.
    fn connect(&self, qp: Arc<QpShared>, epoch: u64);
    /// The UD QP has datagrams to send (it is in RTS or SQD): hand them to the links to
    /// their devices (called without its lock).
    fn send_datagrams(&self, qp: &Arc<QpShared>);
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
    /// Its asynchronous events, which the QP raises for itself and for what its
    /// responder found (`man ibv_get_async_event`).
    pub events: Arc<EventQueue>,
    /// Its counters (what responders dropped, requesters' local ACK timeouts).
    pub counters: Arc<DeviceCounters>,
    /// The kind of HCA it plays: its switches decide what the QP does where HCAs differ.
    pub profile: crate::profile::Profile,
    /// The portability advice of its backend (`profile::warnings`).
    pub advice: Arc<crate::profile::warnings::Advice>,
    /// Its port's state.
    pub port: Arc<crate::port::Port>,
    /// Its capture, if on ([`crate::capture`]).
    pub capture: crate::capture::Slot,
    /// Its table for same-host peers' one-sided fast path, if it has one.
    pub onesided: Option<Arc<crate::onesided::owner::Owner>>,
}

/// One QP, shared by the user's handle and the transport tasks.
pub struct QpShared {
    /// QP number.
    pub qpn: u32,
    /// The handle of its PD.
    pub pd: u32,
    /// Its transport: RC, UC or UD.
    pub qp_type: QpType,
    /// What it takes from its device.
    pub dev: QpDevice,
    /// Send CQ.
    pub send_cq: Arc<CqShared>,
    /// Receive CQ.
    pub recv_cq: Arc<CqShared>,
    /// Granted capacities.
    pub cap: QpCap,
    /// Mutable state.
    pub inner: Mutex<QpInner>,
    /// Wakes the requester's connection-setup task (work without a connection, a lost
    /// connection, a state change).
    pub req_wake: Notify,
    /// Wakes the peer's hellos that wait for the QP to leave RESET or INIT (every state
    /// change and the destroy notify it; see `transport`).
    pub ready: Notify,
    /// Set when the user destroyed the QP.
    pub destroyed: AtomicBool,
    /// Set while the QP waits in the progress engine's transmit queue.
    pub tx_queued: AtomicBool,
    /// Set once any fault was armed on this QP (keeps the fault checks off the fast path).
    pub fault_armed: AtomicBool,
    /// The portability warnings it gave (`portable` profile).
    pub warned: QpWarnings,
    /// Created with `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`: it does not receive the
    /// multicast datagrams it sends itself.
    pub block_self_mcast: bool,
}

impl QpShared {
    /// What `rdma-sim status` shows of the QP ([`control`](crate::control)).
    pub fn status(&self) -> crate::control::QpStatus {
        let g = self.inner.lock();
        let connected = self.qp_type != QpType::Ud && g.qp.state() >= QpState::Rtr;
        let up = g.conn.as_ref().is_some_and(|c| !c.closed.load(Ordering::Relaxed));
        crate::control::QpStatus {
            qpn: self.qpn,
            qp_type: format!("{:?}", self.qp_type).to_uppercase(),
            state: format!("{:?}", g.qp.state()).to_uppercase(),
            dest_qpn: connected.then_some(g.qp.attr().dest_qp_num),
            peer: connected.then(|| g.remote.map(|a| a.to_string())).flatten(),
            connected: connected && up,
            sq_psn: g.qp.sq_psn(),
            rq_psn: g.qp.rq_psn(),
            sq_outstanding: g.qp.sq_outstanding(),
            rq_posted: g.qp.rq_posted(),
            srq: g.qp.has_srq(),
        }
    }

    /// A new QP in RESET, taking its receives from `srq` if given (and then holding it:
    /// the SRQ lives as long as any QP that uses it).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        qpn: u32,
        qp_type: QpType,
        dev: QpDevice,
        pd: u32,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
        srq: Option<Arc<SharedRecvQueue>>,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Self {
        let limits = dev.profile.attrs();
        let qp = Qp::create(QpConfig {
            qpn,
            pd,
            qp_type,
            cap,
            sq_sig_all,
            srq,
            sw: dev.profile.switches(),
            max_msg_sz: limits.max_msg_sz,
            mtu: limits.active_mtu.bytes(),
            roce: limits.link_layer == verbs_api::LinkLayer::Ethernet,
        });
        QpShared {
            qpn,
            qp_type,
            inner: Mutex::new(QpInner {
                qp,
                epoch: 0,
                conn_gen: 0,
                self_conn_gen: 0,
                active: false,
                remote: None,
                conn: None,
                self_conn: None,
                timer_at: None,
                faults: QpFaults::default(),
                busy: false,
                awaits_link: false,
                marks: Vec::new(),
                onesided: None,
            }),
            pd,
            dev,
            send_cq,
            recv_cq,
            cap,
            req_wake: Notify::new(),
            ready: Notify::new(),
            destroyed: AtomicBool::new(false),
            tx_queued: AtomicBool::new(false),
            fault_armed: AtomicBool::new(false),
            warned: QpWarnings::default(),
            block_self_mcast: false,
        }
    }

    /// The same, created with `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` (`on`).
    pub fn blocking_self_mcast(self, on: bool) -> Self {
        QpShared {
            block_self_mcast: on,
            ..self
        }
    }

    /// RESET or destroy (`what`): on a device that cleans CQs, the QP's completions leave
    /// its CQs (and under `portable`, removing some the application never polled is
    /// warned about, see `profile::warnings`).
    fn clean_cqs(&self, what: &str) {
        if !self.dev.profile.switches().cq_clean_on_reset {
            return;
        }
        let mut n = self.send_cq.clean(self.qpn);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            n += self.recv_cq.clean(self.qpn);
        }
        if n > 0 && self.dev.profile.warns() {
            self.dev.advice.cqes_removed(self.qpn, what, n);
        }
    }

    /// Publishes the QP for same-host peers' one-sided fast path while it is an RC QP
    /// that accepts requests (RTR, RTS, SQD), with its PD and remote rights as they are
    /// now; revokes it otherwise (ERR, RESET, destroy), waiting for peers' copies that
    /// checked it before this returns.
    pub(crate) fn sync_onesided(&self, g: &mut QpInner) {
        let Some(owner) = &self.dev.onesided else {
            return;
        };
        let attr = g.qp.attr();
        let mut access = attr.qp_access_flags;
        // Without responder resources the QP answers READs and atomics with
        // NAK-invalid request (IBA 9.7.5.2.2); the path must not execute them first.
        if attr.max_dest_rd_atomic == 0 {
            access.remove(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC);
        }
        let want = self.qp_type == QpType::Rc
            && receives_in(g.qp.state())
            && !self.destroyed.load(Ordering::Acquire);
        match g.onesided.take() {
            Some((slot, was)) if want && was == access => g.onesided = Some((slot, was)),
            old => {
                if let Some((slot, _)) = old {
                    owner.revoke_qp(slot);
                }
                if want {
                    g.onesided = owner.publish_qp(self.qpn, self.pd, access).map(|s| (s, access));
                }
            }
        }
    }

    /// Offers the requester the fast path of the connection just installed (`None`:
    /// the connection has none).
    pub(crate) fn offer_direct(&self, g: &mut QpInner, link: Option<Arc<crate::onesided::link::Link>>) {
        g.qp.set_direct(link.map(|l| l as Arc<dyn backend_sim_proto::qp::DirectWrite>));
    }

    /// Closes both connections (RESET, destroy).
    fn close_conns(&self, g: &mut QpInner) {
        g.qp.set_direct(None);
        for c in [g.conn.take(), g.self_conn.take()].into_iter().flatten() {
            self.dev.path.close(&c);
        }
    }

    /// Whether a task of `epoch` must stop.
    pub fn is_stale(&self, g: &QpInner, epoch: u64) -> bool {
        g.epoch != epoch || self.destroyed.load(Ordering::Acquire)
    }

    /// A send WR completed in error (the requester's `Fatal`, with the lock held): a UC or
    /// UD QP moves to SQE where the profile says so (`Switches::send_error_sqe`, IBA
    /// 10.3.1), its send queue flushed and its receive queue still at work until the
    /// application moves it back to RTS; any other QP moves to ERR.
    pub fn send_failed(&self, g: &mut QpInner) {
        let Some(from) = g.qp.enter_sqe() else {
            return self.enter_error(g);
        };
        tracing::debug!(qpn = self.qpn, ?from, "send error: QP to SQE");
        if let Some(cap) = self.dev.capture.get() {
            crate::capture::notes::state(cap, self.qpn, from, QpState::Sqe);
        }
        if self.dev.profile.warns() {
            self.warned.send_error_sqe(self.qpn, self.qp_type);
        }
        self.deliver(g);
    }

    /// Moves the QP to ERR (with the lock held): flushes both queues.
    pub fn enter_error(&self, g: &mut QpInner) {
        let Some(from) = self.flush_to_error(g) else {
            return;
        };
        tracing::debug!(qpn = self.qpn, ?from, "QP to ERR");
        if let Some(cap) = self.dev.capture.get() {
            crate::capture::notes::state(cap, self.qpn, from, QpState::Err);
        }
        self.deliver(g);
    }

    /// The QP's state machine to ERR, both queues flushed into `g`'s completions (not
    /// delivered yet); what the device counts and the connection task learn of it.
    /// Returns the state it left, `None` if it was in ERR already.
    fn flush_to_error(&self, g: &mut QpInner) -> Option<QpState> {
        let from = g.qp.enter_error()?;
        self.sync_onesided(g);
        self.note_link(g);
        self.req_wake.notify_one();
        Some(from)
    }

    /// Pushes the completions gathered in `g` to the CQs. A CQ overflow moves the QP to
    /// ERR (its completions are lost; the CQ reports the overflow).
    pub fn deliver(&self, g: &mut QpInner) {
        // Counted before the completions become visible: a poller that sees the last one
        // also sees the send queue empty.
        self.note_busy(g);
        if let Some(cap) = self.dev.capture.get() {
            let c = g.qp.poll_completions();
            let recv = c.recv.iter().map(|(w, _)| w);
            crate::capture::notes::completions(cap, c.send.iter().chain(recv));
        }
        loop {
            let QpInner { qp, marks, .. } = &mut *g;
            let mut c = qp.poll_completions();
            if c.send.is_empty() && c.recv.is_empty() {
                // Nothing to push (a round that only transmitted, say): what is left
                // below, without taking the queues and counting the send queue again.
                self.after_delivery(g);
                return;
            }
            let ok_s = c.send.is_empty() || self.push_send(&mut c, marks);
            let ok_r =
                c.recv.is_empty() || self.recv_cq.push_all(c.recv.drain(..).map(|(w, s)| (w, s, None)));
            if !(ok_s && ok_r) {
                self.cq_overflowed();
            }
            if (ok_s && ok_r) || g.qp.state() == QpState::Err {
                let c = g.qp.poll_completions();
                c.send.clear();
                c.recv.clear();
                // (Again: an overflow's flush may have emptied it.)
                self.note_busy(g);
                self.after_delivery(g);
                return;
            }
            tracing::warn!(qpn = self.qpn, "completion queue overflow: QP to ERR");
            self.flush_to_error(g);
        }
    }

    /// What follows a delivery: the SQ_DRAINED event once SQD has drained, and the
    /// events and counts the state machines raised.
    #[inline]
    fn after_delivery(&self, g: &mut QpInner) {
        if g.qp.sqd_event_due() && g.qp.check_drained() {
            tracing::debug!(qpn = self.qpn, "send queue drained (SQD)");
        }
        if g.qp.has_news() {
            self.take_news(g);
        }
    }

    /// Pushes the send completions to the send CQ, each with the mark that frees its
    /// send queue slots when polled (under `SlotRelease::AtPoll`; see `SqSlots`).
    fn push_send(&self, c: &mut Completions<'_>, marks: &mut Vec<u64>) -> bool {
        marks.clear();
        c.take_marks(marks);
        if marks.is_empty() {
            return self.send_cq.push_all(c.send.drain(..).map(|w| (w, false, None)));
        }
        debug_assert_eq!(marks.len(), c.send.len());
        let (send, slots) = c.send_with_slots();
        self.send_cq
            .push_all(send.drain(..).zip(marks.drain(..)).map(|(w, upto)| {
                (
                    w,
                    false,
                    Some(SlotMark {
                        slots: slots.clone(),
                        upto,
                    }),
                )
            }))
    }

    /// Queues the asynchronous events the QP owes on the device (none once the QP is
    /// destroyed: its handle is gone, and the events with it), and adds what its
    /// responder dropped to the device's counters.
    #[cold]
    fn take_news(&self, g: &mut QpInner) {
        let (dropped, gaps) = g.qp.take_uc_counts();
        self.dev.counters.add_uc(dropped, gaps);
        let destroyed = self.destroyed.load(Ordering::Acquire);
        for ev in g.qp.poll_events() {
            if !destroyed {
                self.dev.events.raise(ev);
            }
        }
    }

    /// The QP's connection is gone (broken, or replaced by a newer one): what was in
    /// flight on it is resent (RC) or lost (UC, whose WRs then complete), and a request
    /// half received is forgotten.
    pub fn link_lost(&self, g: &mut QpInner) {
        g.qp.set_direct(None);
        g.qp.handle_connection_lost();
        self.deliver(g);
    }

    /// A CQ of this QP lost a completion: `IBV_EVENT_CQ_ERR` for it, once per CQ.
    #[cold]
    fn cq_overflowed(&self) {
        for cq in [&self.send_cq, &self.recv_cq] {
            if cq.overflow_event_due() {
                self.dev.events.raise(AsyncEvent {
                    event_type: AsyncEventType::CqErr,
                    element: AsyncElement::Cq(cq.handle),
                });
            }
        }
    }

    /// Brings the device's count of busy send queues in line with this QP's (call after
    /// the send queue changed: a post, completions, a flush, a reset). Every path that
    /// completes or flushes WQEs ends in [`QpShared::deliver`], which calls it before it
    /// pushes the completions.
    pub fn note_busy(&self, g: &mut QpInner) {
        let busy = g.qp.sq_outstanding() > 0;
        if busy != g.busy {
            g.busy = busy;
            self.dev.path.count_busy(busy);
        }
    }

    /// Brings the device's count of QPs waiting for their connection in line with this
    /// QP's (call after its state or its connection changed): an RC or UC QP in RTR, RTS
    /// or SQD without a connection waits for the sim's TCP connection and hello, which
    /// an HCA does not have (see `Progress::count_awaiting_link`); so does a UC QP in SQE,
    /// whose receive side works on.
    pub fn note_link(&self, g: &mut QpInner) {
        let awaits = self.qp_type != QpType::Ud
            && receives_in(g.qp.state())
            && g.conn.is_none()
            && !self.destroyed.load(Ordering::Acquire);
        if awaits != g.awaits_link {
            g.awaits_link = awaits;
            self.dev.path.count_awaiting_link(awaits);
        }
    }

    /// Current time, in one place so tests can see where time enters.
    pub fn now() -> Instant {
        Instant::now()
    }
}
