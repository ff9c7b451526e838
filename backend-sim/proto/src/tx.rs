//! Outgoing bytes of one connection: frame headers and payloads, written with as few
//! `writev(2)` calls as possible, this side's responses ahead of its queued requests.
//!
//! Headers, inline data and small payloads are copied into one arena; larger payloads are
//! queued as [`Seg`]s that point into registered memory and are gathered by the kernel
//! straight from there (zero copy). Consecutive frames queued together go out in one
//! system call. A region deregistered before its bytes could be gathered breaks the
//! stream ([`TxQueue::write_to`] fails, the connection is dropped): the bytes are not
//! there to send, and sending anything else in their place (zeros) would let the
//! operation complete successfully with data it never had. Dropping the connection makes
//! the peer resend the request, which then meets the dead key and fails as it must.
//!
//! The stream carries two flows that IBA keeps apart: this side's requests and its
//! responses (ACKs, NAKs, READ and atomic responses) to the peer's requests. Each keeps
//! its order, and a frame once begun is finished before another starts; but at every
//! frame boundary a queued response goes before the request frames still waiting. An HCA
//! interleaves its ACKs with the packets of the messages it is sending, so an ACK never
//! waits behind the other direction's data; one queued behind a send queue's worth of
//! large WRITEs (128 of 1 MiB is 128 MiB) would reach the peer long after its local ACK
//! timer gave up on the requests it answers, while data moved all along.

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

/// The two flows of a stream: responses go first at each frame boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    Resp = 0,
    Req = 1,
}

enum Part {
    Bytes {
        start: usize,
        end: usize,
    },
    Mem(Seg),
    /// The stream ends here: the bytes that belonged here are gone (their region was
    /// deregistered).
    Dead,
}

impl Part {
    fn len(&self) -> usize {
        match self {
            Part::Bytes { start, end } => end - start,
            Part::Mem(s) => s.len,
            Part::Dead => 0,
        }
    }
}

struct Queued {
    part: Part,
    /// The last part of its frame: another frame may go after it.
    ends_frame: bool,
}

/// The parts of one flow, in order.
#[derive(Default)]
struct LaneQ {
    parts: VecDeque<Queued>,
    /// Bytes of `parts.front()` already written.
    head_off: usize,
}

/// Bytes waiting to be written to one stream.
pub struct TxQueue {
    arena: Vec<u8>,
    lanes: [LaneQ; 2],
    /// The flow whose front frame is partly written: it is finished first.
    cur: Option<Lane>,
    /// The flow of the frame being queued (payload pushes join it).
    building: Lane,
    /// Payload bytes of the frame being queued still to come.
    payload_left: usize,
    pending: usize,
    /// A [`Part::Dead`] is queued: the stream ends there.
    dead: bool,
    /// Whether anything but coalesced ACKs is queued (ACKs alone may wait a little).
    urgent: bool,
    /// Bytes of responses ever queued and ever written.
    resp_queued: u64,
    resp_written: u64,
    /// Where each queued response's header ends (in response bytes), oldest first.
    replies: VecDeque<u64>,
    /// Told of every frame queued and its payload (a capture of the traffic), if set.
    pub tap: Option<Box<dyn FrameTap>>,
}

