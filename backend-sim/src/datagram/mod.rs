//! UD datagrams between devices (IBA 9.8.4 "Unreliable datagram service"; docs/wire.md
//! "Links"): how a UD QP's sends leave its device and how a datagram finds the QP it
//! names.
//!
//! UD QPs have no peer and no connection. A device keeps one *link* per device it
//! exchanges datagrams with: a TCP connection, opened on demand by the first UD send to
//! a device it has no link to, and used from then on by every UD QP of both devices, in
//! both directions ([`link`]). Opening one is checked as a QP pair's hello is, so that
//! the device at the accepting end knows which device is at the other: the source
//! (GID, LID) of every datagram on a link is that device's, whatever the frame says,
//! and a third process cannot make datagrams appear to come from another device's QPs
//! ([`setup`]); which link a datagram takes, and how a link set up takes its place in
//! the device's table, is [`links`]. Datagrams between the QPs of one device never leave it (an HCA loops
//! them back too): they go through the device's own queue of bytes, in the same frames.
//!
//! - **Sending** ([`Datagrams::transmit`], on the thread that posted, or that saw the
//!   link come up): under the QP's lock each datagram's header and payload are copied
//!   into the queue of its link (a datagram is at most an MTU), and its WR completes:
//!   the datagram is handed on. Then, without the QP's lock, the link's bytes are
//!   written, without blocking; what the socket does not take, the link's task writes
//!   when it can. A datagram to a device whose link is being set up waits (its WR with
//!   it) for at most the setup's time; to a device that could not be reached (for
//!   [`FAILED_HOLD`] after a failed attempt) it is lost, and its WR completes all the
//!   same, as UD's do. A queue that is full (the socket takes bytes slower than the QPs
//!   post) holds the QP's send queue back, as the wire holds an HCA's: the WQE and those
//!   behind it wait, uncompleted, until the writer that makes room hands the QP back
//!   ([`waiters`]); a sender is never dropped for being fast. (A device that stops
//!   reading altogether has its link closed, see [`link::STALL_LIMIT`].)
//! - **Receiving** ([`receive`]; [`link`]'s task on the device's setup runtime, an application
//!   thread whose empty poll reads the device's first [`POLLED_LINKS`] links as it reads
//!   its connections ([`SidePaths`]: a datagram need not wait for the setup thread to
//!   wake), or the thread that drains the device's own queue): each whole datagram goes
//!   to the UD QP its
//!   destination QPN names, in the QP's lock ([`QpShared::receive_datagram`]); no such
//!   QP, one of another type or a destroyed one, and the datagram is dropped and
//!   counted.
//!
//! Lock order: a QP's lock, then the link table's, then a link's queue. A thread that
//! writes a socket or delivers datagrams holds no QP lock but the one of the QP it
//! delivers to; no lock is held while a thread waits.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arrayvec::ArrayVec;
use parking_lot::Mutex;
use verbs_api::{Gid, QpState};

use crate::addressing::Addressing;
use crate::counters::DeviceCounters;
use crate::mcast::Multicast;
use crate::progress::Progress;
use crate::qp::{QpShared, QpTable};
use crate::verify::Claims;
use backend_sim_proto::qp::DatagramSource;
use backend_sim_proto::qp::{Emitted, UdRoute};
use backend_sim_proto::wire::{DATAGRAM_HDR_LEN, MAX_DATAGRAM};

mod fanout;
pub mod gsi;
pub mod link;
mod links;
mod receive;
pub mod setup;
pub mod table;
pub mod waiters;

use link::Link;
pub use receive::Inbox;
use table::LinkTable;
use waiters::Waiters;

/// How long datagrams to a device that could not be reached are lost without a new
/// attempt to reach it (so that a program sending to a device that is not there does not
/// open a connection per datagram).
pub const FAILED_HOLD: Duration = Duration::from_millis(200);
/// Bytes queued for one link (or the device's own queue) beyond which the sending QPs
/// wait: a peer that does not read cannot grow this side's memory. (The kernel's socket
/// buffers hold far more; this queue only bridges a socket that is full for a moment.)
pub const QUEUE_MAX: usize = 64 << 10;
/// Bytes a link's queue (or the device's own) may hold when the connection manager's
/// messages are appended, beyond which one is dropped and waits for its resend: more
/// than [`QUEUE_MAX`], so that a burst of them (a thousand requests, replies or
/// disconnects at once, as `cmtime` makes) waits for a peer that reads a moment later
/// instead of costing every message dropped a whole resend interval; still a bound
/// against a peer that does not read. (Datagrams of QPs still wait at [`QUEUE_MAX`].)
pub const GSI_QUEUE_MAX: usize = 1 << 20;

