//! Shared-memory rings for a same-host connection: a sealed memfd (`man 2 memfd_create`,
//! `man 2 fcntl` "File Sealing") holding two single-producer/single-consumer byte rings,
//! one per direction, that carry the same frames as the connection's unix socket
//! ([`same_host`](crate::same_host)) without a system call per message while the reader
//! spins. The rings are the protocol core's byte source and sink
//! ([`backend_sim_proto::io::Recv`], [`Transmit`](backend_sim_proto::io::Transmit)), so
//! every frame is parsed and checked exactly as one read from a socket.
//!
//! The connector creates the segment ([`create`]) and passes it over the unix socket
//! with `SCM_RIGHTS` (`man 7 unix`; [`send_segment`], [`recv_segment`]); the acceptor
//! maps it only if it is a memfd of exactly one of the sizes this build makes
//! ([`CAPACITY`], [`SMALL_CAPACITY`]) whose size can no longer change and whose seals are
//! final (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`): a
//! peer that could shrink it would make a read of the mapping fault (`SIGBUS`).
//!
//! The doorbell is the unix socket itself, not an eventfd: a writer sends it one byte
//! only when the reader has said it is going to sleep, and a writer blocked on a full
//! ring asks the reader to ring back when it frees space. The socket is already what the
//! data path polls, and the liveness signal (a peer that dies closes it: EOF, `EPOLLHUP`);
//! and `MSG_DONTWAIT` makes each send and receive non-blocking by itself, where an
//! eventfd's `O_NONBLOCK` belongs to the open file description both processes share, so
//! a hostile peer could clear it and make this side's read or write of the doorbell block.
//!
//! Sleeping without losing a wake-up (both sides, the classic protocol): a thread about
//! to block on the socket counts itself among the ring's sleepers ([`Peek::arm`]), then
//! (after a `SeqCst` fence) looks at the ring once more and only blocks if it still has
//! nothing to do; the other side publishes its index, then (after a fence) reads the
//! count and, if it is not zero, rings. Of two such sequences at least one sees the
//! other's store. The sleeper takes itself off the count when its wait ends (dropping
//! what [`Peek::arm`] returned): a bell is level-triggered, as a socket's readiness is,
//! so a thread whose ring was taken by another thread of its side (which drained the
//! bell and read the bytes) stays counted, and the peer's next bytes ring it again. A count, not a
//! flag that the ringer clears: with a flag, that ring was the sleeper's only one, and it
//! slept through every later frame while the thread that took the bell went to a sleep
//! that does not watch the connection (the progress thread standing aside for a thread
//! waiting in `ibv_get_cq_event`). Threads that spin over the ring (a ping-pong's, a
//! stream's) never count themselves: the peer makes no system call for them.
//!
//! A writer that finds no room leaves its bytes queued and marks the ring ("room
//! wanted", a one-shot the reader clears when it rings): the reader rings once half the
//! ring is free, not for every frame it reads, and whoever of the writer's threads takes
//! that bell services the connection, writing. The mark is set by the write itself, not
//! by a thread about to sleep: the write that fills the ring may be a thread's that
//! posted and went on, while the thread asleep on the socket armed before it, and would
//! sleep through the room (a socket's sleeper is told by `EPOLLOUT`, which the posting
//! thread's write asked for). Spinning threads see the room in memory
//! ([`Peek::has_news`]). A fresh segment starts with a one-shot "ring me" mark on each
//! ring: until a thread has counted itself, a side whose threads blocked before the
//! connection was theirs would otherwise sleep through its first frames.
//!
//! A peer may write anything into the segment. Each side keeps its own index privately
//! and only publishes it; the peer's index is read once per call and accepted only if it
//! keeps `0 <= tail - head <= capacity` (indices count modulo 2^64); every offset is taken modulo the capacity (a
//! power of two) and every length bounded by what is there, so garbage can at worst
//! produce bytes that the protocol core rejects as it rejects garbage on a socket. An
//! index out of bounds breaks the rings for good (`InvalidData`): the connection closes.
//!
//! Layout: one page of control words, then ring 0 (connector to acceptor), then ring 1.
//! Each ring's control words (`tail`, written by its producer; `head`, by its consumer;
//! the consumer's count of sleepers and the fresh segment's mark; the producer's "room
//! wanted" mark) sit in cache lines of their own, so the two sides do not write the same
//! line (but for the marks, each cleared once per time set).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use backend_sim_proto::io::{RawSlice, Recv, Transmit};
use rustix::net::{RecvFlags, SendFlags};

