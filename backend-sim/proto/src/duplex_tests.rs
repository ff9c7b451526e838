//! Two RC QPs, each with both halves, sending to each other at once over an in-memory
//! stream of bounded capacity (a socket's buffer), composed by [`Connection`] as the
//! driver composes them: what one side's requests and the other side's answers do to
//! each other on the one stream they share.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use verbs_api::timers::local_ack_timeout;
use verbs_api::{AccessFlags, QpCap, SendWr, Sge, WorkCompletion};

use crate::connection::{AckPolicy, Connection};
use crate::engine::Sides;
use crate::faults::ForcedRnr;
use crate::io::{RawSlice, Recv, Transmit};
use crate::memory::{MrShared, MrTable};
use crate::requester::{ReqAttrs, Requester};
use crate::responder::{RespAttrs, Responder};
use crate::rx::Reader;
use crate::tx::WRITE_BUDGET;

const PD: u32 = 1;

/// One direction of the stream: at most `cap` bytes in flight.
struct Pipe {
    bytes: VecDeque<u8>,
    cap: usize,
}

impl Transmit for Pipe {
    unsafe fn transmit(&mut self, iov: &[RawSlice]) -> io::Result<usize> {
        let mut n = 0;
        for r in iov {
            let take = r.len.min(self.cap - self.bytes.len());
            // SAFETY: the caller guarantees each run is readable for the call.
            let run = unsafe { std::slice::from_raw_parts(r.base, take) };
            self.bytes.extend(run);
            n += take;
            if take < r.len {
                break;
            }
        }
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }
}

impl Recv for Pipe {
    unsafe fn recv(&mut self, dst: *mut u8, len: usize) -> io::Result<usize> {
        if self.bytes.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = len.min(self.bytes.len());
        for (i, b) in self.bytes.drain(..n).enumerate() {
            // SAFETY: the caller guarantees `dst` is writable for `len >= n` bytes.
            unsafe { dst.add(i).write(b) };
        }
        Ok(n)
    }
}

/// One QP and its end of the stream.
struct Side {
    mrs: MrTable,
    req: Requester,
    resp: Responder,
    wire: Connection,
    send_wc: Vec<WorkCompletion>,
    recv_wc: Vec<(WorkCompletion, bool)>,
    /// Bytes read from the stream so far.
    read: usize,
    /// Who services this end (the progress thread unless a test says otherwise).
    policy: AckPolicy,
}

impl Side {
    fn new(qpn: u32, peer: u32) -> Side {
        let cap = QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut req = Requester::new(qpn, PD, &cap, true);
        req.dest_qpn = peer;
        req.connect(ReqAttrs {
            sq_psn: 0,
            timeout: local_ack_timeout(14),
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        });
        let mut resp = Responder::new(qpn, PD, 64, 1);
        resp.connect(RespAttrs {
            rq_psn: 0,
            min_rnr_timer: 1,
        });
        resp.access = AccessFlags::REMOTE;
        Side {
            mrs: MrTable::default(),
            req,
            resp,
            wire: Connection::new(Reader::new()),
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
            read: 0,
            policy: AckPolicy::Stream,
        }
    }

    fn mr(&self, len: usize) -> Arc<MrShared> {
        let key = self.mrs.fresh_key(crate::memory::test_draw);
        let m = Arc::new(MrShared::new_owned(PD, key, len, AccessFlags::ALL).unwrap());
        self.mrs.insert(m.clone());
        m
    }

    /// One round as the progress thread runs it: read what the stream has, process it,
    /// build requests, write what the stream takes.
    fn round(&mut self, inbound: &mut Pipe, outbound: &mut Pipe, now: Instant) {
        let read = match self.wire.fill(inbound) {
            Ok(n) => {
                self.read += n;
                true
            }
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                false
            }
        };
        let mut sides = Sides {
            req: Some(&mut self.req),
            resp: Some(&mut self.resp),
            accepting: true,
            send_wc: &mut self.send_wc,
            recv_wc: &mut self.recv_wc,
            forced_rnr: &mut ForcedRnr::default(),
        };
        self.wire
            .receive(&mut sides, &self.mrs, now, self.policy)
            .unwrap();
        self.wire
            .transmit(&mut self.req, &mut self.resp, &self.mrs, now, &mut self.send_wc)
            .unwrap();
        self.wire.end_round(&mut self.resp, self.policy);
        if self.policy == AckPolicy::Delay && !read {
            // An application thread leaves the connection once it finds nothing more,
            // and its next poll sends the ACK it left for later.
            self.resp.flush_ack(&mut self.wire.tx);
        }
        if self.wire.write_due(read) {
            if let Err(e) = self.wire.write_to(outbound) {
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
            }
        }
    }
}

