//! Outgoing bytes of one connection: frame headers and payloads, in order, written with
//! as few `writev(2)` calls as possible.
//!
//! Headers, inline data and small payloads are copied into one arena; larger payloads are
//! queued as [`Seg`]s that point into registered memory and are gathered by the kernel
//! straight from there (zero copy). Consecutive frames queued together go out in one
//! system call. A region deregistered before its bytes could be gathered breaks the
//! stream ([`TxQueue::write_to`] fails, the connection is dropped): the bytes are not
//! there to send, and sending anything else in their place (zeros) would let the
//! operation complete successfully with data it never had. Dropping the connection makes
//! the peer resend the request, which then meets the dead key and fails as it must.

use std::collections::VecDeque;
use std::io;

use arrayvec::ArrayVec;

use crate::io::{RawSlice, Transmit};
use crate::memory::Seg;
use crate::wire::{Frame, MAX_HDR_LEN};

/// Payloads up to this size are copied into the arena instead of gathered in place.
const COPY_THRESHOLD: usize = 2048;
/// Most iovecs per `writev`.
const MAX_IOV: usize = 128;
/// Most bytes one [`TxQueue::write_to`] call writes. On loopback a `sendmsg` keeps
/// copying for as long as the receiver frees space, so one call over a window of large
/// WRITEs could run for tens of milliseconds, holding the connection while ACKs wait
/// unread and the ACK timer (which counts from the last bytes sent) runs out.
pub const WRITE_BUDGET: usize = 4 << 20;

enum Part {
    Bytes { start: usize, end: usize },
    Mem(Seg),
}

impl Part {
    fn len(&self) -> usize {
        match self {
            Part::Bytes { start, end } => end - start,
            Part::Mem(s) => s.len,
        }
    }
}

/// Bytes waiting to be written to one stream.
#[derive(Default)]
pub struct TxQueue {
    arena: Vec<u8>,
    parts: VecDeque<Part>,
    /// Bytes of `parts.front()` already written.
    head_off: usize,
    pending: usize,
    /// Whether anything but coalesced ACKs is queued (ACKs alone may wait a little).
    urgent: bool,
    /// Bytes ever queued and ever written (stream positions).
    queued_total: u64,
    written_total: u64,
    /// Stream position from which the queued bytes are not the data they stand for (a
    /// region was deregistered before they could be gathered): the stream ends there.
    poison: Option<u64>,
    /// Where each queued response's header (ACK, NAK, READ or atomic response) ends,
    /// oldest first.
    replies: VecDeque<u64>,
}

