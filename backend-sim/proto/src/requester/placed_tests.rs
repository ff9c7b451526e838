//! Tests of WRITEs, READs and atomics the driver executes itself
//! ([`direct`](super::direct)):
//! early and ordered completion, notices instead of requests on every resend, the normal
//! way when the driver refuses, and PSN accounting that a real responder agrees with.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use verbs_api::{AccessFlags, QpCap};

use super::*;
use crate::memory::MrShared;
use crate::responder::{Incoming, RespAttrs, Responder};

/// A driver that executes READs (filling the scatter list with `fill`) and atomics
/// (returning `orig`) as told, and counts what it was asked.
pub(super) struct Fake {
    write: bool,
    read: Mutex<bool>,
    orig: Mutex<Option<u64>>,
    reads: AtomicUsize,
    atomics: AtomicUsize,
    fill: u8,
}

impl Fake {
    pub(super) fn new(write: bool, read: bool, orig: Option<u64>) -> Arc<Self> {
        Arc::new(Fake {
            write,
            read: Mutex::new(read),
            orig: Mutex::new(orig),
            reads: AtomicUsize::new(0),
            atomics: AtomicUsize::new(0),
            fill: 0xab,
        })
    }
}

impl DirectWrite for Fake {
    fn min_len(&self) -> u64 {
        32
    }
    fn write(&self, _: u32, _: u32, _: u64, _: &[Seg]) -> bool {
        self.write
    }
    fn read(&self, _: u32, _: u32, _: u64, segs: &[Seg]) -> bool {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if !*self.read.lock().unwrap() {
            return false;
        }
        segs.iter().all(|s| s.copy_in(0, &vec![self.fill; s.len]))
    }
    fn atomic(&self, _: u32, _: u32, _: u64, _: DirectAtomic) -> Option<u64> {
        self.atomics.fetch_add(1, Ordering::SeqCst);
        *self.orig.lock().unwrap()
    }
}

/// A connected RC requester with the fast path `fake`, and its local region (4 KiB,
/// lkey 7) in `mrs`.
pub(super) fn setup(fake: Arc<Fake>, max_rd_atomic: u8) -> (Requester, MrTable, Arc<MrShared>) {
    setup_with(fake, max_rd_atomic, 16, Switches::default())
}

/// The same with a send queue of `cap` WQEs, on a device with the switches `sw`.
pub(super) fn setup_with(
    fake: Arc<Fake>,
    max_rd_atomic: u8,
    cap: u32,
    sw: Switches,
) -> (Requester, MrTable, Arc<MrShared>) {
    let mrs = MrTable::default();
    let mr = Arc::new(MrShared::new_owned(1, 7, 4096, AccessFlags::LOCAL_WRITE).unwrap());
    mrs.insert(mr.clone());
    let mut req = Requester::new(1, 1, &QpCap::new(cap, 1), false).with_profile(sw, MAX_MSG, 4096);
    req.connect(ReqAttrs {
        sq_psn: 100,
        timeout: Some(Duration::from_millis(10)),
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic,
    });
    req.set_path_mtu(1024);
    req.dest_qpn = 0x42;
    req.set_direct(Some(fake));
    (req, mrs, mr)
}

/// Sends what may go now: the frames (with their payloads) and the completions.
pub(super) fn send(req: &mut Requester, mrs: &MrTable, now: Instant) -> (Vec<(Frame, Vec<u8>)>, Vec<u64>) {
    let (mut tx, mut out) = (TxQueue::new(), Vec::new());
    req.poll_transmit(mrs, now, &mut tx, 64, &mut out).unwrap();
    (decode(&mut tx), ids(&out))
}

fn decode(tx: &mut TxQueue) -> Vec<(Frame, Vec<u8>)> {
    let mut wire = Vec::new();
    tx.drain_into(&mut wire);
    let mut frames = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let (f, head) = Frame::decode(&wire[at..]).unwrap().unwrap();
        let end = at + head + f.payload_len() as usize;
        frames.push((f, wire[at + head..end].to_vec()));
        at = end;
    }
    frames
}