use crate::shm_segment::{capacity_of, segment_len, validate, Mapping, HEADER};
pub use crate::shm_segment::{
    create, enabled, recv_segment, send_no_segment, send_segment, CAPACITY, LARGE_BUDGET, SMALL_CAPACITY,
};

/// Apart far enough that neither a cache line nor the adjacent-line prefetcher's pair is
/// shared between words two sides write.
const LINE: usize = 128;
/// A ring's control words: `tail`, `head`, the consumer's count of threads asleep on
/// the doorbell, the fresh segment's one-shot mark, the producer's one-shot "room
/// wanted" mark.
const TAIL: usize = 0;
const HEAD: usize = LINE;
const SLEEPERS: usize = 2 * LINE;
const FRESH: usize = 2 * LINE + 8;
const ROOM: usize = 3 * LINE;
/// Bytes of one ring's control words.
const CONTROL: usize = 4 * LINE;

/// Bytes a copy into or out of a ring moves before it publishes its index: a large
/// payload is then taken chunk by chunk while the rest of it is still being written,
/// and its room refilled while the rest is being read, instead of the two sides taking
/// turns over whole payloads.
const CHUNK: usize = 64 << 10;

/// Which end of the connection a side is: the connector produces into ring 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The side that connected and created the segment.
    Connector,
    /// The side that accepted and received it.
    Acceptor,
}

/// The error of a peer's index out of bounds.
fn corrupt(what: &str, value: u64, own: u64) -> io::Error {
    tracing::warn!("the same-host peer wrote a bad {what} into the shared ring ({value} against {own}): closing the connection");
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the peer's {what} in the shared ring ({value}) is out of bounds of this side's {own}"),
    )
}

/// One side's view of a segment: it produces into one ring and consumes from the other.
pub struct Rings {
    map: std::sync::Arc<Mapping>,
    cap: usize,
    /// Byte offset of the control words of the ring this side writes, and of its data.
    tx_ctl: usize,
    tx_data: usize,
    /// The same for the ring this side reads.
    rx_ctl: usize,
    rx_data: usize,
    /// This side's own indices (the shared copies are only published).
    tx_tail: u64,
    rx_head: u64,
    /// Set once the peer's index was out of bounds.
    broken: bool,
    /// Whether the ring this side writes may still carry the fresh segment's mark.
    fresh: bool,
    /// What this side's threads share about the rings (see [`Peek`]).
    state: Arc<State>,
    /// Stores of this side's shared indices (tests).
    #[cfg(test)]
    published: u64,
}

/// What a side's threads share about its rings beside the mapping.
#[derive(Default)]
struct State {
    /// Set when a wait on the doorbell socket reported it readable (a ring, or the end
    /// of the stream); the consumer takes the socket's bytes the next time it finds the
    /// ring empty ([`Peek::read_or_end`]). Spinning readers look at the ring alone.
    rung: AtomicBool,
    /// The last write left bytes for want of room.
    tx_blocked: AtomicBool,
}

impl Rings {
    /// Maps segment `seg` (one from [`create`], or received from the peer: it is checked
    /// first, as the module docs say) as `side`.
    pub fn map(seg: BorrowedFd<'_>, side: Side) -> io::Result<Rings> {
        Rings::map_with(seg, side, capacity_of(seg)?)
    }

