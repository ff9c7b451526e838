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
//! ([`setup`]). Datagrams between the QPs of one device never leave it (an HCA loops
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
//! - **Receiving** ([`link`]'s task on the device's setup runtime, an application
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
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use parking_lot::Mutex;
use verbs_api::{Gid, QpState, QpType, MULTICAST_QPN};

use crate::addressing::Addressing;
use crate::counters::DeviceCounters;
use crate::mcast::Multicast;
use crate::progress::{Progress, SidePaths};
use crate::qp::{QpShared, QpTable};
use crate::verify::Claims;
use crate::wire::{Frame, DATAGRAM_HDR_LEN, MAX_DATAGRAM};
use backend_sim_proto::qp::DatagramSource;
use backend_sim_proto::qp::{Emitted, UdRoute};

mod fanout;
pub mod gsi;
pub mod link;
pub mod setup;
pub mod table;
pub mod waiters;

use link::Link;
use table::{LinkTable, Slot};
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

    /// Where a datagram to the device at `peer` goes now; sets a link up (and has `qp`
    /// wait for it) if there is none.
    fn link_to(self: &Arc<Self>, peer: SocketAddr, qp: &Arc<QpShared>) -> Target {
        let mut t = self.links.lock();
        match t.by_peer.get_mut(&peer) {
            Some(Slot::Up(link)) if !link.is_closed() => return Target::Link(link.clone()),
            Some(Slot::Pending(waiting)) => {
                if !waiting.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(qp))) {
                    waiting.push(Arc::downgrade(qp));
                }
                return Target::Wait;
            }
            Some(Slot::Failed(until)) if Instant::now() < *until => return Target::Lost,
            _ => {}
        }
        if !t.reserve(None, self.bound) {
            tracing::warn!(
                device = %self.name, %peer,
                "{} links to other devices, all in use: datagrams to another are lost",
                self.bound
            );
            return Target::Lost;
        }
        t.by_peer.insert(peer, Slot::Pending(vec![Arc::downgrade(qp)]));
        drop(t);
        tracing::debug!(device = %self.name, %peer, "UD: opening a link");
        self.rt.spawn(setup::open(self.clone(), peer));
        Target::Wait
    }

    /// Sets the links to the other member devices of group `mgid` up ahead of the first
    /// datagram, as a subnet manager or a RoCE network is set up for a group when a port
    /// joins it: rdma_cm's join (`rdma_join_multicast`) calls it, so that a program that
    /// sends to the group right away and then destroys its QP (rdma-core's `mckey`)
    /// does not lose its datagrams to the links' setup, which an HCA does not have.
    pub fn prepare_group(self: &Arc<Self>, mgid: &Gid) {
        for &peer in crate::mcast::registry().members(mgid).iter() {
            if self.addr.reaches_self(peer) {
                continue;
            }
            let mut t = self.links.lock();
            if t.by_peer.contains_key(&peer) || !t.reserve(None, self.bound) {
                continue;
            }
            t.by_peer.insert(peer, Slot::Pending(Vec::new()));
            drop(t);
            tracing::debug!(device = %self.name, %peer, group = %mgid, "UD: opening a link to a group's member");
            self.rt.spawn(setup::open(self.clone(), peer));
        }
    }

    /// The link to `peer` this device opened is up (`Some`, which takes its place in the
    /// table unless a live one is there already) or could not be set up (`None`): the
    /// QPs that waited for it send (or lose) their datagrams. `epoch`: the port's when
    /// the setup began ([`Datagrams::take_place`]); whether the link took its place.
    fn settle(self: &Arc<Self>, peer: SocketAddr, link: Option<&Arc<Link>>, epoch: u64) -> bool {
        self.take_place(peer, link, false, epoch)
    }

    /// The link from the device at `peer` is accepted (set up and checked, on a place
    /// [`Datagrams::reserve_for`] took): it replaces the last one from that device.
    /// Whether it took its place (see [`Datagrams::take_place`]).
    fn adopt(self: &Arc<Self>, peer: SocketAddr, link: &Arc<Link>, epoch: u64) -> bool {
        self.take_place(peer, Some(link), true, epoch)
    }

    /// A link set up (or not) takes the place reserved for it. Not if the port went down
    /// since `epoch` (read when the setup checked it), even if it is back: the port's
    /// going down closed the links in the table, under its lock, and this one was not
    /// among them, nor may what the other device sent on it while the port was down
    /// arrive. Checked here, in the table's lock, so that a port going down either finds
    /// the link to close or is seen; the caller drops a link that did not take its
    /// place, and the next datagram to that device opens another.
    fn take_place(
        self: &Arc<Self>,
        peer: SocketAddr,
        link: Option<&Arc<Link>>,
        accepted: bool,
        epoch: u64,
    ) -> bool {
        let mut t = self.links.lock();
        t.release();
        let port_went_down = link.is_some() && !self.port.up_since(epoch);
        let link = link.filter(|_| !port_went_down);
        if port_went_down {
            tracing::debug!(device = %self.name, %peer, "UD link closed: the port went down during its setup");
            if accepted {
                return false;
            }
        }
        if let Some(l) = link {
            t.adopt(l, accepted);
        }
        // (A link the port's going down closed leaves no slot: the next datagram to the
        // device opens another once the port is up.)
        let fresh = || match link {
            Some(l) => Some(Slot::Up(l.clone())),
            None if port_went_down => None,
            None => Some(Slot::Failed(Instant::now() + FAILED_HOLD)),
        };
        let (slot, waiting) = match t.by_peer.remove(&peer) {
            Some(Slot::Up(l)) if !l.is_closed() => (Some(Slot::Up(l)), Vec::new()),
            Some(Slot::Pending(w)) => (fresh(), w),
            _ => (fresh(), Vec::new()),
        };
        if let Some(slot) = slot {
            t.by_peer.insert(peer, slot);
        }
        // (In the table's lock, as `send_gsi` queues them: none is left behind.)
        let gsi_waiting = self.gsi.take_pending(peer);
        drop(t);
        for qp in waiting.iter().filter_map(Weak::upgrade) {
            self.transmit(&qp);
        }
        self.settle_gsi(peer, link, gsi_waiting, accepted);
        link.is_some()
    }

    /// Whether a link from the device at `peer` could take a place now (a look before a
    /// stranger's hello costs a check).
    fn has_room_for(&self, peer: SocketAddr) -> bool {
        self.links.lock().has_room(Some(peer), self.bound)
    }

    /// Takes a place for a link from the device at `peer`, checked and about to be
    /// accepted; `false`: none (see [`table`]). [`Datagrams::adopt`] or
    /// [`Datagrams::unreserve`] gives it back.
    fn reserve_for(&self, peer: SocketAddr) -> bool {
        self.links.lock().reserve(Some(peer), self.bound)
    }

    /// Gives back a place taken for a link that did not come up.
    fn unreserve(&self) {
        self.links.lock().release();
    }

    /// An established link is read by application threads' empty polls too, as QP
    /// connections are (see [`SidePaths`]), while the device has at most
    /// [`POLLED_LINKS`]; more are left to their tasks alone.
    pub fn read_by_pollers(self: &Arc<Self>, link: &Arc<Link>) {
        let mut t = self.links.lock();
        if t.polled.try_push(link.clone()).is_ok() {
            let side: Arc<dyn SidePaths> = self.clone();
            self.progress.add_side_paths(Arc::downgrade(&side));
        }
    }

    /// Closes every link (the port went down); each leaves the table as its task ends.
    pub fn close_links(&self) {
        let all = self.links.lock().all();
        for l in all {
            l.close();
        }
    }

    /// The link ended: it leaves the table (and the connection manager hears of it).
    fn forget(&self, link: &Arc<Link>) {
        self.links.lock().remove(link);
        self.gsi_link_closed(link.peer_addr);
    }

    /// Delivers the datagrams queued for this device's own QPs (any thread may; one
    /// does at a time, and goes around again for what was queued meanwhile); the QPs
    /// that waited for room in the queue go to `woken`.
    fn drain_local(&self, woken: &mut Vec<Weak<QpShared>>) {
        let src = self.own_source();
        loop {
            let Some(mut buf) = self.local.draining.try_lock() else {
                return;
            };
            self.local.dirty.store(false, Ordering::SeqCst);
            loop {
                {
                    let mut q = self.local.queue.lock();
                    if q.is_empty() {
                        self.local.waiters.take_into(woken);
                        break;
                    }
                    std::mem::swap(&mut *q, &mut *buf);
                    self.local.waiters.take_into(woken);
                }
                let mut at = 0;
                let mut inbox = Inbox::default();
                // Frames this device encoded itself: they decode (a failure would end
                // the batch, not the process).
                while let Ok(Some((f, n))) = Frame::decode(&buf[at..]) {
                    let len = f.payload_len() as usize;
                    let Some(payload) = buf.get(at + n..at + n + len) else {
                        break;
                    };
                    self.deliver(&mut inbox, &f, payload, &src);
                    at += n + len;
                }
                drop(inbox);
                buf.clear();
            }
            drop(buf);
            if !self.local.dirty.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// Datagram `frame` (with `payload`) from `src` to the QP it names, in `inbox`'s run.
    pub fn deliver(&self, inbox: &mut Inbox, frame: &Frame, payload: &[u8], src: &DatagramSource) {
        let Frame::Datagram {
            dst_qpn,
            src_qpn,
            qkey,
            grh,
            ..
        } = *frame
        else {
            return;
        };
        if !self.port.is_up() {
            // Arrived at a port that went down meanwhile: lost, as on the wire.
            tracing::trace!(device = %self.name, dst_qpn, "UD: datagram dropped: the port is down");
            return self.counters.ud_dropped();
        }
        if dst_qpn == crate::cm_msg::CM_QPN {
            return self.to_gsi(qkey, payload, src);
        }
        if dst_qpn == MULTICAST_QPN {
            return match grh.map(|h| Gid(h.dgid)).filter(|g| g.is_multicast()) {
                Some(mgid) => self.deliver_to_group(inbox, frame, payload, src, mgid, src_qpn),
                None => self.no_such_qp(dst_qpn),
            };
        }
        if inbox.last.as_ref().is_none_or(|(n, _)| *n != dst_qpn) || inbox.group.is_some() {
            inbox.finish();
            match self.qps.lock().get(&dst_qpn).and_then(Weak::upgrade) {
                Some(qp) if qp.qp_type == QpType::Ud => inbox.last = Some((dst_qpn, qp)),
                _ => return self.no_such_qp(dst_qpn),
            }
        }
        match &inbox.last {
            Some((_, qp)) if !qp.destroyed.load(Ordering::Acquire) => {
                qp.receive_datagram(frame, payload, src)
            }
            _ => self.no_such_qp(dst_qpn),
        }
    }

    fn no_such_qp(&self, dst_qpn: u32) {
        tracing::debug!(device = %self.name, dst_qpn, "UD: datagram dropped: no UD QP of that number");
        self.counters.ud_dropped();
    }
}

/// A run of datagrams handed to their QPs one after another (the datagrams of one read
/// from a link, or of one drain of the device's own queue): the QP of consecutive
/// datagrams is looked up once, and its completions become visible once, when the run
/// moves to another QP or ends (dropped), as the progress engine delivers a
/// connection's after each batch of frames.
#[derive(Default)]
pub struct Inbox {
    last: Option<(u32, Arc<QpShared>)>,
    /// The multicast group of the run, and its QPs on this device.
    group: Option<(Gid, Vec<Arc<QpShared>>)>,
    /// The list of a group's QPs that ended, for the next group.
    spare: Option<Vec<Arc<QpShared>>>,
}

impl Inbox {
    fn finish(&mut self) {
        if let Some((_, qp)) = self.last.take() {
            qp.datagrams_done();
        }
        if let Some((_, mut members)) = self.group.take() {
            for qp in members.drain(..) {
                qp.datagrams_done();
            }
            self.spare = Some(members);
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.finish();
    }
}

impl SidePaths for Datagrams {
    fn read_now(&self) -> bool {
        // Taken out of the table's lock: delivering takes QP locks, which come before
        // the table's in the lock order.
        let polled: ArrayVec<Arc<Link>, POLLED_LINKS> = self.links.lock().polled.clone();
        let mut any = false;
        for link in &polled {
            any |= link.read_now(self);
        }
        any
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