pub(super) fn ids(out: &[WorkCompletion]) -> Vec<u64> {
    out.iter()
        .inspect(|wc| assert_eq!(wc.status, WcStatus::Success, "{wc:?}"))
        .map(|wc| wc.wr_id)
        .collect()
}

fn word(mr: &MrShared, at: usize) -> u64 {
    let mut b = [0u8; 8];
    assert!(mr.copy_out(at, &mut b));
    u64::from_ne_bytes(b)
}

/// The responder of the QP `setup` connects to: PSNs from 100, MTU 1024, every remote
/// right, four READs or atomics.
pub(super) fn responder() -> Responder {
    let mut resp = Responder::new(2, 2, 4, 1);
    resp.set_path_mtu(1024);
    resp.connect(RespAttrs {
        rq_psn: 100,
        min_rnr_timer: 1,
    });
    resp.access = AccessFlags::REMOTE;
    resp.max_dest_rd_atomic = 4;
    resp
}

pub(super) fn ack(req: &mut Requester, psn: u32) -> Vec<u64> {
    let mut out = Vec::new();
    req.on_response(&Frame::Ack { psn }, Instant::now(), &mut out)
        .unwrap();
    ids(&out)
}

/// An executed atomic and READ behind a placed WRITE_WITH_IMM that waits for its ACK,
/// their notices one run, complete when
/// the WRITE does, in order, with their results in place; the ACK of their notices
/// completes nothing again. One behind nothing unfinished completes as it is sent, and
/// does not count against `max_rd_atomic` while its notice waits for the ACK.
#[test]
fn executed_read_and_atomic_complete_early_and_in_order() {
    let fake = Fake::new(true, true, Some(41));
    let (mut req, mrs, mr) = setup(fake.clone(), 1);
    let long = [Sge::new(mr.addr(), 64, 7)];
    let word_sge = [Sge::new(mr.addr() + 128, 8, 7)];
    let read_sge = [Sge::new(mr.addr() + 256, 2048, 7)];
    let post = |req: &mut Requester, wr: SendWr<'_>| req.post(&wr.signaled(), &mrs).unwrap();
    post(&mut req, SendWr::write_with_imm(1, &long, (0x9000, 5), 6));
    post(&mut req, SendWr::fetch_and_add(2, &word_sge, (0x9100, 5), 3));
    post(&mut req, SendWr::read(3, &read_sge, (0x9200, 5)));
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    let kinds: Vec<_> = frames.iter().map(|(f, p)| (*f, p.len())).collect();
    assert_eq!(
        kinds,
        [
            (
                Frame::WritePlaced {
                    psn: 100,
                    len: 64,
                    addr: 0x9000,
                    rkey: 5,
                    imm: Some(6),
                    solicited: false,
                    ack_req: true
                },
                0
            ),
            (
                Frame::PlacedRun {
                    psn: 101,
                    pkts: 3,
                    msgs: 2,
                    rd_atomic: 2,
                    ack_req: true
                },
                0
            ),
        ]
    );
    assert!(
        done.is_empty(),
        "completed before the WRITE ahead of them: {done:?}"
    );
    assert_eq!(req.next_psn(), 104, "the READ's notice takes its two PSNs");
    assert_eq!(ack(&mut req, 100), [1, 2, 3]);
    assert_eq!(word(&mr, 128), 41);
    let mut read = vec![0u8; 2048];
    assert!(mr.copy_out(256, &mut read));
    assert!(read.iter().all(|&b| b == 0xab));
    assert_eq!(
        req.outstanding(),
        2,
        "the notices hold their slots until acknowledged"
    );
    // A READ response for the READ's notice (no responder sends one) goes nowhere.
    let mut out = Vec::new();
    let stray = Frame::ReadResp { psn: 102, len: 2048 };
    assert!(matches!(
        req.on_response(&stray, Instant::now(), &mut out),
        Ok(ReadSink::Discard)
    ));
    assert!(out.is_empty());
    assert_eq!(ack(&mut req, 103), Vec::<u64>::new());
    assert_eq!(req.outstanding(), 0);
    // Nothing unfinished ahead: each completes as it is sent, and with max_rd_atomic 1
    // the second goes while the first one's notice is unacknowledged.
    post(&mut req, SendWr::fetch_and_add(4, &word_sge, (0x9100, 5), 3));
    post(&mut req, SendWr::cmp_and_swp(5, &word_sge, (0x9100, 5), 41, 9));
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    assert!(
        matches!(
            frames[..],
            [(
                Frame::PlacedRun {
                    psn: 104,
                    pkts: 2,
                    msgs: 2,
                    ..
                },
                _
            )]
        ),
        "{frames:?}"
    );
    assert_eq!(done, [4, 5]);
    assert_eq!(fake.atomics.load(Ordering::SeqCst), 3);
}