    fn map_with(seg: BorrowedFd<'_>, side: Side, cap: usize) -> io::Result<Rings> {
        debug_assert!(cap.is_power_of_two());
        validate(seg, cap)?;
        let map = std::sync::Arc::new(Mapping::new(seg, segment_len(cap))?);
        let (tx, rx) = match side {
            Side::Connector => (0, 1),
            Side::Acceptor => (1, 0),
        };
        if side == Side::Connector {
            // A fresh segment (the connector made it and has not sent it yet): the first
            // bytes each ring carries ring its doorbell. Until a thread has counted
            // itself among a ring's sleepers, nothing says one watches it: a side whose
            // threads blocked before the connection was theirs (its first service
            // absorbed by a thread only transmitting) would otherwise sleep on the
            // socket through every frame the peer wrote, and the peer's requests run
            // out of retries.
            for ring in [0, 1] {
                map.word(ring * CONTROL + FRESH).store(1, Ordering::Relaxed);
            }
        }
        Ok(Rings {
            map,
            cap,
            tx_ctl: tx * CONTROL,
            tx_data: HEADER + tx * cap,
            rx_ctl: rx * CONTROL,
            rx_data: HEADER + rx * cap,
            tx_tail: 0,
            rx_head: 0,
            broken: false,
            fresh: true,
            state: Arc::new(State::default()),
            #[cfg(test)]
            published: 0,
        })
    }

