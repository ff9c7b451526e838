//! The requester half of a QP, as pure state: no I/O, time passed in
//! (`man ibv_post_send`; IBA 9.7 "Reliable service", 9.7.5.2.8 RNR NAK, 9.7.6 timers,
//! 10.8.3.3 fences). This module is RC's; what a UC QP does instead is in [`uc`], and a
//! UD QP's datagrams are in [`ud`].
//!
//! It keeps the send queue in posting order, turns WQEs into request frames (checking the
//! local gather/scatter lists: a bad lkey or range is `IBV_WC_LOC_PROT_ERR`, or for a
//! SEND's or WRITE's lkey the profile's status, see [`gather_status`]), limits
//! outstanding READ/atomic requests to `max_rd_atomic`, holds back a fenced WQE until the
//! READs and atomics before it have completed, and matches responses:
//!
//! - an ACK completes every SEND/WRITE up to its PSN; a READ or atomic response completes
//!   its WQE (and implicitly acknowledges those before it);
//! - an RNR NAK rewinds to the refused WQE and waits the responder's `min_rnr_timer`
//!   before resending, `rnr_retry` times (7 = forever), then completes it with
//!   `IBV_WC_RNR_RETRY_EXC_ERR`;
//! - no response within the local ACK `timeout` rewinds and resends, `retry_cnt` times,
//!   then `IBV_WC_RETRY_EXC_ERR`; the timeout counts from the last progress or the last
//!   bytes that moved either way ([`Requester::on_timer`]);
//! - any other NAK completes the WQE with the matching remote error, and the reason the
//!   responder gave ([`NakReason`]) in `vendor_err`.
//!
//! Binds of memory windows (`IBV_WR_BIND_MW`) and local invalidations (`IBV_WR_LOCAL_INV`)
//! are local operations: the send queue executes them in their turn, with no frame and
//! no PSN ([`crate::window`]), and they complete in order with the rest (a failed bind as
//! `IBV_WC_MW_BIND_ERR`, a failed invalidation as `IBV_WC_LOC_QP_OP_ERR`, rxe_req.c
//! `rxe_do_local_ops()`). A LOCAL_INV waits until every WQE before it has completed, the
//! local invalidate fence of IBA 10.6.5.1 that rxe makes mandatory
//! (`rxe_wqe_is_fenced()`).
//!
//! An error returns [`Fatal`]: the QP must move to ERR, which flushes the rest (a UC or
//! UD QP to SQE where the profile says so, `Switches::send_error_sqe`: [`Requester::flush`]
//! flushes the send queue alone). WQEs complete strictly in order; only signaled ones (or
//! errors) produce a completion.
//!
//! The code is split by job: `post` (what `ibv_post_send` checks), `transmit`
//! (WQEs into frames), `ack` (responses and retirement), `resume` (resends from a PSN
//! inside a message, READ responses in parts), `timer` (the ACK and RNR timers, a lost
//! link, flush and reset); this file holds the state they share.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::timers::{rnr_timer, RNR_RETRY_INFINITE};
use verbs_api::{QpType, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOp};

use crate::memory::{LocalAccessError, MrTable, Seg};
use crate::opcode_table;
use crate::psn;

/// The most PSNs a requester has outstanding (from the oldest unacknowledged to the
/// last sent): a quarter of the PSN space, within which an ACK's PSN names one packet
/// (the ACK handling ignores PSNs more than 2^22 behind).
pub const PSN_WINDOW: u32 = 1 << 22;
use crate::switches::{SlotRelease, Switches};
use crate::tx::TxQueue;
use crate::window::{BindReq, Invalidator, OnQp};
use crate::wire::{Frame, NakCode, NakReason, MAX_DATAGRAM, MAX_MSG};

mod ack;
mod direct;
mod post;
mod resume;
mod run;
mod timer;
mod transmit;
pub mod uc;
pub mod ud;

pub use direct::{DirectAtomic, DirectWrite};
pub use post::gather_shape;
pub(crate) use post::gather_status;
pub use uc::LINK_WAIT;
pub use ud::UdRoute;

/// How long a requester meets nothing but RNR NAKs before it warns, once per such run: with
/// `rnr_retry` 7 (retry for ever, the default) a SEND to a peer that never posts a
/// receive waits for ever, and without the warning nothing would say why. Each NAK and
/// resend is a debug event; a few seconds of them is no passing shortage any more.
pub const RNR_WARN_AFTER: Duration = Duration::from_secs(3);