/// A posts `a_wrs` and B `b_wrs` WRITEs of `len` bytes to each other, A's end
/// serviced as `a_policy` says, and the two streams (each holding at most `cap` bytes)
/// run until all complete. Returns, for each side that sent any, how many bytes each
/// side had read (A's, B's) when its first WRITE completed.
fn exchange(
    len: usize,
    [a_wrs, b_wrs]: [u64; 2],
    cap: usize,
    a_policy: AckPolicy,
) -> [Option<[usize; 2]>; 2] {
    let mut a = Side::new(1, 2);
    let mut b = Side::new(2, 1);
    a.policy = a_policy;
    let (a_src, a_dst) = (a.mr(len), a.mr(len));
    let (b_src, b_dst) = (b.mr(len), b.mr(len));
    for (me, src, dst, wrs) in [(&mut a, &a_src, &b_dst, a_wrs), (&mut b, &b_src, &a_dst, b_wrs)] {
        for id in 0..wrs {
            let sge = [Sge::new(src.addr(), len as u32, src.key)];
            let wr = SendWr::write(id, &sge, (dst.addr(), dst.key));
            me.req.post(&wr, &me.mrs).unwrap();
        }
    }
    let mut a2b = Pipe {
        bytes: VecDeque::new(),
        cap,
    };
    let mut b2a = Pipe {
        bytes: VecDeque::new(),
        cap,
    };
    let now = Instant::now();
    // Both sides start writing at once, before either has anything to read.
    let mut nothing = Pipe {
        bytes: VecDeque::new(),
        cap: 0,
    };
    a.round(&mut nothing, &mut a2b, now);
    b.round(&mut nothing, &mut b2a, now);
    let mut first_done = [None, None];
    let all = (a_wrs + b_wrs) as usize;
    for _ in 0..100_000 {
        a.round(&mut b2a, &mut a2b, now);
        b.round(&mut a2b, &mut b2a, now);
        for (i, s) in [&a, &b].into_iter().enumerate() {
            if first_done[i].is_none() && !s.send_wc.is_empty() {
                first_done[i] = Some([a.read, b.read]);
            }
        }
        if a.send_wc.len() + b.send_wc.len() == all {
            break;
        }
    }
    assert_eq!(a.send_wc.len() + b.send_wc.len(), all, "not all WRITEs completed");
    assert!(a.send_wc.iter().chain(&b.send_wc).all(|w| w.is_ok()));
    first_done
}

/// [`exchange`] with `wrs` WRITEs each way, both ends serviced by the progress thread:
/// how many of the peer's bytes each side had read when its first WRITE completed.
fn writes_both_ways(len: usize, wrs: u64, cap: usize) -> [usize; 2] {
    let [a, b] = exchange(len, [wrs, wrs], cap, AckPolicy::Stream).map(Option::unwrap);
    [a[0], b[1]]
}

/// An ACK does not wait behind the other direction's data: with both QPs' send queues
/// full of 1 MiB WRITEs, the first WRITE of each completes after about two of the peer's
/// WRITEs came the other way (the one that crossed it, and the one under way when its
/// ACK was queued), not after the peer's whole queue. (`ib_write_bw -b -q 2 -s 1M`
/// spent up to 6 of 7 retries on local ACK timeouts: each ACK left after the 128 MiB its
/// side had queued before it.)
#[test]
fn an_ack_passes_the_writes_queued_before_it() {
    const LEN: usize = 1 << 20;
    let first_done = writes_both_ways(LEN, 16, 256 << 10);
    for (side, read) in ["A", "B"].iter().zip(first_done) {
        // Two WRITEs, their headers and the ACK, and what the stream held.
        assert!(
            read < 2 * LEN + (256 << 10),
            "{side} read {read} bytes of the peer's WRITEs before its first WRITE completed"
        );
    }
}