/// A placed and completed atomic is resent as its notice after a lost connection, a
/// local ACK timeout and a PSN sequence NAK, never executed again, and completes once.
#[test]
fn resends_are_notices_and_an_atomic_executes_once() {
    let fake = Fake::new(false, true, Some(7));
    let (mut req, mrs, mr) = setup(fake.clone(), 1);
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    req.post(
        &SendWr::fetch_and_add(1, &word_sge, (0x9100, 5), 1).signaled(),
        &mrs,
    )
    .unwrap();
    let t0 = Instant::now();
    let (first, done) = send(&mut req, &mrs, t0);
    assert_eq!(done, [1]);
    assert!(matches!(first[0].0, Frame::AtomicPlaced { psn: 100, .. }));
    let mut out = Vec::new();
    req.on_connection_lost();
    assert_eq!(send(&mut req, &mrs, t0).0, first);
    assert!(req
        .on_timer(t0 + Duration::from_millis(20), None, None, &mut out)
        .unwrap());
    assert_eq!(send(&mut req, &mrs, t0).0, first);
    let nak = Frame::Nak {
        psn: 100,
        code: NakCode::PsnSeq,
        reason: None,
    };
    req.on_response(&nak, t0, &mut out).unwrap();
    assert_eq!(send(&mut req, &mrs, t0).0, first);
    // An atomic response for the notice's PSN (no responder sends one) changes nothing.
    req.on_response(&Frame::AtomicResp { psn: 100, orig: 99 }, t0, &mut out)
        .unwrap();
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(word(&mr, 0), 7);
    assert_eq!(
        fake.atomics.load(Ordering::SeqCst),
        1,
        "the atomic was executed again"
    );
    // A sequence NAK for the WRITE behind it resends the WRITE alone: the notice is no
    // READ or atomic waiting for its response, and the NAK acknowledges it.
    let short = [Sge::new(mr.addr() + 64, 16, 7)];
    req.post(&SendWr::write(2, &short, (0x9000, 5)), &mrs).unwrap();
    assert!(matches!(
        send(&mut req, &mrs, t0).0[0].0,
        Frame::Write { psn: 101, .. }
    ));
    let nak = Frame::Nak {
        psn: 101,
        code: NakCode::PsnSeq,
        reason: None,
    };
    req.on_response(&nak, t0, &mut out).unwrap();
    let again = send(&mut req, &mrs, t0).0;
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(matches!(again[0].0, Frame::Write { psn: 101, .. }));
    assert_eq!(ack(&mut req, 101), Vec::<u64>::new());
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(req.outstanding(), 0);
}