/// The longest a connection attempt under way keeps ACK timeouts from counting
/// ([`Requester::connecting`]): an attempt still unanswered after this (a peer that drops
/// packets, a stalled machine) counts as lost packets from then on.
pub const LINK_SETUP_GRACE: Duration = Duration::from_secs(1);

/// The send queue slots that polling frees, under [`SlotRelease::AtPoll`]: WQEs are
/// numbered in the order they complete, each send completion carries the number of the
/// last WQE it covers ([`Requester::take_marks`]), and polling it frees every slot up to
/// there. Shared between the requester (which counts what is held) and the CQ (which
/// frees as the application polls).
#[derive(Debug, Default)]
pub struct SqSlots {
    freed: AtomicU64,
}

impl SqSlots {
    /// A completion marked `upto` was polled: the slots of every WQE up to it are free.
    pub fn release_through(&self, upto: u64) {
        self.freed.fetch_max(upto, Ordering::AcqRel);
    }

    fn freed(&self) -> u64 {
        self.freed.load(Ordering::Acquire)
    }
}

/// The QP must go to ERR, or a UC or UD QP to SQE (a completion with the error has been
/// produced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fatal(pub WcStatus);

/// One send WQE.
#[derive(Debug)]
struct SendWqe {
    wr_id: u64,
    op: WrOp,
    signaled: bool,
    fence: bool,
    solicited: bool,
    inline: bool,
    sges: Vec<Sge>,
    inline_data: Vec<u8>,
    /// Resolved scatter list of a READ/atomic (where the response lands).
    local: Vec<Seg>,
    len: u64,
    /// The PSN of the message's first packet.
    psn: u32,
    /// The PSNs it takes (set when it is sent).
    pkts: u32,
    /// Its packets the responder acknowledged, or of a READ's response those placed: a
    /// resend starts after them ([`resume`]).
    done: u32,
    sent: bool,
    /// The WQE was built once ([`direct`]): the fast path is asked on its first send
    /// only.
    built_once: bool,
    /// Its last send placed the data directly ([`direct`]); a READ or atomic: the
    /// driver executed it, and every send of it is its notice.
    placed: bool,
    /// Its completion was delivered before the responder acknowledged it (a placed READ
    /// or atomic, [`direct`]): it retires later without a second one.
    reported: bool,
    status: Option<WcStatus>,
    /// The completion's `vendor_err` when `status` is an error that carries one (the
    /// responder's [`NakReason`]).
    vendor_err: u32,
    /// Where a UD send goes.
    route: Option<UdRoute>,
    /// What a BIND_MW binds (resolved by the driver at post time).
    bind: Option<BindReq>,
}

impl SendWqe {
    fn blank() -> Self {
        SendWqe {
            wr_id: 0,
            op: WrOp::Send,
            signaled: false,
            fence: false,
            solicited: false,
            inline: false,
            sges: Vec::new(),
            inline_data: Vec::new(),
            local: Vec::new(),
            len: 0,
            psn: 0,
            pkts: 1,
            done: 0,
            sent: false,
            built_once: false,
            placed: false,
            reported: false,
            status: None,
            vendor_err: 0,
            route: None,
            bind: None,
        }
    }

    /// A READ or atomic the driver executed ([`direct`]): done, but for its notice.
    fn executed(&self) -> bool {
        self.placed && self.op.is_read_or_atomic()
    }

    /// A READ or atomic sent and waiting for its response: one of the `max_rd_atomic`
    /// outstanding (a notice of an executed one waits for nothing of the responder's).
    fn holds_rd_atomic(&self) -> bool {
        self.sent && self.op.is_read_or_atomic() && !self.placed
    }

    fn completion(&self, qpn: u32, status: WcStatus) -> WorkCompletion {
        // An atomic's completion counts the 8 bytes of the original value it returns.
        let byte_len = if opcode_table::row(self.op.opcode()).atomic_eth {
            8
        } else {
            self.len as u32
        };
        WorkCompletion {
            wr_id: self.wr_id,
            status,
            opcode: WcOpcode::of_send(self.op.opcode()),
            byte_len,
            qp_num: qpn,
            ..Default::default()
        }
    }
}