/// Nor behind a second write's worth of the other direction's data: with a stream that
/// holds 32 MiB (a socket's receive queue once autotuned), each side's first WRITE
/// completes once it has read what the peer wrote before reading that WRITE (one write
/// of at most `WRITE_BUDGET`, and the frame it ended in), because the peer reads a
/// budget's worth between its writes and its ACK leaves first in the next one. A round
/// reads one frame header or one payload segment and may write a whole budget: writing
/// every round put another budget ahead of each ACK, and under `ib_write_bw -b` left
/// 20-30 MB unread in the receive queues.
#[test]
fn a_side_reads_a_write_budget_between_its_writes() {
    const LEN: usize = 1 << 20;
    let first_done = writes_both_ways(LEN, 32, 32 << 20);
    for (side, read) in ["A", "B"].iter().zip(first_done) {
        assert!(
            read <= WRITE_BUDGET + LEN + 4096,
            "{side} read {read} bytes of the peer's WRITEs before its first WRITE completed"
        );
    }
}

/// An application thread that drives progress and stays in its connection while the
/// peer's WRITEs keep coming acknowledges them as they come, not only once the stream
/// pauses: with the peer's whole send queue on its way, its first WRITE completes once a
/// write budget's worth has been read, not after all of it (the delayed ACK, meant for a
/// ping-pong, left a streaming peer's requester without an ACK for seconds, and its
/// local ACK timer fired whenever its socket was full for 67 ms).
#[test]
fn a_driving_thread_in_a_stream_acknowledges_as_it_goes() {
    const LEN: usize = 1 << 20;
    const WRS: u64 = 32;
    let [_, b_first] = exchange(LEN, [0, WRS], 64 << 20, AckPolicy::Delay);
    let [read, _] = b_first.unwrap();
    assert!(
        read <= WRITE_BUDGET + 2 * LEN,
        "the driving thread had read {read} bytes when the peer's first WRITE completed"
    );
}

/// A ping-pong's ACK still waits for the driving thread's next post, to leave with its
/// next request: one WRITE of 64 KiB that asks for an ACK, whose last read (straight
/// into the region) got all it asked for, so that the reader cannot tell the stream is
/// drained, leaves the ACK owed and nothing written. (Sent alone, the ACK reached the
/// peer before the answer and let it stop polling: each iteration of
/// `ib_write_lat -s 32768` then waited for the peer's progress thread, 90 us instead of
/// 10.)
#[test]
fn a_driving_threads_ack_for_a_single_request_waits_for_its_next_post() {
    const LEN: usize = 64 << 10;
    let mut a = Side::new(1, 2);
    let mut b = Side::new(2, 1);
    let dst = a.mr(LEN);
    let src = b.mr(LEN);
    let sge = [Sge::new(src.addr(), LEN as u32, src.key)];
    b.req
        .post(&SendWr::write(1, &sge, (dst.addr(), dst.key)).signaled(), &b.mrs)
        .unwrap();
    let mut b2a = Pipe {
        bytes: VecDeque::new(),
        cap: 1 << 20,
    };
    let mut a2b = Pipe {
        bytes: VecDeque::new(),
        cap: 1 << 20,
    };
    let now = Instant::now();
    b.round(&mut a2b, &mut b2a, now);
    while !b2a.bytes.is_empty() {
        a.wire.fill(&mut b2a).unwrap();
        let mut sides = Sides {
            req: Some(&mut a.req),
            resp: Some(&mut a.resp),
            accepting: true,
            send_wc: &mut a.send_wc,
            recv_wc: &mut a.recv_wc,
            forced_rnr: &mut ForcedRnr::default(),
        };
        a.wire.receive(&mut sides, &a.mrs, now, AckPolicy::Delay).unwrap();
    }
    assert!(!a.wire.reader.drained(), "the last read was not a short one");
    assert!(a.resp.owes_ack() && a.resp.ack_asked());
    assert!(a.wire.tx.is_empty(), "the ACK left before the next post");
}

