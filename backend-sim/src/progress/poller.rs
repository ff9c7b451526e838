//! The device's connections and its epoll set (`man 7 epoll`, level-triggered): which
//! sockets are in the set, with which interest, and the table by token.
//!
//! A socket in an epoll set makes every packet delivered to it run epoll's wake-up
//! callback in the sender's softirq (two IRQ-safe locks), so a connection is in the set
//! only while the progress thread may block on it; while threads spin over a few
//! connections and read them directly, it is not (see `Progress::settle`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use rustix::event::epoll::EventFlags;

use crate::epoll;
use crate::qp::Conn;

/// Up to this many connections on a device, a spinning thread reads them directly
/// instead of asking epoll which are ready.
pub(super) const DIRECT_MAX: usize = 4;

pub(super) struct Poller {
    pub epfd: OwnedFd,
    conns: Mutex<FxHashMap<u64, Arc<Conn>>>,
    /// Bumped whenever a connection comes or goes (see `Progress::settle`).
    pub generation: AtomicU64,
    next_token: AtomicU64,
    /// How many of the connections go over shared-memory rings, whose bytes no epoll
    /// wait reports unless their reader armed them (see `ring_wire`).
    rings: AtomicUsize,
}

impl Poller {
    pub fn new() -> verbs_api::Result<Poller> {
        let epfd = epoll::create().map_err(|source| verbs_api::Error::Os {
            call: "epoll_create1",
            source,
        })?;
        Ok(Poller {
            epfd,
            conns: Mutex::new(FxHashMap::default()),
            generation: AtomicU64::new(0),
            next_token: AtomicU64::new(1),
            rings: AtomicUsize::new(0),
        })
    }

    /// A token for a new connection.
    pub fn next_token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    pub fn insert(&self, conn: Arc<Conn>) {
        let rings = conn.ring_peek.get().is_some();
        if self.conns.lock().insert(conn.token, conn).is_none() && rings {
            self.rings.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn remove(&self, token: u64) {
        let gone = self.conns.lock().remove(&token);
        if gone.is_some_and(|c| c.ring_peek.get().is_some()) {
            self.rings.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Arms the rings of every connection over rings for the calling thread, about to
    /// block on the epoll set, noting in `armed` what to take back after the wait
    /// (cleared then): whether one has news already (then it must not block).
    pub fn arm_rings(&self, armed: &mut Vec<crate::shm_ring::Armed>) -> bool {
        if self.rings.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let conns = self.conns.lock();
        super::ring_wire::arm_before_sleep(conns.values(), armed)
    }

    /// Every connection over rings that has news (see `ring_wire::has_news`), into
    /// `out`. A look at memory, no system call: epoll reports such a connection's bytes
    /// only while its reader sleeps. All of them: a look capped at a few would leave
    /// the rest, whenever those few keep having news (busy, or held by other threads),
    /// unserviced for as long.
    pub fn rings_with_news(&self, out: &mut Vec<Arc<Conn>>) {
        if self.rings.load(Ordering::Relaxed) == 0 {
            return;
        }
        let conns = self.conns.lock();
        for c in conns.values() {
            if super::ring_wire::has_news(c) {
                out.push(c.clone());
            }
        }
    }

    pub fn get(&self, token: u64) -> Option<Arc<Conn>> {
        self.conns.lock().get(&token).cloned()
    }

    pub fn len(&self) -> usize {
        self.conns.lock().len()
    }

    /// Every connection, into `out`.
    pub fn all_into(&self, out: &mut Vec<Arc<Conn>>) {
        out.extend(self.conns.lock().values().cloned());
    }

    /// Every connection if there are at most [`DIRECT_MAX`], into `out`, but those
    /// `quiet` says a look would find nothing at (asked under the table's lock: it must
    /// neither block nor touch the table); false if more. A quiet connection costs the
    /// caller no reference taken and given back.
    pub fn few_into(&self, out: &mut [Option<Arc<Conn>>; DIRECT_MAX], quiet: impl Fn(&Conn) -> bool) -> bool {
        let conns = self.conns.lock();
        if conns.len() > DIRECT_MAX {
            return false;
        }
        // (Only a connection over rings can be quiet: sockets are not asked.)
        let rings = self.rings.load(Ordering::Relaxed) > 0;
        for (slot, c) in out.iter_mut().zip(conns.values().filter(|c| !rings || !quiet(c))) {
            *slot = Some(c.clone());
        }
        true
    }

    /// Records the events a connection wants, and tells epoll if it is registered.
    pub fn set_interest(&self, conn: &Conn, want: u32) {
        let mut ep = conn.ep.lock();
        ep.interest = want;
        if ep.registered {
            let _ = epoll::modify(&self.epfd, conn.sock.as_fd(), flags(want), conn.token);
        }
    }

    /// Puts a connection in the epoll set (if it is open and not there yet).
    pub fn arm(&self, conn: &Conn) -> io::Result<()> {
        let mut ep = conn.ep.lock();
        if !ep.registered && !conn.is_closed() {
            epoll::add_to(&self.epfd, conn.sock.as_fd(), flags(ep.interest), conn.token)?;
            ep.registered = true;
        }
        Ok(())
    }

    /// Takes a connection out of the epoll set (threads read it directly meanwhile).
    pub fn disarm(&self, conn: &Conn) {
        let mut ep = conn.ep.lock();
        if ep.registered {
            let _ = epoll::delete(&self.epfd, conn.sock.as_fd());
            ep.registered = false;
        }
    }
}

/// The epoll flags of an interest kept as `EPOLLIN` / `EPOLLOUT` bits.
fn flags(interest: u32) -> EventFlags {
    EventFlags::from_bits_truncate(interest)
}
