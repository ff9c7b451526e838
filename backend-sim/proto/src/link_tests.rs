//! Deterministic tests of the sans-IO core: one QP's requester talks to another QP's
//! responder through an in-memory link (the same [`engine`](crate::engine) the TCP
//! transport uses), with time passed in by hand. Exact RNR timing, transport retries,
//! duplicate detection, a random-operation model check, and hostile frames.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use verbs_api::timers::{local_ack_timeout, rnr_timer};
use verbs_api::{AccessFlags, QpCap, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

use crate::engine::{drive, DriveState, Sides, Stop};
use crate::faults::ForcedRnr;
use crate::memory::{MrShared, MrTable};
use crate::requester::{ReqAttrs, Requester};
use crate::responder::{RespAttrs, Responder};
use crate::rx::Reader;
use crate::tx::TxQueue;

mod fast_path;

const PD: u32 = 1;

struct Link {
    a_mrs: MrTable,
    b_mrs: MrTable,
    req: Requester,
    resp: Responder,
    a2b: TxQueue,
    b2a: TxQueue,
    rx_b: Reader,
    rx_a: Reader,
    st_a: DriveState,
    st_b: DriveState,
    now: Instant,
    send_wc: Vec<WorkCompletion>,
    recv_wc: Vec<(WorkCompletion, bool)>,
    a_err: bool,
    b_err: bool,
    /// While set, requests vanish on the way (a stalled or unreachable responder).
    drop_requests: bool,
    /// While set, responses vanish on the way.
    drop_responses: bool,
    /// Request bytes sent so far.
    sent_bytes: usize,
    /// Requests B answers with RNR whatever its receive queue holds (fault injection).
    forced_rnr: ForcedRnr,
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

impl Link {
    fn new(rnr_retry: u8, retry_cnt: u8, timeout: u8, min_rnr_timer: u8) -> Link {
        let mut req = Requester::new(1, PD, &cap(), false);
        req.dest_qpn = 2;
        req.connect(ReqAttrs {
            sq_psn: 100,
            timeout: local_ack_timeout(timeout),
            retry_cnt,
            rnr_retry,
            max_rd_atomic: 4,
        });
        let mut resp = Responder::new(2, PD, 256, 4);
        resp.connect(RespAttrs {
            rq_psn: 100,
            min_rnr_timer,
        });
        resp.access = AccessFlags::REMOTE;
        resp.max_dest_rd_atomic = 16;
        Link {
            a_mrs: MrTable::default(),
            b_mrs: MrTable::default(),
            req,
            resp,
            a2b: TxQueue::new(),
            b2a: TxQueue::new(),
            rx_b: Reader::new(),
            rx_a: Reader::new(),
            st_a: DriveState::default(),
            st_b: DriveState::default(),
            now: Instant::now(),
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
            a_err: false,
            b_err: false,
            drop_requests: false,
            drop_responses: false,
            sent_bytes: 0,
            forced_rnr: ForcedRnr::NONE,
        }
    }

    fn mr(table: &MrTable, len: usize) -> Arc<MrShared> {
        let m = Arc::new(
            MrShared::new_owned(
                PD,
                table.fresh_key(crate::memory::test_draw),
                len,
                AccessFlags::ALL,
            )
            .unwrap(),
        );
        table.insert(m.clone());
        m
    }

    fn a_err(&mut self) {
        self.a_err = true;
        self.req.flush(&mut self.send_wc);
    }

    fn b_err(&mut self) {
        self.b_err = true;
        self.resp.flush(&mut self.recv_wc);
    }

    /// B's responder over the bytes it has.
    fn drive_b(&mut self) -> Result<(), Stop> {
        let mut swc = Vec::new();
        let mut sides = Sides {
            req: None,
            resp: Some(&mut self.resp),
            accepting: !self.b_err,
            send_wc: &mut swc,
            recv_wc: &mut self.recv_wc,
            forced_rnr: &mut self.forced_rnr,
        };
        drive(
            &mut sides,
            &mut self.rx_b,
            &self.b_mrs,
            &mut self.b2a,
            self.now,
            &mut self.st_b,
            usize::MAX,
            0,
        )
    }

    /// A's requester over the bytes it has.
    fn drive_a(&mut self) -> Result<(), Stop> {
        let mut rwc = Vec::new();
        let mut sides = Sides {
            req: Some(&mut self.req),
            resp: None,
            accepting: false,
            send_wc: &mut self.send_wc,
            recv_wc: &mut rwc,
            forced_rnr: &mut ForcedRnr::default(),
        };
        drive(
            &mut sides,
            &mut self.rx_a,
            &self.a_mrs,
            &mut self.b2a,
            self.now,
            &mut self.st_a,
            usize::MAX,
            0,
        )
    }

    /// Moves bytes both ways until nothing moves.
    fn pump(&mut self) {
        loop {
            if !self.a_err
                && self
                    .req
                    .poll_transmit(&self.a_mrs, self.now, &mut self.a2b, 64, &mut self.send_wc)
                    .is_err()
            {
                self.a_err();
            }
            let mut moved = false;
            let mut bytes = Vec::new();
            self.a2b.drain_into(&mut bytes);
            if !bytes.is_empty() {
                moved = true;
                self.sent_bytes += bytes.len();
            }
            if !self.drop_requests {
                let mut off = 0;
                loop {
                    off += self.rx_b.feed(&bytes[off..]);
                    loop {
                        match self.drive_b() {
                            Ok(()) => break,
                            Err(Stop::Fatal(_)) => self.b_err(),
                            Err(Stop::Protocol(m)) => panic!("protocol error on a well-behaved link: {m}"),
                        }
                    }
                    if off == bytes.len() {
                        break;
                    }
                }
            }
            let mut back = Vec::new();
            self.b2a.drain_into(&mut back);
            if !back.is_empty() {
                moved = true;
            }
            if !self.drop_responses {
                let mut off = 0;
                loop {
                    off += self.rx_a.feed(&back[off..]);
                    if !self.a_err {
                        match self.drive_a() {
                            Ok(()) => {}
                            Err(Stop::Fatal(_)) => self.a_err(),
                            Err(Stop::Protocol(m)) => panic!("protocol error on a well-behaved link: {m}"),
                        }
                    }
                    if off == back.len() {
                        break;
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Moves the clock to `t` and runs the requester's timers.
    fn at(&mut self, t: Instant) {
        self.now = t;
        if !self.a_err && self.req.on_timer(t, None, None, &mut self.send_wc).is_err() {
            self.a_err();
        }
        self.pump();
    }

    /// Builds the requests that may go now and returns their bytes (not delivered).
    fn transmit(&mut self) -> Vec<u8> {
        self.req
            .poll_transmit(&self.a_mrs, self.now, &mut self.a2b, 64, &mut self.send_wc)
            .unwrap();
        let mut bytes = Vec::new();
        self.a2b.drain_into(&mut bytes);
        bytes
    }

    fn take_send(&mut self) -> Vec<WorkCompletion> {
        std::mem::take(&mut self.send_wc)
    }

    fn take_recv(&mut self) -> Vec<WorkCompletion> {
        std::mem::take(&mut self.recv_wc)
            .into_iter()
            .map(|(w, _)| w)
            .collect()
    }
}

fn sge(m: &MrShared, off: usize, len: usize) -> Sge {
    Sge::new(m.addr() + off as u64, len as u32, m.key)
}

/// Copies `data` into `m` at `at` (what the application, or an earlier transfer, put there).
fn put(m: &Arc<MrShared>, at: usize, data: &[u8]) {
    crate::memory::Seg {
        mr: m.clone(),
        offset: at,
        len: data.len(),
    }
    .copy_in(0, data);
}

/// Copies `out.len()` bytes of `m` at `at` into `out`.
fn get(m: &Arc<MrShared>, at: usize, out: &mut [u8]) {
    crate::memory::Seg {
        mr: m.clone(),
        offset: at,
        len: out.len(),
    }
    .copy_out(0, out);
}

/// (wr_id, status) of each completion, in order.
fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn rnr_waits_exactly_the_timer_and_counts_retries() {
    let timer = 14; // 1.28 ms
    let mut l = Link::new(2, 7, 14, timer);
    let src = Link::mr(&l.a_mrs, 64);
    l.req
        .post(&SendWr::send(7, &[sge(&src, 0, 8)]).signaled(), &l.a_mrs)
        .unwrap();
    let t0 = l.now;
    l.pump();
    let first = l.sent_bytes;
    assert!(first > 0);
    assert!(l.take_send().is_empty(), "RNR NAK: no completion yet");
    // Just before the timer: nothing is resent.
    l.at(t0 + rnr_timer(timer) - Duration::from_nanos(1));
    assert_eq!(l.sent_bytes, first, "resent before min_rnr_timer elapsed");
    // At the timer: resent, refused again (retry 1 of 2).
    l.at(t0 + rnr_timer(timer));
    assert_eq!(l.sent_bytes, 2 * first);
    assert!(l.take_send().is_empty());
    // Retry 2 of 2 is refused too: rnr_retry = 2 allows three attempts in all.
    l.at(t0 + rnr_timer(timer) * 2 - Duration::from_nanos(1));
    assert_eq!(l.sent_bytes, 2 * first, "resent before min_rnr_timer elapsed");
    l.at(t0 + rnr_timer(timer) * 2);
    assert_eq!(l.sent_bytes, 3 * first);
    let wc = l.take_send();
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::RnrRetryExcErr));
    assert!(l.a_err);
    l.at(t0 + rnr_timer(timer) * 10);
    assert_eq!(l.sent_bytes, 3 * first, "nothing is sent after the error");
}

#[test]
fn receive_posted_during_rnr_wait_lets_the_send_through() {
    let mut l = Link::new(7, 7, 14, 1);
    let src = Link::mr(&l.a_mrs, 64);
    let dst = Link::mr(&l.b_mrs, 64);
    put(&src, 0, b"hello");
    l.req
        .post(&SendWr::send(1, &[sge(&src, 0, 5)]).signaled(), &l.a_mrs)
        .unwrap();
    l.pump();
    for k in 1..50 {
        l.at(l.now + rnr_timer(1));
        assert!(l.take_send().is_empty(), "completed during RNR wait {k}");
    }
    l.resp.post(&RecvWr::new(9, &[sge(&dst, 0, 64)])).unwrap();
    l.at(l.now + rnr_timer(1));
    let s = l.take_send();
    let r = l.take_recv();
    assert_eq!((s.len(), s[0].status), (1, WcStatus::Success));
    assert_eq!((r[0].wr_id, r[0].byte_len, r[0].opcode), (9, 5, WcOpcode::Recv));
    let mut got = [0u8; 5];
    get(&dst, 0, &mut got);
    assert_eq!(&got, b"hello");
}

#[test]
fn silent_responder_exhausts_retry_cnt_after_exactly_retry_cnt_resends() {
    let mut l = Link::new(7, 3, 10, 1);
    let src = Link::mr(&l.a_mrs, 64);
    let dst = Link::mr(&l.b_mrs, 64);
    l.drop_requests = true;
    l.req
        .post(
            &SendWr::write(1, &[sge(&src, 0, 8)], (dst.addr(), dst.key)).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    l.pump();
    let one = l.sent_bytes;
    let timeout = local_ack_timeout(10).unwrap();
    let t0 = l.now;
    for k in 1..=3u32 {
        l.at(t0 + timeout * k - Duration::from_nanos(1));
        assert_eq!(l.sent_bytes, one * k as usize, "resent before the timeout");
        l.at(t0 + timeout * k);
        assert_eq!(l.sent_bytes, one * (k as usize + 1), "resend {k}");
        assert!(l.take_send().is_empty());
    }
    l.at(t0 + timeout * 4);
    let wc = l.take_send();
    assert_eq!((wc.len(), wc[0].status), (1, WcStatus::RetryExcErr));
}

#[test]
fn duplicates_are_not_executed_twice() {
    // Responses are lost: the requester resends the FETCH_AND_ADD and the WRITE; the
    // responder must answer from its replay state, not add twice.
    let mut l = Link::new(7, 7, 10, 1);
    let res = Link::mr(&l.a_mrs, 64);
    let word = Link::mr(&l.b_mrs, 64);
    l.drop_responses = true;
    l.req
        .post(
            &SendWr::fetch_and_add(1, &[sge(&res, 0, 8)], (word.addr(), word.key), 5).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    l.req
        .post(
            &SendWr::write(2, &[sge(&res, 8, 8)], (word.addr() + 8, word.key)).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    l.pump();
    l.drop_responses = false;
    l.at(l.now + local_ack_timeout(10).unwrap());
    let wc = l.take_send();
    assert_eq!(statuses(&wc), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    let v = crate::memory::Seg {
        mr: word,
        offset: 0,
        len: 8,
    }
    .atomic(|a| a.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(v, Some(5), "the add ran once");
    let mut old = [0u8; 8];
    get(&res, 0, &mut old);
    assert_eq!(
        u64::from_ne_bytes(old),
        0,
        "the old value of the first (and only) add"
    );
}

#[test]
fn psn_ahead_of_the_responder_ends_in_retry_exceeded() {
    // A requester that starts at a PSN the responder does not expect (a bad out-of-band
    // exchange) is NAKed with a sequence error and, unable to resend from that PSN, runs
    // into its transport retries.
    let mut l = Link::new(7, 2, 10, 1);
    l.resp.connect(RespAttrs {
        rq_psn: 90,
        min_rnr_timer: 1,
    });
    let src = Link::mr(&l.a_mrs, 64);
    let dst = Link::mr(&l.b_mrs, 64);
    l.req
        .post(
            &SendWr::write(1, &[sge(&src, 0, 8)], (dst.addr(), dst.key)).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    l.pump();
    let t = local_ack_timeout(10).unwrap();
    for k in 1..=3 {
        l.at(l.now + t);
        if k < 3 {
            assert!(l.take_send().is_empty());
        }
    }
    let wc = l.take_send();
    assert_eq!(wc[0].status, WcStatus::RetryExcErr);
}

#[test]
fn connection_lost_mid_payload_is_resent_and_delivered_once() {
    let mut l = Link::new(7, 7, 10, 1);
    let src = Link::mr(&l.a_mrs, 8192);
    let dst = Link::mr(&l.b_mrs, 8192);
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
    put(&src, 0, &data);
    l.resp.post(&RecvWr::new(9, &[sge(&dst, 0, 8192)])).unwrap();
    l.req
        .post(&SendWr::send(1, &[sge(&src, 0, 5000)]).signaled(), &l.a_mrs)
        .unwrap();
    // Deliver only the header and part of the payload, then break the connection.
    let bytes = l.transmit();
    l.rx_b.feed(&bytes[..2000]);
    l.drive_b().unwrap();
    assert!(l.take_recv().is_empty());
    l.resp.connection_lost();
    l.rx_b = Reader::new();
    l.req.on_connection_lost();
    // Reconnected: the requester resends; the receive is still there and is used once.
    l.pump();
    let s = l.take_send();
    let r = l.take_recv();
    assert_eq!((s.len(), s[0].status), (1, WcStatus::Success));
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].status),
        (9, 5000, WcStatus::Success)
    );
    let mut got = vec![0u8; 5000];
    get(&dst, 0, &mut got);
    assert!(got == data);
}

#[test]
fn forced_rnr_answers_rnr_despite_posted_receives() {
    let mut l = Link::new(7, 7, 10, 1);
    let src = Link::mr(&l.a_mrs, 64);
    let dst = Link::mr(&l.b_mrs, 64);
    l.resp.post(&RecvWr::new(9, &[sge(&dst, 0, 64)])).unwrap();
    l.forced_rnr = ForcedRnr::next(2);
    l.req
        .post(&SendWr::send(1, &[sge(&src, 0, 8)]).signaled(), &l.a_mrs)
        .unwrap();
    l.pump();
    let first = l.sent_bytes;
    l.at(l.now + rnr_timer(1));
    assert_eq!(l.sent_bytes, 2 * first);
    assert!(l.take_send().is_empty(), "still refused");
    l.at(l.now + rnr_timer(1));
    let s = l.take_send();
    assert_eq!(
        (s.len(), s[0].status),
        (1, WcStatus::Success),
        "third attempt goes through"
    );
    assert_eq!(l.take_recv().len(), 1);
}

/// Feeds `bytes` to B's responder, as the engine does (a fatal error moves B to ERR and
/// the rest of the stream is still consumed).
fn feed_b(l: &mut Link, bytes: &[u8]) {
    let mut off = 0;
    loop {
        off += l.rx_b.feed(&bytes[off..]);
        loop {
            match l.drive_b() {
                Ok(()) => break,
                Err(Stop::Fatal(_)) => l.b_err(),
                Err(Stop::Protocol(m)) => panic!("protocol error: {m}"),
            }
        }
        if off == bytes.len() {
            return;
        }
    }
}

/// Feeds `bytes` to A's requester.
fn feed_a(l: &mut Link, bytes: &[u8]) {
    let mut off = 0;
    loop {
        off += l.rx_a.feed(&bytes[off..]);
        loop {
            match l.drive_a() {
                Ok(()) => break,
                Err(Stop::Fatal(_)) => l.a_err(),
                Err(Stop::Protocol(m)) => panic!("protocol error: {m}"),
            }
        }
        if off == bytes.len() {
            return;
        }
    }
}

/// The bytes of a region, read directly (the tests own it; no copy is in progress).
fn bytes_of(m: &MrShared) -> Vec<u8> {
    // SAFETY: the region's buffer stays allocated while `m` lives (even after `kill`),
    // and nothing else accesses it during the test.
    unsafe { std::slice::from_raw_parts(m.base(), m.len()) }.to_vec()
}

/// Found by `tests/lifetime.rs`: the responder QP was destroyed mid-burst, and the
/// requester, whose peer is the side that sets the connection up, was left without one.
/// After the first ACK timeout nothing re-armed the timer (no resend, no connection
/// attempt), so the outstanding WRs never completed. The timer now keeps running while
/// anything is outstanding: `retry_cnt` timeouts later the oldest WR fails with
/// `RETRY_EXC_ERR` and the rest are flushed.
#[test]
fn requester_cut_off_from_its_peer_gives_up_after_retry_cnt() {
    let mut l = Link::new(7, 2, 10, 1);
    let src = Link::mr(&l.a_mrs, 64);
    let dst = Link::mr(&l.b_mrs, 64);
    for id in 1..=2 {
        l.req
            .post(
                &SendWr::write(id, &[sge(&src, 0, 8)], (dst.addr(), dst.key)).signaled(),
                &l.a_mrs,
            )
            .unwrap();
    }
    l.req
        .poll_transmit(&l.a_mrs, l.now, &mut l.a2b, 64, &mut l.send_wc)
        .unwrap();
    // The connection breaks before anything arrives, and nobody sets it up again.
    l.req.on_connection_lost();
    let t0 = l.now;
    let mut timeouts = 0u32;
    while !l.a_err {
        let at = l
            .req
            .next_deadline()
            .unwrap_or_else(|| panic!("no timer armed after {timeouts} timeouts: the WRs never complete"));
        l.now = at;
        timeouts += 1;
        if l.req.on_timer(at, None, None, &mut l.send_wc).is_err() {
            l.a_err();
        }
        assert!(timeouts <= 10, "still waiting after {timeouts} timeouts");
    }
    assert_eq!(timeouts, 3, "the first timeout and retry_cnt = 2 more");
    assert!(l.now - t0 <= local_ack_timeout(10).unwrap() * 3);
    let s = l.take_send();
    assert_eq!(
        statuses(&s),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
}

/// Found by `tests/lifetime.rs`: a WRITE whose target region was deregistered while its
/// payload arrived dropped the rest of the payload and was still acknowledged, so the
/// requester saw SUCCESS for data that never landed. It now fails as its later packets
/// would on an HCA: a remote access error NAK (`REM_ACCESS_ERR` at the requester, the
/// responder QP to ERR), and nothing is written after the deregistration.
#[test]
fn write_into_a_region_deregistered_mid_payload_fails() {
    const LEN: usize = 64 * 1024;
    let mut l = Link::new(7, 7, 10, 1);
    let src = Link::mr(&l.a_mrs, LEN);
    let dst = Link::mr(&l.b_mrs, LEN);
    put(&src, 0, &[0x5a; LEN]);
    l.req
        .post(
            &SendWr::write(1, &[sge(&src, 0, LEN)], (dst.addr(), dst.key)).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    l.req
        .post(
            &SendWr::write(2, &[sge(&src, 0, 8)], (dst.addr(), dst.key)).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    let bytes = l.transmit();
    let half = LEN / 2;
    feed_b(&mut l, &bytes[..half]);
    assert!(!l.b_err);
    // ibv_dereg_mr on the responder, halfway through the payload.
    l.b_mrs.remove(dst.key);
    dst.kill();
    feed_b(&mut l, &bytes[half..]);
    assert!(l.b_err, "the responder QP goes to ERR");
    l.pump();
    assert_eq!(
        statuses(&l.take_send()),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    let mem = bytes_of(&dst);
    assert!(mem[..1000].iter().all(|&b| b == 0x5a), "the start arrived before");
    assert!(
        mem[half..].iter().all(|&b| b == 0),
        "written after deregistration"
    );
}

/// Found by `tests/lifetime.rs`: a READ whose local sink was deregistered while the
/// response arrived completed with SUCCESS although its data was dropped. It now
/// completes with `LOC_PROT_ERR` (the rest flushed), and the sink is not written after
/// the deregistration.
#[test]
fn read_into_a_sink_deregistered_mid_payload_fails() {
    const LEN: usize = 64 * 1024;
    let mut l = Link::new(7, 7, 10, 1);
    let sink = Link::mr(&l.a_mrs, LEN);
    let remote = Link::mr(&l.b_mrs, LEN);
    put(&remote, 0, &[0x77; LEN]);
    for (id, len) in [(1, LEN), (2, 8)] {
        l.req
            .post(
                &SendWr::read(id, &[sge(&sink, 0, len)], (remote.addr(), remote.key)).signaled(),
                &l.a_mrs,
            )
            .unwrap();
    }
    let bytes = l.transmit();
    feed_b(&mut l, &bytes);
    let mut back = Vec::new();
    l.b2a.drain_into(&mut back);
    let half = LEN / 2;
    feed_a(&mut l, &back[..half]);
    assert!(l.send_wc.is_empty());
    l.a_mrs.remove(sink.key);
    sink.kill();
    feed_a(&mut l, &back[half..]);
    assert!(l.a_err);
    assert_eq!(
        statuses(&l.take_send()),
        [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    let mem = bytes_of(&sink);
    assert!(mem[..1000].iter().all(|&b| b == 0x77), "the start arrived before");
    assert!(
        mem[half..].iter().all(|&b| b == 0),
        "written after deregistration"
    );
}

/// Same for an atomic: the old value cannot land in a deregistered buffer, so the atomic
/// completes with `LOC_PROT_ERR` instead of SUCCESS.
#[test]
fn atomic_result_into_a_deregistered_buffer_fails() {
    let mut l = Link::new(7, 7, 10, 1);
    let res = Link::mr(&l.a_mrs, 8);
    let word = Link::mr(&l.b_mrs, 8);
    l.req
        .post(
            &SendWr::fetch_and_add(1, &[sge(&res, 0, 8)], (word.addr(), word.key), 5).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    let bytes = l.transmit();
    feed_b(&mut l, &bytes);
    let mut back = Vec::new();
    l.b2a.drain_into(&mut back);
    l.a_mrs.remove(res.key);
    res.kill();
    feed_a(&mut l, &back);
    assert_eq!(statuses(&l.take_send()), [(1, WcStatus::LocProtErr)]);
    assert!(l.a_err);
    assert_eq!(bytes_of(&res), [0; 8]);
}

/// One step of the random model check.
#[derive(Clone, Debug)]
enum Op {
    Send {
        len: usize,
    },
    Write {
        off: usize,
        len: usize,
        byte: u8,
    },
    Read {
        off: usize,
        len: usize,
    },
    Faa {
        add: u64,
    },
    Recv,
    Pump,
    Tick,
    /// The requests sent in the next pump vanish on the way.
    LoseRequests,
    /// The responses sent in the next pump vanish on the way.
    LoseResponses,
    /// The connection breaks: what the next pump sends either way is lost, and both
    /// sides learn it (the requester resends from its oldest unacknowledged WQE).
    LoseConnection,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..=256).prop_map(|len| Op::Send { len }),
        (0usize..3000, 0usize..1200, any::<u8>()).prop_map(|(off, len, byte)| Op::Write { off, len, byte }),
        (0usize..3000, 0usize..1200).prop_map(|(off, len)| Op::Read { off, len }),
        any::<u64>().prop_map(|add| Op::Faa { add }),
        Just(Op::Recv),
        Just(Op::Pump),
        Just(Op::Tick),
    ]
}

proptest! {
    /// Random posts, pumps and clock ticks against a sequential reference model of RC:
    /// every signaled WR completes exactly once and in order, SEND payloads land in the
    /// receives in order, remote memory ends up as the model says, READs and FAAs return
    /// what the model says at their position in the stream.
    #[test]
    fn random_operations_match_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        check_model(ops, None)?;
    }

    /// Hostile bytes at a responder: never a panic, never a byte written outside the one
    /// registered region (which sits inside guard zones of a larger buffer).
    #[test]
    fn hostile_bytes_stay_inside_registered_memory(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..256), 1..20)) {
        let mut backing = vec![0xeeu8; 3 * 4096];
        let table = MrTable::default();
        let key = table.fresh_key(crate::memory::test_draw);
        // SAFETY: `backing` outlives the region (killed below before the Vec drops).
        let mr = Arc::new(unsafe { MrShared::new_borrowed(PD, key, backing.as_mut_ptr().add(4096), 4096, AccessFlags::ALL) });
        table.insert(mr.clone());
        let mut resp = Responder::new(2, PD, 16, 4);
        resp.connect(RespAttrs { rq_psn: 0, min_rnr_timer: 1 });
        resp.access = AccessFlags::REMOTE;
        resp.max_dest_rd_atomic = 16;
        for _ in 0..4 { resp.post(&RecvWr::new(1, &[Sge::new(mr.addr(), 4096, key)])).unwrap(); }
        let mut rx = Reader::new();
        let mut tx = TxQueue::new();
        let mut out = Vec::new();
        let mut st = DriveState::default();
        let mut accepting = true;
        'outer: for c in chunks {
            // Mix in a plausible header now and then so that deeper paths are reached.
            let mut bytes = c;
            if bytes.first().is_some_and(|b| b % 3 == 0) {
                let f = crate::wire::Frame::Write { psn: 0, len: bytes.len() as u32, addr: mr.addr().wrapping_add(bytes[0] as u64 * 64), rkey: key, imm: None, solicited: false, ack_req: false };
                let mut h = [0u8; crate::wire::MAX_HDR_LEN];
                let n = f.encode(&mut h);
                let mut v = h[..n].to_vec();
                v.extend_from_slice(&bytes);
                bytes = v;
            }
            let mut off = 0;
            while off < bytes.len() {
                off += rx.feed(&bytes[off..]);
                let mut swc = Vec::new();
                let mut sides = Sides { req: None, resp: Some(&mut resp), accepting, send_wc: &mut swc, recv_wc: &mut out, forced_rnr: &mut ForcedRnr::default() };
                match drive(&mut sides, &mut rx, &table, &mut tx, Instant::now(), &mut st, usize::MAX, 0) {
                    Ok(()) => {}
                    Err(Stop::Fatal(_)) => accepting = false,
                    Err(Stop::Protocol(_)) => break 'outer,
                }
            }
            let mut sink = Vec::new();
            tx.drain_into(&mut sink);
        }
        mr.kill();
        prop_assert!(backing[..4096].iter().all(|&b| b == 0xee), "bytes before the region changed");
        prop_assert!(backing[8192..].iter().all(|&b| b == 0xee), "bytes after the region changed");
    }

    /// Any well-formed request frame with any fields, at a responder: never a panic, the
    /// guard zones stay intact.
    #[test]
    fn arbitrary_request_frames(frames in proptest::collection::vec(crate::wire::tests::arb_frame(), 1..20), payload in 0usize..600) {
        let mut backing = vec![0xeeu8; 3 * 4096];
        let table = MrTable::default();
        let key = table.fresh_key(crate::memory::test_draw);
        // SAFETY: as above.
        let mr = Arc::new(unsafe { MrShared::new_borrowed(PD, key, backing.as_mut_ptr().add(4096), 4096, AccessFlags::ALL) });
        table.insert(mr.clone());
        let mut resp = Responder::new(2, PD, 16, 4);
        resp.connect(RespAttrs { rq_psn: 0, min_rnr_timer: 1 });
        resp.access = AccessFlags::REMOTE;
        resp.max_dest_rd_atomic = 16;
        resp.post(&RecvWr::new(1, &[Sge::new(mr.addr(), 4096, key)])).unwrap();
        let mut rx = Reader::new();
        let mut tx = TxQueue::new();
        let mut out = Vec::new();
        let mut st = DriveState::default();
        let mut accepting = true;
        for f in frames {
            // Aim some frames at the region so the accept paths run too.
            let f = match f {
                crate::wire::Frame::Write { psn, imm, solicited, ack_req, .. } => crate::wire::Frame::Write { psn, len: payload as u32, addr: mr.addr() + (psn as u64 % 5000), rkey: key, imm, solicited, ack_req },
                crate::wire::Frame::Send { psn, imm, solicited, ack_req, .. } => crate::wire::Frame::Send { psn, len: payload as u32, imm, solicited, ack_req, inv: None },
                crate::wire::Frame::ReadResp { .. } => continue,
                other => other,
            };
            let mut h = [0u8; crate::wire::MAX_HDR_LEN];
            let n = f.encode(&mut h);
            let mut bytes = h[..n].to_vec();
            bytes.extend(std::iter::repeat_n(0x5a, f.payload_len() as usize));
            let mut off = 0;
            let mut stop = false;
            while off < bytes.len() {
                off += rx.feed(&bytes[off..]);
                let mut swc = Vec::new();
                let mut sides = Sides { req: None, resp: Some(&mut resp), accepting, send_wc: &mut swc, recv_wc: &mut out, forced_rnr: &mut ForcedRnr::default() };
                match drive(&mut sides, &mut rx, &table, &mut tx, Instant::now(), &mut st, usize::MAX, 0) {
                    Ok(()) => {}
                    Err(Stop::Fatal(_)) => accepting = false,
                    Err(Stop::Protocol(_)) => { stop = true; break; }
                }
            }
            if stop { break; }
            let mut sink = Vec::new();
            tx.drain_into(&mut sink);
        }
        mr.kill();
        prop_assert!(backing[..4096].iter().all(|&b| b == 0xee));
        prop_assert!(backing[8192..].iter().all(|&b| b == 0xee));
    }
}

/// A READ of the model check.
struct ModelRead {
    id: u64,
    /// Where it lands in the local region.
    at: usize,
    /// The model's bytes at its place in the stream.
    want: Vec<u8>,
    /// Its remote range.
    range: std::ops::Range<usize>,
    /// A WRITE or atomic posted after it changed that range.
    later: bool,
}

/// Runs the model check of `random_operations_match_the_model` over `ops`; with
/// `fast_path`, the requester's driver executes WRITEs, READs and atomics itself as the
/// bits of `fast_path` say ([`fast_path`]), and the ops may lose frames on the way.
fn check_model(ops: Vec<Op>, fast_path: Option<u64>) -> Result<(), TestCaseError> {
    let mut l = Link::new(7, 7, 10, 1);
    // Room for 60 WRITEs or READs of 1200 bytes each, one after the other.
    let local = Link::mr(&l.a_mrs, 128 * 1024);
    let remote = Link::mr(&l.b_mrs, 8 * 1024);
    if let Some(pattern) = fast_path {
        l.req
            .set_direct(Some(fast_path::InProcess::new(pattern, &remote)));
    }
    let rbufs = Link::mr(&l.b_mrs, 256 * 400);
    let mut model = vec![0u8; 8 * 1024];
    let mut expect_send: Vec<(u64, WcOpcode)> = Vec::new();
    let mut reads: Vec<ModelRead> = Vec::new();
    // A READ whose response is lost is executed again when resent (IBA 9.7.5.2.1: the
    // responder executes a repeated READ anew), so it may see what the WRITEs and
    // atomics after it wrote meanwhile.
    let lossy = ops
        .iter()
        .any(|o| matches!(o, Op::LoseRequests | Op::LoseResponses | Op::LoseConnection));
    let changed = |reads: &mut Vec<ModelRead>, r: std::ops::Range<usize>| {
        for e in reads.iter_mut() {
            e.later |= r.start < e.range.end && e.range.start < r.end;
        }
    };
    let mut faas: Vec<(u64, usize, u64)> = Vec::new();
    let mut sends: Vec<Vec<u8>> = Vec::new();
    let mut recvs_posted = 0usize;
    let mut next_local = 0usize;
    let mut id = 0u64;
    for o in ops {
        id += 1;
        match o {
            Op::Send { len } => {
                let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_add(id as u8)).collect();
                let at = next_local;
                next_local += 300;
                put(&local, at, &data);
                l.req
                    .post(&SendWr::send(id, &[sge(&local, at, len)]).signaled(), &l.a_mrs)
                    .unwrap();
                expect_send.push((id, WcOpcode::Send));
                sends.push(data);
            }
            Op::Write { off, len, byte } => {
                let len = len.min(8 * 1024 - off.min(8 * 1024));
                let at = next_local;
                next_local += 1200;
                put(&local, at, &vec![byte; len]);
                l.req
                    .post(
                        &SendWr::write(
                            id,
                            &[sge(&local, at, len)],
                            (remote.addr() + off as u64, remote.key),
                        )
                        .signaled(),
                        &l.a_mrs,
                    )
                    .unwrap();
                model[off..off + len].fill(byte);
                changed(&mut reads, off..off + len);
                expect_send.push((id, WcOpcode::RdmaWrite));
            }
            Op::Read { off, len } => {
                let len = len.min(8 * 1024 - off.min(8 * 1024));
                let at = next_local;
                next_local += 1200;
                l.req
                    .post(
                        &SendWr::read(
                            id,
                            &[sge(&local, at, len)],
                            (remote.addr() + off as u64, remote.key),
                        )
                        .signaled(),
                        &l.a_mrs,
                    )
                    .unwrap();
                reads.push(ModelRead {
                    id,
                    at,
                    want: model[off..off + len].to_vec(),
                    range: off..off + len,
                    later: false,
                });
                expect_send.push((id, WcOpcode::RdmaRead));
            }
            Op::Faa { add } => {
                let at = next_local;
                next_local += 8;
                l.req
                    .post(
                        &SendWr::fetch_and_add(
                            id,
                            &[sge(&local, at, 8)],
                            (remote.addr() + 4096, remote.key),
                            add,
                        )
                        .signaled(),
                        &l.a_mrs,
                    )
                    .unwrap();
                let mut w = [0u8; 8];
                w.copy_from_slice(&model[4096..4104]);
                let old = u64::from_ne_bytes(w);
                model[4096..4104].copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
                faas.push((id, at, old));
                changed(&mut reads, 4096..4104);
                expect_send.push((id, WcOpcode::FetchAdd));
            }
            Op::Recv => {
                if recvs_posted < 400 {
                    l.resp
                        .post(&RecvWr::new(
                            1000 + recvs_posted as u64,
                            &[sge(&rbufs, recvs_posted * 256, 256)],
                        ))
                        .unwrap();
                    recvs_posted += 1;
                }
            }
            Op::Pump => l.pump(),
            Op::Tick => l.at(l.now + Duration::from_micros(20)),
            Op::LoseRequests => {
                l.drop_requests = true;
                l.pump();
                l.drop_requests = false;
            }
            Op::LoseResponses => {
                l.drop_responses = true;
                l.pump();
                l.drop_responses = false;
            }
            Op::LoseConnection => {
                (l.drop_requests, l.drop_responses) = (true, true);
                l.pump();
                (l.drop_requests, l.drop_responses) = (false, false);
                l.req.on_connection_lost();
                l.resp.connection_lost();
            }
        }
    }
    // Enough receives for every SEND, then run the clock until everything is done.
    while recvs_posted < sends.len() {
        l.resp
            .post(&RecvWr::new(
                1000 + recvs_posted as u64,
                &[sge(&rbufs, recvs_posted * 256, 256)],
            ))
            .unwrap();
        recvs_posted += 1;
    }
    for _ in 0..2000 {
        l.at(l.now + rnr_timer(1));
        if l.req.outstanding() == 0 {
            break;
        }
    }
    // Lost frames are resent after the local ACK timeout.
    for _ in 0..64 {
        if l.req.outstanding() == 0 || fast_path.is_none() {
            break;
        }
        l.at(l.now + local_ack_timeout(10).unwrap());
    }
    prop_assert!(!l.a_err && !l.b_err, "an error on a well-formed workload");
    let s = l.take_send();
    prop_assert_eq!(
        s.iter().map(|w| (w.wr_id, w.opcode)).collect::<Vec<_>>(),
        expect_send
    );
    prop_assert!(s.iter().all(|w| w.status == WcStatus::Success));
    let r = l.take_recv();
    prop_assert_eq!(r.len(), sends.len());
    for (k, (w, data)) in r.iter().zip(&sends).enumerate() {
        prop_assert_eq!(w.wr_id, 1000 + k as u64);
        prop_assert_eq!(w.byte_len as usize, data.len());
        let mut got = vec![0u8; data.len()];
        get(&rbufs, k * 256, &mut got);
        prop_assert_eq!(&got, data);
    }
    let mut mem = vec![0u8; 8 * 1024];
    get(&remote, 0, &mut mem);
    prop_assert!(mem == model, "remote memory differs from the model");
    for ModelRead {
        id: rid,
        at,
        want,
        later,
        ..
    } in reads
    {
        if lossy && later {
            continue;
        }
        let mut got = vec![0u8; want.len()];
        get(&local, at, &mut got);
        prop_assert!(got == want, "READ {} returned other bytes than the model", rid);
    }
    for (fid, at, old) in faas {
        let mut got = [0u8; 8];
        get(&local, at, &mut got);
        prop_assert_eq!(u64::from_ne_bytes(got), old, "old value of FAA {}", fid);
    }
    Ok(())
}

/// A refused remote access is logged at the responder (a warning: its QP goes to ERR and
/// its application learns nothing else about why), naming the QP, the rkey, the address,
/// the length and the reason; the requester's completion carries the reason's code.
#[test]
fn a_refused_access_is_logged_at_the_responder_with_its_reason() {
    use crate::trace_capture::Capture;
    use crate::wire::NakReason;
    let cap = Capture::default();
    let mut l = Link::new(7, 7, 14, 1);
    let src = Link::mr(&l.a_mrs, 64);
    let dst = Link::mr(&l.b_mrs, 64);
    let addr = dst.addr() + 32;
    l.req
        .post(
            &SendWr::write(5, &[sge(&src, 0, 48)], (addr, dst.key)).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    cap.run(|| l.pump());
    let wc = l.take_send();
    assert_eq!(statuses(&wc), [(5, WcStatus::RemAccessErr)]);
    assert_eq!(wc[0].vendor_err, NakReason::OutOfBounds.vendor_err());
    let warned = cap.find(tracing::Level::WARN, "refused");
    assert_eq!(warned.len(), 1, "{:?}", cap.events());
    let e = &warned[0];
    assert_eq!(e.field("qpn"), Some("2"));
    assert_eq!(e.field("op"), Some("WRITE"));
    assert_eq!(e.field("rkey"), Some(format!("{:#x}", dst.key).as_str()));
    assert_eq!(e.field("addr"), Some(format!("{addr:#x}").as_str()));
    assert_eq!(e.field("len"), Some("48"));
    assert_eq!(e.field("reason"), Some("OutOfBounds"));
    assert!(
        e.message().contains("the address range leaves the memory region"),
        "{}",
        e.message()
    );
}

/// With `rnr_retry` 7 a SEND to a peer that never posts a receive is retried for ever:
/// each RNR NAK sent and received, and each resend after the wait, is a debug event, and
/// once the run of NAKs has lasted `RNR_WARN_AFTER` (3 s) the requester warns, once,
/// naming both QPs and how long. Progress ends the run; a later run warns again.
#[test]
fn an_rnr_run_of_three_seconds_is_warned_about_once() {
    use crate::requester::RNR_WARN_AFTER;
    use crate::trace_capture::Capture;
    use tracing::Level;
    let timer = 31; // 491.52 ms between resends
    let step = rnr_timer(timer);
    // Local ACK timeout 0 (infinite): only RNR NAKs in play.
    let mut l = Link::new(7, 7, 0, timer);
    let src = Link::mr(&l.a_mrs, 64);
    let dst = Link::mr(&l.b_mrs, 64);
    l.req
        .post(&SendWr::send(1, &[sge(&src, 0, 8)]).signaled(), &l.a_mrs)
        .unwrap();
    let cap = Capture::default();
    let t0 = l.now;
    // Six waits: 2.95 s of NAKs, seven of them.
    cap.run(|| {
        l.pump();
        for k in 1..=6 {
            l.at(t0 + step * k);
        }
    });
    assert!(step * 6 < RNR_WARN_AFTER && step * 7 >= RNR_WARN_AFTER);
    assert!(l.take_send().is_empty());
    assert_eq!(cap.find(Level::DEBUG, "RNR NAK sent").len(), 7);
    assert_eq!(cap.find(Level::DEBUG, "RNR NAK received").len(), 7);
    assert_eq!(cap.find(Level::DEBUG, "RNR wait over: resending").len(), 6);
    let sent = &cap.find(Level::DEBUG, "RNR NAK sent")[0];
    assert_eq!((sent.field("qpn"), sent.field("timer")), (Some("2"), Some("31")));
    let got = &cap.find(Level::DEBUG, "RNR NAK received")[0];
    assert_eq!((got.field("qpn"), got.field("dest_qpn")), (Some("1"), Some("2")));
    assert!(cap.find(Level::WARN, "RNR NAKs").is_empty(), "warned before 3 s");
    // The eighth NAK comes 3.44 s after the first: one warning, and no second one.
    cap.run(|| {
        for k in 7..=12 {
            l.at(t0 + step * k);
        }
    });
    let warned = cap.find(Level::WARN, "RNR NAKs");
    assert_eq!(warned.len(), 1, "{warned:?}");
    let w = &warned[0];
    assert_eq!(w.field("qpn"), Some("1"));
    assert_eq!(w.field("dest_qpn"), Some("2"));
    assert_eq!(w.field("waited_ms"), Some("3440"));
    assert_eq!(w.field("rnr_naks"), Some("8"));
    assert!(
        w.message()
            .contains("QP 0x1 has met RNR NAKs from QP 0x2 for 3.4 s")
            && w.message().contains("rnr_retry 7 retries for ever"),
        "{}",
        w.message()
    );
    // A receive at last: the SEND completes and the run is over. A new one warns anew.
    l.resp.post(&RecvWr::new(9, &[sge(&dst, 0, 64)])).unwrap();
    let t1 = t0 + step * 13;
    cap.run(|| l.at(t1));
    assert_eq!(statuses(&l.take_send()), [(1, WcStatus::Success)]);
    l.req
        .post(&SendWr::send(2, &[sge(&src, 0, 8)]).signaled(), &l.a_mrs)
        .unwrap();
    cap.run(|| {
        l.pump();
        for k in 1..=7 {
            l.at(t1 + step * k);
        }
    });
    assert_eq!(cap.find(Level::WARN, "RNR NAKs").len(), 2);
}

/// A resend after the local ACK timeout is a debug event naming the QPs, the PSN resent
/// from and the retries left.
#[test]
fn a_resend_after_the_ack_timeout_is_logged() {
    use crate::trace_capture::Capture;
    use tracing::Level;
    let mut l = Link::new(7, 3, 10, 1);
    let src = Link::mr(&l.a_mrs, 64);
    let dst = Link::mr(&l.b_mrs, 64);
    l.drop_responses = true;
    l.req
        .post(
            &SendWr::write(1, &[sge(&src, 0, 8)], (dst.addr(), dst.key)).signaled(),
            &l.a_mrs,
        )
        .unwrap();
    let cap = Capture::default();
    cap.run(|| {
        l.pump();
        l.drop_responses = false;
        let t = l.now + local_ack_timeout(10).unwrap();
        l.at(t);
    });
    assert_eq!(statuses(&l.take_send()), [(1, WcStatus::Success)]);
    let resent = cap.find(Level::DEBUG, "local ACK timeout: resending");
    assert_eq!(resent.len(), 1, "{:?}", cap.events());
    let e = &resent[0];
    assert_eq!(e.field("qpn"), Some("1"));
    assert_eq!(e.field("dest_qpn"), Some("2"));
    assert_eq!(e.field("psn"), Some("100"));
    assert_eq!(e.field("retries_left"), Some("2"));
}

impl Link {
    /// The same link between two devices with the switches `sw`.
    fn with_switches(mut self, sw: crate::switches::Switches) -> Link {
        let req = std::mem::replace(&mut self.req, Requester::new(0, PD, &cap(), false));
        self.req = req.with_profile(sw, crate::wire::MAX_MSG, crate::wire::MAX_DATAGRAM);
        let resp = std::mem::replace(&mut self.resp, Responder::new(0, PD, 1, 1));
        self.resp = resp.with_switches(sw);
        self
    }
}

/// The status switches at both ends of a link, under IBA's choices (`portable`) and rxe's:
/// a SEND longer than the receive, a WRITE the responder QP's access flags forbid, a
/// SEND with a bad lkey, a receive with a bad lkey.
#[test]
fn the_status_switches_give_iba_or_rxe_statuses_at_both_ends() {
    use crate::switches::Switches;
    use crate::wire::NakReason;
    for (sw, rxe) in [(Switches::PORTABLE, false), (Switches::RXE, true)] {
        // Too small: the responder's receive, and the requester's SEND.
        let mut l = Link::new(7, 7, 10, 1).with_switches(sw);
        let (src, dst) = (Link::mr(&l.a_mrs, 256), Link::mr(&l.b_mrs, 256));
        l.resp.post(&RecvWr::new(9, &[sge(&dst, 0, 16)])).unwrap();
        l.req
            .post(&SendWr::send(1, &[sge(&src, 0, 100)]).signaled(), &l.a_mrs)
            .unwrap();
        l.pump();
        let (r, s) = (l.take_recv(), l.take_send());
        let want = if rxe {
            (WcStatus::LocQpOpErr, WcStatus::RemOpErr)
        } else {
            (WcStatus::LocLenErr, WcStatus::RemInvReqErr)
        };
        assert_eq!((r[0].status, s[0].status), want, "{sw:?}");
        assert!(l.a_err && l.b_err, "both QPs to ERR");

        // The responder QP's access flags lack REMOTE_WRITE.
        let mut l = Link::new(7, 7, 10, 1).with_switches(sw);
        l.resp.access = AccessFlags::REMOTE_READ;
        let (src, dst) = (Link::mr(&l.a_mrs, 64), Link::mr(&l.b_mrs, 64));
        l.req
            .post(
                &SendWr::write(1, &[sge(&src, 0, 8)], (dst.addr(), dst.key)).signaled(),
                &l.a_mrs,
            )
            .unwrap();
        l.pump();
        let s = l.take_send();
        let want = if rxe {
            WcStatus::RemInvReqErr
        } else {
            WcStatus::RemAccessErr
        };
        assert_eq!(s[0].status, want, "{sw:?}");
        assert_eq!(
            s[0].vendor_err,
            NakReason::QpAccess.vendor_err(),
            "the reason travels either way"
        );

        // A SEND whose lkey names no region.
        let mut l = Link::new(7, 7, 10, 1).with_switches(sw);
        let src = Link::mr(&l.a_mrs, 64);
        let bad = Sge::new(src.addr(), 8, src.key ^ 0x0f0f_0000);
        l.req.post(&SendWr::send(1, &[bad]).signaled(), &l.a_mrs).unwrap();
        l.pump();
        let want = if rxe {
            WcStatus::LocQpOpErr
        } else {
            WcStatus::LocProtErr
        };
        assert_eq!(l.take_send()[0].status, want, "{sw:?}");

        // A receive whose lkey names no region.
        let mut l = Link::new(7, 7, 10, 1).with_switches(sw);
        let (src, dst) = (Link::mr(&l.a_mrs, 64), Link::mr(&l.b_mrs, 64));
        let bad = Sge::new(dst.addr(), 64, dst.key ^ 0x0f0f_0000);
        l.resp.post(&RecvWr::new(9, &[bad])).unwrap();
        l.req
            .post(&SendWr::send(1, &[sge(&src, 0, 8)]).signaled(), &l.a_mrs)
            .unwrap();
        l.pump();
        let want = if rxe {
            WcStatus::LocQpOpErr
        } else {
            WcStatus::LocProtErr
        };
        assert_eq!(l.take_recv()[0].status, want, "{sw:?}");
        assert_eq!(l.take_send()[0].status, WcStatus::RemOpErr, "{sw:?}");
    }
}
