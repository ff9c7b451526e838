//! A connection's byte source and sink: its socket, or, for a same-host connection set
//! up with them, the shared-memory rings of [`shm_ring`](crate::shm_ring), whose
//! doorbell and liveness signal the socket then is (a peer that closes or dies shows as
//! the end of the socket's stream, as on the socket path).

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use backend_sim_proto::io::{RawSlice, Transmit};

use crate::link::ConnIo;
use crate::qp::Conn;
use crate::shm_ring::{Armed, Rings};
use crate::sys;

/// Gives `conn` (registered, not yet active: no thread services it yet) its rings.
pub fn install(conn: &Conn, rings: Rings) {
    let _ = conn.ring_peek.set(rings.peek());
    conn.io.lock().rings = Some(rings);
}

/// Reads what the peer sent into `io`'s buffer, as a socket read would: `Ok(0)` at the
/// end of the stream, `WouldBlock` when nothing is there.
pub(super) fn fill(io: &mut ConnIo, conn: &Conn) -> io::Result<usize> {
    let ConnIo { wire, rings, .. } = io;
    let Some(rings) = rings.as_mut() else {
        return wire.fill(&mut sys::Sock(conn.sock.as_raw_fd()));
    };
    let bell = conn.sock.as_fd();
    match conn.ring_peek.get() {
        Some(peek) => peek.read_or_end(bell, || wire.fill(&mut rings.io(bell))),
        None => wire.fill(&mut rings.io(bell)),
    }
}

/// Says that a wait reported `conn`'s socket readable: for a connection over rings, its
/// next read that finds the ring empty takes the doorbell's bytes (see [`fill`]).
pub(super) fn note_readable(conn: &Conn) {
    if let Some(p) = conn.ring_peek.get() {
        p.note_rung();
    }
}

/// Arms the rings of `conns` for a thread about to block on their sockets (see
/// [`shm_ring::Peek::arm`](crate::shm_ring::Peek::arm)), into `armed` (cleared first),
/// which the caller clears once the wait ends: whether one has news already, in which
/// case the thread must not block.
pub(super) fn arm_before_sleep<'a>(
    conns: impl Iterator<Item = &'a Arc<Conn>> + Clone,
    armed: &mut Vec<Armed>,
) -> bool {
    armed.clear();
    for c in conns.clone() {
        if let Some(p) = c.ring_peek.get() {
            armed.push(p.arm());
        }
    }
    if armed.is_empty() {
        return false;
    }
    // Paired with the fence of a writer between publishing and reading the counts.
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    conns.into_iter().any(|c| has_news(c))
}

/// Whether `conn` goes over rings that have nothing new for a thread that services it
/// (false for a connection over its socket, whose news only a read finds).
#[inline]
pub(super) fn nothing_new(conn: &Conn) -> bool {
    conn.ring_peek.get().is_some_and(|p| !p.has_news())
}

/// Whether `conn` goes over rings with news for a thread that services it.
pub(super) fn has_news(conn: &Conn) -> bool {
    conn.ring_peek.get().is_some_and(|p| p.has_news())
}

/// Writes what `io` has queued, as a socket write would (`WouldBlock`: no room).
pub(super) fn write(io: &mut ConnIo, conn: &Conn) -> io::Result<usize> {
    let ConnIo { wire, rings, .. } = io;
    match rings.as_mut() {
        None => wire.write_to(&mut sys::Sock(conn.sock.as_raw_fd())),
        Some(r) => wire.write_to(&mut r.io(conn.sock.as_fd())),
    }
}

/// Whether a connection with bytes left to write should wait for `EPOLLOUT`: not one
/// over rings, whose writer waits for the peer's bell (`EPOLLIN`) when the ring is full;
/// its unix socket always reports writable, and the waiting thread would spin.
pub(super) fn wants_out(io: &ConnIo) -> bool {
    io.rings.is_none()
}

/// Writes `bytes` past the protocol core's queue (fault injection's request cut off in
/// the middle), without blocking: how many went (0: no room now).
pub(super) fn send_bytes(io: &mut ConnIo, conn: &Conn, bytes: &[u8]) -> usize {
    match io.rings.as_mut() {
        None => {
            let flags = rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT;
            rustix::net::send(&conn.sock, bytes, flags).unwrap_or(0)
        }
        Some(r) => {
            let run = [RawSlice {
                base: bytes.as_ptr(),
                len: bytes.len(),
            }];
            // SAFETY: the run is a live slice, readable for its length.
            unsafe { r.io(conn.sock.as_fd()).transmit(&run) }.unwrap_or(0)
        }
    }
}