    fn broken() -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the shared ring was corrupted by the peer",
        )
    }

    /// Bytes the peer has published and this side not yet read (`Err`: its tail is out of
    /// bounds, and the rings are broken).
    fn readable(&mut self) -> io::Result<usize> {
        if self.broken {
            return Err(Rings::broken());
        }
        let tail = self.map.word(self.rx_ctl + TAIL).load(Ordering::Acquire);
        let avail = tail.wrapping_sub(self.rx_head);
        if avail > self.cap as u64 {
            self.broken = true;
            return Err(corrupt("tail", tail, self.rx_head));
        }
        Ok(avail as usize)
    }

    /// Room in the ring this side writes (`Err`: the peer's head is out of bounds).
    fn writable(&mut self) -> io::Result<usize> {
        if self.broken {
            return Err(Rings::broken());
        }
        let head = self.map.word(self.tx_ctl + HEAD).load(Ordering::Acquire);
        let used = self.tx_tail.wrapping_sub(head);
        if used > self.cap as u64 {
            self.broken = true;
            return Err(corrupt("head", head, self.tx_tail));
        }
        Ok(self.cap - used as usize)
    }

    /// A look at the rings for threads that do not hold them: whether there is news,
    /// and what a thread needs to sleep on the doorbell.
    pub fn peek(&self) -> Peek {
        Peek {
            map: self.map.clone(),
            cap: self.cap,
            rx_ctl: self.rx_ctl,
            tx_ctl: self.tx_ctl,
            state: self.state.clone(),
        }
    }

    /// Reads up to `len` bytes into `dst`: the count, 0 if none are there, and whether the
    /// peer asked to be woken when room is freed.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, and not otherwise borrowed.
    unsafe fn read(&mut self, dst: *mut u8, len: usize) -> io::Result<(usize, bool)> {
        let n = self.readable()?.min(len);
        if n == 0 {
            return Ok((0, false));
        }
        let mut done = 0;
        while done < n {
            let step = (n - done).min(CHUNK);
            let off = (self.rx_head as usize) & (self.cap - 1);
            let first = step.min(self.cap - off);
            // SAFETY: `off + first <= cap` and `step - first <= cap`, so both runs lie in
            // this side's receive ring inside the mapping; `dst` takes `done + step <= n
            // <= len` bytes (the caller's guarantee). Raw copies: the peer may write the
            // ring meanwhile, which at worst gives bytes the protocol core rejects.
            unsafe {
                let ring = self.map.base.add(self.rx_data);
                let dst = dst.add(done);
                std::ptr::copy_nonoverlapping(ring.add(off), dst, first);
                // (Only a run that wraps has a second part: a copy call saved per read.)
                if step > first {
                    std::ptr::copy_nonoverlapping(ring, dst.add(first), step - first);
                }
            }
            done += step;
            // Published chunk by chunk: the writer refills what is taken while the rest
            // is still being copied.
            self.publish_head(step);
        }
        fence(Ordering::SeqCst);
        // A writer that wants room is rung once half the ring is free, not for every
        // frame read: it has that much to write at least, and the rest follows.
        let wanted = self.map.word(self.rx_ctl + ROOM).load(Ordering::Relaxed) != 0;
        let wake = wanted
            && self.readable().is_ok_and(|left| left <= self.cap / 2)
            && self.map.word(self.rx_ctl + ROOM).swap(0, Ordering::Relaxed) != 0;
        Ok((done, wake))
    }

    /// Writes as much of `iov`, past its first `skip` bytes, as there is room for: the
    /// count, and whether the peer asked to be woken for bytes.
    ///
    /// # Safety
    /// Every run must be valid for reads of its length.
    unsafe fn write(&mut self, iov: &[RawSlice], mut skip: usize) -> io::Result<(usize, bool)> {
        let mut room = self.writable()?;
        let (mut done, mut unpublished) = (0, 0);
        for run in iov {
            if room == 0 {
                break;
            }
            let from = skip.min(run.len);
            skip -= from;
            let n = (run.len - from).min(room);
            let mut put = 0;
            while put < n {
                let step = (n - put).min(CHUNK);
                let off = (self.tx_tail.wrapping_add(unpublished as u64) as usize) & (self.cap - 1);
                let first = step.min(self.cap - off);
                // SAFETY: both runs lie in this side's transmit ring (`off + first <=
                // cap`, `step - first <= cap`); the source run is readable from `from +
                // put` for `step <= run.len - from - put` bytes (the caller's guarantee).
                unsafe {
                    let ring = self.map.base.add(self.tx_data);
                    let src = run.base.add(from + put);
                    std::ptr::copy_nonoverlapping(src, ring.add(off), first);
                    if step > first {
                        std::ptr::copy_nonoverlapping(src.add(first), ring, step - first);
                    }
                }
                put += step;
                unpublished += step;
                if unpublished >= CHUNK {
                    self.publish_tail(unpublished);
                    unpublished = 0;
                }
            }
            done += n;
            room -= n;
        }
        if done == 0 {
            return Ok((0, false));
        }
        self.publish_tail(unpublished);
        fence(Ordering::SeqCst);
        let mut wake = self.map.word(self.tx_ctl + SLEEPERS).load(Ordering::Relaxed) != 0;
        if self.fresh {
            self.fresh = false;
            wake |= self.map.word(self.tx_ctl + FRESH).swap(0, Ordering::Relaxed) != 0;
        }
        Ok((done, wake))
    }

    /// Publishes `n` more bytes read past the published head.
    fn publish_head(&mut self, n: usize) {
        self.rx_head = self.rx_head.wrapping_add(n as u64);
        self.map
            .word(self.rx_ctl + HEAD)
            .store(self.rx_head, Ordering::Release);
        #[cfg(test)]
        {
            self.published += 1;
        }
    }

    /// Publishes `n` more bytes written past the published tail.
    fn publish_tail(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.tx_tail = self.tx_tail.wrapping_add(n as u64);
        self.map
            .word(self.tx_ctl + TAIL)
            .store(self.tx_tail, Ordering::Release);
        #[cfg(test)]
        {
            self.published += 1;
        }
    }

    /// Marks the ring this side writes "room wanted" (see the module docs), with the
    /// fence that pairs with the reader's between publishing its head and reading the
    /// mark.
    fn want_room(&mut self) {
        let w = self.map.word(self.tx_ctl + ROOM);
        if w.load(Ordering::Relaxed) == 0 {
            w.store(1, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
    }

    /// The rings as the protocol core's byte source and sink, with `bell` the connection's
    /// unix socket to ring the peer on.
    pub fn io<'a>(&'a mut self, bell: BorrowedFd<'a>) -> RingIo<'a> {
        RingIo { rings: self, bell }
    }
}

/// A look at a side's rings without the lock of the thread that holds them (see
/// [`Rings::peek`]), and what its threads need to sleep on the doorbell: the counts of
/// sleepers, and whether the socket reported bytes since the consumer last took them.
pub struct Peek {
    map: Arc<Mapping>,
    cap: usize,
    rx_ctl: usize,
    tx_ctl: usize,
    state: Arc<State>,
}

/// What [`Peek::arm`] counted a thread in; taken back when dropped, once the thread's
/// wait is over. It holds the mapping weakly: a thread asleep holds no connection and
/// keeps no segment mapped (a closed connection's goes at once, and with it the count).
pub struct Armed {
    map: std::sync::Weak<Mapping>,
    rx_ctl: usize,
}

impl Drop for Armed {
    fn drop(&mut self) {
        // (The counts wrap: a peer that wrote them gets needless rings or none, as a
        // peer that does not write gets none.)
        if let Some(map) = self.map.upgrade() {
            map.word(self.rx_ctl + SLEEPERS).fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Peek {
    /// Whether the ring this side reads holds bytes it has not taken (the published
    /// indices differ: garbage the peer wrote counts as bytes, for the consumer to
    /// refuse).
    pub fn has_bytes(&self) -> bool {
        let tail = self.map.word(self.rx_ctl + TAIL).load(Ordering::Acquire);
        tail != self.map.word(self.rx_ctl + HEAD).load(Ordering::Relaxed)
    }

    /// Whether the last write left bytes for want of room and half the ring is free
    /// now (a peer's bad index counts as room, for the writer to refuse).
    fn has_room(&self) -> bool {
        if !self.state.tx_blocked.load(Ordering::Relaxed) {
            return false;
        }
        let head = self.map.word(self.tx_ctl + HEAD).load(Ordering::Acquire);
        let tail = self.map.word(self.tx_ctl + TAIL).load(Ordering::Relaxed);
        tail.wrapping_sub(head) <= (self.cap / 2) as u64
    }

    /// Whether a thread that services the connection has something to do on this side:
    /// bytes in the ring, a doorbell to take, or room for bytes a write left.
    pub fn has_news(&self) -> bool {
        self.state.rung.load(Ordering::Relaxed) || self.has_bytes() || self.has_room()
    }

    /// Counts the calling thread among the sleepers, about to block on the doorbell
    /// socket, until the returned value is dropped: the peer rings for the next bytes it
    /// publishes. The caller issues a `SeqCst` fence after arming (once for all the rings
    /// it is about to sleep on), looks again ([`Peek::has_news`]) before it blocks, and
    /// drops what this returned once its wait ends.
    pub fn arm(&self) -> Armed {
        self.map
            .word(self.rx_ctl + SLEEPERS)
            .fetch_add(1, Ordering::Relaxed);
        Armed {
            map: Arc::downgrade(&self.map),
            rx_ctl: self.rx_ctl,
        }
    }

    /// The doorbell socket was reported readable.
    pub fn note_rung(&self) {
        self.state.rung.store(true, Ordering::Relaxed);
    }

    /// Whether the socket was reported readable since the last call (the caller then
    /// takes its bytes).
    pub fn take_rung(&self) -> bool {
        let rung = &self.state.rung;
        rung.load(Ordering::Relaxed) && rung.swap(false, Ordering::Relaxed)
    }

    /// One read of this ring through `read` (a read of the consumer's [`RingIo`]), ending
    /// as a socket read ends: `WouldBlock` when nothing is there, `Ok(0)` at the end of
    /// the stream only once every byte the peer published is taken. When the ring is
    /// empty and a wait reported the doorbell `bell` readable, its bytes are taken and
    /// the ring looked at again: a bell just taken may be for bytes published after the
    /// first look, and a peer that publishes its last frames (a NAK, the final ACK) and
    /// closes right after leaves them in the ring when its end of the stream is seen.
    pub fn read_or_end(
        &self,
        bell: BorrowedFd<'_>,
        mut read: impl FnMut() -> io::Result<usize>,
    ) -> io::Result<usize> {
        match read() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !self.take_rung() {
                    return Err(e);
                }
            }
            r => return r,
        }
        let open = drain_bell(bell)?;
        match read() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !open => Ok(0),
            Ok(n) if !open => {
                // The end is still there once these bytes are taken: the next read
                // that finds the ring empty sees it again.
                self.note_rung();
                Ok(n)
            }
            r => r,
        }
    }
}

/// Rings the peer's doorbell: one byte on the socket, never blocking. A full socket
/// means a ring is already pending; a closed one is the liveness path's to see.
fn ring(bell: BorrowedFd<'_>) {
    let _ = rustix::net::send(bell, &[0], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

/// Takes the doorbell's bytes off `bell` without blocking: `Ok(false)` at the end of the
/// stream (the peer closed or died), `Ok(true)` otherwise. A bounded number of reads: a
/// peer that keeps ringing cannot hold the thread here (the socket stays readable, and
/// the rest is taken next time).
pub fn drain_bell(bell: BorrowedFd<'_>) -> io::Result<bool> {
    let mut buf = [0u8; 256];
    for _ in 0..16 {
        match rustix::net::recv(bell, &mut buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Ok(false),
            Ok(_) => continue,
            Err(rustix::io::Errno::AGAIN) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// A side's rings with the socket that is their doorbell, as [`Recv`] and [`Transmit`]:
/// `WouldBlock` where a socket would block (nothing to read, no room), `InvalidData` once
/// the peer corrupted the rings. The end of the stream is the socket's to report.
pub struct RingIo<'a> {
    rings: &'a mut Rings,
    bell: BorrowedFd<'a>,
}

/// A read takes what the ring holds and counts no sleeper: a thread that blocks
/// afterwards arms the ring first ([`Peek::arm`]). A write that put less than it had
/// notes it for [`Peek::has_news`] and [`Peek::arm`]: the data path then waits for the
/// peer's bell (`EPOLLIN`) where a socket would wait for `EPOLLOUT`.
impl Recv for RingIo<'_> {
    unsafe fn recv(&mut self, dst: *mut u8, len: usize) -> io::Result<usize> {
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: the caller guarantees `dst` is writable for `len` bytes.
        let (n, wake) = unsafe { self.rings.read(dst, len) }?;
        if wake {
            ring(self.bell.as_fd());
        }
        match n {
            0 => Err(io::ErrorKind::WouldBlock.into()),
            n => Ok(n),
        }
    }
}

impl Transmit for RingIo<'_> {
    unsafe fn transmit(&mut self, iov: &[RawSlice]) -> io::Result<usize> {
        let total: usize = iov.iter().map(|r| r.len).sum();
        if total == 0 {
            return Ok(0);
        }
        let mut done = 0;
        let mut marked = false;
        loop {
            // SAFETY: the caller guarantees every run is readable.
            let (n, wake) = unsafe { self.rings.write(iov, done) }?;
            if wake {
                ring(self.bell.as_fd());
            }
            done += n;
            if done == total {
                break;
            }
            if n == 0 {
                if marked {
                    break;
                }
                // No room: ask the reader to ring once half the ring is free, then look
                // again (it may have freed that much meanwhile, before it saw the mark).
                marked = true;
                self.rings.want_room();
            }
        }
        self.rings.state.tx_blocked.store(done < total, Ordering::Relaxed);
        match done {
            0 => Err(io::ErrorKind::WouldBlock.into()),
            n => Ok(n),
        }
    }
}

#[cfg(test)]
#[path = "shm_ring_tests.rs"]
mod tests;
