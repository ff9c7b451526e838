//! The wire format's property tests (every frame round-trips, any bytes decode or fail
//! without a panic) and the frame generators and decoder the other modules' tests use.

use proptest::prelude::*;
use verbs_api::QpType;

use super::*;

/// The frames in `bytes` as a side sent them (payloads skipped); the bytes must end
/// on a frame boundary. For the unit tests of the requester and the responder.
pub(crate) fn decode_all(bytes: &[u8]) -> Vec<Frame> {
    let (mut at, mut out) = (0, Vec::new());
    while let Some((f, n)) = Frame::decode(&bytes[at..]).unwrap() {
        out.push(f);
        at += n + f.payload_len() as usize;
    }
    assert_eq!(at, bytes.len());
    out
}

fn arb_grh() -> impl Strategy<Value = Grh> {
    (
        any::<[u8; 16]>(),
        0u32..=0xf_ffff,
        any::<u8>(),
        any::<u8>(),
        any::<bool>(),
    )
        .prop_map(|(dgid, flow_label, traffic_class, hop_limit, src_default)| Grh {
            dgid,
            flow_label,
            traffic_class,
            hop_limit,
            src_default,
        })
}

pub fn arb_frame() -> impl Strategy<Value = Frame> {
    let psn = 0u32..=0xff_ffff;
    let len = 0u32..=MAX_MSG;
    prop_oneof![
        (
            any::<[u8; 16]>(),
            any::<u16>(),
            prop_oneof![Just(QpType::Rc), Just(QpType::Uc)],
            0u32..=0xff_ffff,
            0u32..=0xff_ffff,
            any::<[u8; TOKEN_LEN]>()
        )
            .prop_map(
                |(src_gid, src_lid, qp_type, src_qpn, dst_qpn, token)| Frame::Hello {
                    src_gid,
                    src_lid,
                    qp_type,
                    src_qpn,
                    dst_qpn,
                    token
                }
            ),
        (0u32..=0xff_ffff, 0u32..=0xff_ffff, any::<[u8; TOKEN_LEN]>()).prop_map(
            |(src_qpn, dst_qpn, token)| Frame::Verify {
                src_qpn,
                dst_qpn,
                token
            }
        ),
        (any::<[u8; 16]>(), any::<u16>(), any::<[u8; TOKEN_LEN]>()).prop_map(|(src_gid, src_lid, token)| {
            Frame::LinkHello {
                src_gid,
                src_lid,
                token,
            }
        }),
        (any::<[u8; 16]>(), any::<u16>(), any::<[u8; TOKEN_LEN]>()).prop_map(|(at_ip, at_port, token)| {
            Frame::LinkVerify {
                at_ip,
                at_port,
                token,
            }
        }),
        (any::<u16>(), any::<u16>()).prop_map(|(port_space, port)| Frame::CmLookup { port_space, port }),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(gid, lid)| Frame::CmAddress { gid, lid }),
        (
            psn.clone(),
            0u32..=MAX_DATAGRAM,
            (0u32..=0xff_ffff, 0u32..=0xff_ffff, any::<u32>()),
            any::<Option<u32>>(),
            any::<bool>(),
            proptest::option::of(arb_grh())
        )
            .prop_map(|(psn, len, (dst_qpn, src_qpn, qkey), imm, solicited, grh)| {
                Frame::Datagram {
                    psn,
                    len,
                    dst_qpn,
                    src_qpn,
                    qkey,
                    imm,
                    solicited,
                    grh,
                }
            }),
        Just(Frame::HelloAck),
        prop_oneof![Just(HelloReject::Refused), Just(HelloReject::Version)]
            .prop_map(|reason| Frame::HelloNak { reason }),
        (
            psn.clone(),
            len.clone(),
            any::<Option<u32>>(),
            any::<bool>(),
            any::<bool>(),
            any::<Option<u32>>(),
        )
            .prop_map(|(psn, len, imm, solicited, ack_req, inv)| Frame::Send {
                psn,
                len,
                // A SEND carries an immediate or an rkey to invalidate, not both.
                imm: imm.filter(|_| inv.is_none()),
                solicited,
                ack_req,
                inv,
            }),
        (
            psn.clone(),
            len.clone(),
            any::<u64>(),
            any::<u32>(),
            any::<Option<u32>>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(psn, len, addr, rkey, imm, solicited, ack_req)| Frame::Write {
                psn,
                len,
                addr,
                rkey,
                imm,
                solicited,
                ack_req
            }),
        (
            psn.clone(),
            len.clone(),
            any::<u64>(),
            any::<u32>(),
            any::<Option<u32>>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(
                |(psn, len, addr, rkey, imm, solicited, ack_req)| Frame::WritePlaced {
                    psn,
                    len,
                    addr,
                    rkey,
                    imm,
                    solicited,
                    ack_req
                }
            ),
        (
            psn.clone(),
            len.clone(),
            any::<u64>(),
            any::<u32>(),
            any::<bool>()
        )
            .prop_map(|(psn, len, addr, rkey, ack_req)| Frame::ReadPlaced {
                psn,
                len,
                addr,
                rkey,
                ack_req
            }),
        (
            psn.clone(),
            any::<u64>(),
            any::<u32>(),
            any::<Option<u64>>(),
            any::<u64>(),
            any::<bool>()
        )
            .prop_map(
                |(psn, addr, rkey, compare, swap_add, ack_req)| Frame::AtomicPlaced {
                    psn,
                    addr,
                    rkey,
                    compare,
                    swap_add,
                    ack_req
                }
            ),
        (
            psn.clone(),
            1u32..1 << 23,
            any::<u32>(),
            any::<u32>(),
            any::<bool>()
        )
            .prop_map(|(psn, pkts, m, r, ack_req)| {
                let msgs = 1 + m % pkts;
                Frame::PlacedRun {
                    psn,
                    pkts,
                    msgs,
                    rd_atomic: r % (msgs + 1),
                    ack_req,
                }
            }),
        (psn.clone(), len.clone(), any::<u64>(), any::<u32>(), any::<u16>()).prop_map(
            |(psn, len, addr, rkey, inflight)| Frame::Read {
                psn,
                len,
                addr,
                rkey,
                inflight
            }
        ),
        (
            psn.clone(),
            any::<u16>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(psn, inflight, addr, rkey, compare, swap)| Frame::CmpSwap {
                psn,
                inflight,
                addr,
                rkey,
                compare,
                swap
            }),
        (
            psn.clone(),
            any::<u16>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>()
        )
            .prop_map(|(psn, inflight, addr, rkey, add)| Frame::FetchAdd {
                psn,
                inflight,
                addr,
                rkey,
                add
            }),
        psn.clone().prop_map(|psn| Frame::Ack { psn }),
        (
            psn.clone(),
            prop_oneof![
                (0u8..32).prop_map(|timer| (NakCode::Rnr { timer }, None)),
                Just((NakCode::PsnSeq, None)),
                Just((NakCode::InvalidRequest, None)),
                Just((NakCode::RemoteAccess, None)),
                Just((NakCode::RemoteOperational, None)),
                proptest::sample::select(NakReason::ALL.to_vec()).prop_map(|r| (r.code(), Some(r)))
            ]
        )
            .prop_map(|(psn, (code, reason))| Frame::Nak { psn, code, reason }),
        (psn.clone(), len).prop_map(|(psn, len)| Frame::ReadResp { psn, len }),
        (psn.clone(), any::<u64>()).prop_map(|(psn, orig)| Frame::AtomicResp { psn, orig }),
        arb_part(psn),
    ]
}

