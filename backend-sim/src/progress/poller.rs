//! The device's connections and its epoll set (`man 7 epoll`, level-triggered): which
//! sockets are in the set, with which interest, and the table by token.
//!
//! A socket in an epoll set makes every packet delivered to it run epoll's wake-up
//! callback in the sender's softirq (two IRQ-safe locks), so a connection is in the set
//! only while the progress thread may block on it; while threads spin over a few
//! connections and read them directly, it is not (see `Progress::settle`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
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
        })
    }

    /// A token for a new connection.
    pub fn next_token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    pub fn insert(&self, conn: Arc<Conn>) {
        self.conns.lock().insert(conn.token, conn);
    }

    pub fn remove(&self, token: u64) {
        self.conns.lock().remove(&token);
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

    /// Every connection if there are at most [`DIRECT_MAX`], into `out`; false if more.
    pub fn few_into(&self, out: &mut [Option<Arc<Conn>>; DIRECT_MAX]) -> bool {
        let conns = self.conns.lock();
        if conns.len() > DIRECT_MAX {
            return false;
        }
        for (slot, c) in out.iter_mut().zip(conns.values()) {
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
