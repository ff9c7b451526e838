//! `SimContext::capture_to`: one device's traffic and verbs context captured into a
//! writer. With whole packets the payload and the ICRC are the real ones; a snap length
//! cuts packets as pcap does; ACKs carry the responder's MSN; WRs, completions, state
//! changes and injected faults are in the capture as comments, which tshark shows, and
//! tshark reads every packet without a malformed one.

mod common;

use std::time::Duration;

use backend_sim::capture::{Buffer, Capture, Snaplen};
use backend_sim::faults::BreakPoint;
use backend_sim::SimContext;
use capture_judge::well_formed_of;
use common::{comments, name, roce, Pair};
use std::sync::Arc;
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(10);

/// A pair whose devices capture into a buffer each, keeping `snap` of each packet.
fn pair(snap: Snaplen) -> (Pair, [(Buffer, Arc<Capture>); 2]) {
    let mut caps = Vec::new();
    let p = Pair::with(
        backend_sim::Profile::default(),
        &RcParams::default(),
        QpCap::new(4, 4),
        |c0: &SimContext, c1: &SimContext| {
            for c in [c0, c1] {
                let b = Buffer::new();
                let cap = c.capture_to(b.clone(), snap).unwrap();
                caps.push((b, cap));
            }
        },
    );
    let caps: [(Buffer, Arc<Capture>); 2] = caps.try_into().unwrap();
    (p, caps)
}

fn bytes((b, cap): &(Buffer, Arc<Capture>)) -> Vec<u8> {
    cap.flush();
    b.contents()
}

fn run(p: &Pair, wr: SendWr<'_>) {
    p.a.post_send(&[wr]).unwrap();
    let wc = poll_n(&p.cq0, 1, WAIT).unwrap();
    assert!(wc[0].is_ok(), "{:?}", wc[0]);
}

