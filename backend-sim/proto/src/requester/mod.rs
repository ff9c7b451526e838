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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::timers::{rnr_timer, RNR_RETRY_INFINITE};
use verbs_api::{SendFlags, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOp};

use crate::memory::{LocalAccessError, MrTable, Seg};
use crate::psn;

/// The most PSNs a requester has outstanding (from the oldest unacknowledged to the
/// last sent): a quarter of the PSN space, within which an ACK's PSN names one packet
/// (the ACK handling ignores PSNs more than 2^22 behind).
pub const PSN_WINDOW: u32 = 1 << 22;
use crate::switches::{SlotRelease, Switches};
use crate::tx::TxQueue;
use crate::window::{BindReq, Invalidator, OnQp};
use crate::wire::{Frame, NakCode, NakReason, MAX_DATAGRAM, MAX_MSG};

pub mod uc;
pub mod ud;
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

/// Where a send WR's inline data comes from, as [`Requester::post_wqe`] reads it.
trait InlineSource {
    /// The WR's SGE count, as the post-time check counts it.
    fn sges(&self, wr: &SendWr<'_>) -> usize;
    /// The WR's data length.
    fn len(&self, wr: &SendWr<'_>) -> u64;
    /// Appends the data to `out`; false if the data cannot be read (an SGE outside the
    /// region its lkey names).
    fn gather(&self, wr: &SendWr<'_>, out: &mut Vec<u8>) -> bool;
}

/// Inline data named by the WR's SGEs, in registered memory (the verbs API's rule).
struct FromSges<'m>(&'m MrTable);

impl InlineSource for FromSges<'_> {
    #[inline(always)]
    fn sges(&self, wr: &SendWr<'_>) -> usize {
        wr.sg_list.len()
    }
    #[inline(always)]
    fn len(&self, wr: &SendWr<'_>) -> u64 {
        wr.total_len()
    }
    #[inline(always)]
    fn gather(&self, wr: &SendWr<'_>, out: &mut Vec<u8>) -> bool {
        // Inline SGEs are read now, by the CPU; they must lie in registered memory of
        // this device (the lkey names the region, of any PD: an HCA does not check an
        // inline lkey) so that no stray pointer is read. (`Ok(false)`: deregistered
        // between the check and the copy.)
        self.0.gather_inline(wr.sg_list, out) == Ok(true)
    }
}

/// Inline data the caller read itself, in pieces (see [`Requester::post_with`]).
struct Pieces<'p>(&'p [&'p [u8]]);

impl InlineSource for Pieces<'_> {
    fn sges(&self, _: &SendWr<'_>) -> usize {
        self.0.len()
    }
    fn len(&self, _: &SendWr<'_>) -> u64 {
        self.0.iter().map(|b| b.len() as u64).sum()
    }
    fn gather(&self, _: &SendWr<'_>, out: &mut Vec<u8>) -> bool {
        for p in self.0 {
            out.extend_from_slice(p);
        }
        true
    }
}

/// The SGE count and length of a send WR as the post-time checks count them: of
/// `pieces` when its inline data comes as pieces (see [`Requester::post_with`]), else of
/// its gather list.
pub fn gather_shape(wr: &SendWr<'_>, pieces: Option<&[&[u8]]>) -> (usize, u64) {
    match pieces {
        Some(p) if wr.send_flags.contains(SendFlags::INLINE) => (Pieces(p).sges(wr), Pieces(p).len(wr)),
        _ => (wr.sg_list.len(), wr.total_len()),
    }
}

/// The status of a SEND or WRITE (any transport) whose gather list was refused for `e`:
/// a key that names no region of the QP's PD (none at all, or another PD's) takes the
/// profile's status (`Switches::send_bad_lkey`: rxe's `lookup_mr()` refuses both alike);
/// an SGE that leaves its region is a local protection error everywhere.
pub(crate) fn gather_status(sw: &Switches, e: LocalAccessError) -> WcStatus {
    match e {
        LocalAccessError::BadKey | LocalAccessError::WrongPd => sw.send_bad_lkey,
        LocalAccessError::NoLocalWrite | LocalAccessError::OutOfBounds => WcStatus::LocProtErr,
    }
}

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
    psn: u32,
    sent: bool,
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
            sent: false,
            status: None,
            vendor_err: 0,
            route: None,
            bind: None,
        }
    }

    fn completion(&self, qpn: u32, status: WcStatus) -> WorkCompletion {
        let byte_len = match self.op {
            WrOp::AtomicCmpAndSwp { .. } | WrOp::AtomicFetchAndAdd { .. } => 8,
            _ => self.len as u32,
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
    qpn: u32,
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
    ack_deadline: Option<Instant>,
    /// PSN of the READ whose response payload is arriving (its header was accepted, its
    /// scatter list is with the reader).
    receiving: Option<u32>,
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
            ack_deadline: None,
            receiving: None,
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

    /// The switches it follows.
    pub fn switches(&self) -> &Switches {
        &self.sw
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
            SlotRelease::AtPoll => self.retired.saturating_sub(self.slots.freed()),
        }
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

    /// Sets the path MTU in bytes (`path_mtu`, given at RTR): a SEND or WRITE then takes
    /// a PSN per packet of that size, a READ as many for its response (IBA 9.7.1).
    /// Until it is set a message takes one PSN.
    pub fn set_path_mtu(&mut self, mtu: u32) {
        self.path_mtu = mtu;
    }

    /// Current attributes.
    pub fn attrs(&self) -> ReqAttrs {
        self.attrs
    }

    /// The next PSN to be sent (`sq_psn` as `ibv_query_qp` reports it).
    pub fn next_psn(&self) -> u32 {
        self.psn
    }

    /// WQEs posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.sq.len()
    }

    /// Whether the SEND or WRITE about to be sent asks for an ACK (the AckReq bit, IBA
    /// 9.2; the responder acknowledges it at once instead of coalescing: see
    /// [`wire::F_ACK_REQ`](crate::wire::F_ACK_REQ)). One in every half of the WQEs
    /// outstanding (posted, not complete) asks, every one when at most two are
    /// outstanding: an ACK comes back while half of the window is still on its way, so
    /// the send queue never runs dry waiting for it, and a deep stream is not answered
    /// with one ACK per message (each a `sendmsg` on the responder and a segment for this
    /// side to take in). The responder also acknowledges whenever the stream pauses
    /// (the requester ran out of WQEs or of room), so nothing waits on a request that
    /// did not ask.
    fn ack_req_due(&mut self) -> bool {
        self.since_ack_req += 1;
        let due = self.since_ack_req >= (self.sq.len() / 2).max(1);
        if due {
            self.since_ack_req = 0;
        }
        due
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

    /// Queues a WQE. Checks what `ibv_post_send` checks at post time: capacity (ENOMEM),
    /// SGE count and inline size (EINVAL). Inline data is copied now. A WR that names a
    /// UD destination (`wr.ud`) is refused here ([`PostCheck::UdDestination`]): UD sends
    /// go through [`Requester::post_ud`].
    pub fn post(&mut self, wr: &SendWr<'_>, mrs: &MrTable) -> Result<(), PostCheck> {
        self.connected_dest(wr)?;
        self.post_wqe(wr, None, FromSges(mrs))
    }

    /// Queues an `IBV_WR_BIND_MW` whose window and region the driver resolved into
    /// `bind` (the checks of [`Requester::post`]; the bind itself runs in its turn).
    pub fn post_bind(&mut self, wr: &SendWr<'_>, bind: BindReq) -> Result<(), PostCheck> {
        self.connected_dest(wr)?;
        self.post_wqe(wr, None, Pieces(&[]))?;
        self.sq.back_mut().expect("just queued").bind = Some(bind);
        Ok(())
    }

    /// A WR posted to an RC or UC QP has no UD destination, and a UD QP's needs one.
    fn connected_dest(&self, wr: &SendWr<'_>) -> Result<(), PostCheck> {
        if self.ud {
            return Err(PostCheck::NoUdDestination);
        }
        if wr.ud.is_some() {
            return Err(PostCheck::UdDestination);
        }
        Ok(())
    }

    /// [`Requester::post`], with an inline WR's data (`IBV_SEND_INLINE` set) given as
    /// `pieces` the caller read itself instead of through `wr.sg_list` (which is then
    /// ignored): a C program's inline data may lie in memory that is not registered.
    /// `None` reads the SGEs, which must name registered memory.
    #[inline]
    pub fn post_with(
        &mut self,
        wr: &SendWr<'_>,
        mrs: &MrTable,
        pieces: Option<&[&[u8]]>,
    ) -> Result<(), PostCheck> {
        self.connected_dest(wr)?;
        self.post_from(wr, mrs, None, pieces)
    }

    /// [`Requester::post_wqe`] with the inline data's source.
    #[inline]
    fn post_from(
        &mut self,
        wr: &SendWr<'_>,
        mrs: &MrTable,
        route: Option<UdRoute>,
        pieces: Option<&[&[u8]]>,
    ) -> Result<(), PostCheck> {
        match pieces {
            Some(p) if wr.send_flags.contains(SendFlags::INLINE) => self.post_wqe(wr, route, Pieces(p)),
            _ => self.post_wqe(wr, route, FromSges(mrs)),
        }
    }

    // One copy per source of inline data: the verbs API's path (`FromSges`) is as if the
    // other did not exist.
    fn post_wqe(
        &mut self,
        wr: &SendWr<'_>,
        route: Option<UdRoute>,
        data: impl InlineSource,
    ) -> Result<(), PostCheck> {
        if self.sq.len() >= self.cap {
            return Err(PostCheck::Full);
        }
        if self.sq.len() as u64 + self.held_unpolled() >= self.cap as u64 {
            return Err(PostCheck::FullUnpolled);
        }
        if data.sges(wr) > self.max_sge as usize {
            return Err(PostCheck::TooManySge);
        }
        if self.uc
            && self.sw.opcode_checked_at_post
            && (matches!(wr.op, WrOp::RdmaRead { .. }) || wr.op.is_atomic())
        {
            return Err(PostCheck::NotUc);
        }
        if let WrOp::AtomicCmpAndSwp { remote, .. } | WrOp::AtomicFetchAndAdd { remote, .. } = wr.op {
            if self.sw.misaligned_atomic_einval && remote.addr % 8 != 0 {
                return Err(PostCheck::MisalignedAtomic);
            }
        }
        if wr.op == WrOp::BindMw && (wr.bind.is_none() || !wr.sg_list.is_empty()) {
            return Err(PostCheck::BadBind);
        }
        let inline = wr.send_flags.contains(SendFlags::INLINE);
        let mut w = self.spare.pop().unwrap_or_else(|| Box::new(SendWqe::blank()));
        w.inline_data.clear();
        w.bind = None;
        if inline {
            if matches!(wr.op, WrOp::RdmaRead { .. }) || wr.op.is_atomic() || wr.op.is_local() {
                self.spare.push(w);
                return Err(PostCheck::InlineNotAllowed);
            }
            if data.len(wr) > self.max_inline as u64 {
                self.spare.push(w);
                return Err(PostCheck::InlineTooLong);
            }
            if !data.gather(wr, &mut w.inline_data) {
                self.spare.push(w);
                return Err(PostCheck::BadInlineSge);
            }
        }
        w.wr_id = wr.wr_id;
        w.op = wr.op;
        w.fence = wr.send_flags.contains(SendFlags::FENCE);
        w.solicited = wr.send_flags.contains(SendFlags::SOLICITED);
        w.signaled = self.sig_all || wr.send_flags.contains(SendFlags::SIGNALED);
        w.inline = inline;
        w.sges.clear();
        if !inline {
            // (Inline data was copied above: its SGEs are not read again.)
            w.sges.extend_from_slice(wr.sg_list);
        }
        w.local.clear();
        w.len = data.len(wr);
        w.psn = 0;
        w.sent = false;
        w.status = None;
        w.vendor_err = 0;
        w.route = route;
        self.sq.push_back(w);
        Ok(())
    }

    /// The earliest time at which [`Requester::on_timer`] has work.
    pub fn next_deadline(&self) -> Option<Instant> {
        [self.rnr_wait, self.ack_deadline, self.link_wait]
            .into_iter()
            .flatten()
            .min()
    }

    /// Builds request frames for as many WQEs as may go now, into `tx`. Local errors
    /// complete the WQE and return [`Fatal`].
    pub fn poll_transmit(
        &mut self,
        mrs: &MrTable,
        now: Instant,
        tx: &mut TxQueue,
        budget: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize, Fatal> {
        if let Some(t) = self.rnr_wait {
            if now < t {
                return Ok(0);
            }
            self.end_rnr_wait();
        }
        let mut sent = 0;
        let max_rd = self.attrs.max_rd_atomic.max(1) as u32;
        while self.next < self.sq.len() && sent < budget && !(self.draining && self.next >= self.started) {
            let idx = self.next;
            if self.sq[idx].op.is_local() {
                if matches!(self.sq[idx].op, WrOp::LocalInv { .. }) && idx > 0 {
                    // The local invalidate fence: every WQE before it completes first.
                    break;
                }
                if self.sq[idx].status.is_none() {
                    if let Err(status) = self.execute_local(idx, mrs) {
                        self.sq[idx].status = Some(status);
                        self.retire(out);
                        return Err(Fatal(status));
                    }
                }
                // (Executed once: a rewind passes over it.)
                let w = &mut self.sq[idx];
                w.sent = true;
                w.psn = self.psn;
                self.next += 1;
                self.started = self.started.max(self.next);
                self.retire(out);
                continue;
            }
            let (is_rd, fence) = {
                let w = &self.sq[idx];
                // A READ/atomic already answered (out of order, before a rewind) is resent
                // to keep the PSNs in sequence, but its answer is not awaited.
                (w.op.is_read_or_atomic() && w.status.is_none(), w.fence)
            };
            if fence && self.rd_inflight > 0 {
                break;
            }
            if is_rd && self.rd_inflight >= max_rd {
                break;
            }
            let psn = self.psn;
            let packets = self.packets_of(idx);
            if !self.uc && !self.within_psn_window(psn, packets) {
                break;
            }
            if self.uc {
                // (Called with a connection: nothing waits for one any more.)
                self.link_wait = None;
            }
            match self.build(idx, psn, mrs, tx) {
                Ok(()) => {}
                Err(status) => {
                    self.sq[idx].status = Some(status);
                    self.retire(out);
                    return Err(Fatal(status));
                }
            }
            let w = &mut self.sq[idx];
            w.psn = psn;
            w.sent = true;
            self.psn = psn::add(psn, packets);
            if is_rd {
                self.rd_inflight += 1;
            }
            self.next += 1;
            self.started = self.started.max(self.next);
            sent += 1;
            if self.ack_deadline.is_none() && !self.uc {
                self.ack_deadline = self.attrs.timeout.map(|t| now + t);
            }
        }
        Ok(sent)
    }

    /// The PSNs WQE `idx` takes: atomics one, a READ those of its response's packets,
    /// a SEND or WRITE one per packet of the path MTU.
    fn packets_of(&self, idx: usize) -> u32 {
        let w = &self.sq[idx];
        if w.op.is_atomic() {
            1
        } else {
            psn::packets(w.len, self.path_mtu)
        }
    }

    /// Whether a message of `packets` PSNs from `psn` keeps every PSN outstanding within
    /// [`PSN_WINDOW`] of the oldest unacknowledged one: beyond, an ACK or a NAK could no
    /// longer be told from one of the PSN space's other half, so the requester waits for
    /// ACKs first, as an HCA stops at its window. The first message outstanding always
    /// goes, however long.
    fn within_psn_window(&self, psn: u32, packets: u32) -> bool {
        let oldest = self
            .sq
            .iter()
            .take(self.next)
            .find(|w| w.sent && w.status.is_none());
        match oldest {
            None => true,
            Some(w) => (psn::diff(psn, w.psn).max(0) as u64 + packets as u64) <= PSN_WINDOW as u64,
        }
    }

    /// Executes the local operation WQE `idx` (a bind or a local invalidation), which is
    /// then complete; an error is its completion's status.
    fn execute_local(&mut self, idx: usize, mrs: &MrTable) -> Result<(), WcStatus> {
        let on = OnQp {
            pd: self.pd,
            qpn: self.qpn,
        };
        let owner_checks = self.sw.mw_owner_checks;
        let w = &mut self.sq[idx];
        match w.op {
            WrOp::BindMw => {
                let bind = w.bind.as_ref().expect("a BIND_MW WQE carries its bind");
                if let Err(e) = mrs.bind_window(bind, on, owner_checks) {
                    tracing::debug!(
                        qpn = on.qpn,
                        wr_id = w.wr_id,
                        "BIND_MW failed: {e}: IBV_WC_MW_BIND_ERR"
                    );
                    return Err(WcStatus::MwBindErr);
                }
            }
            WrOp::LocalInv { rkey } => {
                if self.uc && !self.sw.opcode_checked_at_post {
                    // rxe has no LOCAL_INV on UC (rxe_opcode.c): the QP has no such
                    // operation, as for a READ (see `build`).
                    return Err(WcStatus::LocQpOpErr);
                }
                if let Err(e) = mrs.invalidate(rkey, Invalidator::Local(on), owner_checks, true) {
                    tracing::debug!(
                        qpn = on.qpn,
                        wr_id = w.wr_id,
                        rkey = %format_args!("{rkey:#x}"),
                        "LOCAL_INV failed: {e}: IBV_WC_LOC_QP_OP_ERR"
                    );
                    return Err(WcStatus::LocQpOpErr);
                }
            }
            _ => unreachable!("only BIND_MW and LOCAL_INV are local operations"),
        }
        w.status = Some(WcStatus::Success);
        Ok(())
    }

    fn build(&mut self, idx: usize, psn: u32, mrs: &MrTable, tx: &mut TxQueue) -> Result<(), WcStatus> {
        let pd = self.pd;
        let ack_req = !self.sq[idx].op.is_read_or_atomic() && self.ack_req_due();
        // This READ/atomic and those already outstanding (see `Frame::Read`).
        let inflight = u16::try_from(self.rd_inflight + 1).unwrap_or(u16::MAX);
        let w = &mut self.sq[idx];
        if w.len > self.max_msg {
            return Err(WcStatus::LocLenErr);
        }
        if self.uc && w.op.is_read_or_atomic() {
            // Accepted at post (`Switches::opcode_checked_at_post` off, as on rxe): UC
            // has no such operation, so it fails as it starts.
            return Err(WcStatus::LocQpOpErr);
        }
        let len = w.len as u32;
        match w.op {
            WrOp::Send
            | WrOp::SendWithImm { .. }
            | WrOp::SendWithInv { .. }
            | WrOp::RdmaWrite { .. }
            | WrOp::RdmaWriteWithImm { .. } => {
                let segs = &mut self.scratch;
                if !w.inline {
                    let sw = &self.sw;
                    mrs.resolve_local(pd, &w.sges, false, segs)
                        .map_err(|e| gather_status(sw, e))?;
                }
                let frame = match w.op {
                    WrOp::Send | WrOp::SendWithImm { .. } | WrOp::SendWithInv { .. } => Frame::Send {
                        psn,
                        len,
                        imm: w.op.imm_data(),
                        solicited: w.solicited,
                        ack_req,
                        inv: w.op.invalidate_rkey(),
                    },
                    _ => {
                        let r = w.op.remote().expect("RDMA op has a remote address");
                        Frame::Write {
                            psn,
                            len,
                            addr: r.addr,
                            rkey: r.rkey,
                            imm: w.op.imm_data(),
                            solicited: w.solicited,
                            ack_req,
                        }
                    }
                };
                tx.push_frame(&frame);
                if w.inline {
                    tx.push_bytes(&w.inline_data);
                } else {
                    for s in segs.iter() {
                        tx.push_seg(s);
                    }
                    segs.clear();
                }
            }
            WrOp::RdmaRead { remote } => {
                mrs.resolve_local(pd, &w.sges, true, &mut w.local)
                    .map_err(|_| WcStatus::LocProtErr)?;
                tx.push_frame(&Frame::Read {
                    psn,
                    len,
                    addr: remote.addr,
                    rkey: remote.rkey,
                    inflight,
                });
            }
            WrOp::AtomicCmpAndSwp { remote, .. } | WrOp::AtomicFetchAndAdd { remote, .. } => {
                let total = mrs
                    .resolve_local(pd, &w.sges, true, &mut w.local)
                    .map_err(|_| WcStatus::LocProtErr)?;
                if total < 8 {
                    return Err(WcStatus::LocLenErr);
                }
                let frame = match w.op {
                    WrOp::AtomicCmpAndSwp { compare, swap, .. } => Frame::CmpSwap {
                        psn,
                        inflight,
                        addr: remote.addr,
                        rkey: remote.rkey,
                        compare,
                        swap,
                    },
                    WrOp::AtomicFetchAndAdd { add, .. } => Frame::FetchAdd {
                        psn,
                        inflight,
                        addr: remote.addr,
                        rkey: remote.rkey,
                        add,
                    },
                    _ => unreachable!("matched atomics above"),
                };
                tx.push_frame(&frame);
            }
            WrOp::LocalInv { .. } | WrOp::BindMw => unreachable!("local operations build no frame"),
        }
        Ok(())
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
    fn end_rnr_wait(&mut self) {
        self.rnr_wait = None;
        tracing::debug!(
            qpn = self.qpn,
            dest_qpn = self.dest_qpn,
            psn = self.psn,
            "RNR wait over: resending"
        );
    }

    /// Forward progress (or a reset): a later RNR NAK starts a new run.
    fn end_rnr_run(&mut self) {
        self.rnr_since = None;
        self.rnr_naks = 0;
        self.rnr_warned = false;
    }

    /// Position in `sq` of the sent WQE with `psn`.
    fn find_sent(&self, psn: u32) -> Option<usize> {
        self.sq
            .iter()
            .take(self.next)
            .position(|w| w.sent && w.status.is_none() && w.psn == psn)
    }

    /// Marks every sent, unfinished SEND/WRITE strictly before `idx` (or up to and
    /// including `idx` when `inclusive`) as successful. Returns whether anything changed.
    fn ack_through(&mut self, idx: usize, inclusive: bool) -> bool {
        let end = if inclusive { idx + 1 } else { idx };
        let mut progressed = false;
        for w in self.sq.iter_mut().take(end) {
            if w.sent && w.status.is_none() && !w.op.is_read_or_atomic() {
                w.status = Some(WcStatus::Success);
                progressed = true;
            }
        }
        progressed
    }

    /// One transport retry is used up, unless `retry_cnt` is 7 on a device that retries
    /// those for ever ([`Switches::retry_cnt_7_infinite`]).
    fn spend_retry(&mut self) {
        if !(self.sw.retry_cnt_7_infinite && self.attrs.retry_cnt == 7) {
            self.retry_left -= 1;
        }
    }

    fn progress(&mut self, now: Instant) {
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

    /// Moves finished WQEs off the front of the queue, producing completions in order.
    fn retire(&mut self, out: &mut Vec<WorkCompletion>) {
        while let Some(w) = self.sq.front() {
            let Some(status) = w.status else { break };
            self.retired += 1;
            if w.signaled || status != WcStatus::Success {
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
            w.local.clear();
            self.spare.push(w);
            self.next = self.next.saturating_sub(1);
            self.started = self.started.saturating_sub(1);
        }
    }

    /// Rewinds to the WQE at `idx`: it and everything after it will be sent again, from
    /// its PSN.
    fn rewind(&mut self, idx: usize) {
        if idx >= self.next {
            return;
        }
        let psn = self.sq[idx].psn;
        for w in self.sq.iter_mut().skip(idx).take(self.next - idx) {
            // Only READs/atomics still waiting for their answer are counted in flight; one
            // a peer answered out of order (after an unanswered one) is resent, but no
            // longer counted.
            if w.sent && w.status.is_none() && w.op.is_read_or_atomic() {
                self.rd_inflight -= 1;
            }
            w.sent = false;
        }
        self.next = idx;
        self.psn = psn;
        self.ack_deadline = None;
    }

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
                let upto = self.sq.iter().take(self.next).rposition(|w| {
                    w.sent && psn::diff(w.psn, psn) <= 0 && psn::diff(w.psn, psn) > -(1 << 22)
                });
                if let Some(i) = upto {
                    if self.ack_through(i, true) {
                        self.progress(now);
                    }
                }
                self.retire(out);
                Ok(ReadSink::Discard)
            }
            Frame::ReadResp { psn, len } => {
                let Some(i) = self.find_sent(psn) else {
                    return Ok(ReadSink::Discard);
                };
                let w = &self.sq[i];
                if !matches!(w.op, WrOp::RdmaRead { .. }) || w.len != len as u64 {
                    return self.fail(i, WcStatus::BadRespErr, out);
                }
                self.ack_through(i, false);
                // A response restarts the timer, as every response packet does on an HCA
                // (rxe's completer re-arms it after each): the responder has answered, and
                // the payload that follows is timed from its own bytes (`on_timer`).
                self.ack_deadline = self.attrs.timeout.map(|t| now + t);
                self.receiving = Some(psn);
                let segs = std::mem::take(&mut self.sq[i].local);
                Ok(ReadSink::Into { psn, segs })
            }
            Frame::AtomicResp { psn, orig } => {
                let Some(i) = self.find_sent(psn) else {
                    return Ok(ReadSink::Discard);
                };
                if !self.sq[i].op.is_atomic() {
                    return self.fail(i, WcStatus::BadRespErr, out);
                }
                self.ack_through(i, false);
                let bytes = orig.to_ne_bytes();
                let mut written = 0;
                let mut stored = true;
                for s in &self.sq[i].local {
                    let n = (8 - written).min(s.len);
                    stored &= s.copy_in(0, &bytes[written..written + n]);
                    written += n;
                    if written == 8 {
                        break;
                    }
                }
                if !stored {
                    // The local buffer was deregistered: the old value has nowhere to go.
                    return self.fail(i, WcStatus::LocProtErr, out);
                }
                self.sq[i].status = Some(WcStatus::Success);
                self.rd_inflight -= 1;
                self.progress(now);
                self.retire(out);
                Ok(ReadSink::Discard)
            }
            Frame::Nak { psn, code, reason } => {
                let Some(i) = self.find_sent(psn) else {
                    return Ok(ReadSink::Discard);
                };
                self.ack_through(i, false);
                match code {
                    NakCode::Rnr { timer } => {
                        self.note_rnr(psn, timer, now);
                        if self.rnr_left == 0 {
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
                        if self.retry_left == 0 {
                            return self.fail(i, WcStatus::RetryExcErr, out);
                        }
                        self.spend_retry();
                        self.rewind(i);
                        tracing::debug!(
                            qpn = self.qpn,
                            dest_qpn = self.dest_qpn,
                            psn,
                            retries_left = self.retry_left,
                            "PSN sequence error NAK: resending from the PSN the responder expects"
                        );
                        self.retire(out);
                        Ok(ReadSink::Discard)
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
            let w = &mut self.sq[i];
            w.local = segs;
            w.status = Some(WcStatus::Success);
            self.rd_inflight -= 1;
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
        self.sq[i].local = segs;
        self.fail(i, WcStatus::LocProtErr, out).err()
    }

    fn fail(
        &mut self,
        idx: usize,
        status: WcStatus,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<ReadSink, Fatal> {
        self.sq[idx].status = Some(status);
        // WQEs behind it that an ACK already finished (a WRITE after a READ whose
        // response is still due) are flushed, not completed: completions come in order,
        // and after an error only flushes follow, whatever the responder executed.
        for w in self.sq.iter_mut().skip(idx + 1) {
            if w.status == Some(WcStatus::Success) {
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
        let i = self.sq.iter().position(|w| w.status.is_none())?;
        self.fail(i, status, out).err()
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
        self.rd_inflight = 0;
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
mod tests {
    use super::*;
    use crate::memory::MrShared;
    use std::sync::Arc;
    use verbs_api::{AccessFlags, QpCap};

    /// A memory table with one 64-byte region (lkey 7), and a connected requester with
    /// room for `wrs` WRs.
    fn setup(wrs: u32, attrs: ReqAttrs) -> (MrTable, Arc<MrShared>, Requester) {
        let mrs = MrTable::default();
        let mr = Arc::new(MrShared::new_owned(1, 7, 64, AccessFlags::LOCAL_WRITE).unwrap());
        mrs.insert(mr.clone());
        let cap = QpCap::new(wrs, 1);
        let mut req = Requester::new(1, 1, &cap, false);
        req.connect(attrs);
        (mrs, mr, req)
    }

    /// Inline data handed over as pieces (the C ABI's, from memory that need not be
    /// registered) is what goes on the wire; the pieces count as the WR's SGEs and their
    /// length against `max_inline_data`; the same WR without pieces must name registered
    /// memory, as the verbs API requires.
    #[test]
    fn inline_pieces_are_sent_and_checked_as_sges() {
        let mrs = MrTable::default();
        let cap = QpCap {
            max_send_wr: 8,
            max_recv_wr: 1,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 16,
        };
        let mut req = Requester::new(1, 1, &cap, false);
        req.connect(ReqAttrs {
            sq_psn: 0,
            timeout: None,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        });
        // An lkey no region has: only the pieces can be read.
        let unregistered = [Sge::new(0x1000, 7, 99)];
        let wr = SendWr::write(1, &unregistered, (0x2000, 5)).inline().signaled();
        assert_eq!(req.post(&wr, &mrs), Err(PostCheck::BadInlineSge));
        let three: [&[u8]; 3] = [b"ab", b"cd", b"e"];
        assert_eq!(req.post_with(&wr, &mrs, Some(&three)), Err(PostCheck::TooManySge));
        let long: [&[u8]; 2] = [&[1; 9], &[2; 8]];
        assert_eq!(
            req.post_with(&wr, &mrs, Some(&long)),
            Err(PostCheck::InlineTooLong)
        );
        let two: [&[u8]; 2] = [b"abc", b"defg"];
        req.post_with(&wr, &mrs, Some(&two)).unwrap();
        let now = Instant::now();
        let (mut tx, mut out, mut wire) = (TxQueue::new(), Vec::new(), Vec::new());
        assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(1));
        tx.drain_into(&mut wire);
        let (frame, head) = Frame::decode(&wire).unwrap().unwrap();
        assert!(matches!(frame, Frame::Write { len: 7, .. }), "{frame}");
        assert_eq!(&wire[head..], b"abcdefg");
        req.on_response(&Frame::Ack { psn: 0 }, now, &mut out).unwrap();
        assert_eq!(
            out.iter()
                .map(|w| (w.wr_id, w.status, w.byte_len))
                .collect::<Vec<_>>(),
            [(1, WcStatus::Success, 7)]
        );
    }

    /// Every local-key path of the requester, under each profile's switches: a SEND's or
    /// WRITE's lkey that names no region, or a region of another PD, takes the profile's
    /// status (rxe's `lookup_mr()` refuses both, LOC_QP_OP_ERR); an SGE past its region
    /// is LOC_PROT_ERR everywhere, and so is any bad local SGE of a READ or an atomic
    /// (rxe_comp.c `do_read()`, `do_atomic()`).
    #[test]
    fn local_key_errors_take_the_profiles_status_per_path() {
        let mrs = MrTable::default();
        let mine = Arc::new(MrShared::new_owned(1, 7, 64, AccessFlags::LOCAL_WRITE).unwrap());
        let other_pd = Arc::new(MrShared::new_owned(2, 9, 64, AccessFlags::LOCAL_WRITE).unwrap());
        mrs.insert(mine.clone());
        mrs.insert(other_pd.clone());
        let no_region = Sge::new(mine.addr(), 8, 0x77);
        let foreign = Sge::new(other_pd.addr(), 8, 9);
        let past_end = Sge::new(mine.addr() + 60, 8, 7);
        let remote = (0x1000, 5);
        for (sw, bad_lkey) in [
            (Switches::PORTABLE, WcStatus::LocProtErr),
            (Switches::RXE, WcStatus::LocQpOpErr),
            (Switches::MLX5, WcStatus::LocProtErr),
        ] {
            let cases: [(SendWr<'_>, WcStatus); 10] = [
                (SendWr::send(1, std::slice::from_ref(&no_region)), bad_lkey),
                (SendWr::send(1, std::slice::from_ref(&foreign)), bad_lkey),
                (
                    SendWr::send(1, std::slice::from_ref(&past_end)),
                    WcStatus::LocProtErr,
                ),
                (
                    SendWr::write(1, std::slice::from_ref(&no_region), remote),
                    bad_lkey,
                ),
                (SendWr::write(1, std::slice::from_ref(&foreign), remote), bad_lkey),
                (
                    SendWr::write(1, std::slice::from_ref(&past_end), remote),
                    WcStatus::LocProtErr,
                ),
                (
                    SendWr::read(1, std::slice::from_ref(&no_region), remote),
                    WcStatus::LocProtErr,
                ),
                (
                    SendWr::read(1, std::slice::from_ref(&foreign), remote),
                    WcStatus::LocProtErr,
                ),
                (
                    SendWr::fetch_and_add(1, std::slice::from_ref(&no_region), remote, 1),
                    WcStatus::LocProtErr,
                ),
                (
                    SendWr::fetch_and_add(1, std::slice::from_ref(&foreign), remote, 1),
                    WcStatus::LocProtErr,
                ),
            ];
            for (wr, want) in cases {
                let mut req = Requester::new(1, 1, &QpCap::new(4, 1), false).with_profile(sw, MAX_MSG, 1024);
                req.connect(ReqAttrs {
                    sq_psn: 0,
                    timeout: None,
                    retry_cnt: 7,
                    rnr_retry: 7,
                    max_rd_atomic: 1,
                });
                req.post(&wr, &mrs).unwrap();
                let (mut tx, mut out) = (TxQueue::new(), Vec::new());
                let got = req.poll_transmit(&mrs, Instant::now(), &mut tx, 4, &mut out);
                assert_eq!(got, Err(Fatal(want)), "{:?} under {sw:?}", wr.op);
                assert_eq!(out[0].status, want);
                assert_eq!(tx.pending(), 0, "nothing is sent");
            }
        }
    }

    /// Found by the `responder` fuzz target: two FETCH_AND_ADDs in flight, the peer
    /// answers the second first, then the connection breaks. The rewind subtracted the
    /// answered one from the READ/atomic count a second time: a u32 underflow (a panic in
    /// debug builds; in release builds the count wrapped to u32::MAX and the QP never sent
    /// another READ or atomic).
    #[test]
    fn an_atomic_answered_out_of_order_survives_a_rewind() {
        let (mrs, mr, mut req) = setup(
            8,
            ReqAttrs {
                sq_psn: 10,
                timeout: None,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 2,
            },
        );
        let sges: Vec<[Sge; 1]> = (0..4).map(|k| [Sge::new(mr.addr() + 8 * k, 8, 7)]).collect();
        let faa = |id: u64| SendWr::fetch_and_add(id, &sges[id as usize - 1], (0x1000, 5), 1).signaled();
        let now = Instant::now();
        let mut tx = TxQueue::new();
        let mut out = Vec::new();
        let mut sink = Vec::new();
        req.post(&faa(1), &mrs).unwrap();
        req.post(&faa(2), &mrs).unwrap();
        assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(2));
        req.on_response(&Frame::AtomicResp { psn: 11, orig: 0 }, now, &mut out)
            .unwrap();
        req.on_connection_lost();
        tx.drain_into(&mut sink);
        // Both are resent (PSNs stay in sequence); the first one's answer completes both.
        assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(2));
        for psn in [10, 11] {
            req.on_response(&Frame::AtomicResp { psn, orig: 0 }, now, &mut out)
                .unwrap();
        }
        assert_eq!(
            out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::Success), (2, WcStatus::Success)]
        );
        // Nothing is counted in flight any more: two new atomics go out at once.
        req.post(&faa(3), &mrs).unwrap();
        req.post(&faa(4), &mrs).unwrap();
        assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(2));
    }

    /// SQD stops WQEs from starting, not from finishing: a SEND refused with RNR before
    /// the move is resent after the RNR wait, a WQE posted in SQD is not sent, and the
    /// queue counts as drained once the started one completes.
    #[test]
    fn sqd_resends_what_was_started_and_starts_nothing() {
        let attrs = ReqAttrs {
            sq_psn: 0,
            timeout: None,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        };
        let (mrs, mr, mut req) = setup(4, attrs);
        let sge = [Sge::new(mr.addr(), 8, 7)];
        let now = Instant::now();
        let (mut tx, mut out, mut sink) = (TxQueue::new(), Vec::new(), Vec::new());
        req.post(&SendWr::send(1, &sge).signaled(), &mrs).unwrap();
        assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(1));
        req.draining = true;
        req.post(&SendWr::send(2, &sge).signaled(), &mrs).unwrap();
        let rnr = Frame::Nak {
            psn: 0,
            code: NakCode::Rnr { timer: 1 },
            reason: None,
        };
        req.on_response(&rnr, now, &mut out).unwrap();
        assert!(!req.drained());
        let later = now + Duration::from_secs(1);
        tx.drain_into(&mut sink);
        assert_eq!(req.poll_transmit(&mrs, later, &mut tx, 16, &mut out), Ok(1));
        sink.clear();
        tx.drain_into(&mut sink);
        assert_eq!(
            crate::wire::tests::decode_all(&sink).len(),
            1,
            "the refused SEND alone"
        );
        req.on_response(&Frame::Ack { psn: 0 }, later, &mut out).unwrap();
        assert_eq!(out.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1]);
        assert!(req.drained(), "the WQE posted in SQD is not in flight");
        assert!(req.has_unsent());
        assert_eq!(req.poll_transmit(&mrs, later, &mut tx, 16, &mut out), Ok(0));
        req.draining = false;
        assert_eq!(req.poll_transmit(&mrs, later, &mut tx, 16, &mut out), Ok(1));
        assert!(!req.drained());
    }

    /// The PSNs of the WRITEs in `bytes` (frames as sent) that ask for an ACK.
    fn asking(bytes: &[u8]) -> Vec<u32> {
        crate::wire::tests::decode_all(bytes)
            .into_iter()
            .filter_map(|f| match f {
                Frame::Write {
                    psn, ack_req: true, ..
                } => Some(psn),
                _ => None,
            })
            .collect()
    }

    /// A deep stream asks for an ACK once per half of the WQEs outstanding (not for each
    /// WRITE); a WRITE alone in the send queue always asks.
    #[test]
    fn a_stream_asks_for_an_ack_once_per_half_window() {
        let attrs = ReqAttrs {
            sq_psn: 0,
            timeout: None,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        };
        let (mrs, mr, mut req) = setup(16, attrs);
        let sge = [Sge::new(mr.addr(), 8, 7)];
        let now = Instant::now();
        let (mut tx, mut out, mut sent) = (TxQueue::new(), Vec::new(), Vec::new());
        for id in 0..16 {
            req.post(&SendWr::write(id, &sge, (0x1000, 5)).signaled(), &mrs)
                .unwrap();
        }
        assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 64, &mut out), Ok(16));
        tx.drain_into(&mut sent);
        assert_eq!(asking(&sent), [7, 15]);
        req.on_response(&Frame::Ack { psn: 15 }, now, &mut out).unwrap();
        assert_eq!(out.len(), 16);
        // The application polls them: their slots are free again.
        polled(&mut req);

        // One at a time, each acknowledged before the next: every one asks.
        for (id, psn) in (16..20).zip(16u32..) {
            req.post(&SendWr::write(id, &sge, (0x1000, 5)).signaled(), &mrs)
                .unwrap();
            assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 64, &mut out), Ok(1));
            sent.clear();
            tx.drain_into(&mut sent);
            assert_eq!(asking(&sent), [psn]);
            req.on_response(&Frame::Ack { psn }, now, &mut out).unwrap();
        }
    }

    /// The application polled every completion produced so far (frees their slots under
    /// `SlotRelease::AtPoll`, as the CQ does).
    fn polled(req: &mut Requester) {
        let mut marks = Vec::new();
        req.take_marks(&mut marks);
        if let Some(&upto) = marks.last() {
            req.slots().release_through(upto);
        }
    }

    /// Posts `n` WRITEs (`signaled(i)` says which), all acknowledged at once; returns
    /// how many completions they produced.
    fn complete_writes(
        req: &mut Requester,
        mrs: &MrTable,
        sge: &[Sge],
        first: u64,
        n: u64,
        signaled: impl Fn(u64) -> bool,
    ) -> usize {
        let now = Instant::now();
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        for id in first..first + n {
            let wr = SendWr::write(id, sge, (0x1000, 5));
            req.post(&if signaled(id) { wr.signaled() } else { wr }, mrs)
                .unwrap();
        }
        req.poll_transmit(mrs, now, &mut tx, 64, &mut out).unwrap();
        let psn = req.next_psn().wrapping_sub(1) & verbs_api::PSN_MASK;
        req.on_response(&Frame::Ack { psn }, now, &mut out).unwrap();
        assert_eq!(req.outstanding(), 0, "all complete");
        out.len()
    }

    /// `SlotRelease::AtPoll` (portable, mlx5): completed WRs hold their slots until a
    /// completion that covers them is polled, so a queue of unsignaled WRs fills up;
    /// `AtCompletion` (rxe) frees them as they complete.
    #[test]
    fn send_queue_slots_are_freed_at_poll_or_at_completion_by_profile() {
        let attrs = ReqAttrs {
            sq_psn: 0,
            timeout: None,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        };
        // At poll: 4 unsignaled WRITEs complete, and their slots stay taken.
        let (mrs, mr, req) = setup(4, attrs);
        let mut req = req.with_profile(Switches::PORTABLE, MAX_MSG, MAX_DATAGRAM);
        let sge = [Sge::new(mr.addr(), 8, 7)];
        assert_eq!(complete_writes(&mut req, &mrs, &sge, 0, 4, |_| false), 0);
        assert_eq!(req.held_unpolled(), 4);
        let wr = SendWr::write(9, &sge, (0x1000, 5));
        assert_eq!(req.post(&wr, &mrs), Err(PostCheck::FullUnpolled));
        // The last of 4 signaled: polling its completion frees all four.
        req.reset();
        assert_eq!(req.held_unpolled(), 0);
        assert_eq!(complete_writes(&mut req, &mrs, &sge, 0, 4, |id| id == 3), 1);
        assert_eq!(req.held_unpolled(), 4);
        polled(&mut req);
        assert_eq!(req.held_unpolled(), 0);
        req.post(&wr, &mrs).unwrap();

        // At completion: the same unsignaled WRITEs leave the queue empty.
        let (mrs, mr, req) = setup(4, attrs);
        let mut req = req.with_profile(Switches::RXE, MAX_MSG, MAX_DATAGRAM);
        let sge = [Sge::new(mr.addr(), 8, 7)];
        assert_eq!(complete_writes(&mut req, &mrs, &sge, 0, 4, |_| false), 0);
        assert_eq!(req.held_unpolled(), 0);
        req.post(&SendWr::write(9, &sge, (0x1000, 5)), &mrs).unwrap();
    }

    /// `retry_cnt` 7 is seven retries (IBA, mlx5), or for ever (rxe): a peer that never
    /// answers fails the WRITE after 7 resends, or never.
    #[test]
    fn retry_cnt_7_is_finite_or_infinite_by_profile() {
        let step = Duration::from_millis(10);
        let attrs = ReqAttrs {
            sq_psn: 0,
            timeout: Some(step),
            retry_cnt: 7,
            rnr_retry: 0,
            max_rd_atomic: 1,
        };
        for (sw, infinite) in [(Switches::PORTABLE, false), (Switches::RXE, true)] {
            let (mrs, mr, req) = setup(4, attrs);
            let mut req = req.with_profile(sw, MAX_MSG, MAX_DATAGRAM);
            let sge = [Sge::new(mr.addr(), 8, 7)];
            req.post(&SendWr::write(1, &sge, (0x1000, 5)).signaled(), &mrs)
                .unwrap();
            let mut t = Instant::now();
            let (mut tx, mut out) = (TxQueue::new(), Vec::new());
            let mut sends = 0;
            for _ in 0..50 {
                sends += req.poll_transmit(&mrs, t, &mut tx, 16, &mut out).unwrap_or(0);
                tx = TxQueue::new();
                t += step * 2;
                let _ = req.on_timer(t, None, None, &mut out);
                if !out.is_empty() {
                    break;
                }
            }
            if infinite {
                assert!(
                    out.is_empty() && sends == 50,
                    "{sw:?}: {out:?} after {sends} sends"
                );
            } else {
                assert_eq!(out.len(), 1, "{sw:?}");
                assert_eq!(out[0].status, WcStatus::RetryExcErr);
                assert_eq!(sends, 8, "the first send and seven retries");
            }
        }
    }

    /// A requester with `timeout` and `retry_cnt` that sent one signaled WRITE at `t0`.
    fn one_write_sent(timeout: Duration, retry_cnt: u8, t0: Instant) -> Requester {
        let attrs = ReqAttrs {
            sq_psn: 0,
            timeout: Some(timeout),
            retry_cnt,
            rnr_retry: 0,
            max_rd_atomic: 1,
        };
        let (mrs, mr, mut req) = setup(4, attrs);
        let sge = [Sge::new(mr.addr(), 64, 7)];
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        req.post(&SendWr::write(1, &sge, (0x1000, 5)).signaled(), &mrs)
            .unwrap();
        assert_eq!(req.poll_transmit(&mrs, t0, &mut tx, 16, &mut out), Ok(1));
        assert!(out.is_empty(), "{out:?}");
        req
    }

    /// `on_timer` says whether it left something to send: a resend after the ACK timeout
    /// does; a deadline not reached, or one that only moved because bytes left meanwhile,
    /// does not (the progress engine then leaves the connection to whichever thread
    /// drives it instead of servicing it on a timer).
    #[test]
    fn the_ack_timer_says_whether_a_resend_is_due() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut req = one_write_sent(ms(10), 1, t0);
        let mut out = Vec::new();
        assert_eq!(req.on_timer(t0 + ms(5), Some(t0), None, &mut out), Ok(false));
        assert_eq!(
            req.on_timer(t0 + ms(11), Some(t0 + ms(8)), None, &mut out),
            Ok(false)
        );
        assert!(!req.has_unsent());
        assert_eq!(req.next_deadline(), Some(t0 + ms(18)));
        assert_eq!(
            req.on_timer(t0 + ms(19), Some(t0 + ms(8)), None, &mut out),
            Ok(true)
        );
        assert!(req.has_unsent(), "rewound: the WRITE goes again");
        assert!(out.is_empty(), "{out:?}");
    }

    /// A connection attempt under way does not use up `retry_cnt`: the lifetime test's
    /// READ ended in `IBV_WC_RETRY_EXC_ERR` (`vendor_err` ENOTCONN) on a loaded CI machine,
    /// its three 67 ms timeouts spent while the sim reconnected. A failed attempt, or
    /// one that outlasts the grace, counts again.
    #[test]
    fn a_connection_being_set_up_uses_no_retries() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut req = one_write_sent(ms(10), 0, t0);
        let mut out = Vec::new();
        req.connecting(Some(t0));
        for k in 1..50 {
            let now = t0 + ms(11 * k);
            assert_eq!(req.on_timer(now, Some(t0), None, &mut out), Ok(false));
            assert!(out.is_empty(), "timeout {k} counted: {out:?}");
            assert_eq!(req.next_deadline(), Some(now + ms(10)));
        }
        // The attempt failed: the next timeout is the WR's last (retry_cnt 0).
        req.connecting(None);
        let now = t0 + ms(600);
        assert_eq!(
            req.on_timer(now, Some(t0), None, &mut out),
            Err(Fatal(WcStatus::RetryExcErr))
        );
        // An attempt that outlasts the grace counts as lost packets.
        let mut req = one_write_sent(ms(10), 0, t0);
        req.connecting(Some(t0));
        let late = t0 + LINK_SETUP_GRACE + ms(1);
        assert_eq!(
            req.on_timer(late, Some(t0), None, &mut out),
            Err(Fatal(WcStatus::RetryExcErr))
        );
    }

    /// perf-compare's `write_bw -a` failed with `IBV_WC_RETRY_EXC_ERR`: 128 WRITEs of
    /// 8 MiB were queued at once and took longer than `timeout` to leave, so the timer
    /// fired on messages still being written, and each resend queued them again. The
    /// timer now counts from the last bytes sent; only silence after that is a loss.
    #[test]
    fn the_ack_timer_counts_from_the_last_transmission() {
        let timeout = Duration::from_millis(10);
        let t0 = Instant::now();
        let mut req = one_write_sent(timeout, 0, t0);
        let mut out = Vec::new();
        assert_eq!(req.next_deadline(), Some(t0 + timeout));
        // The deadline passes while bytes are still leaving: no retry (retry_cnt 0 would
        // fail the WR at once), the deadline moves to timeout after the last byte sent.
        let sending = t0 + timeout - Duration::from_millis(1);
        let late = t0 + timeout + Duration::from_millis(2);
        assert_eq!(req.on_timer(late, Some(sending), None, &mut out), Ok(false));
        assert!(out.is_empty());
        assert_eq!(req.next_deadline(), Some(sending + timeout));
        // Silence for a whole timeout after the last byte: retries are used up.
        let silent = sending + timeout + Duration::from_millis(1);
        assert_eq!(
            req.on_timer(silent, Some(sending), None, &mut out),
            Err(Fatal(WcStatus::RetryExcErr))
        );
        assert_eq!(
            out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::RetryExcErr)]
        );
        // Without a transmission record the timer counts from the send, as before.
        let mut req = one_write_sent(timeout, 0, t0);
        assert!(req.on_timer(late, None, None, &mut out).is_err());
    }

    /// Under WRITEs both ways the ACK a requester waits for comes after the rest of the
    /// message the peer is sending, on the same ordered stream: `ib_write_bw -b` spent up
    /// to 6 of 7 retries on local ACK timeouts while data arrived all along. Bytes
    /// arriving from the peer (or waiting unread on this side, which the driver reports
    /// as arriving now) keep the timer from counting; only silence both ways is a loss.
    #[test]
    fn bytes_arriving_from_the_peer_keep_the_ack_timer_from_counting() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut req = one_write_sent(ms(10), 0, t0);
        let mut out = Vec::new();
        // Nothing more left after t0, but the peer's bytes arrived until t0 + 8 ms: no
        // retry (retry_cnt 0 would fail the WR at once), the deadline follows them.
        assert_eq!(
            req.on_timer(t0 + ms(11), Some(t0), Some(t0 + ms(8)), &mut out),
            Ok(false)
        );
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(req.next_deadline(), Some(t0 + ms(18)));
        // Bytes waiting unread at t0 + 30 ms: the deadline moves on again.
        let now = t0 + ms(30);
        assert_eq!(req.on_timer(now, Some(t0), Some(now), &mut out), Ok(false));
        assert_eq!(req.next_deadline(), Some(now + ms(10)));
        assert_eq!(req.take_ack_timeouts(), 0);
        // A whole timeout of silence both ways: the retries are used up.
        assert_eq!(
            req.on_timer(now + ms(11), Some(t0), Some(now), &mut out),
            Err(Fatal(WcStatus::RetryExcErr))
        );
        assert_eq!(req.take_ack_timeouts(), 1);
    }

    /// A requester with a 10 ms timeout and `retry_cnt` 1 that sent a 64-byte READ at
    /// `t0` and accepted its response header at `t0 + 8 ms`; returns the scatter list the
    /// payload goes to.
    fn read_answered(t0: Instant) -> (Requester, Vec<Seg>) {
        let ms = Duration::from_millis;
        let attrs = ReqAttrs {
            sq_psn: 0,
            timeout: Some(ms(10)),
            retry_cnt: 1,
            rnr_retry: 0,
            max_rd_atomic: 1,
        };
        let (mrs, mr, mut req) = setup(4, attrs);
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        req.post(
            &SendWr::read(1, &[Sge::new(mr.addr(), 64, 7)], (0x1000, 5)).signaled(),
            &mrs,
        )
        .unwrap();
        assert_eq!(req.poll_transmit(&mrs, t0, &mut tx, 16, &mut out), Ok(1));
        let resp = Frame::ReadResp { psn: 0, len: 64 };
        match req.on_response(&resp, t0 + ms(8), &mut out) {
            Ok(ReadSink::Into { psn: 0, segs }) => (req, segs),
            _ => panic!("the response is taken"),
        }
    }

    /// Found by tests/lifetime.rs in CI: a READ, then a WRITE the responder ACKed while
    /// the READ's response was still due (its region was deregistered, the resent READ
    /// met the dead rkey). The WRITE completed SUCCESS after the READ's error; after an
    /// error only flushes may follow.
    #[test]
    fn a_wqe_acked_behind_a_failed_read_is_flushed() {
        let attrs = ReqAttrs {
            sq_psn: 0,
            timeout: Some(Duration::from_millis(10)),
            retry_cnt: 1,
            rnr_retry: 0,
            max_rd_atomic: 4,
        };
        let (mrs, mr, mut req) = setup(4, attrs);
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let t0 = Instant::now();
        let sge = [Sge::new(mr.addr(), 8, 7)];
        req.post(&SendWr::read(1, &sge, (0x1000, 5)).signaled(), &mrs)
            .unwrap();
        req.post(&SendWr::write(2, &sge, (0x2000, 5)).signaled(), &mrs)
            .unwrap();
        assert_eq!(req.poll_transmit(&mrs, t0, &mut tx, 16, &mut out), Ok(2));
        req.on_response(&Frame::Ack { psn: 1 }, t0, &mut out).unwrap();
        assert!(out.is_empty(), "the WRITE waits behind the READ: {out:?}");
        let nak = Frame::Nak {
            psn: 0,
            code: NakCode::RemoteAccess,
            reason: None,
        };
        assert!(req.on_response(&nak, t0, &mut out).is_err());
        assert_eq!(
            out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
        );
    }

    /// A READ whose response is arriving is not resent when the local ACK timeout passes:
    /// found as allocations in tests/alloc.rs under load, where the timer fired while a
    /// 64 KiB response's payload was being read, and the resend rebuilt the READ's
    /// scatter list (handed to the payload) and had the responder read the region again.
    /// The response header restarts the timer, as every response packet does on an HCA,
    /// and the payload's bytes move it on; a payload that stops for a whole timeout counts
    /// against `retry_cnt`, still without a resend, until `IBV_WC_RETRY_EXC_ERR`.
    #[test]
    fn a_read_response_still_arriving_is_not_resent() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let (mut req, segs) = read_answered(t0);
        let mut out = Vec::new();
        assert_eq!(req.next_deadline(), Some(t0 + ms(18)), "restarted by the header");
        // Payload bytes until 15 ms: at 19 ms the deadline moves to 25, nothing is resent.
        let rx = Some(t0 + ms(15));
        assert_eq!(req.on_timer(t0 + ms(19), Some(t0), rx, &mut out), Ok(false));
        assert!(!req.has_unsent(), "resent while its response arrived");
        assert_eq!(req.next_deadline(), Some(t0 + ms(25)));
        // Silence for a whole timeout: a retry is used up, still no resend.
        assert_eq!(req.on_timer(t0 + ms(26), Some(t0), rx, &mut out), Ok(false));
        assert!(!req.has_unsent());
        assert!(out.is_empty(), "{out:?}");
        // The rest arrives: the READ completes.
        req.read_done(0, segs, t0 + ms(27), &mut out);
        assert_eq!(
            out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::Success)]
        );

        // A payload that never ends: retry_cnt timeouts, then RETRY_EXC_ERR.
        let (mut req, _segs) = read_answered(t0);
        let mut out = Vec::new();
        assert_eq!(req.on_timer(t0 + ms(19), Some(t0), None, &mut out), Ok(false));
        assert!(!req.has_unsent());
        assert_eq!(
            req.on_timer(t0 + ms(30), Some(t0), None, &mut out),
            Err(Fatal(WcStatus::RetryExcErr))
        );
        assert_eq!(
            out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::RetryExcErr)]
        );
    }
}
