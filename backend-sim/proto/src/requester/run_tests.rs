//! Tests of coalesced notices ([`run`](super::run)): held while a transmit call goes on,
//! sent before any other request frame, at half the send queue and when the call ends,
//! one frame for a run that a responder takes in whole; resends one notice each.

use super::placed_tests::{ack, responder, send, setup, setup_with, Fake};
use super::*;
use crate::responder::Incoming;

/// Executed atomics' notices wait while the call goes on and leave, as one frame, before
/// the SEND behind them (the responder sees PSNs in order); the WQE after the SEND goes
/// the normal way (the SEND is unanswered).
#[test]
fn notices_wait_and_leave_before_a_normal_frame() {
    let (mut req, mrs, mr) = setup(Fake::new(false, false, Some(0)), 1);
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    let msg = [Sge::new(mr.addr() + 64, 16, 7)];
    let faa = |id| SendWr::fetch_and_add(id, &word_sge, (0x9100, 5), 1).signaled();
    for wr in [faa(1), faa(2), SendWr::send(3, &msg).signaled(), faa(4)] {
        req.post(&wr, &mrs).unwrap();
    }
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    let got: Vec<_> = frames.iter().map(|(f, _)| *f).collect();
    assert!(
        matches!(
            got[..],
            [
                Frame::PlacedRun {
                    psn: 100,
                    pkts: 2,
                    msgs: 2,
                    rd_atomic: 2,
                    ..
                },
                Frame::Send { psn: 102, .. },
                Frame::FetchAdd { psn: 103, .. }
            ]
        ),
        "{got:?}"
    );
    assert_eq!(done, [1, 2]);
}

/// A run of four executed operations (atomics, a READ of three PSNs) goes as one frame
/// taking their six PSNs; a responder advances its expected PSN over it, counts four
/// messages and acknowledges its last PSN.
#[test]
fn a_run_goes_as_one_frame_and_a_responder_takes_it_whole() {
    let (mut req, mrs, mr) = setup(Fake::new(false, true, Some(3)), 1);
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    let read_sge = [Sge::new(mr.addr() + 1024, 3000, 7)];
    let faa = |id| SendWr::fetch_and_add(id, &word_sge, (0x9100, 5), 1).signaled();
    let wrs = [
        faa(1),
        faa(2),
        SendWr::read(3, &read_sge, (0x9200, 5)).signaled(),
        faa(4),
    ];
    for wr in &wrs {
        req.post(wr, &mrs).unwrap();
    }
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    assert_eq!(done, [1, 2, 3, 4]);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert!(
        matches!(
            frames[0],
            (
                Frame::PlacedRun {
                    psn: 100,
                    pkts: 6,
                    msgs: 4,
                    rd_atomic: 4,
                    ..
                },
                ref payload
            ) if payload.is_empty()
        ),
        "{frames:?}"
    );
    assert_eq!(req.next_psn(), 106);
    let mut resp = responder();
    let (rmrs, mut tx, mut rout) = (MrTable::default(), TxQueue::new(), Vec::new());
    assert!(matches!(
        resp.on_request(&frames[0].0, &rmrs, &mut tx, &mut rout),
        Ok(Incoming::Discard)
    ));
    assert_eq!(resp.expected_psn(), 106);
    assert_eq!(resp.msn(), 4);
    resp.flush_ack(&mut tx);
    let mut wire = Vec::new();
    tx.drain_into(&mut wire);
    let (ackf, _) = Frame::decode(&wire).unwrap().unwrap();
    assert_eq!(ackf, Frame::Ack { psn: 105 });
    assert_eq!(ack(&mut req, 105), Vec::<u64>::new());
    assert_eq!(req.outstanding(), 0);
    assert!(rout.is_empty());
}

/// At depth the run is cut at half the send queue and asks for the ACK, so slots free
/// while the rest is still being built; a resend after a lost connection is one notice
/// per operation, never a run.
#[test]
fn runs_are_cut_at_half_the_queue_and_resends_go_one_by_one() {
    let (mut req, mrs, mr) = setup_with(Fake::new(false, false, Some(0)), 1, 8, Switches::default());
    let word_sge = [Sge::new(mr.addr(), 8, 7)];
    for id in 1..=8 {
        req.post(
            &SendWr::fetch_and_add(id, &word_sge, (0x9100, 5), 1).signaled(),
            &mrs,
        )
        .unwrap();
    }
    let (frames, done) = send(&mut req, &mrs, Instant::now());
    assert_eq!(done, (1..=8).collect::<Vec<_>>());
    let got: Vec<_> = frames.iter().map(|(f, _)| *f).collect();
    assert_eq!(
        got,
        [
            Frame::PlacedRun {
                psn: 100,
                pkts: 4,
                msgs: 4,
                rd_atomic: 4,
                ack_req: true
            },
            Frame::PlacedRun {
                psn: 104,
                pkts: 4,
                msgs: 4,
                rd_atomic: 4,
                ack_req: true
            }
        ]
    );
    assert_eq!(ack(&mut req, 103), Vec::<u64>::new());
    assert_eq!(req.outstanding(), 4, "the first run's slots are free");
    req.on_connection_lost();
    let (again, done) = send(&mut req, &mrs, Instant::now());
    assert!(done.is_empty());
    let psns: Vec<_> = again
        .iter()
        .map(|(f, _)| match f {
            Frame::AtomicPlaced { psn, .. } => *psn,
            other => panic!("not a single notice: {other:?}"),
        })
        .collect();
    assert_eq!(psns, [104, 105, 106, 107]);
}