#[test]
fn whole_packets_carry_their_payload_the_icrc_the_msn_and_the_verbs_context() {
    let (p, caps) = pair(Snaplen::Whole);
    let src = p.pd0.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let pattern: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    src.write(0, &pattern).unwrap();
    let dst = p
        .pd1
        .reg_mr(
            8192,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    p.b.post_recv(&[RecvWr::new(10, &[dst.sge(0, 4096).unwrap()])])
        .unwrap();
    run(&p, SendWr::send(1, &[src.sge(0, 3000).unwrap()]).signaled());
    assert!(poll_n(&p.cq1, 1, WAIT).unwrap()[0].is_ok());
    run(
        &p,
        SendWr::write(2, &[src.sge(0, 100).unwrap()], dst.remote().at(4096)).signaled(),
    );
    run(
        &p,
        SendWr::read(3, &[src.sge(4096, 8).unwrap()], dst.remote().at(0)).signaled(),
    );
    run(
        &p,
        SendWr::fetch_and_add(4, &[src.sge(4104, 8).unwrap()], dst.remote().at(4096), 5).signaled(),
    );

    let f0 = bytes(&caps[0]);
    let sent = roce(&f0);
    let ops: Vec<&str> = sent.iter().map(|(p, ..)| name(p)).collect();
    assert_eq!(
        ops,
        [
            "SEND_FIRST",
            "SEND_MIDDLE",
            "SEND_LAST",
            "RDMA_WRITE_ONLY",
            "RDMA_READ_REQUEST",
            "FETCH_ADD"
        ]
    );
    for (p, data, orig, _) in &sent {
        assert_eq!(
            p.icrc_ok,
            Some(true),
            "{} kept whole, with the ICRC rxe computes",
            name(p)
        );
        assert_eq!(data.len() + 14, *orig, "kept whole");
    }
    // The SEND's packets carry its bytes, 1024 (the path MTU) at a time.
    let at = 20 + 8 + 12;
    assert_eq!(&sent[0].1[at..at + 1024], &pattern[..1024]);
    assert_eq!(&sent[2].1[at..at + 952], &pattern[2048..]);

    // The responder's MSN: one more per message, the READ's and the atomic's counted
    // in their responses.
    let f1 = bytes(&caps[1]);
    let mut answers: Vec<(&str, u32)> = roce(&f1)
        .iter()
        .map(|(p, ..)| (name(p), p.headers.aeth.unwrap().msn))
        .collect();
    answers.dedup();
    assert_eq!(
        answers,
        [
            ("ACKNOWLEDGE", 1),
            ("ACKNOWLEDGE", 2),
            ("RDMA_READ_RESPONSE_ONLY", 3),
            ("ATOMIC_ACKNOWLEDGE", 4)
        ]
    );

    let notes = comments(&f0);
    let a = p.a.qp_num();
    for want in [
        format!("QP {a:#x}: state Init -> Rtr"),
        format!("QP {a:#x}: post_send wr_id 0x1 Send length 3000 signaled"),
        format!("QP {a:#x}: completion wr_id 0x1 Send status Success byte_len 3000"),
        format!(
            "QP {a:#x}: post_send wr_id 0x4 AtomicFetchAndAdd length 8 remote {:#x} rkey {:#x} signaled",
            dst.addr() + 4096,
            dst.rkey()
        ),
    ] {
        assert!(notes.contains(&want), "{want:?} not among {notes:#?}");
    }
    assert!(
        notes.iter().any(|n| n.contains("connection set up")),
        "{notes:#?}"
    );
    let b = p.b.qp_num();
    assert!(comments(&f1).contains(&format!("QP {b:#x}: post_recv wr_id 0xa length 4096")));

    // tshark: the comments, the MSNs, every packet well formed.
    let rows = well_formed_of(&f0, &["frame.comment", "infiniband.bth.opcode"]);
    assert!(rows
        .iter()
        .any(|r| r[0] == format!("QP {a:#x}: post_send wr_id 0x1 Send length 3000 signaled")));
    assert_eq!(rows.iter().filter(|r| !r[1].is_empty()).count(), sent.len());
    let rows = well_formed_of(&f1, &["infiniband.aeth.msn"]);
    let msns: Vec<&str> = rows
        .iter()
        .map(|r| r[0].as_str())
        .filter(|m| !m.is_empty())
        .collect();
    assert_eq!(msns.last(), Some(&"4"), "{msns:?}");
}

#[test]
fn a_snap_length_cuts_packets_as_pcap_does() {
    let (p, caps) = pair(Snaplen::Bytes(80));
    let src = p.pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p
        .pd1
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    run(
        &p,
        SendWr::write(1, &[src.sge(0, 2048).unwrap()], dst.remote().at(0)).signaled(),
    );
    let f0 = bytes(&caps[0]);
    let sent = roce(&f0);
    assert_eq!(sent.len(), 2);
    for (p, data, orig, _) in &sent {
        assert_eq!(data.len() + 14, 80, "cut at 80 bytes");
        assert_eq!(
            *orig,
            14 + 20 + 8 + p.headers.len() + 1024 + 4,
            "the packet's length on the wire"
        );
        assert_eq!(p.icrc_ok, None);
    }
    let rows = well_formed_of(&f0, &["frame.cap_len", "frame.len", "infiniband.bth.opcode"]);
    let cut: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| !r[2].is_empty())
        .map(|r| (r[0].as_str(), r[1].as_str()))
        .collect();
    assert_eq!(cut, [("80", "1098"), ("80", "1082")]);
}