/// A valid [`Frame::Part`]: never both first and last, a RETH on a WRITE's first part
/// only, no longer than its message, an invalidation on a SEND only, no flags on a READ
/// response's. Its payload is a few packets at most (the tests that feed frames to a
/// responder send each one's payload), its message of any length.
fn arb_part(psn: std::ops::RangeInclusive<u32>) -> impl Strategy<Value = Frame> {
    (
        psn,
        0u32..=8192,
        0u32..=MAX_MSG,
        prop_oneof![
            Just(PartKind::Send),
            Just(PartKind::Write),
            Just(PartKind::ReadResp)
        ],
        0u8..3,
        (any::<u64>(), any::<u32>()),
        (
            any::<Option<u32>>(),
            any::<Option<u32>>(),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(psn, a, b, kind, pos, (addr, rkey), (imm, inv, solicited, ack_req))| {
                let (first, last) = (pos == 0, pos == 2);
                let reth = kind == PartKind::Write && first;
                let flags = kind != PartKind::ReadResp;
                Frame::Part {
                    psn,
                    len: a,
                    kind,
                    first,
                    last,
                    addr: if reth { addr } else { 0 },
                    rkey: if reth { rkey } else { 0 },
                    total: a.max(b),
                    imm: imm.filter(|_| flags),
                    solicited: solicited && flags,
                    ack_req: ack_req && flags,
                    inv: inv.filter(|_| kind == PartKind::Send && imm.is_none()),
                }
            },
        )
}

proptest! {
    #[test]
    fn roundtrip(f in arb_frame()) {
        let mut b = [0u8; MAX_HDR_LEN];
        let n = f.encode(&mut b);
        prop_assert_eq!(Frame::decode(&b[..n]).unwrap(), Some((f, n)));
        // every strict prefix asks for more bytes
        for k in 0..n {
            prop_assert_eq!(Frame::decode(&b[..k]).unwrap(), None);
        }
    }

    /// Any bytes: no panic; whatever decodes re-encodes to the same bytes.
    #[test]
    fn hostile_bytes(b in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Ok(Some((f, n))) = Frame::decode(&b) {
            prop_assert!(n <= b.len());
            prop_assert!(f.payload_len() <= MAX_MSG);
            let mut out = [0u8; MAX_HDR_LEN];
            let m = f.encode(&mut out);
            prop_assert_eq!(&out[..m], &b[..n]);
        }
    }

    /// Mutating one byte of a valid header never panics the decoder.
    #[test]
    fn single_byte_mutations(f in arb_frame(), i in 0usize..MAX_HDR_LEN, v in any::<u8>()) {
        let mut b = [0u8; MAX_HDR_LEN];
        let n = f.encode(&mut b);
        b[i % n] = v;
        let _ = Frame::decode(&b[..n]);
    }
}

#[test]
fn rejects_unknown_and_oversized() {
    let mut b = [0u8; MAX_HDR_LEN];
    b[0] = 0x99;
    assert_eq!(Frame::decode(&b), Err(WireError::UnknownOpcode(0x99)));
    let n = Frame::Send {
        psn: 1,
        len: 4,
        imm: None,
        solicited: false,
        ack_req: false,
        inv: None,
    }
    .encode(&mut b);
    b[8..12].copy_from_slice(&(MAX_MSG + 1).to_le_bytes());
    assert_eq!(Frame::decode(&b[..n]), Err(WireError::TooLong(MAX_MSG + 1)));
    b[8..12].copy_from_slice(&4u32.to_le_bytes());
    b[4..8].copy_from_slice(&0x0100_0000u32.to_le_bytes());
    assert_eq!(Frame::decode(&b[..n]), Err(WireError::BadField("PSN")));
}

/// A run's counts that cannot be (no operation, more operations than PSNs, more READs
/// and atomics than operations, half the PSN space or more) are refused as malformed.
#[test]
fn a_placed_run_with_impossible_counts_is_refused() {
    let bad = [(4, 0, 0), (2, 3, 0), (4, 2, 3), (1 << 23, 1, 0)];
    for (pkts, msgs, rd_atomic) in bad {
        let mut hdr = [0u8; MAX_HDR_LEN];
        let n = Frame::PlacedRun {
            psn: 1,
            pkts,
            msgs,
            rd_atomic,
            ack_req: false,
        }
        .encode(&mut hdr);
        assert!(
            matches!(Frame::decode(&hdr[..n]), Err(WireError::BadField(_))),
            "{pkts} {msgs} {rd_atomic}"
        );
    }
}
