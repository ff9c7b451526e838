//! One packet lost inside a message, on a network that cuts every frame into its
//! packets: the responder NAKs the PSN it expects once and keeps the message's receive
//! and position, and the requester resends from that packet (SEND, WRITE) or reads the
//! rest again (READ), across the PSN wrap at 2^24 as well (IBA 9.7.5.1.2, 9.7.5.2.1).

use std::time::Duration;

use verbs_api::{RecvWr, SendWr, WcStatus};

use super::workload::{get, pattern, put, region, sge};
use super::{Attrs, Dir, Fabric, FaultMix};
use crate::psn;
use crate::wire::{Frame, NakCode, PartKind};

/// A message of four packets at the default path MTU (1024).
const LEN: usize = 4000;

/// A connection whose first PSN is `psn` over a network that loses nothing by itself
/// and cuts every frame into its packets, recording what it carries.
fn pair(psn: u32) -> Fabric {
    let mut mix = FaultMix::clean(Duration::from_micros(2));
    mix.split_ppm = 1_000_000;
    let mut f = Fabric::new(
        0,
        mix,
        Attrs {
            psn,
            ..Attrs::default()
        },
    );
    f.record();
    f
}

fn settle(f: &mut Fabric) {
    f.run_until(Duration::from_secs(10), 100_000);
    assert!(f.broken().is_none(), "{:?}", f.broken());
}

/// The NAKs B sent.
fn naks(f: &Fabric) -> Vec<Frame> {
    f.recorded()
        .iter()
        .filter(|(d, fr, _)| *d == Dir::BtoA && matches!(fr, Frame::Nak { .. }))
        .map(|(_, fr, _)| *fr)
        .collect()
}

/// A's request packets after the first lost one: (PSN, length, first, last, RETH
/// address).
fn resent(f: &Fabric) -> Vec<(u32, u32, bool, bool, u64)> {
    let lost = f
        .recorded()
        .iter()
        .position(|(d, _, lost)| *d == Dir::AtoB && *lost)
        .expect("a packet was lost");
    f.recorded()[lost + 1..]
        .iter()
        .filter(|(d, _, _)| *d == Dir::AtoB)
        .filter_map(|(_, fr, _)| match *fr {
            Frame::Part {
                psn,
                len,
                first,
                last,
                addr,
                ..
            } => Some((psn, len, first, last, addr)),
            _ => None,
        })
        .collect()
}

fn sends_ok(f: &Fabric) {
    let st: Vec<_> = f.a.send_wc.iter().map(|w| w.status).collect();
    assert_eq!(st, [WcStatus::Success]);
}

/// A SEND of four packets from PSN `first` whose second packet is lost: one NAK for it
/// although the third and fourth arrive out of sequence, the resend starts at that
/// packet as MIDDLE and LAST with the message's bytes from 1024 on, and the receive
/// the first packet took completes with the whole message.
fn lost_middle_of_a_send(first: u32) {
    let mut f = pair(first);
    let src = region(&mut f, false, LEN);
    let dst = region(&mut f, true, LEN);
    let data = pattern(7, LEN);
    put(&src, 0, &data);
    f.b.post_recv(&RecvWr::new(9, &[sge(&dst, 0, LEN)])).unwrap();
    let lost = psn::add(first, 1);
    f.lose_once(Dir::AtoB, lost);
    f.a.post(&SendWr::send(1, &[sge(&src, 0, LEN)]).signaled())
        .unwrap();
    settle(&mut f);
    sends_ok(&f);
    let recv: Vec<_> =
        f.b.recv_wc
            .iter()
            .map(|(w, _)| (w.wr_id, w.status, w.byte_len))
            .collect();
    assert_eq!(recv, [(9, WcStatus::Success, LEN as u32)]);
    assert_eq!(get(&dst, 0, LEN), data);
    assert_eq!(
        naks(&f),
        [Frame::Nak {
            psn: lost,
            code: NakCode::PsnSeq,
            reason: None
        }]
    );
    assert_eq!(
        resent(&f),
        [
            (psn::add(first, 2), 1024, false, false, 0),
            (psn::add(first, 3), 928, false, true, 0),
            (lost, 1024, false, false, 0),
            (psn::add(first, 2), 1024, false, false, 0),
            (psn::add(first, 3), 928, false, true, 0),
        ]
    );
}

#[test]
fn a_lost_middle_of_a_send_is_nakked_once_and_resent_from_it() {
    lost_middle_of_a_send(0);
}

#[test]
fn a_lost_middle_across_the_psn_wrap_is_resent_from_it() {
    // PSNs 0xfffffe, 0xffffff, 0, 1: the packet after the wrap is lost.
    lost_middle_of_a_send(0xff_fffe);
    lost_middle_of_a_send(0xff_ffff);
}

/// A WRITE of four packets whose second is lost: the responder keeps its write
/// position, and the resend carries MIDDLE and LAST packets without a RETH.
#[test]
fn a_lost_middle_of_a_write_is_resent_from_it_without_a_reth() {
    let mut f = pair(0);
    let src = region(&mut f, false, LEN);
    let dst = region(&mut f, true, LEN);
    let data = pattern(11, LEN);
    put(&src, 0, &data);
    f.lose_once(Dir::AtoB, 1);
    let remote = (dst.addr(), dst.key);
    f.a.post(&SendWr::write(1, &[sge(&src, 0, LEN)], remote).signaled())
        .unwrap();
    settle(&mut f);
    sends_ok(&f);
    assert_eq!(get(&dst, 0, LEN), data);
    assert_eq!(naks(&f).len(), 1);
    let r = resent(&f);
    assert_eq!(
        &r[2..],
        [
            (1, 1024, false, false, 0),
            (2, 1024, false, false, 0),
            (3, 928, false, true, 0)
        ]
    );
    // The first packet, and only it, carried the RETH.
    let reths: Vec<_> = f
        .recorded()
        .iter()
        .filter_map(|(_, fr, _)| match *fr {
            Frame::Part {
                psn,
                kind: PartKind::Write,
                addr,
                ..
            } if addr != 0 => Some((psn, addr)),
            _ => None,
        })
        .collect();
    assert_eq!(reths, [(0, dst.addr())]);
}