/// A READ or atomic the driver refuses goes the normal way, once asked, and completes
/// with the responder's answer.
#[test]
fn refused_ones_go_the_normal_way() {
    let fake = Fake::new(false, false, None);
    let (mut req, mrs, mr) = setup(fake.clone(), 4);
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    let read_sge = [Sge::new(mr.addr() + 64, 64, 7)];
    req.post(
        &SendWr::cmp_and_swp(1, &word_sge, (0x9100, 5), 0, 1).signaled(),
        &mrs,
    )
    .unwrap();
    req.post(&SendWr::read(2, &read_sge, (0x9200, 5)).signaled(), &mrs)
        .unwrap();
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    assert!(done.is_empty());
    assert!(
        matches!(frames[0].0, Frame::CmpSwap { psn: 100, .. }),
        "{frames:?}"
    );
    assert!(
        matches!(
            frames[1].0,
            Frame::Read {
                psn: 101,
                len: 64,
                ..
            }
        ),
        "{frames:?}"
    );
    assert_eq!(fake.atomics.load(Ordering::SeqCst), 1);
    // The READ was not asked: the atomic before it is unanswered (RC ordering).
    assert_eq!(
        fake.reads.load(Ordering::SeqCst),
        0,
        "asked behind an unanswered atomic"
    );
    let mut out = Vec::new();
    let now = Instant::now();
    req.on_response(&Frame::AtomicResp { psn: 100, orig: 55 }, now, &mut out)
        .unwrap();
    match req.on_response(&Frame::ReadResp { psn: 101, len: 64 }, now, &mut out) {
        Ok(ReadSink::Into { psn, segs }) => {
            assert!(segs[0].copy_in(0, &[3; 64]));
            req.read_done(psn, segs, now, &mut out);
        }
        _ => panic!("the READ's response has nowhere to go"),
    }
    assert_eq!(ids(&out), [1, 2]);
    assert_eq!(word(&mr, 0), 55);
    // Resent after a lost connection: still the normal way, not asked again.
    req.post(
        &SendWr::fetch_and_add(3, &word_sge, (0x9100, 5), 1).signaled(),
        &mrs,
    )
    .unwrap();
    send(&mut req, &mrs, now);
    req.on_connection_lost();
    let (frames, _) = send(&mut req, &mrs, now);
    assert!(
        matches!(frames[0].0, Frame::FetchAdd { psn: 102, .. }),
        "{frames:?}"
    );
    assert_eq!(fake.atomics.load(Ordering::SeqCst), 2);
}

