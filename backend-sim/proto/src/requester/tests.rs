use super::*;
use crate::memory::MrShared;
use std::sync::Arc;
use verbs_api::{AccessFlags, QpCap};

/// A memory table with one 64-byte region (lkey 7), and a connected requester with
/// room for `wrs` WRs.
fn setup(wrs: u32, attrs: ReqAttrs) -> (MrTable, Arc<MrShared>, Requester) {
    let mrs = MrTable::default();
    let mr = Arc::new(MrShared::new_owned(1, 7, 64, AccessFlags::LOCAL_WRITE).unwrap());
    mrs.insert(mr.clone());
    let cap = QpCap::new(wrs, 1);
    let mut req = Requester::new(1, 1, &cap, false);
    req.connect(attrs);
    (mrs, mr, req)
}

/// Inline data handed over as pieces (the C ABI's, from memory that need not be
/// registered) is what goes on the wire; the pieces count as the WR's SGEs and their
/// length against `max_inline_data`; the same WR without pieces must name registered
/// memory, as the verbs API requires.
#[test]
fn inline_pieces_are_sent_and_checked_as_sges() {
    let mrs = MrTable::default();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 1,
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 16,
    };
    let mut req = Requester::new(1, 1, &cap, false);
    req.connect(ReqAttrs {
        sq_psn: 0,
        timeout: None,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
    });
    // An lkey no region has: only the pieces can be read.
    let unregistered = [Sge::new(0x1000, 7, 99)];
    let wr = SendWr::write(1, &unregistered, (0x2000, 5)).inline().signaled();
    assert_eq!(req.post(&wr, &mrs), Err(PostCheck::BadInlineSge));
    let three: [&[u8]; 3] = [b"ab", b"cd", b"e"];
    assert_eq!(req.post_with(&wr, &mrs, Some(&three)), Err(PostCheck::TooManySge));
    let long: [&[u8]; 2] = [&[1; 9], &[2; 8]];
    assert_eq!(
        req.post_with(&wr, &mrs, Some(&long)),
        Err(PostCheck::InlineTooLong)
    );
    let two: [&[u8]; 2] = [b"abc", b"defg"];
    req.post_with(&wr, &mrs, Some(&two)).unwrap();
    let now = Instant::now();
    let (mut tx, mut out, mut wire) = (TxQueue::new(), Vec::new(), Vec::new());
    assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(1));
    tx.drain_into(&mut wire);
    let (frame, head) = Frame::decode(&wire).unwrap().unwrap();
    assert!(matches!(frame, Frame::Write { len: 7, .. }), "{frame}");
    assert_eq!(&wire[head..], b"abcdefg");
    req.on_response(&Frame::Ack { psn: 0 }, now, &mut out).unwrap();
    assert_eq!(
        out.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        [(1, WcStatus::Success, 7)]
    );
}

