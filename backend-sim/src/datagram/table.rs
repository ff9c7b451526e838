//! A device's table of links (docs/wire.md "Links"): the state of the link to each
//! device it exchanges datagrams with, and the bound on the links it holds, so that
//! strangers who may open links as often as they like cannot take its descriptors.
//!
//! - **One link per device and direction.** A link accepted from a device replaces the
//!   one accepted from it before (closed at once): the device lost its link and opened
//!   another, or a stranger opens many under its one identity. A link this device opened
//!   stays beside an accepted one (both devices opened a link at the same moment), so a
//!   device holds at most two links to another.
//! - **At most `bound` links**, established or being set up (the bound a device gets from
//!   [`link_bound`]). A newcomer beyond it takes the place of the link idle longest,
//!   if that one has carried nothing for [`MIN_IDLE`] (it is closed; its device opens
//!   a new one when it next has a datagram), and is refused if not: links a stranger holds
//!   and does not use give way to a device that needs one, and links in use are not shed
//!   for one another.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use rustix::process::{getrlimit, Resource};

use super::link::Link;
use super::POLLED_LINKS;
use crate::qp::QpShared;

/// Most links a device holds, whatever its process's open-file limit.
pub const MAX_LINKS: usize = 1024;
/// Fewest links a device holds, however low its process's open-file limit.
const MIN_LINKS: usize = 16;
/// How long a link must have carried nothing before a newcomer may take its place.
pub const MIN_IDLE: Duration = Duration::from_secs(1);

/// The links a device holds: a quarter of the process's open-file limit (each is a
/// descriptor, and the QPs' connections need theirs), within `MIN_LINKS..=MAX_LINKS`.
pub fn link_bound() -> usize {
    getrlimit(Resource::Nofile)
        .current
        .map_or(MAX_LINKS, |soft| usize::try_from(soft / 4).unwrap_or(MAX_LINKS))
        .clamp(MIN_LINKS, MAX_LINKS)
}

/// The state of the link to one device.
pub enum Slot {
    /// Being set up; these QPs have datagrams waiting for it.
    Pending(Vec<Weak<QpShared>>),
    /// Established.
    Up(Arc<Link>),
    /// The last attempt failed: datagrams to it are lost until then.
    Failed(Instant),
}

/// A device's links, by the address of the device at the other end.
#[derive(Default)]
pub struct LinkTable {
    /// The link datagrams to each device take.
    pub by_peer: HashMap<SocketAddr, Slot>,
    /// The links application threads' polls read: the first [`POLLED_LINKS`] established.
    pub polled: ArrayVec<Arc<Link>, POLLED_LINKS>,
    /// Every established link (also one not in `by_peer`: the second link to a device,
    /// when both opened one at the same moment).
    established: Vec<Arc<Link>>,
    /// The link accepted from each device.
    accepted: HashMap<SocketAddr, Arc<Link>>,
    /// Places taken by links being set up (opened, or accepted and checked).
    reserved: usize,
}

impl LinkTable {
    /// Whether a link from (`Some`) or to (`None`) a device could take a place now,
    /// under `bound`: a cheap look before a stranger's hello costs a check.
    pub fn has_room(&self, from: Option<SocketAddr>, bound: usize) -> bool {
        self.established.len() + self.reserved < bound
            || from.is_some_and(|p| self.accepted.contains_key(&p))
            || self.idlest().is_some()
    }

    /// Takes a place for a link being set up from (`Some`) or to (`None`) a device, under
    /// `bound`: a free one, else that of the device's own accepted link, else that of the
    /// link idle longest if it has been idle for [`MIN_IDLE`] (closed now); `false` if
    /// none. [`LinkTable::release`] gives it back.
    pub fn reserve(&mut self, from: Option<SocketAddr>, bound: usize) -> bool {
        if self.established.len() + self.reserved >= bound {
            let own = from.and_then(|p| self.accepted.get(&p).cloned());
            let Some(victim) = own.or_else(|| self.idlest()) else {
                return false;
            };
            tracing::debug!(peer = %victim.peer_addr, "UD: closing the link idle longest to make room");
            self.remove(&victim);
            victim.close();
        }
        self.reserved += 1;
        true
    }

    /// Gives back a place [`LinkTable::reserve`] took.
    pub fn release(&mut self) {
        self.reserved = self.reserved.saturating_sub(1);
    }

    /// An established link (on a place reserved for it, which it takes over): `accepted`
    /// from its device, it closes and replaces the one accepted from it before.
    pub fn adopt(&mut self, link: &Arc<Link>, accepted: bool) {
        self.established.push(link.clone());
        if accepted {
            if let Some(old) = self.accepted.insert(link.peer_addr, link.clone()) {
                tracing::debug!(peer = %link.peer_addr, "UD: a new link from the device replaces its last one");
                self.remove(&old);
                old.close();
            }
        }
    }

    /// `link` leaves the table (it ended, or was closed to make room). If datagrams to its
    /// device took it and another link to that device is up, they take that one now.
    pub fn remove(&mut self, link: &Arc<Link>) {
        self.established.retain(|l| !Arc::ptr_eq(l, link));
        self.polled.retain(|l| !Arc::ptr_eq(l, link));
        let peer = link.peer_addr;
        if self.accepted.get(&peer).is_some_and(|l| Arc::ptr_eq(l, link)) {
            self.accepted.remove(&peer);
        }
        if let Some(Slot::Up(l)) = self.by_peer.get(&peer) {
            if Arc::ptr_eq(l, link) {
                match self
                    .established
                    .iter()
                    .find(|l| l.peer_addr == peer && !l.is_closed())
                {
                    Some(other) => {
                        self.by_peer.insert(peer, Slot::Up(other.clone()));
                    }
                    None => {
                        self.by_peer.remove(&peer);
                    }
                }
            }
        }
    }

    /// Every established link.
    pub fn all(&self) -> Vec<Arc<Link>> {
        self.established.clone()
    }

    /// The link idle longest, if it has been idle for [`MIN_IDLE`].
    fn idlest(&self) -> Option<Arc<Link>> {
        self.established
            .iter()
            .filter(|l| !l.is_closed())
            .min_by_key(|l| l.last_active())
            .filter(|l| l.idle_for() >= MIN_IDLE)
            .cloned()
    }
}