/// With a path MTU set, a message takes a PSN per packet (IBA 9.7.1): a WRITE of 4 KiB
/// at 1 KiB four, a SEND of 1500 bytes two, a READ of 3000 bytes the three of its
/// response, an atomic one; the responder expects the PSN after all of them, and every
/// request completes. Without the MTU each took one, as the sim counted before.
#[test]
fn a_message_takes_a_psn_per_packet_of_the_path_mtu() {
    let mut a = Side::new(1, 2);
    let mut b = Side::new(2, 1);
    for s in [&mut a, &mut b] {
        s.req.set_path_mtu(1024);
        s.resp.set_path_mtu(1024);
        s.resp.max_dest_rd_atomic = 1;
    }
    let src = a.mr(8192);
    let dst = b.mr(8192);
    let sge = |mr: &Arc<MrShared>, off: usize, len: u32| Sge::new(mr.addr() + off as u64, len, mr.key);
    b.resp
        .post(&verbs_api::RecvWr::new(9, &[sge(&dst, 4096, 2048)]))
        .unwrap();
    let sges = [
        sge(&src, 0, 4096),
        sge(&src, 0, 1500),
        sge(&src, 0, 3000),
        sge(&src, 4096, 8),
    ];
    let wrs = [
        SendWr::write(1, &sges[0..1], (dst.addr(), dst.key)).signaled(),
        SendWr::send(2, &sges[1..2]).signaled(),
        SendWr::read(3, &sges[2..3], (dst.addr(), dst.key)).signaled(),
        SendWr::fetch_and_add(4, &sges[3..4], (dst.addr() + 8000, dst.key), 1).signaled(),
    ];
    for wr in &wrs {
        a.req.post(wr, &a.mrs).unwrap();
    }
    let mut a2b = Pipe {
        bytes: VecDeque::new(),
        cap: 1 << 20,
    };
    let mut b2a = Pipe {
        bytes: VecDeque::new(),
        cap: 1 << 20,
    };
    let now = Instant::now();
    for _ in 0..1000 {
        a.round(&mut b2a, &mut a2b, now);
        b.round(&mut a2b, &mut b2a, now);
        if a.send_wc.len() == 4 {
            break;
        }
    }
    assert_eq!(a.send_wc.len(), 4, "every request completes");
    assert!(a.send_wc.iter().all(|w| w.is_ok()), "{:?}", a.send_wc);
    assert_eq!(a.req.next_psn(), 4 + 2 + 3 + 1);
    assert_eq!(b.resp.expected_psn(), 4 + 2 + 3 + 1);
    assert_eq!(b.recv_wc.len(), 1);
}

/// A requester keeps its outstanding PSNs within `PSN_WINDOW` of the oldest
/// unacknowledged one: at a path MTU of 1 byte a WRITE of 4 MiB takes 2^22 PSNs, so the
/// second of two waits for the first's ACK, then both complete.
#[test]
fn outstanding_psns_stay_within_the_window() {
    const LEN: usize = 4 << 20;
    let mut a = Side::new(1, 2);
    let mut b = Side::new(2, 1);
    a.req.set_path_mtu(1);
    b.resp.set_path_mtu(1);
    let src = a.mr(LEN);
    let dst = b.mr(LEN);
    let sge = [Sge::new(src.addr(), LEN as u32, src.key)];
    for id in 0..2 {
        a.req
            .post(&SendWr::write(id, &sge, (dst.addr(), dst.key)).signaled(), &a.mrs)
            .unwrap();
    }
    let mut a2b = Pipe {
        bytes: VecDeque::new(),
        cap: 16 << 20,
    };
    let mut b2a = Pipe {
        bytes: VecDeque::new(),
        cap: 16 << 20,
    };
    let now = Instant::now();
    let mut nothing = Pipe {
        bytes: VecDeque::new(),
        cap: 0,
    };
    a.round(&mut nothing, &mut a2b, now);
    assert_eq!(
        a.req.next_psn(),
        crate::requester::PSN_WINDOW,
        "only the first WRITE went"
    );
    for _ in 0..10_000 {
        b.round(&mut a2b, &mut b2a, now);
        a.round(&mut b2a, &mut a2b, now);
        if a.send_wc.len() == 2 {
            break;
        }
    }
    assert_eq!(a.send_wc.len(), 2);
    assert!(a.send_wc.iter().all(|w| w.is_ok()));
    assert_eq!(
        a.req.next_psn(),
        (2 * crate::requester::PSN_WINDOW) & verbs_api::PSN_MASK
    );
}
