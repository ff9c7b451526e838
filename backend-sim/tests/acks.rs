//! ACK coalescing on a stream of requests: a responder that has more requests waiting in
//! its socket acknowledges several with one ACK (the last PSN covers all before it), as an
//! HCA coalesces ACKs; it does not answer each 12 KiB WRITE with a `sendmsg` of its own,
//! but it does answer at once a request that asks for an ACK (the AckReq bit).
//! A raw peer writes 48 WRITEs of 12 KiB in one call (more than the socket buffers take
//! at once, so they stream in while the device reads) and reads the ACK frames it gets
//! back. Asking for none, it gets 3-7 (when the device caught up with the stream); with
//! every fourth asking, 12-13, each within the four WRITEs after the one that asked.
//! (Before the AckReq bit, the device acknowledged every 32 KiB: 17-18 ACKs, and 36-43
//! before ACKs were coalesced at all.)

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use backend_sim::SimBackend;
use backend_sim_proto::wire::Frame;
use common::{frame, impersonate};
use verbs_api::*;

/// WRITEs in the burst, and the size of each.
const WRITES: u32 = 48;
const LEN: usize = 12 << 10;

/// Sends the burst (every `ask`-th WRITE with the AckReq bit, none if 0) to a fresh
/// device in one write and returns, for each ACK that comes back up to the one covering
/// the last WRITE, the WRITE it acknowledges through (each WRITE takes a PSN per packet
/// of the path MTU; an ACK names the last packet of a WRITE), after checking every WRITE
/// landed.
fn burst_acks(ask: u32) -> Vec<u32> {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(1, 1))).unwrap();
    let mr = pd
        .reg_mr(
            WRITES as usize * LEN,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let params = RcParams::default();
    let mut s = impersonate(&ctx, &qp, &params);
    let packets = (LEN as u32).div_ceil(params.path_mtu.bytes());

    // The whole burst in one write.
    let mut burst = Vec::new();
    for k in 0..WRITES {
        let psn = k * packets;
        burst.extend(frame(Frame::Write {
            psn,
            len: LEN as u32,
            addr: mr.addr() + (k as usize * LEN) as u64,
            rkey: mr.rkey(),
            imm: None,
            solicited: false,
            ack_req: ask != 0 && k % ask == ask - 1,
        }));
        burst.extend(std::iter::repeat_n(k as u8 + 1, LEN));
    }
    s.write_all(&burst).unwrap();

    // Read ACKs until one covers the last WRITE.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut buf, mut got, mut acks) = (vec![0u8; 4096], 0, Vec::new());
    let t0 = Instant::now();
    while acks.last() != Some(&(WRITES - 1)) {
        assert!(t0.elapsed() < Duration::from_secs(5), "ACKs so far: {acks:?}");
        let n = s.read(&mut buf[got..]).expect("the device answers");
        assert!(n > 0, "the device closed the connection; ACKs so far: {acks:?}");
        got += n;
        let mut off = 0;
        while let Ok(Some((f, len))) = Frame::decode(&buf[off..got]) {
            match f {
                Frame::Ack { psn } => {
                    assert_eq!((psn + 1) % packets, 0, "ACK {psn} inside a WRITE's packets");
                    acks.push((psn + 1) / packets - 1)
                }
                other => panic!("unexpected answer {other}"),
            }
            off += len;
        }
        buf.copy_within(off..got, 0);
        got -= off;
    }
    for k in 0..WRITES as usize {
        let mut b = [0u8; 1];
        mr.read(k * LEN + LEN - 1, &mut b).unwrap();
        assert_eq!(b[0], k as u8 + 1, "WRITE {k}");
    }
    assert!(acks.windows(2).all(|w| w[0] < w[1]), "{acks:?}");
    acks
}

#[test]
fn a_burst_of_writes_that_asks_for_no_ack_is_acknowledged_by_few_acks() {
    // 3-7 here; when the socket drains (the device caught up with the peer) an ACK
    // leaves, so a fast device gets more: the bound leaves room for that and still
    // fails an ACK per WRITE or per 32 KiB (36-43 and 17-18 before).
    let acks = burst_acks(0);
    assert!(
        acks.len() <= WRITES as usize / 3,
        "{} ACKs for {WRITES} WRITEs: {acks:?}",
        acks.len()
    );
}

#[test]
fn a_write_that_asks_for_an_ack_is_acknowledged_before_the_next_one_that_asks() {
    const ASK: u32 = 4;
    let acks = burst_acks(ASK);
    for asked in (ASK - 1..WRITES).step_by(ASK as usize) {
        assert!(
            acks.iter().any(|&a| (asked..asked + ASK).contains(&a)),
            "WRITE {asked} asked for an ACK; ACKs: {acks:?}"
        );
    }
}