/// A responder that NAKs a notice (its QP has no responder resources) fails the WQE as
/// for that NAK, without a second completion for it; the WQEs behind it are flushed.
#[test]
fn a_nak_of_a_notice_errors_without_a_second_completion() {
    let fake = Fake::new(false, true, Some(1));
    let (mut req, mrs, mr) = setup(fake, 1);
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    req.post(
        &SendWr::fetch_and_add(1, &word_sge, (0x9100, 5), 1).signaled(),
        &mrs,
    )
    .unwrap();
    req.post(
        &SendWr::fetch_and_add(2, &word_sge, (0x9100, 5), 1).signaled(),
        &mrs,
    )
    .unwrap();
    assert_eq!(send(&mut req, &mrs, Instant::now()).1, [1, 2]);
    let mut out = Vec::new();
    let nak = Frame::Nak {
        psn: 100,
        code: NakCode::InvalidRequest,
        reason: Some(NakReason::NoRdAtomicResources),
    };
    assert!(matches!(
        req.on_response(&nak, Instant::now(), &mut out),
        Err(Fatal(WcStatus::RemInvReqErr))
    ));
    req.flush(&mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(req.outstanding(), 0);
}

/// Requester and responder agree on the PSNs: an executed READ's notice takes the
/// READ's PSNs at the path MTU, the responder acknowledges it and executes the normal
/// READ behind it, whose response completes it; the ACK completes nothing twice.
#[test]
fn a_responder_accepts_what_follows_a_notice() {
    let fake = Fake::new(false, true, None);
    let (mut req, mrs, mr) = setup(fake, 4);
    let remote = Arc::new(MrShared::new_owned(2, 9, 4096, AccessFlags::ALL).unwrap());
    let rmrs = MrTable::default();
    rmrs.insert(remote.clone());
    let seg = Seg {
        mr: remote.clone(),
        offset: 0,
        len: 16,
    };
    assert!(seg.copy_in(0, &[5; 16]));
    let mut resp = responder();
    let big = [Sge::new(mr.addr(), 3000, 7)];
    let small = [Sge::new(mr.addr() + 3072, 16, 7)];
    let raddr = (remote.addr(), 9);
    req.post(&SendWr::read(1, &big, raddr).signaled(), &mrs).unwrap();
    req.post(&SendWr::read(2, &small, raddr).signaled(), &mrs)
        .unwrap();
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    assert_eq!(done, [1]);
    let (mut tx, mut rout) = (TxQueue::new(), Vec::new());
    for (f, _) in &frames {
        assert!(matches!(
            resp.on_request(f, &rmrs, &mut tx, &mut rout),
            Ok(Incoming::Discard)
        ));
    }
    assert_eq!(
        resp.expected_psn(),
        104,
        "3000 bytes at MTU 1024: three PSNs, then one"
    );
    let mut out = Vec::new();
    let now = Instant::now();
    for (f, payload) in decode(&mut tx) {
        if let ReadSink::Into { psn, segs } = req.on_response(&f, now, &mut out).unwrap() {
            assert!(segs[0].copy_in(0, &payload));
            req.read_done(psn, segs, now, &mut out);
        }
    }
    assert_eq!(ids(&out), [2]);
    assert_eq!(req.outstanding(), 0);
    let mut got = [0u8; 16];
    assert!(mr.copy_out(3072, &mut got));
    assert_eq!(got, [5; 16]);
}

/// An early completion frees its WQE's slot as any completion does, though the WQE
/// waits for its notice's ACK: at once, or under `SlotRelease::AtPoll` once polled.
#[test]
fn an_early_completion_frees_the_slot() {
    for at_poll in [false, true] {
        let sw = Switches {
            sq_slot_release: if at_poll {
                SlotRelease::AtPoll
            } else {
                SlotRelease::AtCompletion
            },
            ..Switches::default()
        };
        let (mut req, mrs, mr) = setup_with(Fake::new(false, true, Some(0)), 1, 1, sw);
        let word_sge = [Sge::new(mr.addr(), 8, 7)];
        let faa = |id| SendWr::fetch_and_add(id, &word_sge, (0x9100, 5), 1).signaled();
        req.post(&faa(1), &mrs).unwrap();
        assert_eq!(send(&mut req, &mrs, Instant::now()).1, [1]);
        assert_eq!(req.outstanding(), 1, "the notice is unacknowledged");
        if at_poll {
            assert_eq!(req.post(&faa(2), &mrs), Err(PostCheck::FullUnpolled));
            let mut marks = Vec::new();
            req.take_marks(&mut marks);
            assert_eq!(marks, [1]);
            req.slots().release_through(marks[0]);
        }
        req.post(&faa(2), &mrs).unwrap();
        assert_eq!(req.post(&faa(3), &mrs), Err(PostCheck::Full));
        assert_eq!(send(&mut req, &mrs, Instant::now()).1, [2]);
        assert_eq!(ack(&mut req, 101), Vec::<u64>::new());
        assert_eq!(req.outstanding(), 0);
        assert_eq!(req.held_unpolled(), u64::from(at_poll));
    }
}

/// An atomic first sent the normal way (behind an unanswered READ) is never asked when
/// it is resent: the responder may have executed it and lost only its answer.
#[test]
fn a_resend_of_one_sent_the_normal_way_is_never_asked() {
    let fake = Fake::new(false, false, Some(1));
    let (mut req, mrs, mr) = setup(fake.clone(), 4);
    let read_sge = [Sge::new(mr.addr() + 64, 64, 7)];
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    req.post(&SendWr::read(1, &read_sge, (0x9200, 5)).signaled(), &mrs)
        .unwrap();
    req.post(
        &SendWr::fetch_and_add(2, &word_sge, (0x9100, 5), 1).signaled(),
        &mrs,
    )
    .unwrap();
    let (frames, _) = send(&mut req, &mrs, Instant::now());
    assert!(
        matches!(frames[1].0, Frame::FetchAdd { psn: 101, .. }),
        "{frames:?}"
    );
    let (now, mut out) = (Instant::now(), Vec::new());
    match req.on_response(&Frame::ReadResp { psn: 100, len: 64 }, now, &mut out) {
        Ok(ReadSink::Into { psn, segs }) => req.read_done(psn, segs, now, &mut out),
        _ => panic!("the READ's response has nowhere to go"),
    }
    assert_eq!(ids(&out), [1]);
    req.on_connection_lost();
    let (frames, done) = send(&mut req, &mrs, now);
    assert!(
        matches!(frames[0].0, Frame::FetchAdd { psn: 101, .. }),
        "{frames:?}"
    );
    assert!(done.is_empty());
    assert_eq!(fake.atomics.load(Ordering::SeqCst), 0, "asked on a resend");
}

/// An executed atomic waiting for the placed WRITE_WITH_IMM ahead of it is flushed when
/// that WRITE fails: after an error completion only flushes follow.
#[test]
fn one_waiting_behind_a_failed_write_is_flushed() {
    let fake = Fake::new(true, false, Some(1));
    let (mut req, mrs, mr) = setup(fake, 1);
    let long = [Sge::new(mr.addr() + 64, 64, 7)];
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    req.post(&SendWr::write_with_imm(1, &long, (0x9000, 5), 6).signaled(), &mrs)
        .unwrap();
    req.post(
        &SendWr::fetch_and_add(2, &word_sge, (0x9100, 5), 1).signaled(),
        &mrs,
    )
    .unwrap();
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    assert!(matches!(frames[1].0, Frame::AtomicPlaced { .. }), "{frames:?}");
    assert!(done.is_empty());
    let mut out = Vec::new();
    let nak = Frame::Nak {
        psn: 100,
        code: NakCode::RemoteAccess,
        reason: Some(NakReason::OutOfBounds),
    };
    assert!(req.on_response(&nak, Instant::now(), &mut out).is_err());
    req.flush(&mut out);
    let got: Vec<_> = out.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]);
}