/// A queue of datagrams' bytes, allocated once at its largest: below [`QUEUE_MAX`] a
/// whole datagram more always fits, so appending never grows it (and the writer's
/// buffer, swapped with it, is allocated alike).
pub fn queue_buf() -> Vec<u8> {
    Vec::with_capacity(QUEUE_MAX + DATAGRAM_HDR_LEN + MAX_DATAGRAM as usize)
}
/// Links an application thread's empty poll reads (a read per link and poll: beyond a
/// few, a poll would cost more than the wake-up it saves).
pub const POLLED_LINKS: usize = 4;

/// Links one call of [`Datagrams::transmit`] writes itself before it returns (more are
/// left to their tasks).
const WRITE_NOW: usize = 8;

/// What became of a datagram offered to a queue of bytes.
pub enum Queued<R> {
    /// Appended (what the encoder returned).
    Appended(R),
    /// The queue is full: the QP waits for room.
    Full,
    /// Nowhere to go: the link is closed, or there is none.
    Closed,
}

/// How a pass over a send queue goes on after one datagram.
enum Settled {
    /// To the next WQE.
    Next,
    /// No further: a queue is full.
    Stop,
    /// No further: the WQE failed locally (the QP leaves RTS).
    Fatal,
}

/// Where a datagram goes.
enum Target {
    /// To a QP of this device.
    Local,
    /// Into this link.
    Link(Arc<Link>),
    /// Nowhere yet: the link is being set up.
    Wait,
    /// Nowhere: the device cannot be reached.
    Lost,
}

/// The device's own queue of datagrams to its own QPs.
struct LocalQueue {
    /// Frames appended by senders.
    queue: Mutex<Vec<u8>>,
    /// Held by the thread delivering (its buffer: the frames it took from `queue`).
    draining: Mutex<Vec<u8>>,
    /// Set after an append: the thread delivering goes around again.
    dirty: AtomicBool,
    /// QPs waiting for room in `queue`.
    waiters: Waiters,
}

/// A device's UD side: its links and its own queue.
pub struct Datagrams {
    /// The device's name (for the log).
    pub name: String,
    /// The runtime of the links' tasks (the device's setup runtime).
    pub rt: tokio::runtime::Handle,
    /// Where the device is reached.
    pub addr: Arc<Addressing>,
    /// The hellos the device is sending (links' and QPs').
    pub claims: Arc<Claims>,
    /// How its links run.
    pub transport: crate::same_host::Transport,
    qps: Arc<QpTable>,
    pub(crate) counters: Arc<DeviceCounters>,
    progress: Arc<Progress>,
    links: Mutex<LinkTable>,
    /// Most links the device holds ([`table::link_bound`]).
    bound: usize,
    local: LocalQueue,
    /// The connection manager's side (datagrams to QP 1, [`gsi`]).
    gsi: gsi::GsiPort,
    /// The device's multicast groups (whose QPs take datagrams to QP 0xFFFFFF).
    mcast: Arc<Multicast>,
    /// The device's port: while it is down no datagram leaves and no link is opened.
    pub port: Arc<crate::port::Port>,
    /// How long each link set up from now on waits before it carries datagrams
    /// ([`Faults::delay_link_setup`](crate::faults::Faults::delay_link_setup)), in ns.
    pub(crate) setup_delay_ns: std::sync::atomic::AtomicU64,
}

