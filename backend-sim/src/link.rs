//! An established connection of a QP pair: its socket, the protocol core's view of it
//! ([`Connection`]: incoming and outgoing bytes), and the flags by which the device's threads
//! agree who services it. The data path ([`progress`](crate::progress)) gives it its
//! behaviour; this module only holds it, so that a QP can name its connection without
//! knowing the data path.
//!
//! Generic over the QP type `Q` so that the QP, which holds its connection, and the
//! connection, which names its QP, need not import each other: the one instance is
//! `Conn<QpShared>` ([`qp::Conn`](crate::qp::Conn)).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use backend_sim_proto::connection::Connection;

/// A connection's bytes: what only the thread holding its I/O lock touches.
pub struct ConnIo {
    /// Its bytes, as the protocol core keeps them.
    pub wire: Connection,
    /// The epoll interest last asked for (a copy of `EpReg::interest`, to skip its lock
    /// when nothing changes).
    pub interest: u32,
    /// The shared-memory rings that carry its frames on the same host (the socket is
    /// then their doorbell and liveness signal only); `None`: the socket carries them.
    pub rings: Option<crate::shm_ring::Rings>,
}

/// A connection's place in the device's epoll set. A socket in an epoll set costs every
/// packet delivered to it a wake-up callback (two IRQ-safe locks in the sender's
/// softirq), so a connection is only registered while the progress thread may block on
/// the set; while threads spin over a few connections and read them directly, it is not.
pub struct EpReg {
    /// Whether the socket is in the epoll set now.
    pub registered: bool,
    /// The events wanted (`EPOLLIN`, and `EPOLLOUT` while bytes wait to be written).
    pub interest: u32,
}

/// The established connection of a QP pair (over TCP, or a unix socket to a device on
/// the same host).
pub struct Conn<Q> {
    /// Its key in the device's table and epoll set.
    pub token: u64,
    /// The QP it serves.
    pub qp: Arc<Q>,
    /// The QP's epoch when it was set up (a RESET or destroy makes it stale).
    pub epoch: u64,
    /// The socket.
    pub sock: crate::stream::DataSock,
    /// Its bytes (the I/O lock).
    pub io: Mutex<ConnIo>,
    /// A look at its incoming ring, when its frames go over rings (set with them).
    pub ring_peek: std::sync::OnceLock<crate::shm_ring::Peek>,
    /// Set once closed: no thread services it afterwards.
    pub closed: AtomicBool,
    /// Whether the connection owes an ACK left for later. Cleared when the ACK leaves
    /// with other frames first (the next request of a ping-pong), so that
    /// [`Progress::flush_acks`](crate::progress::Progress::flush_acks) skips it instead of servicing it for nothing. Every
    /// change is a swap that also moves the device's count of owed ACKs
    /// (`Progress::acks_owed`).
    pub ack_owed: AtomicBool,
    /// Whether the connection is in the device's delayed-ACK list. It stays there once
    /// added, until it is closed: a ping-pong owes an ACK after every message it
    /// receives, and adding and removing it each time cost a dozen locked instructions
    /// per message.
    pub ack_listed: AtomicBool,
    /// Set by every thread that wants the connection serviced; the thread holding its
    /// I/O lock goes around again if it finds it set after letting go (no work is lost
    /// to a failed `try_lock`).
    pub pending: AtomicBool,
    /// Its epoll registration (lock order: after the I/O lock).
    pub ep: Mutex<EpReg>,
    /// When bytes last left on this connection (the data path's clock, in nanoseconds, 0 =
    /// never): the requester's ACK timer counts from it.
    pub last_tx: AtomicU64,
    /// When bytes last arrived on it (the same clock): while a READ response's payload
    /// arrives, the ACK timer counts from it too.
    pub last_rx: AtomicU64,
    /// Whether the QP's application answers what it receives with posts of its own, so
    /// that an ACK may wait for its next post (set by its posts, cleared when a wait
    /// ran out; see `progress::answer`).
    pub answers: AtomicBool,
    /// Until when the ACK the connection owes waits for that answer (the data path's
    /// clock, in nanoseconds; 0: none waits).
    pub ack_held_until: AtomicU64,
}

impl<Q> Conn<Q> {
    /// Whether the connection has been closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether bytes from the peer wait on this side, not yet taken in: unread in the
    /// socket (`FIONREAD`, `man 7 tcp`, `man 7 unix`) or its rings, or in the hands of a
    /// thread that holds the I/O lock, which on a busy machine may have been preempted in
    /// the middle of its round for tens of milliseconds.
    pub fn peer_bytes_waiting(&self) -> bool {
        self.io.is_locked()
            || self.ring_peek.get().is_some_and(|p| p.has_bytes())
            || rustix::io::ioctl_fionread(&self.sock).is_ok_and(|n| n > 0)
    }
}
