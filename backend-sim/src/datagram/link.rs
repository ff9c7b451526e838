//! One established link between two devices (docs/wire.md "Links"): its socket, the
//! datagrams queued for it, and its task on the device's setup runtime, which reads the
//! datagrams the other device sends and writes what the senders' threads could not.
//!
//! Senders append whole datagrams to the link's queue under its lock (bounded: past
//! [`QUEUE_MAX`](super::QUEUE_MAX) the sending QP waits, see [`waiters`](super::waiters),
//! and whoever makes room hands it back) and then write it themselves
//! ([`Link::flush`]): the writer swaps the queue for its own buffer (so senders never
//! wait for a system call) and writes without blocking; what the socket does not take,
//! the task writes when the socket is writable again. One thread writes at a time; one
//! that finds another writing leaves its bytes to it (the `dirty` flag sends that one
//! around again). The connection manager's messages are the exception
//! ([`Link::send_now`]): a kernel's CM sends a MAD whatever the program does next, so
//! the call that sends one returns only once it is in the socket, never left to another
//! thread that the program's exit may stop before it writes.
//!
//! The task reads whatever arrives (so does an application thread's empty poll,
//! [`Link::read_now`], whichever comes first: one reader at a time keeps the datagrams
//! in order), hands each whole datagram to the QP it names
//! ([`Datagrams::deliver`]) with the source the link's setup proved, and ends the link
//! on the end of the stream, a socket error, anything that is not a well-formed
//! datagram (a protocol error, logged), or a device that reads nothing for
//! [`STALL_LIMIT`] while bytes wait for it (a stuck peer must not hold this device's
//! UD QPs for ever); the link then leaves the device's table, the QPs waiting for it try
//! again, and the next datagram to that device opens a new link.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::Interest;
use tokio::sync::Notify;

use super::waiters::Waiters;
use super::{queue_buf, Datagrams, Inbox, Queued, GSI_QUEUE_MAX, QUEUE_MAX};
use crate::qp::QpShared;
use crate::sys::{monotonic_ns, Sock};
use backend_sim_proto::io::{RawSlice, Transmit};
use backend_sim_proto::link_rx::LinkReader;
use backend_sim_proto::qp::DatagramSource;

/// How long a link may have bytes waiting that the other device does not read before it
/// is closed.
pub const STALL_LIMIT: Duration = Duration::from_secs(5);

/// What a writer holds: the bytes it took from the queue and how far it got.
struct Writer {
    buf: Vec<u8>,
    off: usize,
}

/// How a write went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flushed {
    /// Everything queued is written.
    Done,
    /// The socket takes no more now.
    Blocked,
    /// Another thread is writing.
    Busy,
    /// The socket failed: the link is closed.
    Broken,
}

/// An established link.
pub struct Link {
    /// The device at the other end, as the link's setup proved it: the source of every
    /// datagram that arrives on the link.
    pub peer: DatagramSource,
    /// Where that device listens (the link's key in the device's table).
    pub peer_addr: SocketAddr,
    sock: crate::stream::Stream,
    queue: Mutex<Vec<u8>>,
    writer: Mutex<Writer>,
    dirty: AtomicBool,
    /// QPs waiting for room in `queue`.
    waiters: Waiters,
    /// Bytes written so far (the task tells a stalled peer by it).
    written: AtomicU64,
    /// When datagrams last went either way (monotonic nanoseconds): the table closes the
    /// link idle longest to make room.
    active_ns: AtomicU64,
    /// Wakes the task: bytes wait for the socket.
    wake: Notify,
    closed: AtomicBool,
    /// The reader of what arrives: the task's, or that of an application thread that
    /// polls a CQ ([`Link::read_now`]); one at a time, so datagrams keep their order.
    rx: Mutex<LinkReader>,
}