/// Every local-key path of the requester, under each profile's switches: a SEND's or
/// WRITE's lkey that names no region, or a region of another PD, takes the profile's
/// status (rxe's `lookup_mr()` refuses both, LOC_QP_OP_ERR); an SGE past its region
/// is LOC_PROT_ERR everywhere, and so is any bad local SGE of a READ or an atomic
/// (rxe_comp.c `do_read()`, `do_atomic()`).
#[test]
fn local_key_errors_take_the_profiles_status_per_path() {
    let mrs = MrTable::default();
    let mine = Arc::new(MrShared::new_owned(1, 7, 64, AccessFlags::LOCAL_WRITE).unwrap());
    let other_pd = Arc::new(MrShared::new_owned(2, 9, 64, AccessFlags::LOCAL_WRITE).unwrap());
    mrs.insert(mine.clone());
    mrs.insert(other_pd.clone());
    let no_region = Sge::new(mine.addr(), 8, 0x77);
    let foreign = Sge::new(other_pd.addr(), 8, 9);
    let past_end = Sge::new(mine.addr() + 60, 8, 7);
    let remote = (0x1000, 5);
    for (sw, bad_lkey) in [
        (Switches::PORTABLE, WcStatus::LocProtErr),
        (Switches::RXE, WcStatus::LocQpOpErr),
        (Switches::MLX5, WcStatus::LocProtErr),
    ] {
        let cases: [(SendWr<'_>, WcStatus); 10] = [
            (SendWr::send(1, std::slice::from_ref(&no_region)), bad_lkey),
            (SendWr::send(1, std::slice::from_ref(&foreign)), bad_lkey),
            (
                SendWr::send(1, std::slice::from_ref(&past_end)),
                WcStatus::LocProtErr,
            ),
            (
                SendWr::write(1, std::slice::from_ref(&no_region), remote),
                bad_lkey,
            ),
            (SendWr::write(1, std::slice::from_ref(&foreign), remote), bad_lkey),
            (
                SendWr::write(1, std::slice::from_ref(&past_end), remote),
                WcStatus::LocProtErr,
            ),
            (
                SendWr::read(1, std::slice::from_ref(&no_region), remote),
                WcStatus::LocProtErr,
            ),
            (
                SendWr::read(1, std::slice::from_ref(&foreign), remote),
                WcStatus::LocProtErr,
            ),
            (
                SendWr::fetch_and_add(1, std::slice::from_ref(&no_region), remote, 1),
                WcStatus::LocProtErr,
            ),
            (
                SendWr::fetch_and_add(1, std::slice::from_ref(&foreign), remote, 1),
                WcStatus::LocProtErr,
            ),
        ];
        for (wr, want) in cases {
            let mut req = Requester::new(1, 1, &QpCap::new(4, 1), false).with_profile(sw, MAX_MSG, 1024);
            req.connect(ReqAttrs {
                sq_psn: 0,
                timeout: None,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
            });
            req.post(&wr, &mrs).unwrap();
            let (mut tx, mut out) = (TxQueue::new(), Vec::new());
            let got = req.poll_transmit(&mrs, Instant::now(), &mut tx, 4, &mut out);
            assert_eq!(got, Err(Fatal(want)), "{:?} under {sw:?}", wr.op);
            assert_eq!(out[0].status, want);
            assert_eq!(tx.pending(), 0, "nothing is sent");
        }
    }
}

/// Found by the `responder` fuzz target: two FETCH_AND_ADDs in flight, the peer
/// answers the second first, then the connection breaks. The rewind subtracted the
/// answered one from the READ/atomic count a second time: a u32 underflow (a panic in
/// debug builds; in release builds the count wrapped to u32::MAX and the QP never sent
/// another READ or atomic).
#[test]
fn an_atomic_answered_out_of_order_survives_a_rewind() {
    let (mrs, mr, mut req) = setup(
        8,
        ReqAttrs {
            sq_psn: 10,
            timeout: None,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 2,
        },
    );
    let sges: Vec<[Sge; 1]> = (0..4).map(|k| [Sge::new(mr.addr() + 8 * k, 8, 7)]).collect();
    let faa = |id: u64| SendWr::fetch_and_add(id, &sges[id as usize - 1], (0x1000, 5), 1).signaled();
    let now = Instant::now();
    let mut tx = TxQueue::new();
    let mut out = Vec::new();
    let mut sink = Vec::new();
    req.post(&faa(1), &mrs).unwrap();
    req.post(&faa(2), &mrs).unwrap();
    assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(2));
    req.on_response(&Frame::AtomicResp { psn: 11, orig: 0 }, now, &mut out)
        .unwrap();
    req.on_connection_lost();
    tx.drain_into(&mut sink);
    // Both are resent (PSNs stay in sequence); the first one's answer completes both.
    assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(2));
    for psn in [10, 11] {
        req.on_response(&Frame::AtomicResp { psn, orig: 0 }, now, &mut out)
            .unwrap();
    }
    assert_eq!(
        out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    // Nothing is counted in flight any more: two new atomics go out at once.
    req.post(&faa(3), &mrs).unwrap();
    req.post(&faa(4), &mrs).unwrap();
    assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(2));
}

