//! The device's links to other devices, as its UD side finds, opens and places them
//! (IBA 9.8.4: a UD send names its destination by address vector; the sim reaches the
//! destination device over a link per device pair, see the parent module): which link a
//! datagram takes, a link's setup settled into the table (or refused when the port went
//! down meanwhile), the places a stranger's link may take, and the links application
//! threads read.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Instant;

use verbs_api::Gid;

use super::link::Link;
use super::table::Slot;
use super::{setup, Datagrams, Target, FAILED_HOLD};
use crate::progress::SidePaths;
use crate::qp::QpShared;

impl Datagrams {
    /// Where a datagram to the device at `peer` goes now; sets a link up (and has `qp`
    /// wait for it) if there is none.
    pub(super) fn link_to(self: &Arc<Self>, peer: SocketAddr, qp: &Arc<QpShared>) -> Target {
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
    pub(super) fn settle(self: &Arc<Self>, peer: SocketAddr, link: Option<&Arc<Link>>, epoch: u64) -> bool {
        self.take_place(peer, link, false, epoch)
    }

    /// The link from the device at `peer` is accepted (set up and checked, on a place
    /// [`Datagrams::reserve_for`] took): it replaces the last one from that device.
    /// Whether it took its place (see [`Datagrams::take_place`]).
    pub(super) fn adopt(self: &Arc<Self>, peer: SocketAddr, link: &Arc<Link>, epoch: u64) -> bool {
        self.take_place(peer, Some(link), true, epoch)
    }

    /// A link set up (or not) takes the place reserved for it. Not if the port went down
    /// since `epoch` (read when the setup checked it), even if it is back: the port's
    /// going down closed the links in the table, under its lock, and this one was not
    /// among them, nor may what the other device sent on it while the port was down
    /// arrive. Checked here, in the table's lock, so that a port going down either finds
    /// the link to close or is seen; the caller drops a link that did not take its
    /// place, and the next datagram to that device opens another.
    pub(super) fn take_place(
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
    pub(super) fn has_room_for(&self, peer: SocketAddr) -> bool {
        self.links.lock().has_room(Some(peer), self.bound)
    }

    /// Takes a place for a link from the device at `peer`, checked and about to be
    /// accepted; `false`: none (see [`table`]). [`Datagrams::adopt`] or
    /// [`Datagrams::unreserve`] gives it back.
    pub(super) fn reserve_for(&self, peer: SocketAddr) -> bool {
        self.links.lock().reserve(Some(peer), self.bound)
    }

    /// Gives back a place taken for a link that did not come up.
    pub(super) fn unreserve(&self) {
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
    pub(super) fn forget(&self, link: &Arc<Link>) {
        self.links.lock().remove(link);
        self.gsi_link_closed(link.peer_addr);
    }
}