impl Link {
    /// A link over `sock` (set up and checked) to the device `peer` listening at
    /// `peer_addr`.
    pub fn new(sock: crate::stream::Stream, peer_addr: SocketAddr, peer: DatagramSource) -> Arc<Link> {
        Arc::new(Link {
            peer,
            peer_addr,
            sock,
            queue: Mutex::new(queue_buf()),
            writer: Mutex::new(Writer {
                buf: queue_buf(),
                off: 0,
            }),
            dirty: AtomicBool::new(false),
            waiters: Waiters::default(),
            written: AtomicU64::new(0),
            active_ns: AtomicU64::new(monotonic_ns()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            rx: Mutex::new(LinkReader::new()),
        })
    }

    /// Reads and delivers what has arrived, without blocking, unless another thread
    /// reads the link now; whether datagrams arrived. The end of the stream or a
    /// malformed datagram closes the link (its task then leaves the table).
    pub fn read_now(&self, dg: &Datagrams) -> bool {
        if self.is_closed() {
            return false;
        }
        let Some(mut rx) = self.rx.try_lock() else {
            return false;
        };
        match rx.fill(&mut Sock(self.sock.as_raw_fd())) {
            Ok(0) => {
                tracing::debug!(device = %dg.name, peer = %self.peer_addr, "UD link: the other device closed it");
                self.close();
                false
            }
            Ok(_) => {
                if let Err(e) = self.deliver(dg, &mut rx) {
                    tracing::warn!(device = %dg.name, peer = %self.peer_addr, "UD link: {e}; closing it");
                    self.close();
                }
                true
            }
            // Nothing there (a socket error is the task's to report: its next read
            // meets it too).
            Err(_) => false,
        }
    }

    /// When datagrams last went either way (monotonic nanoseconds).
    pub fn last_active(&self) -> u64 {
        self.active_ns.load(Ordering::Relaxed)
    }

    /// How long the link has carried nothing.
    pub fn idle_for(&self) -> Duration {
        Duration::from_nanos(monotonic_ns().saturating_sub(self.last_active()))
    }

    /// Hands each whole datagram read to the QP it names; a malformed one is an error.
    /// Nothing read from a link that is closed is delivered: it was closed because the
    /// address it arrived at is gone (a new LID, a removed GID) or the port went down,
    /// and what the other device sent after that went to an address that reaches
    /// nothing, though the socket, until its task ends, still carries it.
    fn deliver(&self, dg: &Datagrams, rx: &mut LinkReader) -> Result<(), String> {
        if self.is_closed() {
            return Ok(());
        }
        self.active_ns.store(monotonic_ns(), Ordering::Relaxed);
        let mut inbox = Inbox::default();
        loop {
            match rx.next_datagram() {
                Ok(Some((frame, payload))) => dg.deliver(&mut inbox, &frame, payload, &self.peer),
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("protocol error: {e}")),
            }
        }
    }

    /// Whether the link has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Ends the link: its task leaves the table and closes the socket.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Appends a datagram with `f` (which writes its header and payload to the end of
    /// the queue), unless the link is closed, or its queue is full: then `qp` waits for
    /// room ([`Link::flush`] hands it back). Call [`Link::flush`] afterwards, without the
    /// QP's lock.
    pub fn append<R>(&self, qp: &Arc<QpShared>, f: impl FnOnce(&mut Vec<u8>) -> R) -> Queued<R> {
        if self.is_closed() {
            return Queued::Closed;
        }
        let mut q = self.queue.lock();
        if q.len() >= QUEUE_MAX {
            self.waiters.add(qp);
            return Queued::Full;
        }
        let r = f(&mut q);
        drop(q);
        self.dirty.store(true, Ordering::SeqCst);
        Queued::Appended(r)
    }

    /// Appends whole frames (`bytes`) that no QP waits for (the connection manager's),
    /// unless the link is closed or its queue holds [`GSI_QUEUE_MAX`]; whether it did.
    /// Call [`Link::flush`] afterwards.
    pub fn append_bytes(&self, bytes: &[u8]) -> bool {
        if self.is_closed() {
            return false;
        }
        let mut q = self.queue.lock();
        if q.len() >= GSI_QUEUE_MAX {
            return false;
        }
        q.extend_from_slice(bytes);
        drop(q);
        self.dirty.store(true, Ordering::SeqCst);
        true
    }