/// SQD stops WQEs from starting, not from finishing: a SEND refused with RNR before
/// the move is resent after the RNR wait, a WQE posted in SQD is not sent, and the
/// queue counts as drained once the started one completes.
#[test]
fn sqd_resends_what_was_started_and_starts_nothing() {
    let attrs = ReqAttrs {
        sq_psn: 0,
        timeout: None,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
    };
    let (mrs, mr, mut req) = setup(4, attrs);
    let sge = [Sge::new(mr.addr(), 8, 7)];
    let now = Instant::now();
    let (mut tx, mut out, mut sink) = (TxQueue::new(), Vec::new(), Vec::new());
    req.post(&SendWr::send(1, &sge).signaled(), &mrs).unwrap();
    assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(1));
    req.draining = true;
    req.post(&SendWr::send(2, &sge).signaled(), &mrs).unwrap();
    let rnr = Frame::Nak {
        psn: 0,
        code: NakCode::Rnr { timer: 1 },
        reason: None,
    };
    req.on_response(&rnr, now, &mut out).unwrap();
    assert!(!req.drained());
    let later = now + Duration::from_secs(1);
    tx.drain_into(&mut sink);
    assert_eq!(req.poll_transmit(&mrs, later, &mut tx, 16, &mut out), Ok(1));
    sink.clear();
    tx.drain_into(&mut sink);
    assert_eq!(
        crate::wire::tests::decode_all(&sink).len(),
        1,
        "the refused SEND alone"
    );
    req.on_response(&Frame::Ack { psn: 0 }, later, &mut out).unwrap();
    assert_eq!(out.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1]);
    assert!(req.drained(), "the WQE posted in SQD is not in flight");
    assert!(req.has_unsent());
    assert_eq!(req.poll_transmit(&mrs, later, &mut tx, 16, &mut out), Ok(0));
    req.draining = false;
    assert_eq!(req.poll_transmit(&mrs, later, &mut tx, 16, &mut out), Ok(1));
    assert!(!req.drained());
}

/// The PSNs of the WRITEs in `bytes` (frames as sent) that ask for an ACK.
fn asking(bytes: &[u8]) -> Vec<u32> {
    crate::wire::tests::decode_all(bytes)
        .into_iter()
        .filter_map(|f| match f {
            Frame::Write {
                psn, ack_req: true, ..
            } => Some(psn),
            _ => None,
        })
        .collect()
}

/// A deep stream asks for an ACK once per half of the WQEs outstanding (not for each
/// WRITE); a WRITE alone in the send queue always asks.
#[test]
fn a_stream_asks_for_an_ack_once_per_half_window() {
    let attrs = ReqAttrs {
        sq_psn: 0,
        timeout: None,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
    };
    let (mrs, mr, mut req) = setup(16, attrs);
    let sge = [Sge::new(mr.addr(), 8, 7)];
    let now = Instant::now();
    let (mut tx, mut out, mut sent) = (TxQueue::new(), Vec::new(), Vec::new());
    for id in 0..16 {
        req.post(&SendWr::write(id, &sge, (0x1000, 5)).signaled(), &mrs)
            .unwrap();
    }
    assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 64, &mut out), Ok(16));
    tx.drain_into(&mut sent);
    assert_eq!(asking(&sent), [7, 15]);
    req.on_response(&Frame::Ack { psn: 15 }, now, &mut out).unwrap();
    assert_eq!(out.len(), 16);
    // The application polls them: their slots are free again.
    polled(&mut req);

    // One at a time, each acknowledged before the next: every one asks.
    for (id, psn) in (16..20).zip(16u32..) {
        req.post(&SendWr::write(id, &sge, (0x1000, 5)).signaled(), &mrs)
            .unwrap();
        assert_eq!(req.poll_transmit(&mrs, now, &mut tx, 64, &mut out), Ok(1));
        sent.clear();
        tx.drain_into(&mut sent);
        assert_eq!(asking(&sent), [psn]);
        req.on_response(&Frame::Ack { psn }, now, &mut out).unwrap();
    }
}

/// The application polled every completion produced so far (frees their slots under
/// `SlotRelease::AtPoll`, as the CQ does).
fn polled(req: &mut Requester) {
    let mut marks = Vec::new();
    req.take_marks(&mut marks);
    if let Some(&upto) = marks.last() {
        req.slots().release_through(upto);
    }
}