/// Where a READ response's payload goes.
pub enum ReadSink {
    /// Into these segments, then call [`Requester::read_done`] with the same PSN.
    Into {
        /// PSN of the READ.
        psn: u32,
        /// Scatter list.
        segs: Vec<Seg>,
    },
    /// Nowhere (a stale or unexpected response): drop the payload.
    Discard,
}

/// Connection attributes the requester needs (set at RTR → RTS).
#[derive(Clone, Copy, Debug)]
pub struct ReqAttrs {
    /// First PSN to send.
    pub sq_psn: u32,
    /// Local ACK timeout (`None`: infinite).
    pub timeout: Option<Duration>,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// Outstanding READ/atomics allowed (0 is treated as 1).
    pub max_rd_atomic: u8,
}

/// The send side of a QP.
pub struct Requester {
    pub(crate) qpn: u32,
    pd: u32,
    cap: usize,
    max_inline: u32,
    max_sge: u32,
    sig_all: bool,
    /// Boxed: a WQE moves from the spare list to the queue and back once per message (four
    /// moves), and a pointer moves in one instruction where the 144-byte WQE took a
    /// `memcpy` of about 30.
    sq: VecDeque<Box<SendWqe>>,
    // (The boxes move between the two lists, which is what the lint's advice would undo.)
    #[allow(clippy::vec_box)]
    spare: Vec<Box<SendWqe>>,
    /// Index in `sq` of the first WQE not yet sent.
    next: usize,
    /// Index in `sq` of the first WQE never sent: those before it were started, and a
    /// rewind (RNR, a timeout, a lost connection) resends them even in SQD, which only
    /// stops new ones from starting.
    started: usize,
    psn: u32,
    attrs: ReqAttrs,
    rd_inflight: u32,
    /// SENDs and WRITEs sent since the last one that asked for an ACK.
    since_ack_req: usize,
    retry_left: u8,
    rnr_left: u8,
    rnr_wait: Option<Instant>,
    /// When the current run of RNR NAKs began (the first since the last progress), how
    /// many it has had, and whether it was warned about ([`RNR_WARN_AFTER`]).
    rnr_since: Option<Instant>,
    rnr_naks: u64,
    rnr_warned: bool,
    /// A resend started by a NAK is under way: further NAKs start none (they are the
    /// same loss seen again, or stale copies) until progress or a timeout, as rxe's
    /// completer does (`started_retry`).
    nak_retrying: bool,
    ack_deadline: Option<Instant>,
    /// PSN of the READ whose response payload is arriving (its header was accepted, its
    /// scatter list is with the reader).
    receiving: Option<u32>,
    /// The READ response payload arriving: its packets, whether it ends the response,
    /// and whether it is the whole response (the scatter list the reader has is the
    /// WQE's own, not a slice of it).
    arriving: (u32, bool, bool),
    /// SQD: start nothing new.
    pub draining: bool,
    /// The peer QP's number (`dest_qp_num`), for what the requester logs.
    pub dest_qpn: u32,
    /// A UC QP ([`uc`]).
    uc: bool,
    /// UC: until when WRs wait for a connection ([`Requester::wait_for_link`]).
    link_wait: Option<Instant>,
    /// A UD QP ([`ud`]).
    ud: bool,
    /// The QP's Q_Key (UD: what a WR's `remote_qkey` with the high bit set stands for).
    pub qkey: u32,
    /// Why the QP has no connection to its peer, as an `errno`: that of the last failed
    /// attempt to connect (`ECONNREFUSED`, `EMFILE`, ...), `ENOTCONN` while none failed
    /// yet (still connecting, waiting for the peer to connect, or the link just broke),
    /// 0 while connected. An `IBV_WC_RETRY_EXC_ERR` completion carries it in `vendor_err`
    /// (as an HCA puts a vendor syndrome there), so "the peer stopped answering" (0) and
    /// "the peer could not be reached" can be told apart. Kept by the transport.
    pub link_error: u32,
    /// Until when a connection attempt under way (this side connects) keeps the ACK timer
    /// from counting against `retry_cnt` ([`Requester::connecting`]).
    link_setup: Option<Instant>,
    /// Local ACK timeouts counted against `retry_cnt` since
    /// [`Requester::take_ack_timeouts`].
    ack_timeouts: u64,
    scratch: Vec<Seg>,
    /// The device profile's behavioural switches.
    sw: Switches,
    /// The longest message (the port's `max_msg_sz`).
    max_msg: u64,
    /// The longest UD datagram (the port's active MTU).
    mtu: u32,
    /// RC/UC: the path MTU (`path_mtu`), by which a message takes one PSN per packet.
    path_mtu: u32,
    /// WQEs retired so far (completed, whether or not with a completion).
    retired: u64,
    /// Slots freed by polling ([`SlotRelease::AtPoll`]).
    slots: Arc<SqSlots>,
    /// For each completion `retire` produced and the driver has not taken: the number of
    /// the last WQE it covers ([`SqSlots`]).
    marks: Vec<u64>,
    /// The connection's one-sided fast path, offered by the driver ([`direct`]).
    direct: Option<Arc<dyn DirectWrite>>,
    /// WQEs at the front of `sq` whose completions went early ([`direct`]): complete as
    /// the application sees them, so their slots are free (or, under
    /// [`SlotRelease::AtPoll`], held until polled), though they wait for an ACK.
    early: usize,
    /// The frames built now are lost on the way (there is no connection), so building
    /// them is no first send ([`direct`]).
    lost_builds: bool,
    /// Notices of executed WQEs first sent in this call of `poll_transmit`, not yet on
    /// the wire ([`run`]): they leave as one frame before any other request frame, at a
    /// bound, and when the call ends.
    run: Option<run::NoticeRun>,
}