/// A READ whose second response packet is lost: the third comes out of sequence, and A
/// reads the rest again, from the lost packet's PSN with the RETH's address and length
/// advanced past the packet it has.
#[test]
fn a_lost_read_response_packet_reads_the_rest_again() {
    let mut f = pair(0);
    let src = region(&mut f, true, LEN);
    let dst = region(&mut f, false, LEN);
    let data = pattern(13, LEN);
    put(&src, 0, &data);
    f.lose_once(Dir::BtoA, 1);
    let remote = (src.addr(), src.key);
    f.a.post(&SendWr::read(1, &[sge(&dst, 0, LEN)], remote).signaled())
        .unwrap();
    settle(&mut f);
    sends_ok(&f);
    assert_eq!(get(&dst, 0, LEN), data);
    let reads: Vec<_> = f
        .recorded()
        .iter()
        .filter_map(|(d, fr, _)| match *fr {
            Frame::Read { psn, len, addr, .. } if *d == Dir::AtoB => Some((psn, len, addr - src.addr())),
            _ => None,
        })
        .collect();
    assert_eq!(reads, [(0, LEN as u32, 0), (1, LEN as u32 - 1024, 1024)]);
    // The second READ's response is numbered from its PSN.
    let resp: Vec<_> = f
        .recorded()
        .iter()
        .filter_map(|(d, fr, lost)| match *fr {
            Frame::Part {
                psn,
                len,
                kind: PartKind::ReadResp,
                ..
            } if *d == Dir::BtoA => Some((psn, len, *lost)),
            _ => None,
        })
        .collect();
    assert_eq!(
        resp,
        [
            (0, 1024, false),
            (1, 1024, true),
            (2, 1024, false),
            (3, 928, false),
            (1, 1024, false),
            (2, 1024, false),
            (3, 928, false),
        ]
    );
}

/// What an HCA puts on the wire for a SEND of four packets whose second is lost on the
/// way, as the capture shows it (the packets of each frame the ends queue, IBA's opcodes
/// and PSNs, [`crate::capture::segment`]): FIRST, MIDDLE, MIDDLE, LAST; the responder's
/// PSN sequence error NAK for the lost packet's PSN; the resend from that packet, MIDDLE,
/// MIDDLE, LAST, no FIRST again; the ACK of the last. The requester's debug event says it
/// resends from inside the message, and from which byte.
#[test]
fn the_capture_shows_the_nak_and_the_resend_from_the_packet() {
    use std::sync::{Arc, Mutex};

    use crate::capture::headers::{ack_syndrome, nak_syndrome};
    use crate::capture::opcode::{op, Transport};
    use crate::capture::segment::{segments, Context};
    use crate::trace_capture::Capture;

    type Seen = Arc<Mutex<Vec<(u32, u8, u32, Option<u8>)>>>;
    struct Tap(Seen, u32);
    impl crate::tx::FrameTap for Tap {
        fn sent(&mut self, f: &Frame, msn: u32) {
            let cx = Context {
                transport: Transport::Rc,
                dst_qpn: self.1,
                mtu: 1024,
                msn,
            };
            for s in segments(f, &cx) {
                let h = s.headers;
                self.0
                    .lock()
                    .unwrap()
                    .push((self.1, h.bth.opcode, h.bth.psn, h.aeth.map(|a| a.syndrome)));
            }
        }
    }
    let seen = Seen::default();
    let mut f = pair(0);
    f.a.port.tap(Box::new(Tap(seen.clone(), 2)));
    f.b.port.tap(Box::new(Tap(seen.clone(), 1)));
    let src = region(&mut f, false, LEN);
    let dst = region(&mut f, true, LEN);
    put(&src, 0, &pattern(3, LEN));
    f.b.post_recv(&RecvWr::new(9, &[sge(&dst, 0, LEN)])).unwrap();
    f.lose_once(Dir::AtoB, 1);
    let events = Capture::default();
    events.run(|| {
        f.a.post(&SendWr::send(1, &[sge(&src, 0, LEN)]).signaled())
            .unwrap();
        settle(&mut f);
    });
    sends_ok(&f);
    let (to_b, to_a) = (2, 1);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (to_b, op::SEND_FIRST, 0, None),
            (to_b, op::SEND_MIDDLE, 1, None),
            (to_b, op::SEND_MIDDLE, 2, None),
            (to_b, op::SEND_LAST, 3, None),
            (to_a, op::ACKNOWLEDGE, 1, Some(nak_syndrome(NakCode::PsnSeq))),
            (to_b, op::SEND_MIDDLE, 1, None),
            (to_b, op::SEND_MIDDLE, 2, None),
            (to_b, op::SEND_LAST, 3, None),
            (to_a, op::ACKNOWLEDGE, 3, Some(ack_syndrome())),
        ]
    );
    let resend = events.find(
        tracing::Level::DEBUG,
        "resending from a packet inside the message",
    );
    let at: Vec<_> = resend
        .iter()
        .map(|e| (e.field("psn").unwrap_or(""), e.field("offset").unwrap_or("")))
        .collect();
    assert_eq!(at, [("1", "1024")]);
}