/// Posts `n` WRITEs (`signaled(i)` says which), all acknowledged at once; returns
/// how many completions they produced.
fn complete_writes(
    req: &mut Requester,
    mrs: &MrTable,
    sge: &[Sge],
    first: u64,
    n: u64,
    signaled: impl Fn(u64) -> bool,
) -> usize {
    let now = Instant::now();
    let (mut tx, mut out) = (TxQueue::new(), Vec::new());
    for id in first..first + n {
        let wr = SendWr::write(id, sge, (0x1000, 5));
        req.post(&if signaled(id) { wr.signaled() } else { wr }, mrs)
            .unwrap();
    }
    req.poll_transmit(mrs, now, &mut tx, 64, &mut out).unwrap();
    let psn = req.next_psn().wrapping_sub(1) & verbs_api::PSN_MASK;
    req.on_response(&Frame::Ack { psn }, now, &mut out).unwrap();
    assert_eq!(req.outstanding(), 0, "all complete");
    out.len()
}

/// `SlotRelease::AtPoll` (portable, mlx5): completed WRs hold their slots until a
/// completion that covers them is polled, so a queue of unsignaled WRs fills up;
/// `AtCompletion` (rxe) frees them as they complete.
#[test]
fn send_queue_slots_are_freed_at_poll_or_at_completion_by_profile() {
    let attrs = ReqAttrs {
        sq_psn: 0,
        timeout: None,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
    };
    // At poll: 4 unsignaled WRITEs complete, and their slots stay taken.
    let (mrs, mr, req) = setup(4, attrs);
    let mut req = req.with_profile(Switches::PORTABLE, MAX_MSG, MAX_DATAGRAM);
    let sge = [Sge::new(mr.addr(), 8, 7)];
    assert_eq!(complete_writes(&mut req, &mrs, &sge, 0, 4, |_| false), 0);
    assert_eq!(req.held_unpolled(), 4);
    let wr = SendWr::write(9, &sge, (0x1000, 5));
    assert_eq!(req.post(&wr, &mrs), Err(PostCheck::FullUnpolled));
    // The last of 4 signaled: polling its completion frees all four.
    req.reset();
    assert_eq!(req.held_unpolled(), 0);
    assert_eq!(complete_writes(&mut req, &mrs, &sge, 0, 4, |id| id == 3), 1);
    assert_eq!(req.held_unpolled(), 4);
    polled(&mut req);
    assert_eq!(req.held_unpolled(), 0);
    req.post(&wr, &mrs).unwrap();

    // At completion: the same unsignaled WRITEs leave the queue empty.
    let (mrs, mr, req) = setup(4, attrs);
    let mut req = req.with_profile(Switches::RXE, MAX_MSG, MAX_DATAGRAM);
    let sge = [Sge::new(mr.addr(), 8, 7)];
    assert_eq!(complete_writes(&mut req, &mrs, &sge, 0, 4, |_| false), 0);
    assert_eq!(req.held_unpolled(), 0);
    req.post(&SendWr::write(9, &sge, (0x1000, 5)), &mrs).unwrap();
}

/// `retry_cnt` 7 is seven retries (IBA, mlx5), or for ever (rxe): a peer that never
/// answers fails the WRITE after 7 resends, or never.
#[test]
fn retry_cnt_7_is_finite_or_infinite_by_profile() {
    let step = Duration::from_millis(10);
    let attrs = ReqAttrs {
        sq_psn: 0,
        timeout: Some(step),
        retry_cnt: 7,
        rnr_retry: 0,
        max_rd_atomic: 1,
    };
    for (sw, infinite) in [(Switches::PORTABLE, false), (Switches::RXE, true)] {
        let (mrs, mr, req) = setup(4, attrs);
        let mut req = req.with_profile(sw, MAX_MSG, MAX_DATAGRAM);
        let sge = [Sge::new(mr.addr(), 8, 7)];
        req.post(&SendWr::write(1, &sge, (0x1000, 5)).signaled(), &mrs)
            .unwrap();
        let mut t = Instant::now();
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let mut sends = 0;
        for _ in 0..50 {
            sends += req.poll_transmit(&mrs, t, &mut tx, 16, &mut out).unwrap_or(0);
            tx = TxQueue::new();
            t += step * 2;
            let _ = req.on_timer(t, None, None, &mut out);
            if !out.is_empty() {
                break;
            }
        }
        if infinite {
            assert!(
                out.is_empty() && sends == 50,
                "{sw:?}: {out:?} after {sends} sends"
            );
        } else {
            assert_eq!(out.len(), 1, "{sw:?}");
            assert_eq!(out[0].status, WcStatus::RetryExcErr);
            assert_eq!(sends, 8, "the first send and seven retries");
        }
    }
}