impl TxQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Bytes waiting.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Whether anything but ACK frames is queued.
    pub fn urgent(&self) -> bool {
        self.urgent
    }

    /// Responses to the peer's requests (ACKs, NAKs, READ and atomic responses) queued
    /// and not yet written: what a peer that stops reading makes this side hold.
    pub fn unsent_replies(&self) -> usize {
        self.replies.len()
    }

    /// Queues a frame header.
    pub fn push_frame(&mut self, f: &Frame) {
        if !matches!(f, Frame::Ack { .. }) {
            self.urgent = true;
        }
        let mut hdr = [0u8; MAX_HDR_LEN];
        let n = f.encode(&mut hdr);
        self.push_bytes(&hdr[..n]);
        if f.is_response() {
            self.replies.push_back(self.queued_total);
        }
    }

    /// Queues bytes (copied).
    pub fn push_bytes(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        let start = self.arena.len();
        self.arena.extend_from_slice(b);
        self.extend_bytes(start, self.arena.len());
    }

    fn extend_bytes(&mut self, start: usize, end: usize) {
        self.pending += end - start;
        self.queued_total += (end - start) as u64;
        if let Some(Part::Bytes { end: last_end, .. }) = self.parts.back_mut() {
            if *last_end == start {
                *last_end = end;
                return;
            }
        }
        self.parts.push_back(Part::Bytes { start, end });
    }

    /// Queues the bytes of a registered-memory range: small ranges are copied now, large
    /// ones are gathered from the region when written. Returns false if the region has
    /// been deregistered: the stream ends before these bytes (see [`TxQueue::write_to`]).
    pub fn push_seg(&mut self, seg: &Seg) -> bool {
        if seg.len == 0 {
            return true;
        }
        if seg.len <= COPY_THRESHOLD {
            let start = self.arena.len();
            self.arena.resize(start + seg.len, 0);
            let ok = seg.copy_out(0, &mut self.arena[start..]);
            if !ok && self.poison.is_none() {
                self.poison = Some(self.queued_total);
            }
            self.extend_bytes(start, self.arena.len());
            if !ok {
                return false;
            }
        } else {
            self.pending += seg.len;
            self.queued_total += seg.len as u64;
            self.parts.push_back(Part::Mem(seg.clone()));
        }
        true
    }

    fn deregistered() -> io::Error {
        io::Error::other("a registered region was deregistered before its queued bytes were sent")
    }

    fn advance(&mut self, mut n: usize) {
        self.pending -= n;
        self.written_total += n as u64;
        while self.replies.front().is_some_and(|&end| end <= self.written_total) {
            self.replies.pop_front();
        }
        while n > 0 {
            let front = self.parts.front().expect("advance within pending bytes");
            let left = front.len() - self.head_off;
            if n >= left {
                n -= left;
                self.parts.pop_front();
                self.head_off = 0;
            } else {
                self.head_off += n;
                n = 0;
            }
        }
        if self.parts.is_empty() {
            self.arena.clear();
            self.head_off = 0;
            self.urgent = false;
        }
    }

    /// Writes as much as `out` (the connection's socket) takes without blocking, up to
    /// [`WRITE_BUDGET`] bytes. Returns the bytes written; `WouldBlock` when the socket is
    /// full before anything was written. Fails for good once bytes of a deregistered
    /// region are due (everything queued before them has been written): the connection
    /// must be dropped.
    pub fn write_to(&mut self, out: &mut impl Transmit) -> io::Result<usize> {
        self.write_at_most(out, WRITE_BUDGET)
    }

    /// [`TxQueue::write_to`] with another budget.
    pub fn write_at_most(&mut self, out: &mut impl Transmit, budget: usize) -> io::Result<usize> {
        let mut total = 0;
        while !self.is_empty() && total < budget {
            match self.writev_once(out, budget - total) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "connection closed")),
                Ok(n) => {
                    total += n;
                    self.advance(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && total > 0 => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// One write of at most `budget` bytes: one run, or a gather list of up to
    /// [`MAX_IOV`] runs.
    fn writev_once(&mut self, out: &mut impl Transmit, budget: usize) -> io::Result<usize> {
        // The latency path: all that is queued is one run of the arena (frame headers,
        // an inline or copied payload). One run straight from it, without walking the
        // parts.
        if let (1, Some(&Part::Bytes { start, end }), None) =
            (self.parts.len(), self.parts.front(), self.poison)
        {
            let from = start + self.head_off;
            let len = (end - from).min(budget);
            let run = [RawSlice {
                base: self.arena[from..].as_ptr(),
                len,
            }];
            // SAFETY: `from..from + len` lies inside the arena (`from < end <=
            // arena.len()`), which nothing changes during the call.
            return unsafe { out.transmit(&run) };
        }
        // Filled as they are built: no zeroing of 128 entries per call on the latency path.
        let mut iov = ArrayVec::<RawSlice, MAX_IOV>::new();
        let mut pinned = ArrayVec::<&Seg, MAX_IOV>::new();
        // Bytes that may still go out: what is queued before the bytes of a deregistered
        // region goes out (as a link delivers the packets before a failure); the stream
        // ends where those begin.
        let mut room = self
            .poison
            .map_or(usize::MAX, |p| (p - self.written_total) as usize)
            .min(budget);
        for (i, part) in self.parts.iter().enumerate() {
            if iov.is_full() || room == 0 {
                break;
            }
            let skip = if i == 0 { self.head_off } else { 0 };
            match part {
                Part::Bytes { start, end } => {
                    let len = (end - start - skip).min(room);
                    iov.push(RawSlice {
                        base: self.arena[start + skip..].as_ptr(),
                        len,
                    });
                    room -= len;
                }
                Part::Mem(seg) => {
                    if !seg.mr.pin() {
                        // Deregistered while queued: its bytes cannot be sent.
                        let at = self.written_total + iov.iter().map(|v| v.len as u64).sum::<u64>();
                        self.poison = Some(self.poison.map_or(at, |p| p.min(at)));
                        break;
                    }
                    pinned.push(seg);
                    let len = (seg.len - skip).min(room);
                    iov.push(RawSlice {
                        // SAFETY (pointer arithmetic): offset + skip < offset + len <=
                        // region length, an invariant of `Seg`.
                        base: unsafe { seg.mr.base().add(seg.offset + skip) },
                        len,
                    });
                    room -= len;
                }
            }
        }
        if iov.is_empty() && self.poison == Some(self.written_total) {
            return Err(Self::deregistered());
        }
        // SAFETY: every run points into memory that stays valid for the call: the arena
        // (not touched during the call) or pinned registered regions (unpinned below);
        // the transmitter only reads them.
        let r = unsafe { out.transmit(&iov) };
        // By reference: iterating the ArrayVec by value would first copy all of it (1 KiB).
        for seg in &pinned {
            seg.mr.unpin();
        }
        r
    }

    /// Moves every queued byte into `out` (for the in-memory test harness).
    pub fn drain_into(&mut self, out: &mut Vec<u8>) {
        while let Some(part) = self.parts.pop_front() {
            let skip = std::mem::take(&mut self.head_off);
            match part {
                Part::Bytes { start, end } => out.extend_from_slice(&self.arena[start + skip..end]),
                Part::Mem(seg) => {
                    let at = out.len();
                    out.resize(at + seg.len - skip, 0);
                    seg.copy_out(skip, &mut out[at..]);
                }
            }
        }
        self.arena.clear();
        self.pending = 0;
        self.urgent = false;
        self.written_total = self.queued_total;
        self.replies.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MrShared;
    use std::sync::Arc;
    use verbs_api::AccessFlags;

    #[test]
    fn gathers_headers_and_memory_in_order() {
        let mr = Arc::new(MrShared::new_owned(1, 5, 10_000, AccessFlags::empty()).unwrap());
        let seg = Seg {
            mr: mr.clone(),
            offset: 0,
            len: 10_000,
        };
        seg.copy_in(0, &vec![7u8; 10_000]);
        let mut q = TxQueue::new();
        q.push_bytes(b"abc");
        q.push_seg(&seg);
        q.push_bytes(b"xyz");
        assert_eq!(q.pending(), 10_006);
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        let n = q.write_to(&mut crate::io::ToWrite(&a)).unwrap();
        assert_eq!(n, 10_006);
        let mut got = vec![0u8; 10_006];
        use std::io::Read;
        (&b).read_exact(&mut got).unwrap();
        assert_eq!(&got[..3], b"abc");
        assert!(got[3..10_003].iter().all(|&x| x == 7));
        assert_eq!(&got[10_003..], b"xyz");
        assert!(q.is_empty());
    }

    /// One call writes at most its budget even when the socket would take more (on
    /// loopback a reader may drain it as fast as it fills): the caller gets the
    /// connection back to read ACKs and note the time of the last bytes sent.
    #[test]
    fn one_call_writes_at_most_the_budget() {
        const BUDGET: usize = 16 * 1024;
        const LEN: usize = 100_000;
        let mr = Arc::new(MrShared::new_owned(1, 5, LEN, AccessFlags::empty()).unwrap());
        let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
        let seg = Seg {
            mr: mr.clone(),
            offset: 0,
            len: LEN,
        };
        seg.copy_in(0, &pattern);
        let mut q = TxQueue::new();
        q.push_seg(&seg);
        // The socket takes all 100 kB at once (its buffer is ~200 kB): only the budget
        // splits the writes.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let mut calls = 0;
        while !q.is_empty() {
            let n = q.write_at_most(&mut crate::io::ToWrite(&a), BUDGET).unwrap();
            assert!(n > 0 && n <= BUDGET, "one call wrote {n} bytes");
            calls += 1;
        }
        assert_eq!(calls, LEN.div_ceil(BUDGET));
        let mut got = vec![0u8; LEN];
        use std::io::Read;
        (&b).read_exact(&mut got).unwrap();
        assert!(got == pattern, "bytes arrived out of order");
    }

    /// A region deregistered while its bytes wait ends the stream there: what was queued
    /// before goes out, nothing is sent in their place (it used to be zeros, so a READ
    /// "succeeded" with data the responder never had), and the writer fails.
    #[test]
    fn dead_region_breaks_the_stream() {
        for len in [100, 5000] {
            let mr = Arc::new(MrShared::new_owned(1, 5, len, AccessFlags::empty()).unwrap());
            let seg = Seg {
                mr: mr.clone(),
                offset: 0,
                len,
            };
            seg.copy_in(0, &vec![9u8; len]);
            let mut q = TxQueue::new();
            q.push_bytes(b"hdr");
            if len > COPY_THRESHOLD {
                // Gathered in place when written: the region dies while queued.
                assert!(q.push_seg(&seg));
                mr.kill();
            } else {
                // Copied now: the region died between the access check and the copy.
                mr.kill();
                assert!(!q.push_seg(&seg));
            }
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            for _ in 0..2 {
                let e = q.write_to(&mut crate::io::ToWrite(&a)).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::Other, "{len}");
            }
            // Only the bytes queued before went out before this marker.
            use std::io::{Read, Write};
            (&a).write_all(&[0xab]).unwrap();
            let mut got = [0u8; 4];
            (&b).read_exact(&mut got).unwrap();
            assert_eq!(&got, b"hdr\xab", "{len}");
        }
    }
}