#[test]
fn injected_faults_are_marked() {
    let (p, caps) = pair(Snaplen::Headers);
    let src = p.pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p.pd1.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    p.c1.faults().force_rnr(p.b.qp_num(), 1).unwrap();
    p.b.post_recv(&[RecvWr::new(10, &[dst.sge(0, 64).unwrap()])])
        .unwrap();
    run(&p, SendWr::send(1, &[src.sge(0, 64).unwrap()]).signaled());

    // A UD datagram an injected fault drops: in the capture, marked.
    const QKEY: u32 = 0x1111;
    let (ux, uy) = (
        common::ud_qp(&p.pd0, &p.cq0, QKEY),
        common::ud_qp(&p.pd1, &p.cq1, QKEY),
    );
    let params = RcParams::default();
    let ah = p
        .pd0
        .create_ah(&ah_attr_for(
            &local_endpoint(&p.c1, &uy, &params, 0).unwrap(),
            &params,
        ))
        .unwrap();
    p.c0.faults().drop_datagrams(ux.qp_num(), 1).unwrap();
    ux.post_send(&[SendWr::send(4, &[src.sge(0, 100).unwrap()])
        .signaled()
        .ud(&ah, uy.qp_num(), QKEY)])
        .unwrap();
    assert!(poll_n(&p.cq0, 1, WAIT).unwrap()[0].is_ok());

    let f1 = bytes(&caps[1]);
    let rnr: Vec<_> = roce(&f1)
        .into_iter()
        .filter(|(p, ..)| p.headers.aeth.is_some_and(|a| a.syndrome >> 5 == 1))
        .collect();
    assert_eq!(rnr.len(), 1, "one RNR NAK");
    assert_eq!(rnr[0].3.as_deref(), Some("RNR NAK forced (fault injection)"));
    let f0 = bytes(&caps[0]);
    let lost: Vec<_> = roce(&f0)
        .into_iter()
        .filter(|(p, ..)| p.headers.deth.is_some())
        .collect();
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].0.headers.bth.dst_qpn, uy.qp_num());
    assert_eq!(
        lost[0].3.as_deref(),
        Some("dropped: fault injection (drop_datagrams)")
    );
    for f in [&f0, &f1] {
        let rows = well_formed_of(f, &["frame.comment"]);
        assert!(rows.iter().any(|r| r[0].contains("fault injection")));
    }
}

#[test]
fn a_stall_a_setup_delay_and_a_request_cut_by_a_break_are_noted() {
    let (p, caps) = pair(Snaplen::Headers);
    let (a, b) = (p.a.qp_num(), p.b.qp_num());
    let src = p.pd0.reg_mr(64 << 10, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p
        .pd1
        .reg_mr(64 << 10, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    p.c1.faults()
        .stall_responder(b, Duration::from_millis(20))
        .unwrap();
    p.c0.faults().delay_setup(a, Duration::from_millis(1)).unwrap();
    run(
        &p,
        SendWr::write(1, &[src.sge(0, 8).unwrap()], dst.remote().at(0)).signaled(),
    );
    // Cut in the middle of a WRITE of 64 packets: resent whole once connected again.
    p.c0.faults().break_connection(a, BreakPoint::MidRequest).unwrap();
    run(
        &p,
        SendWr::write(2, &[src.sge_all()], dst.remote().at(0)).signaled(),
    );

    let (f0, f1) = (bytes(&caps[0]), bytes(&caps[1]));
    let notes1 = comments(&f1);
    let stalled =
        format!("QP {b:#x}: fault injection: responder stalled for 20ms (requests wait in the socket)");
    assert!(notes1.contains(&stalled), "{notes1:#?}");
    let notes0 = comments(&f0);
    let delayed = format!(
        "QP {a:#x}: fault injection: connections set up from now on wait 1ms before carrying traffic"
    );
    assert!(notes0.contains(&delayed), "{notes0:#?}");
    let cut = format!("QP {a:#x}: fault injection: connection broken MidRequest: ");
    let i = notes0
        .iter()
        .position(|n| n.starts_with(&cut) && n.ends_with("written before the break"))
        .unwrap_or_else(|| panic!("{notes0:#?}"));
    // Part of the WRITE's bytes left, not all.
    let counts: Vec<usize> = notes0[i][cut.len()..]
        .split(' ')
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(counts.len() == 2 && counts[0] < counts[1], "{}", notes0[i]);
    let broken = format!("QP {a:#x}: fault injection: connection broken");
    assert!(notes0[i..].contains(&broken), "{notes0:#?}");
    for f in [&f0, &f1] {
        well_formed_of(f, &["frame.comment"]);
    }
}