/// A requester with `timeout` and `retry_cnt` that sent one signaled WRITE at `t0`.
fn one_write_sent(timeout: Duration, retry_cnt: u8, t0: Instant) -> Requester {
    let attrs = ReqAttrs {
        sq_psn: 0,
        timeout: Some(timeout),
        retry_cnt,
        rnr_retry: 0,
        max_rd_atomic: 1,
    };
    let (mrs, mr, mut req) = setup(4, attrs);
    let sge = [Sge::new(mr.addr(), 64, 7)];
    let (mut tx, mut out) = (TxQueue::new(), Vec::new());
    req.post(&SendWr::write(1, &sge, (0x1000, 5)).signaled(), &mrs)
        .unwrap();
    assert_eq!(req.poll_transmit(&mrs, t0, &mut tx, 16, &mut out), Ok(1));
    assert!(out.is_empty(), "{out:?}");
    req
}

/// `on_timer` says whether it left something to send: a resend after the ACK timeout
/// does; a deadline not reached, or one that only moved because bytes left meanwhile,
/// does not (the progress engine then leaves the connection to whichever thread
/// drives it instead of servicing it on a timer).
#[test]
fn the_ack_timer_says_whether_a_resend_is_due() {
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let mut req = one_write_sent(ms(10), 1, t0);
    let mut out = Vec::new();
    assert_eq!(req.on_timer(t0 + ms(5), Some(t0), None, &mut out), Ok(false));
    assert_eq!(
        req.on_timer(t0 + ms(11), Some(t0 + ms(8)), None, &mut out),
        Ok(false)
    );
    assert!(!req.has_unsent());
    assert_eq!(req.next_deadline(), Some(t0 + ms(18)));
    assert_eq!(
        req.on_timer(t0 + ms(19), Some(t0 + ms(8)), None, &mut out),
        Ok(true)
    );
    assert!(req.has_unsent(), "rewound: the WRITE goes again");
    assert!(out.is_empty(), "{out:?}");
}

/// A connection attempt under way does not use up `retry_cnt`: the lifetime test's
/// READ ended in `IBV_WC_RETRY_EXC_ERR` (`vendor_err` ENOTCONN) on a loaded CI machine,
/// its three 67 ms timeouts spent while the sim reconnected. A failed attempt, or
/// one that outlasts the grace, counts again.
#[test]
fn a_connection_being_set_up_uses_no_retries() {
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let mut req = one_write_sent(ms(10), 0, t0);
    let mut out = Vec::new();
    req.connecting(Some(t0));
    for k in 1..50 {
        let now = t0 + ms(11 * k);
        assert_eq!(req.on_timer(now, Some(t0), None, &mut out), Ok(false));
        assert!(out.is_empty(), "timeout {k} counted: {out:?}");
        assert_eq!(req.next_deadline(), Some(now + ms(10)));
    }
    // The attempt failed: the next timeout is the WR's last (retry_cnt 0).
    req.connecting(None);
    let now = t0 + ms(600);
    assert_eq!(
        req.on_timer(now, Some(t0), None, &mut out),
        Err(Fatal(WcStatus::RetryExcErr))
    );
    // An attempt that outlasts the grace counts as lost packets.
    let mut req = one_write_sent(ms(10), 0, t0);
    req.connecting(Some(t0));
    let late = t0 + LINK_SETUP_GRACE + ms(1);
    assert_eq!(
        req.on_timer(late, Some(t0), None, &mut out),
        Err(Fatal(WcStatus::RetryExcErr))
    );
}