/// What wants to see every frame a connection sends: the driver's capture, which
/// writes the frame as the RoCE packets an HCA would send ([`crate::capture`]).
pub trait FrameTap: Send {
    /// `f` was queued to be sent; for a response (ACK, NAK, READ or atomic response),
    /// `msn` is the responder's message sequence number that its AETH carries (IBA
    /// 9.7.5.1.1), else 0.
    fn sent(&mut self, f: &Frame, msn: u32);
    /// Bytes of the payload of the frame last told of, in order (copied or inline).
    fn payload(&mut self, _bytes: &[u8]) {}
    /// A registered-memory range of that payload (gathered in place when written).
    fn payload_seg(&mut self, _seg: &Seg) {}
    /// The next frame is marked: `why` is what the sim did to it (a fault injected).
    fn mark_next(&mut self, _why: &'static str) {}
}

impl Default for TxQueue {
    fn default() -> Self {
        TxQueue {
            arena: Vec::new(),
            lanes: [LaneQ::default(), LaneQ::default()],
            cur: None,
            building: Lane::Req,
            payload_left: 0,
            pending: 0,
            dead: false,
            urgent: false,
            resp_queued: 0,
            resp_written: 0,
            replies: VecDeque::new(),
            tap: None,
        }
    }
}

impl TxQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing waits (not even the end of the stream).
    pub fn is_empty(&self) -> bool {
        self.pending == 0 && !self.dead
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

    /// Queues a frame header; its payload, if it has one, follows with
    /// [`TxQueue::push_bytes`] or [`TxQueue::push_seg`]. A response joins the responses,
    /// anything else the requests.
    pub fn push_frame(&mut self, f: &Frame) {
        self.push_reply(f, 0)
    }

    /// Marks the next frame queued for the tap, if any: `why` says what the sim did to
    /// it (a fault it injected).
    pub fn mark_next(&mut self, why: &'static str) {
        if let Some(t) = &mut self.tap {
            t.mark_next(why);
        }
    }

    /// [`TxQueue::push_frame`] for a response, which carries the responder's message
    /// sequence number `msn` on a RoCE wire (the sim's frames do not: the tap is told).
    pub fn push_reply(&mut self, f: &Frame, msn: u32) {
        if let Some(t) = &mut self.tap {
            t.sent(f, msn);
        }
        if !matches!(f, Frame::Ack { .. }) {
            self.urgent = true;
        }
        let response = f.is_response();
        self.building = if response { Lane::Resp } else { Lane::Req };
        let mut hdr = [0u8; MAX_HDR_LEN];
        let n = f.encode(&mut hdr);
        self.copy_in(&hdr[..n]);
        if response {
            self.replies.push_back(self.resp_queued);
        }
        self.payload_left = f.payload_len() as usize;
        if self.payload_left == 0 {
            self.end_frame();
        }
    }

    /// Queues bytes (copied): the payload of the frame being queued, or raw bytes.
    pub fn push_bytes(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        if let Some(t) = &mut self.tap {
            t.payload(b);
        }
        self.copy_in(b);
        self.took_payload(b.len());
    }

    fn copy_in(&mut self, b: &[u8]) {
        let start = self.arena.len();
        self.arena.extend_from_slice(b);
        self.extend_bytes(start, self.arena.len());
    }

    fn extend_bytes(&mut self, start: usize, end: usize) {
        let len = end - start;
        self.pending += len;
        let lane = self.building;
        if lane == Lane::Resp {
            self.resp_queued += len as u64;
        }
        let q = &mut self.lanes[lane as usize];
        let started = q.parts.len() == 1 && q.head_off > 0;
        if let Some(last) = q.parts.back_mut() {
            if let Part::Bytes { end: last_end, .. } = &mut last.part {
                // Not across a frame boundary into bytes already being written: the
                // boundary is where a response may go.
                if *last_end == start && !(started && last.ends_frame) {
                    *last_end = end;
                    last.ends_frame = false;
                    return;
                }
            }
        }
        q.parts.push_back(Queued {
            part: Part::Bytes { start, end },
            ends_frame: false,
        });
    }

    /// `n` payload bytes of the frame being queued were queued.
    fn took_payload(&mut self, n: usize) {
        if self.payload_left > 0 {
            self.payload_left = self.payload_left.saturating_sub(n);
            if self.payload_left == 0 {
                self.end_frame();
            }
        }
    }

    fn end_frame(&mut self) {
        if let Some(last) = self.lanes[self.building as usize].parts.back_mut() {
            last.ends_frame = true;
        }
    }

    fn push_dead(&mut self) {
        self.dead = true;
        self.lanes[self.building as usize].parts.push_back(Queued {
            part: Part::Dead,
            ends_frame: false,
        });
    }

    /// Queues the bytes of a registered-memory range: small ranges are copied now, large
    /// ones are gathered from the region when written. Returns false if the region has
    /// been deregistered: the stream ends before these bytes (see [`TxQueue::write_to`]).
    pub fn push_seg(&mut self, seg: &Seg) -> bool {
        if seg.len == 0 {
            return true;
        }
        if let Some(t) = &mut self.tap {
            t.payload_seg(seg);
        }
        if seg.len <= COPY_THRESHOLD {
            let start = self.arena.len();
            self.arena.resize(start + seg.len, 0);
            if !seg.copy_out(0, &mut self.arena[start..]) {
                self.arena.truncate(start);
                self.push_dead();
                return false;
            }
            self.extend_bytes(start, self.arena.len());
        } else {
            self.pending += seg.len;
            if self.building == Lane::Resp {
                self.resp_queued += seg.len as u64;
            }
            self.lanes[self.building as usize].parts.push_back(Queued {
                part: Part::Mem(seg.clone()),
                ends_frame: false,
            });
        }
        self.took_payload(seg.len);
        true
    }

    fn deregistered() -> io::Error {
        io::Error::other("a registered region was deregistered before its queued bytes were sent")
    }

    /// The flow the next byte comes from: the frame in progress, else a response, else
    /// a request.
    fn next_lane(&self) -> Lane {
        match self.cur {
            Some(l) => l,
            None if self.lanes[Lane::Resp as usize].parts.is_empty() => Lane::Req,
            None => Lane::Resp,
        }
    }

    /// The queued parts in the order their bytes go out (as [`TxQueue::advance`] takes
    /// them), at most [`MAX_IOV`], each as (flow, index in it).
    fn order(&self, out: &mut ArrayVec<(Lane, usize), MAX_IOV>) {
        let mut from = [0usize; 2];
        if let Some(l) = self.cur {
            let parts = &self.lanes[l as usize].parts;
            from[l as usize] = parts.len();
            for (i, q) in parts.iter().enumerate() {
                if out.try_push((l, i)).is_err() {
                    return;
                }
                if q.ends_frame {
                    from[l as usize] = i + 1;
                    break;
                }
            }
        }
        for l in [Lane::Resp, Lane::Req] {
            for i in from[l as usize]..self.lanes[l as usize].parts.len() {
                if out.try_push((l, i)).is_err() {
                    return;
                }
            }
        }
    }

    fn advance(&mut self, mut n: usize) {
        if n == self.pending && !self.dead {
            // Everything queued went (the usual end of a small message's write): every
            // part and every response is done, with no walk over them.
            for q in &mut self.lanes {
                q.parts.clear();
                q.head_off = 0;
            }
            self.cur = None;
            self.pending = 0;
            self.resp_written = self.resp_queued;
            self.replies.clear();
            self.arena.clear();
            self.urgent = false;
            return;
        }
        self.pending -= n;
        while n > 0 {
            let l = self.next_lane();
            let q = &mut self.lanes[l as usize];
            let front = q.parts.front().expect("advance within pending bytes");
            let left = front.part.len() - q.head_off;
            let took = n.min(left);
            if l == Lane::Resp {
                self.resp_written += took as u64;
            }
            n -= took;
            if took == left {
                let ends = front.ends_frame;
                q.parts.pop_front();
                q.head_off = 0;
                self.cur = if ends || q.parts.is_empty() { None } else { Some(l) };
            } else {
                q.head_off += took;
                self.cur = Some(l);
            }
        }
        while self.replies.front().is_some_and(|&end| end <= self.resp_written) {
            self.replies.pop_front();
        }
        if self.lanes.iter().all(|q| q.parts.is_empty()) {
            self.arena.clear();
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
        let [resp, req] = &self.lanes;
        let single = match (resp.parts.len(), req.parts.len()) {
            (1, 0) => Some(resp),
            (0, 1) => Some(req),
            _ => None,
        };
        if let Some(q) = single {
            if let Part::Bytes { start, end } = q.parts[0].part {
                let from = start + q.head_off;
                let len = (end - from).min(budget);
                let run = [RawSlice {
                    base: self.arena[from..].as_ptr(),
                    len,
                }];
                // SAFETY: `from..from + len` lies inside the arena (`from < end <=
                // arena.len()`), which nothing changes during the call.
                return unsafe { out.transmit(&run) };
            }
        }
        // A ping-pong's: one run of each flow (the ACK owed and the next request, each
        // headers and inline bytes in the arena). They go in the order `order` gives:
        // the flow whose frame is partly written first, else the response.
        if let (1, 1) = (resp.parts.len(), req.parts.len()) {
            if let (Part::Bytes { start: s0, end: e0 }, Part::Bytes { start: s1, end: e1 }) =
                (&resp.parts[0].part, &req.parts[0].part)
            {
                let resp_run = (s0 + resp.head_off, *e0);
                let req_run = (s1 + req.head_off, *e1);
                let (first, second) = match self.cur {
                    Some(Lane::Req) => (req_run, resp_run),
                    _ => (resp_run, req_run),
                };
                let mut room = budget;
                let mut iov = ArrayVec::<RawSlice, 2>::new();
                for (from, end) in [first, second] {
                    let len = (end - from).min(room);
                    if len == 0 {
                        break;
                    }
                    iov.push(RawSlice {
                        base: self.arena[from..].as_ptr(),
                        len,
                    });
                    room -= len;
                }
                // SAFETY: both runs lie inside the arena (`from <= end <= arena.len()`),
                // which nothing changes during the call.
                return unsafe { out.transmit(&iov) };
            }
        }
        let mut order = ArrayVec::<(Lane, usize), MAX_IOV>::new();
        self.order(&mut order);
        // Filled as they are built: no zeroing of 128 entries per call on the latency path.
        let mut iov = ArrayVec::<RawSlice, MAX_IOV>::new();
        let mut pinned = ArrayVec::<(Lane, usize), MAX_IOV>::new();
        // What is queued before the bytes of a deregistered region goes out (as a link
        // delivers the packets before a failure); the stream ends where those begin.
        let mut died = None;
        let mut room = budget;
        for &(l, i) in &order {
            if room == 0 {
                break;
            }
            let q = &self.lanes[l as usize];
            let skip = if i == 0 { q.head_off } else { 0 };
            match &q.parts[i].part {
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
                        died = Some((l, i));
                        break;
                    }
                    pinned.push((l, i));
                    let len = (seg.len - skip).min(room);
                    iov.push(RawSlice {
                        // SAFETY: pointer arithmetic within the region: offset + skip < offset + len <=
                        // region length, an invariant of `Seg`.
                        base: unsafe { seg.mr.base().add(seg.offset + skip) },
                        len,
                    });
                    room -= len;
                }
                Part::Dead => break,
            }
        }
        let r = if iov.is_empty() {
            Err(Self::deregistered())
        } else {
            // SAFETY: every run points into memory that stays valid for the call: the
            // arena (not touched during the call) or pinned registered regions (unpinned
            // below); the transmitter only reads them.
            unsafe { out.transmit(&iov) }
        };
        for &(l, i) in &pinned {
            if let Part::Mem(seg) = &self.lanes[l as usize].parts[i].part {
                seg.mr.unpin();
            }
        }
        if let Some((l, i)) = died {
            let q = &mut self.lanes[l as usize];
            let skip = if i == 0 { q.head_off } else { 0 };
            self.pending -= q.parts[i].part.len() - skip;
            q.parts[i].part = Part::Dead;
            self.dead = true;
        }
        r
    }