impl Requester {
    /// An empty send queue for QP `qpn` in PD `pd` with the QP's capacities;
    /// `sig_all` is `sq_sig_all`.
    pub fn new(qpn: u32, pd: u32, cap: &verbs_api::QpCap, sig_all: bool) -> Self {
        Requester {
            qpn,
            pd,
            cap: cap.max_send_wr as usize,
            max_inline: cap.max_inline_data,
            max_sge: cap.max_send_sge,
            sig_all,
            sq: VecDeque::with_capacity(cap.max_send_wr.min(4096) as usize),
            spare: Vec::new(),
            next: 0,
            started: 0,
            psn: 0,
            attrs: ReqAttrs {
                sq_psn: 0,
                timeout: None,
                retry_cnt: 0,
                rnr_retry: 0,
                max_rd_atomic: 1,
            },
            rd_inflight: 0,
            since_ack_req: 0,
            retry_left: 0,
            rnr_left: 0,
            rnr_wait: None,
            rnr_since: None,
            rnr_naks: 0,
            rnr_warned: false,
            nak_retrying: false,
            ack_deadline: None,
            receiving: None,
            arriving: (0, true, true),
            draining: false,
            dest_qpn: 0,
            uc: false,
            link_wait: None,
            ud: false,
            qkey: 0,
            link_error: 0,
            link_setup: None,
            ack_timeouts: 0,
            scratch: Vec::new(),
            sw: Switches::default(),
            max_msg: MAX_MSG as u64,
            mtu: MAX_DATAGRAM,
            path_mtu: psn::NO_MTU,
            retired: 0,
            slots: Arc::default(),
            marks: Vec::new(),
            direct: None,
            early: 0,
            lost_builds: false,
            run: None,
        }
    }

    /// The same, on a device with the switches `sw` whose port takes messages of up to
    /// `max_msg` bytes and datagrams of up to `mtu` (capped at the wire's limits).
    pub fn with_profile(mut self, sw: Switches, max_msg: u32, mtu: u32) -> Self {
        self.sw = sw;
        self.max_msg = max_msg.min(MAX_MSG) as u64;
        self.mtu = mtu.min(MAX_DATAGRAM);
        self
    }

    /// The slots polling frees (for the CQ to release them as completions are polled).
    pub fn slots(&self) -> &Arc<SqSlots> {
        &self.slots
    }

    /// Slots held by WQEs that completed but whose completions (or a later one's) were
    /// not polled yet: none under [`SlotRelease::AtCompletion`].
    pub fn held_unpolled(&self) -> u64 {
        match self.sw.sq_slot_release {
            SlotRelease::AtCompletion => 0,
            SlotRelease::AtPoll => (self.retired + self.early as u64).saturating_sub(self.slots.freed()),
        }
    }

    /// WQEs posted and not complete as the application sees them (a READ or atomic
    /// whose completion went early is complete): those that hold a slot whatever was
    /// polled.
    fn pending(&self) -> usize {
        self.sq.len() - self.early
    }