/// perf-compare's `write_bw -a` failed with `IBV_WC_RETRY_EXC_ERR`: 128 WRITEs of
/// 8 MiB were queued at once and took longer than `timeout` to leave, so the timer
/// fired on messages still being written, and each resend queued them again. The
/// timer now counts from the last bytes sent; only silence after that is a loss.
#[test]
fn the_ack_timer_counts_from_the_last_transmission() {
    let timeout = Duration::from_millis(10);
    let t0 = Instant::now();
    let mut req = one_write_sent(timeout, 0, t0);
    let mut out = Vec::new();
    assert_eq!(req.next_deadline(), Some(t0 + timeout));
    // The deadline passes while bytes are still leaving: no retry (retry_cnt 0 would
    // fail the WR at once), the deadline moves to timeout after the last byte sent.
    let sending = t0 + timeout - Duration::from_millis(1);
    let late = t0 + timeout + Duration::from_millis(2);
    assert_eq!(req.on_timer(late, Some(sending), None, &mut out), Ok(false));
    assert!(out.is_empty());
    assert_eq!(req.next_deadline(), Some(sending + timeout));
    // Silence for a whole timeout after the last byte: retries are used up.
    let silent = sending + timeout + Duration::from_millis(1);
    assert_eq!(
        req.on_timer(silent, Some(sending), None, &mut out),
        Err(Fatal(WcStatus::RetryExcErr))
    );
    assert_eq!(
        out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RetryExcErr)]
    );
    // Without a transmission record the timer counts from the send, as before.
    let mut req = one_write_sent(timeout, 0, t0);
    assert!(req.on_timer(late, None, None, &mut out).is_err());
}

