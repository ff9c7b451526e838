//! The harness's own tests: hand-built inputs reach what they aim at, and its
//! assertions fire.
use backend_sim_proto::wire::Frame;

use crate::harness::Harness;
use crate::input::*;
use crate::regions::{FOREIGN, LOCAL, REGION_LEN, TARGET};

fn setup(recvs: u8, wrs: Vec<WrSpec>) -> Setup {
    Setup {
        qp_refuses: 0,
        rq_psn: 10,
        sq_psn: 500,
        min_rnr_timer: 1,
        ack_timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        recvs,
        wrs,
        ud: false,
    }
}

fn region(h: &Harness, r: usize) -> Vec<u8> {
    h.bytes()[h.offs[r]..h.offs[r] + REGION_LEN[r]].to_vec()
}

fn sent_frames(h: &mut Harness) -> Vec<Frame> {
    h.peer_reads();
    let mut v = Vec::new();
    let mut b = &h.out[..];
    while let Ok(Some((f, n))) = Frame::decode(b) {
        v.push(f);
        b = &b[n + f.payload_len() as usize..];
    }
    v
}

#[test]
fn write_read_and_atomic_reach_the_target() {
    let mut h = Harness::new(&setup(0, vec![]));
    let at = AddrSel::Region {
        region: 0,
        off: 512 + 64,
    };
    h.step(&Step::Frame(FrameSpec::Write {
        psn: PsnSel::Near(0),
        len: LenSel::Small(16),
        at,
        key: KeySel::Region(0),
        imm: None,
        solicited: false,
        ack_req: false,
        fill: 1,
    }));
    h.check();
    assert_eq!(&region(&h, TARGET)[64..80], &(1..17).collect::<Vec<u8>>()[..]);
    h.step(&Step::Frame(FrameSpec::FetchAdd {
        psn: PsnSel::Near(0),
        at,
        key: KeySel::Region(0),
        add: 1,
    }));
    h.step(&Step::Frame(FrameSpec::Read {
        psn: PsnSel::Near(0),
        len: LenSel::Small(16),
        at,
        key: KeySel::Region(0),
    }));
    h.check();
    assert_eq!(region(&h, TARGET)[64], 2, "the FETCH_AND_ADD ran");
    assert_eq!(
        sent_frames(&mut h),
        [
            Frame::Ack { psn: 10 },
            Frame::AtomicResp {
                psn: 11,
                orig: u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8])
            },
            Frame::ReadResp { psn: 12, len: 16 },
        ]
    );
    assert!(!h.err);
}

#[test]
fn forged_responses_reach_the_requester() {
    let read = WrSpec::Read {
        len: 8,
        off: 16,
        split: true,
        addr: 0,
    };
    let mut h = Harness::new(&setup(1, vec![read]));
    h.step(&Step::Frame(FrameSpec::Reply {
        which: 0,
        how: 0,
        orig: 0,
        fill: 0x30,
    }));
    h.check();
    assert_eq!(&region(&h, LOCAL)[16..24], b"01234567");
    assert_eq!(h.last_send_id, 2, "the READ (wr_id 2, after receive 1) completed");
    // A response for nothing outstanding is ignored; a NAK fails the next WQE.
    h.step(&Step::PostSend(WrSpec::FetchAdd { off: 0, add: 1 }));
    h.step(&Step::PeerReads);
    h.step(&Step::Frame(FrameSpec::Nak {
        psn: PsnSel::Near(1),
        code: 3,
    }));
    assert!(h.err, "a remote access NAK moves the QP to ERR");
    assert!(h.recvs.is_empty());
    h.check();
}

#[test]
fn a_region_deregistered_mid_payload_is_not_written() {
    let mut h = Harness::new(&setup(0, vec![]));
    let before = region(&h, TARGET);
    h.step(&Step::Partial {
        frame: FrameSpec::Write {
            psn: PsnSel::Near(0),
            len: LenSel::Small(3000),
            at: AddrSel::Region { region: 0, off: 512 },
            key: KeySel::Region(0),
            imm: None,
            solicited: false,
            ack_req: false,
            fill: 7,
        },
        keep: 1000,
    });
    h.check();
    assert_ne!(region(&h, TARGET)[..1000], before[..1000]);
    h.step(&Step::Deregister(0));
    h.step(&Step::Raw(vec![0xab; 2000]));
    h.check();
    assert!(h.err, "the WRITE whose region died mid-payload fails the QP");
    assert_eq!(
        region(&h, TARGET)[1000..],
        before[1000..],
        "written after deregistration"
    );
}

#[test]
fn a_flood_of_duplicates_stays_bounded() {
    // The input the fuzzer found first: one SEND executed, then 63 Ki copies of it.
    let send = FrameSpec::Send {
        psn: PsnSel::Near(0),
        len: LenSel::Small(0),
        imm: None,
        solicited: false,
        ack_req: false,
        fill: 0,
    };
    Harness::run(&Input {
        setup: setup(2, vec![]),
        steps: vec![
            Step::Frame(send.clone()),
            Step::Repeat {
                frame: FrameSpec::Send {
                    psn: PsnSel::Near(-1),
                    len: LenSel::Small(0),
                    imm: None,
                    solicited: false,
                    ack_req: false,
                    fill: 0,
                },
                count: 63744,
                next_psn: false,
            },
            Step::Chunk(16),
            Step::Repeat {
                frame: send,
                count: 5000,
                next_psn: false,
            },
        ],
    });
}