    /// Moves the marks of the completions produced since the last call into `out`, one
    /// per completion in the same order (under [`SlotRelease::AtPoll`]; otherwise none).
    pub fn take_marks(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.marks);
    }

    /// Applies connection attributes (RTR → RTS, or RTS → RTS for `min_rnr_timer`-like
    /// changes): PSNs restart at `sq_psn`.
    pub fn connect(&mut self, attrs: ReqAttrs) {
        self.attrs = attrs;
        self.psn = attrs.sq_psn;
        self.retry_left = attrs.retry_cnt;
        self.rnr_left = attrs.rnr_retry;
    }

    /// Applies a new budget (`ibv_modify_qp` SQD -> SQD: `timeout`, `retry_cnt`,
    /// `rnr_retry`, `max_rd_atomic` in `attrs`; its `sq_psn` is ignored): the WQEs sent
    /// from now on count their retries against it. In SQD nothing is in flight once the
    /// queue has drained, so the counts start afresh.
    pub fn set_budget(&mut self, attrs: ReqAttrs) {
        self.attrs = ReqAttrs {
            sq_psn: self.attrs.sq_psn,
            ..attrs
        };
        self.retry_left = attrs.retry_cnt;
        self.rnr_left = attrs.rnr_retry;
    }

    /// Sets the path MTU in bytes (`path_mtu`, given at RTR): a SEND or WRITE then takes
    /// a PSN per packet of that size, a READ as many for its response (IBA 9.7.1).
    /// Until it is set a message takes one PSN.
    pub fn set_path_mtu(&mut self, mtu: u32) {
        self.path_mtu = mtu;
    }

    /// Current attributes.
    #[cfg(any(test, feature = "internals"))]
    pub fn attrs(&self) -> ReqAttrs {
        self.attrs
    }

    /// The next PSN to be sent (`sq_psn` as `ibv_query_qp` reports it).
    pub fn next_psn(&self) -> u32 {
        self.psn
    }

    /// WQEs posted and not yet retired (completed and, for a READ or atomic whose
    /// completion went early, its notice acknowledged).
    pub fn outstanding(&self) -> usize {
        self.sq.len()
    }

    /// Whether nothing has been sent that is not yet complete: the connection is idle, so
    /// a new WQE is latency-bound rather than part of a stream.
    pub fn nothing_in_flight(&self) -> bool {
        self.next == 0
    }

    /// Whether a WQE waits to be sent (and may be, now or after a timer).
    pub fn has_unsent(&self) -> bool {
        self.next < self.sq.len()
    }

    /// Whether every WQE started has completed: in SQD, the send queue is drained
    /// (WQEs posted but never started wait for the return to RTS).
    pub fn drained(&self) -> bool {
        if self.ud {
            return self.ud_drained();
        }
        self.started == 0
    }
}

/// Why `post` refused a WR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostCheck {
    /// The queue holds `max_send_wr` WQEs (ENOMEM).
    Full,
    /// The queue holds fewer, but with the WQEs complete and not yet polled it holds
    /// `max_send_wr` (ENOMEM, under [`SlotRelease::AtPoll`]).
    FullUnpolled,
    /// An atomic whose remote address is not 8-byte aligned (EINVAL, with
    /// [`Switches::misaligned_atomic_einval`]).
    MisalignedAtomic,
    /// More SGEs than `max_send_sge` (EINVAL).
    TooManySge,
    /// Inline data longer than `max_inline_data` (EINVAL).
    InlineTooLong,
    /// `IBV_SEND_INLINE` on a READ or atomic (EINVAL).
    InlineNotAllowed,
    /// An inline SGE outside the registered region its lkey names (EINVAL).
    BadInlineSge,
    /// A READ or atomic on a UC QP, which has neither (EINVAL).
    NotUc,
    /// An opcode other than SEND and SEND_WITH_IMM on a UD QP (EINVAL).
    NotUd,
    /// A send on a UD QP without a destination (`wr.ud`) (EINVAL).
    NoUdDestination,
    /// A send on a connected QP that names a UD destination (`wr.ud`) (EINVAL).
    UdDestination,
    /// A BIND_MW without its window (`wr.bind_mw`), or with a gather list (EINVAL).
    BadBind,
}

#[cfg(test)]
mod placed_tests;
#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod tests;