    /// Whether a datagram may be appended now: the link is closed, or its queue is full
    /// (then `qp` waits for room, as with [`Link::append`]), or there is room.
    pub fn room(&self, qp: &Arc<QpShared>) -> Queued<()> {
        if self.is_closed() {
            return Queued::Closed;
        }
        let q = self.queue.lock();
        if q.len() >= QUEUE_MAX {
            self.waiters.add(qp);
            return Queued::Full;
        }
        Queued::Appended(())
    }

    /// Appends the bytes of a whole datagram found room for ([`Link::room`]), unless the
    /// link closed meanwhile. (Other senders may have filled the queue since: it then
    /// holds at most a datagram more per sender, never more.)
    pub fn append_room_found(&self, bytes: &[u8]) {
        if self.is_closed() {
            return;
        }
        self.queue.lock().extend_from_slice(bytes);
        self.dirty.store(true, Ordering::SeqCst);
    }

    /// Writes what is queued, without blocking, and leaves what the socket does not take
    /// to the task; the QPs that waited for room, if there is some now (or the link is
    /// closed: they find another), go to `woken`.
    pub fn flush(&self, woken: &mut Vec<Weak<QpShared>>) {
        if self.write_out(false) == Flushed::Blocked {
            self.wake.notify_one();
        }
        self.wake_waiters(woken);
    }

    /// Moves the QPs waiting for room to `woken` if there is room (or the link is closed).
    fn wake_waiters(&self, woken: &mut Vec<Weak<QpShared>>) {
        let q = self.queue.lock();
        if q.len() < QUEUE_MAX || self.is_closed() {
            self.waiters.take_into(woken);
        }
    }

    /// Has the task look at the link (bytes were queued that nobody writes now).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Writes what is queued, and goes around again for bytes appended meanwhile (their
    /// senders found the writer taken and left them to this thread). With `wait`, waits
    /// for a thread that holds the writer; without, leaves the bytes to it.
    fn write_out(&self, wait: bool) -> Flushed {
        loop {
            let mut w = if wait {
                self.writer.lock()
            } else {
                match self.writer.try_lock() {
                    Some(w) => w,
                    None => return Flushed::Busy,
                }
            };
            self.dirty.store(false, Ordering::SeqCst);
            let r = self.write_locked(&mut w);
            drop(w);
            match r {
                Ok(true) => {}
                Ok(false) => return Flushed::Blocked,
                Err(e) => {
                    tracing::debug!(peer = %self.peer_addr, "UD link: write failed: {e}");
                    self.close();
                    return Flushed::Broken;
                }
            }
            if !self.dirty.load(Ordering::SeqCst) {
                return Flushed::Done;
            }
        }
    }