#[test]
#[should_panic(expected = "canary")]
fn an_overwritten_canary_is_caught() {
    let mut h = Harness::new(&setup(0, vec![]));
    // SAFETY: a byte of our own buffer, in the guard after TARGET.
    unsafe { *h.base.add(h.offs[TARGET] + REGION_LEN[TARGET]) = 0 };
    h.check();
}

#[test]
#[should_panic(expected = "another PD")]
fn a_changed_foreign_region_is_caught() {
    let mut h = Harness::new(&setup(0, vec![]));
    // SAFETY: a byte of our own buffer, inside FOREIGN.
    unsafe { *h.base.add(h.offs[FOREIGN]) ^= 1 };
    h.check();
}

fn ud_setup(recvs: u8, wrs: Vec<WrSpec>) -> Setup {
    Setup {
        ud: true,
        ..setup(recvs, wrs)
    }
}

fn datagram(to_us: bool, qkey: Option<u32>, len: u16, grh: bool) -> FrameSpec {
    FrameSpec::Datagram {
        psn: PsnSel::Raw(3),
        to_us,
        other_qpn: 0x99,
        src_qpn: 0x77,
        qkey,
        len: LenSel::Small(len),
        imm: Some(5),
        solicited: false,
        grh: grh.then_some((1, 2, 3)),
        fill: 0x30,
    }
}

/// On a UD QP a datagram for it lands behind the 40 bytes of GRH in the first receive
/// (512 bytes at LOCAL 0); one with another Q_Key, or for another QPN, takes nothing; one
/// longer than the receive is LOC_LEN_ERR and writes nothing.
#[test]
fn datagrams_reach_a_ud_qps_receives() {
    let mut h = Harness::new(&ud_setup(3, vec![]));
    let before = region(&h, LOCAL);
    h.step(&Step::Frame(datagram(true, Some(crate::QKEY ^ 1), 8, false)));
    h.step(&Step::Frame(datagram(false, None, 8, false)));
    h.check();
    assert_eq!(h.recvs.len(), 3, "a receive was taken");
    h.step(&Step::Frame(datagram(true, None, 16, true)));
    h.check();
    assert_eq!(h.recvs.len(), 2);
    let now = region(&h, LOCAL);
    assert_eq!(now[6], 0x1b, "the GRH's next header");
    assert_eq!(&now[40..56], &(0x30..0x40).collect::<Vec<u8>>()[..]);
    assert_eq!(now[56..], before[56..]);
    h.step(&Step::Frame(datagram(true, None, 500, false)));
    h.check();
    assert_eq!(h.recvs.len(), 1, "the receive too short completed (LOC_LEN_ERR)");
    assert_eq!(region(&h, LOCAL)[512..], before[512..], "nothing written into it");
    assert!(!h.err && !h.closed);
}

/// Anything but well-formed datagrams on a link closes the link, not the QP; a new link
/// works. A datagram above the MTU does not decode.
#[test]
fn garbage_on_a_link_closes_it_and_the_qp_stays_up() {
    let mut h = Harness::new(&ud_setup(2, vec![]));
    h.step(&Step::Frame(FrameSpec::Ack { psn: PsnSel::Raw(1) }));
    assert!(h.closed && !h.err);
    h.step(&Step::Reconnect);
    let mut above = datagram(true, None, 0, false);
    if let FrameSpec::Datagram { len, .. } = &mut above {
        *len = LenSel::Raw(4097);
    }
    h.step(&Step::Frame(above));
    assert!(h.closed && !h.err);
    h.step(&Step::Reconnect);
    h.step(&Step::Frame(datagram(true, None, 4, false)));
    h.check();
    assert_eq!(h.recvs.len(), 1);
}

/// A datagram, or a link's setup frame, on an RC QP's connection is a protocol error.
#[test]
fn datagrams_on_a_connection_are_protocol_errors() {
    for f in [
        datagram(true, None, 4, true),
        FrameSpec::LinkHello {
            src_gid: [1; 16],
            src_lid: 2,
            verify: false,
        },
    ] {
        let mut h = Harness::new(&setup(1, vec![]));
        h.step(&Step::Frame(f));
        assert!(h.closed && h.err);
        h.check();
    }
}

/// A UD QP sends SENDs (with or without immediate, inline or not) as datagrams and
/// refuses what UD has not; a bad lkey fails the QP.
#[test]
fn a_ud_qp_sends_datagrams_only() {
    let send = WrSpec::Send {
        len: 100,
        imm: Some(1),
        inline: false,
    };
    let write = WrSpec::Write {
        len: 8,
        addr: 0,
        rkey: 0,
    };
    let mut h = Harness::new(&ud_setup(0, vec![send.clone(), write]));
    assert_eq!(h.last_send_id, 1, "the SEND completed, the WRITE was refused");
    h.step(&Step::PostSend(WrSpec::Send {
        len: 8,
        imm: None,
        inline: true,
    }));
    h.step(&Step::PeerReads);
    assert_eq!(h.last_send_id, 2);
    h.step(&Step::PostSend(WrSpec::BadSge {
        key: KeySel::Raw(1),
        off: 0,
        len: 8,
    }));
    h.step(&Step::PeerReads);
    assert!(h.err, "a bad lkey fails the QP");
    h.check();
}