impl Datagrams {
    /// The UD side of a device.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        rt: tokio::runtime::Handle,
        addr: Arc<Addressing>,
        claims: Arc<Claims>,
        qps: Arc<QpTable>,
        counters: Arc<DeviceCounters>,
        progress: Arc<Progress>,
        mcast: Arc<Multicast>,
        port: Arc<crate::port::Port>,
        transport: crate::same_host::Transport,
    ) -> Self {
        Datagrams {
            transport,
            name: name.to_string(),
            rt,
            addr,
            claims,
            qps,
            counters,
            progress,
            links: Mutex::default(),
            bound: table::link_bound(),
            local: LocalQueue {
                queue: Mutex::new(queue_buf()),
                draining: Mutex::new(queue_buf()),
                dirty: AtomicBool::new(false),
                waiters: Waiters::default(),
            },
            gsi: gsi::GsiPort::default(),
            mcast,
            port,
            setup_delay_ns: Default::default(),
        }
    }

    /// This device as the source of its own datagrams.
    fn own_source(&self) -> DatagramSource {
        DatagramSource {
            gid: self.addr.ip_gid().0,
            lid: self.addr.lid(),
        }
    }

    /// Hands the datagrams of UD QP `qp` on (see the module docs), and completes their
    /// WRs; then those of the QPs that waited for the room this made.
    pub fn transmit(self: &Arc<Self>, qp: &Arc<QpShared>) {
        let mut woken = Vec::new();
        self.transmit_one(qp, &mut woken);
        self.transmit_woken(woken);
    }

    /// Hands on the datagrams of the QPs in `woken` (they waited for room in a queue),
    /// and of those their writes make room for in turn: a list worked through, not
    /// recursion, as each write may wake more.
    pub fn transmit_woken(self: &Arc<Self>, mut woken: Vec<Weak<QpShared>>) {
        while let Some(w) = woken.pop() {
            if let Some(qp) = w.upgrade() {
                self.transmit_one(&qp, &mut woken);
            }
        }
    }

    /// One pass over `qp`'s send queue, in order: each datagram is appended to its
    /// queue, waits for its link to be set up, or is lost; a full queue stops the pass
    /// (the WQE and those behind it wait, as an HCA's send queue waits for the wire,
    /// until the writer that makes room hands the QP back). Writes the queues it filled
    /// and puts the QPs waiting for the room this made in `woken`.
    fn transmit_one(self: &Arc<Self>, qp: &Arc<QpShared>, woken: &mut Vec<Weak<QpShared>>) {
        let mut written: ArrayVec<Arc<Link>, WRITE_NOW> = ArrayVec::new();
        let mut local = false;
        {
            let mut g = qp.inner.lock();
            if !matches!(g.qp.state(), QpState::Rts | QpState::Sqd) {
                return;
            }
            let mut from = 0;
            let mut fatal = false;
            while let Some((idx, route)) = g.qp.poll_datagram(from) {
                from = idx + 1;
                if !self.port.is_up() {
                    if qp.fails_for_port(&mut g) {
                        break;
                    }
                    tracing::trace!(qpn = qp.qpn, "UD: datagram lost: the port is down");
                    self.counters.ud_unsent();
                    g.qp.datagram_lost(idx);
                    continue;
                }
                if g.faults.drop_datagrams > 0 {
                    g.faults.drop_datagrams -= 1;
                    self.progress
                        .counters
                        .datagrams_dropped
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        qpn = qp.qpn,
                        dst_qpn = route.remote_qpn,
                        "UD: datagram lost (fault injection)"
                    );
                    if let Some(cap) = qp.dev.capture.get() {
                        self.capture_lost(cap, &g.qp, idx, &route);
                    }
                    g.qp.datagram_lost(idx);
                    continue;
                }
                let group = route.grh.map(|h| Gid(h.dgid)).filter(|g| g.is_multicast());
                let queued = match group {
                    Some(mgid) => {
                        match self.send_to_group(qp, &mut g.qp, idx, &mgid, &mut written, &mut local) {
                            fanout::Sent::Queued(q) => q,
                            fanout::Sent::Wait => {
                                g.qp.datagram_waits(idx);
                                continue;
                            }
                            fanout::Sent::Nowhere => {
                                tracing::trace!(qpn = qp.qpn, group = %mgid, "UD: no device has members of the group");
                                g.qp.datagram_lost(idx);
                                continue;
                            }
                        }
                    }
                    None => {
                        match self.send_to_device(qp, &mut g.qp, idx, route.peer, &mut written, &mut local) {
                            Some(q) => q,
                            None => {
                                g.qp.datagram_waits(idx);
                                continue;
                            }
                        }
                    }
                };
                match self.settle_one(qp, &mut g.qp, idx, queued, &route.peer) {
                    Settled::Next => {}
                    Settled::Stop => break,
                    Settled::Fatal => {
                        fatal = true;
                        break;
                    }
                }
            }
            qp.complete_datagrams(&mut g, fatal);
        }
        for link in written {
            link.flush(woken);
        }
        if local {
            self.local.dirty.store(true, Ordering::SeqCst);
            self.drain_local(woken);
        }
    }

    /// Writes the datagram of WQE `idx` that an injected fault drops to the capture,
    /// marked (its header: the payload never left the send queue).
    #[cold]
    fn capture_lost(
        &self,
        cap: &crate::capture::Capture,
        core: &backend_sim_proto::qp::Qp,
        idx: usize,
        route: &UdRoute,
    ) {
        let Some(f) = core.datagram_frame(idx) else { return };
        let dst = match route.grh.map(|h| Gid(h.dgid)).filter(|g| g.is_multicast()) {
            Some(mgid) => mgid.0,
            None => crate::capture::gid_of(route.peer.ip()),
        };
        let note = "dropped: fault injection (drop_datagrams)";
        crate::capture::datagram_frame(cap, &f, &[], self.addr.ip_gid().0, dst, Some(note));
    }

    /// Offers WQE `idx` of `qp` (its core `core`) to the queue of the device at
    /// `peer`: this device's own, or the link to it (which goes to `written`, or past its
    /// room is woken); `None`: the link is being set up, and the WQE waits for it.
    fn send_to_device(
        self: &Arc<Self>,
        qp: &Arc<QpShared>,
        core: &mut backend_sim_proto::qp::Qp,
        idx: usize,
        peer: SocketAddr,
        written: &mut ArrayVec<Arc<Link>, WRITE_NOW>,
        local: &mut bool,
    ) -> Option<Queued<Result<Emitted, backend_sim_proto::qp::Fatal>>> {
        let target = if self.addr.reaches_self(peer) {
            Target::Local
        } else {
            self.link_to(peer, qp)
        };
        Some(match &target {
            Target::Local => {
                *local = true;
                let mut q = self.local.queue.lock();
                if q.len() < QUEUE_MAX {
                    Queued::Appended(emit(core, idx, qp, &mut q, self.addr.ip_gid(), peer))
                } else {
                    self.local.waiters.add(qp);
                    Queued::Full
                }
            }
            Target::Link(link) => {
                let gid = self.addr.ip_gid();
                let r = link.append(qp, |q| emit(core, idx, qp, q, gid, peer));
                if !written.iter().any(|l| Arc::ptr_eq(l, link)) {
                    if written.is_full() {
                        // (After the append: the task looks at the queue when it wakes.)
                        link.wake();
                    } else {
                        written.push(link.clone());
                    }
                }
                r
            }
            Target::Wait => return None,
            Target::Lost => Queued::Closed,
        })
    }

    /// What a datagram's offer to its queue (or queues) means for the pass over the send
    /// queue: WQE `idx` is done or lost (next), waits for room (stop), or failed locally.
    fn settle_one(
        &self,
        qp: &QpShared,
        core: &mut backend_sim_proto::qp::Qp,
        idx: usize,
        queued: Queued<Result<Emitted, backend_sim_proto::qp::Fatal>>,
        peer: &SocketAddr,
    ) -> Settled {
        match queued {
            Queued::Appended(Ok(Emitted::Sent)) => Settled::Next,
            Queued::Appended(Ok(Emitted::TooLong)) => {
                self.counters.ud_unsent();
                Settled::Next
            }
            Queued::Appended(Err(_)) => Settled::Fatal,
            Queued::Full => {
                tracing::trace!(
                    qpn = qp.qpn,
                    %peer,
                    "UD: the queue to the destination device is full: the send queue waits"
                );
                core.datagram_waits(idx);
                Settled::Stop
            }
            Queued::Closed => {
                tracing::debug!(qpn = qp.qpn, %peer, "UD: datagram lost: no link to its device");
                self.counters.ud_unsent();
                core.datagram_lost(idx);
                Settled::Next
            }
        }
    }
}

/// The UD requester emits WQE `idx` into `q` (see `Qp::emit_datagram`), and a datagram
/// sent is captured (`RDMA_SIM_PCAP`) as from `src_gid` to `peer`.
fn emit(
    core: &mut backend_sim_proto::qp::Qp,
    idx: usize,
    qp: &QpShared,
    q: &mut Vec<u8>,
    src_gid: verbs_api::Gid,
    peer: SocketAddr,
) -> Result<Emitted, backend_sim_proto::qp::Fatal> {
    let at = q.len();
    let r = core.emit_datagram(idx, &qp.dev.mrs, q);
    if let (Ok(Emitted::Sent), Some(cap)) = (&r, qp.dev.capture.get()) {
        crate::capture::datagram_to(cap, &q[at..], src_gid.0, peer.ip());
    }
    r
}
