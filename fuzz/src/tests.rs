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