/// Under WRITEs both ways the ACK a requester waits for comes after the rest of the
/// message the peer is sending, on the same ordered stream: `ib_write_bw -b` spent up
/// to 6 of 7 retries on local ACK timeouts while data arrived all along. Bytes
/// arriving from the peer (or waiting unread on this side, which the driver reports
/// as arriving now) keep the timer from counting; only silence both ways is a loss.
#[test]
fn bytes_arriving_from_the_peer_keep_the_ack_timer_from_counting() {
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let mut req = one_write_sent(ms(10), 0, t0);
    let mut out = Vec::new();
    // Nothing more left after t0, but the peer's bytes arrived until t0 + 8 ms: no
    // retry (retry_cnt 0 would fail the WR at once), the deadline follows them.
    assert_eq!(
        req.on_timer(t0 + ms(11), Some(t0), Some(t0 + ms(8)), &mut out),
        Ok(false)
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(req.next_deadline(), Some(t0 + ms(18)));
    // Bytes waiting unread at t0 + 30 ms: the deadline moves on again.
    let now = t0 + ms(30);
    assert_eq!(req.on_timer(now, Some(t0), Some(now), &mut out), Ok(false));
    assert_eq!(req.next_deadline(), Some(now + ms(10)));
    assert_eq!(req.take_ack_timeouts(), 0);
    // A whole timeout of silence both ways: the retries are used up.
    assert_eq!(
        req.on_timer(now + ms(11), Some(t0), Some(now), &mut out),
        Err(Fatal(WcStatus::RetryExcErr))
    );
    assert_eq!(req.take_ack_timeouts(), 1);
}

/// A requester with a 10 ms timeout and `retry_cnt` 1 that sent a 64-byte READ at
/// `t0` and accepted its response header at `t0 + 8 ms`; returns the scatter list the
/// payload goes to.
fn read_answered(t0: Instant) -> (Requester, Vec<Seg>) {
    let ms = Duration::from_millis;
    let attrs = ReqAttrs {
        sq_psn: 0,
        timeout: Some(ms(10)),
        retry_cnt: 1,
        rnr_retry: 0,
        max_rd_atomic: 1,
    };
    let (mrs, mr, mut req) = setup(4, attrs);
    let (mut tx, mut out) = (TxQueue::new(), Vec::new());
    req.post(
        &SendWr::read(1, &[Sge::new(mr.addr(), 64, 7)], (0x1000, 5)).signaled(),
        &mrs,
    )
    .unwrap();
    assert_eq!(req.poll_transmit(&mrs, t0, &mut tx, 16, &mut out), Ok(1));
    let resp = Frame::ReadResp { psn: 0, len: 64 };
    match req.on_response(&resp, t0 + ms(8), &mut out) {
        Ok(ReadSink::Into { psn: 0, segs }) => (req, segs),
        _ => panic!("the response is taken"),
    }
}

/// Found by tests/lifetime.rs in CI: a READ, then a WRITE the responder ACKed while
/// the READ's response was still due (its region was deregistered, the resent READ
/// met the dead rkey). The WRITE completed SUCCESS after the READ's error; after an
/// error only flushes may follow.
#[test]
fn a_wqe_acked_behind_a_failed_read_is_flushed() {
    let attrs = ReqAttrs {
        sq_psn: 0,
        timeout: Some(Duration::from_millis(10)),
        retry_cnt: 1,
        rnr_retry: 0,
        max_rd_atomic: 4,
    };
    let (mrs, mr, mut req) = setup(4, attrs);
    let (mut tx, mut out) = (TxQueue::new(), Vec::new());
    let t0 = Instant::now();
    let sge = [Sge::new(mr.addr(), 8, 7)];
    req.post(&SendWr::read(1, &sge, (0x1000, 5)).signaled(), &mrs)
        .unwrap();
    req.post(&SendWr::write(2, &sge, (0x2000, 5)).signaled(), &mrs)
        .unwrap();
    assert_eq!(req.poll_transmit(&mrs, t0, &mut tx, 16, &mut out), Ok(2));
    req.on_response(&Frame::Ack { psn: 1 }, t0, &mut out).unwrap();
    assert!(out.is_empty(), "the WRITE waits behind the READ: {out:?}");
    let nak = Frame::Nak {
        psn: 0,
        code: NakCode::RemoteAccess,
        reason: None,
    };
    assert!(req.on_response(&nak, t0, &mut out).is_err());
    assert_eq!(
        out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
}

/// A READ whose response is arriving is not resent when the local ACK timeout passes:
/// found as allocations in tests/alloc.rs under load, where the timer fired while a
/// 64 KiB response's payload was being read, and the resend rebuilt the READ's
/// scatter list (handed to the payload) and had the responder read the region again.
/// The response header restarts the timer, as every response packet does on an HCA,
/// and the payload's bytes move it on; a payload that stops for a whole timeout counts
/// against `retry_cnt`, still without a resend, until `IBV_WC_RETRY_EXC_ERR`.
#[test]
fn a_read_response_still_arriving_is_not_resent() {
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let (mut req, segs) = read_answered(t0);
    let mut out = Vec::new();
    assert_eq!(req.next_deadline(), Some(t0 + ms(18)), "restarted by the header");
    // Payload bytes until 15 ms: at 19 ms the deadline moves to 25, nothing is resent.
    let rx = Some(t0 + ms(15));
    assert_eq!(req.on_timer(t0 + ms(19), Some(t0), rx, &mut out), Ok(false));
    assert!(!req.has_unsent(), "resent while its response arrived");
    assert_eq!(req.next_deadline(), Some(t0 + ms(25)));
    // Silence for a whole timeout: a retry is used up, still no resend.
    assert_eq!(req.on_timer(t0 + ms(26), Some(t0), rx, &mut out), Ok(false));
    assert!(!req.has_unsent());
    assert!(out.is_empty(), "{out:?}");
    // The rest arrives: the READ completes.
    req.read_done(0, segs, t0 + ms(27), &mut out);
    assert_eq!(
        out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success)]
    );

    // A payload that never ends: retry_cnt timeouts, then RETRY_EXC_ERR.
    let (mut req, _segs) = read_answered(t0);
    let mut out = Vec::new();
    assert_eq!(req.on_timer(t0 + ms(19), Some(t0), None, &mut out), Ok(false));
    assert!(!req.has_unsent());
    assert_eq!(
        req.on_timer(t0 + ms(30), Some(t0), None, &mut out),
        Err(Fatal(WcStatus::RetryExcErr))
    );
    assert_eq!(
        out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RetryExcErr)]
    );
}