    /// Writes until the queue is empty (`true`) or the socket takes no more (`false`).
    fn write_locked(&self, w: &mut Writer) -> io::Result<bool> {
        loop {
            if w.off == w.buf.len() {
                w.buf.clear();
                w.off = 0;
                let mut q = self.queue.lock();
                if q.is_empty() {
                    return Ok(true);
                }
                std::mem::swap(&mut *q, &mut w.buf);
            }
            let rest = &w.buf[w.off..];
            let run = [RawSlice {
                base: rest.as_ptr(),
                len: rest.len(),
            }];
            // SAFETY: `rest` is the writer's own buffer, alive and unchanged for the call.
            // (A write straight to the socket, from any thread: tokio's record of its
            // readiness is cleared by the task's own failed write, see `serve`.)
            match unsafe { Sock(self.sock.as_raw_fd()).transmit(&run) } {
                Ok(n) => {
                    w.off += n;
                    self.written.fetch_add(n as u64, Ordering::Relaxed);
                    self.active_ns.store(monotonic_ns(), Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether bytes wait for the task to write them. Not while another thread writes:
    /// that one wakes the task if the socket blocks it, and goes around again for bytes
    /// appended meanwhile.
    fn backlog(&self) -> bool {
        self.backlog_with(|| {})
    }

    /// [`Link::backlog`], running `meanwhile` while it holds the writer. The check holds
    /// the writer too, so a thread that appended and found it taken left its bytes to
    /// the task: the `dirty` flag that thread set before trying is read once the writer
    /// is let go, and counts as bytes waiting (else they wait for the next wake).
    fn backlog_with(&self, meanwhile: impl FnOnce()) -> bool {
        let Some(w) = self.writer.try_lock() else {
            return false;
        };
        let waiting = w.off < w.buf.len() || !self.queue.lock().is_empty();
        meanwhile();
        drop(w);
        waiting || self.dirty.load(Ordering::SeqCst)
    }

    /// Appends whole CM frames (`bytes`, as [`Link::append_bytes`]) and writes what is
    /// queued before returning, waiting for a thread that holds the writer (none waits
    /// on anything while it holds it); only what the socket does not take is left to the
    /// task. Whether the bytes were appended. A thread that holds the writer may be
    /// descheduled before it goes around again for bytes appended meanwhile, and the
    /// program may exit first (`rdma_reject` and then `_exit`): bytes left to it would be
    /// lost, where a kernel's CM sends them.
    pub fn send_now(&self, bytes: &[u8], woken: &mut Vec<Weak<QpShared>>) -> bool {
        if !self.append_bytes(bytes) {
            return false;
        }
        if self.write_out(true) == Flushed::Blocked {
            self.wake.notify_one();
        }
        self.wake_waiters(woken);
        true
    }
}

/// The link's task: reads and delivers what arrives, writes what waits, until the link
/// ends; then the link leaves the device's table, and the QPs waiting for it try again.
pub async fn run(dg: Arc<Datagrams>, link: Arc<Link>) {
    dg.read_by_pollers(&link);
    let why = serve(&dg, &link).await;
    tracing::debug!(device = %dg.name, peer = %link.peer_addr, "UD link closed: {why}");
    link.close();
    dg.forget(&link);
    let mut woken = Vec::new();
    link.wake_waiters(&mut woken);
    dg.transmit_woken(woken);
}

async fn serve(dg: &Arc<Datagrams>, link: &Link) -> String {
    let mut woken = Vec::new();
    // Bytes written as of when the stall clock last started.
    let mut progress = (link.written.load(Ordering::Relaxed), tokio::time::Instant::now());
    loop {
        if link.is_closed() {
            return "closed".into();
        }
        let want_write = link.backlog();
        let written = link.written.load(Ordering::Relaxed);
        if !want_write || written != progress.0 {
            progress = (written, tokio::time::Instant::now());
        }
        tokio::select! {
            r = link.sock.readable() => {
                if let Err(e) = r {
                    return format!("socket error: {e}");
                }
                let fd = link.sock.as_raw_fd();
                // (No await while the reader is held: an application thread that finds
                // it taken leaves the link to this task.)
                let mut rx = link.rx.lock();
                // `try_io` clears the socket's readiness when the read would block (also
                // when a polling thread read the bytes that made it ready).
                match link.sock.try_io(Interest::READABLE, || rx.fill(&mut Sock(fd))) {
                    Ok(0) => return "the other device closed it".into(),
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                        continue
                    }
                    Err(e) => return format!("read failed: {e}"),
                }
                if let Err(e) = link.deliver(dg, &mut rx) {
                    tracing::warn!(device = %dg.name, peer = %link.peer_addr, "UD link: {e}; closing it");
                    return e;
                }
            }
            w = link.sock.writable(), if want_write => {
                if let Err(e) = w {
                    return format!("socket error: {e}");
                }
                let flushed = link.sock.try_io(Interest::WRITABLE, || match link.write_out(false) {
                    Flushed::Blocked => Err(io::ErrorKind::WouldBlock.into()),
                    other => Ok(other),
                });
                link.wake_waiters(&mut woken);
                dg.transmit_woken(std::mem::take(&mut woken));
                if let Ok(Flushed::Broken) = flushed {
                    return "write failed".into();
                }
            }
            _ = tokio::time::sleep_until(progress.1 + STALL_LIMIT), if want_write => {
                if link.written.load(Ordering::Relaxed) == progress.0 {
                    tracing::warn!(
                        device = %dg.name,
                        peer = %link.peer_addr,
                        "UD link: the other device has read nothing for {STALL_LIMIT:?}; closing the link"
                    );
                    return "the other device stopped reading".into();
                }
            }
            _ = link.wake.notified() => {}
        }
    }
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