/// When the retries run out behind an unacknowledged notice, the error completes the
/// first WQE whose completion has not gone yet; the completed one gets no second.
#[test]
fn spent_retries_fail_the_first_wqe_not_yet_completed() {
    let fake = Fake::new(false, true, Some(1));
    let (mut req, mrs, mr) = setup(fake, 1);
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    let short = [Sge::new(mr.addr() + 64, 16, 7)];
    req.post(
        &SendWr::fetch_and_add(1, &word_sge, (0x9100, 5), 1).signaled(),
        &mrs,
    )
    .unwrap();
    req.post(&SendWr::write(2, &short, (0x9000, 5)).signaled(), &mrs)
        .unwrap();
    let mut t = Instant::now();
    assert_eq!(send(&mut req, &mrs, t).1, [1]);
    let mut out = Vec::new();
    let mut failed = false;
    for _ in 0..20 {
        t += Duration::from_millis(20);
        if req.on_timer(t, None, None, &mut out).is_err() {
            failed = true;
            break;
        }
        send(&mut req, &mrs, t);
    }
    assert!(failed, "the retries never ran out");
    req.flush(&mut out);
    let got: Vec<_> = out.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [(2, WcStatus::RetryExcErr)]);
}

/// A WQE built while the QP has no connection (its frame lost on the way, for the local
/// checks only) still asks the fast path when it is first sent over one.
#[test]
fn a_build_without_a_connection_is_no_first_send() {
    let fake = Fake::new(false, false, Some(3));
    let (mut req, mrs, mr) = setup(fake.clone(), 1);
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    req.post(
        &SendWr::fetch_and_add(1, &word_sge, (0x9100, 5), 1).signaled(),
        &mrs,
    )
    .unwrap();
    let direct = req.direct.take();
    req.builds_are_lost(true);
    let (lost, _) = send(&mut req, &mrs, Instant::now());
    req.builds_are_lost(false);
    assert!(matches!(lost[0].0, Frame::FetchAdd { .. }), "{lost:?}");
    req.set_direct(direct);
    req.on_connection_lost();
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    assert!(
        matches!(frames[0].0, Frame::AtomicPlaced { psn: 100, .. }),
        "{frames:?}"
    );
    assert_eq!(done, [1]);
    assert_eq!(fake.atomics.load(Ordering::SeqCst), 1);
}