    /// Moves every queued byte into `out`, in the order they would be written (for the
    /// in-memory test harness).
    pub fn drain_into(&mut self, out: &mut Vec<u8>) {
        loop {
            let l = self.next_lane();
            let q = &mut self.lanes[l as usize];
            let Some(front) = q.parts.pop_front() else { break };
            let skip = std::mem::take(&mut q.head_off);
            self.cur = if front.ends_frame || q.parts.is_empty() {
                None
            } else {
                Some(l)
            };
            match front.part {
                Part::Bytes { start, end } => out.extend_from_slice(&self.arena[start + skip..end]),
                Part::Mem(seg) => {
                    let at = out.len();
                    out.resize(at + seg.len - skip, 0);
                    seg.copy_out(skip, &mut out[at..]);
                }
                Part::Dead => {}
            }
        }
        self.arena.clear();
        self.pending = 0;
        self.dead = false;
        self.urgent = false;
        self.resp_written = self.resp_queued;
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

    /// A transmitter that takes at most `step` bytes per call.
    struct Trickle<'a> {
        out: &'a mut Vec<u8>,
        step: usize,
    }

    impl Transmit for Trickle<'_> {
        unsafe fn transmit(&mut self, iov: &[RawSlice]) -> io::Result<usize> {
            let mut room = self.step;
            for r in iov {
                let n = r.len.min(room);
                // SAFETY: the caller guarantees each run is readable for its length.
                self.out
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(r.base, n) });
                room -= n;
            }
            Ok(self.step - room)
        }
    }

    /// A write that takes everything queued leaves the queue as new: no response left
    /// unsent, nothing urgent, and frames queued afterwards go out whole and in order
    /// however the next writes cut them.
    #[test]
    fn a_queue_written_whole_starts_over_clean() {
        let mut q = TxQueue::new();
        q.push_reply(&Frame::Ack { psn: 3 }, 0);
        q.push_frame(&send(4, 5));
        q.push_bytes(b"hello");
        assert_eq!((q.unsent_replies(), q.urgent()), (1, true));
        let mut wire = Vec::new();
        let all = q.pending();
        let n = q
            .write_to(&mut Trickle {
                out: &mut wire,
                step: usize::MAX,
            })
            .unwrap();
        assert_eq!(n, all);
        assert!(q.is_empty());
        assert_eq!((q.unsent_replies(), q.urgent(), q.pending()), (0, false, 0));
        assert_eq!(frames(&wire), [(0x20, 3), (0x10, 4)]);

        wire.clear();
        q.push_reply(&Frame::Ack { psn: 4 }, 0);
        q.push_frame(&send(5, 3));
        q.push_bytes(b"abc");
        let mut written = 0;
        while !q.is_empty() {
            let mut out = Trickle {
                out: &mut wire,
                step: 5,
            };
            written += q.write_at_most(&mut out, 5).unwrap();
            if written >= 16 && !q.is_empty() {
                // The ACK is out, the SEND not yet: the response counts as sent.
                assert_eq!(q.unsent_replies(), 0, "{written} bytes written");
            }
        }
        assert_eq!(frames(&wire), [(0x20, 4), (0x10, 5)]);
        assert_eq!(&wire[32..35], b"abc");
        assert_eq!((q.unsent_replies(), q.urgent()), (0, false));
    }

    /// A SEND header of `len` payload bytes.
    fn send(psn: u32, len: u32) -> Frame {
        Frame::Send {
            psn,
            len,
            imm: None,
            solicited: false,
            ack_req: false,
            inv: None,
        }
    }

    /// The frames in `bytes`, payloads skipped, as (opcode byte, PSN).
    fn frames(bytes: &[u8]) -> Vec<(u8, u32)> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < bytes.len() {
            let (f, n) = Frame::decode(&bytes[off..]).unwrap().expect("a whole frame");
            out.push((bytes[off], f.psn().unwrap_or(0)));
            off += n + f.payload_len() as usize;
        }
        out
    }

    /// A response queued while request frames wait goes out at the next frame boundary,
    /// ahead of them: the frame under way is finished first, and responses keep their
    /// order among themselves. An ACK queued behind a send queue of large WRITEs would
    /// reach the peer only after all of them.
    #[test]
    fn responses_pass_queued_requests_at_the_next_frame_boundary() {
        let mr = Arc::new(MrShared::new_owned(1, 5, 10_000, AccessFlags::empty()).unwrap());
        let seg = |len| Seg {
            mr: mr.clone(),
            offset: 0,
            len,
        };
        let write = |psn| Frame::Write {
            psn,
            len: 10_000,
            addr: 0,
            rkey: 5,
            imm: None,
            solicited: false,
            ack_req: false,
        };
        let queue = || {
            let mut q = TxQueue::new();
            for psn in 1..=3 {
                q.push_frame(&write(psn));
                q.push_seg(&seg(10_000));
            }
            q
        };
        let answer = |q: &mut TxQueue| {
            q.push_frame(&Frame::Ack { psn: 7 });
            q.push_frame(&Frame::ReadResp { psn: 8, len: 5000 });
            q.push_seg(&seg(5000));
            q.push_frame(&Frame::Ack { psn: 9 });
        };
        let (w, a, r) = (0x11, 0x20, 0x22);
        let want = [(w, 1), (a, 7), (r, 8), (a, 9), (w, 2), (w, 3)];
        // Written by the writer, the first WRITE under way when the responses come.
        let mut q = queue();
        let mut wire = Vec::new();
        assert_eq!(
            q.write_at_most(&mut crate::io::ToWrite(&mut wire), 100).unwrap(),
            100
        );
        answer(&mut q);
        assert_eq!(q.unsent_replies(), 3);
        while !q.is_empty() {
            // Small writes: every boundary is met between two calls too.
            q.write_at_most(&mut crate::io::ToWrite(&mut wire), 3000).unwrap();
        }
        assert_eq!(q.unsent_replies(), 0);
        assert_eq!(frames(&wire), want);
        // The test harness's drain takes the same order.
        let mut q = queue();
        let mut drained = Vec::new();
        q.write_at_most(&mut crate::io::ToWrite(&mut drained), 100)
            .unwrap();
        answer(&mut q);
        q.drain_into(&mut drained);
        assert!(drained == wire, "drain_into and write_to disagree");
        // Queued before anything was written, the responses go first of all.
        let mut q = queue();
        answer(&mut q);
        let mut first = Vec::new();
        q.drain_into(&mut first);
        assert_eq!(frames(&first), [(a, 7), (r, 8), (a, 9), (w, 1), (w, 2), (w, 3)]);
    }

    /// A queue of one run of each flow in the arena (a ping-pong's ACK owed and its next
    /// request) goes out in the order of any other: the response first, unless the
    /// request's frame is under way, then that frame first; in pieces of any size.
    #[test]
    fn one_run_of_each_flow_goes_in_order() {
        let req = |psn| Frame::Write {
            psn,
            len: 8,
            addr: 0,
            rkey: 5,
            imm: None,
            solicited: false,
            ack_req: false,
        };
        let (w, a) = (0x11, 0x20);
        for budget in 1..=64 {
            // Both requests queued (one run), then the ACK: it goes first.
            let mut q = TxQueue::new();
            for psn in [1, 2] {
                q.push_frame(&req(psn));
                q.push_bytes(&[psn as u8; 8]);
            }
            q.push_frame(&Frame::Ack { psn: 7 });
            let mut wire = Vec::new();
            while !q.is_empty() {
                let n = q
                    .write_at_most(&mut crate::io::ToWrite(&mut wire), budget)
                    .unwrap();
                assert!(n > 0 && n <= budget, "{n} bytes in a call of budget {budget}");
            }
            assert_eq!(frames(&wire), [(a, 7), (w, 1), (w, 2)], "budget {budget}");
            assert_eq!(q.unsent_replies(), 0);
            // A request under way when the ACK comes: it is finished first.
            for started in [1, 5, 20] {
                let mut q = TxQueue::new();
                q.push_frame(&req(1));
                q.push_bytes(&[1; 8]);
                let mut wire = Vec::new();
                q.write_at_most(&mut crate::io::ToWrite(&mut wire), started)
                    .unwrap();
                q.push_frame(&Frame::Ack { psn: 7 });
                while !q.is_empty() {
                    q.write_at_most(&mut crate::io::ToWrite(&mut wire), budget)
                        .unwrap();
                }
                assert_eq!(
                    frames(&wire),
                    [(w, 1), (a, 7)],
                    "budget {budget}, {started} first"
                );
                let ack = {
                    let mut t = TxQueue::new();
                    t.push_frame(&Frame::Ack { psn: 7 });
                    t.pending()
                };
                let end = wire.len() - ack;
                assert_eq!(&wire[end - 8..end], &[1; 8], "the request's payload");
            }
        }
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
