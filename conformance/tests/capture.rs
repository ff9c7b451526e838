//! The conformance cases on the sim, captured (`--pcap`), and their packets checked with
//! tshark against what each case implies: the RNR case's NAK carries the timer its
//! `min_rnr_timer` encodes, the access cases the NAK code of their completion status, an
//! atomic its operands in the AtomicETH and the original value in the AtomicAckETH, a
//! WRITE or READ its RETH with the address, rkey and length the WR gave (the capture's
//! own record of the post), a READ's responses one PSN per packet of the path MTU, and a
//! run of WRs consecutive PSNs and MSNs; tshark reads every packet, none malformed.
//!
//! Field values are tshark's dissection, not the sim's encoder: what Wireshark shows a
//! user is what is held to the case.

use std::path::Path;

use backend_sim::SimBackend;
use capture_judge::{well_formed, Scratch};
use conformance::{cases, run_case, Config};

/// The path MTU of the cases' pairs (`RcParams::default`).
const MTU: u64 = 1024;

/// IBA's opcodes (RC), as tshark prints them.
mod op {
    pub const SEND_ONLY: u8 = 4;
    pub const WRITE_FIRST: u8 = 6;
    pub const WRITE_MIDDLE: u8 = 7;
    pub const WRITE_LAST: u8 = 8;
    pub const WRITE_ONLY: u8 = 10;
    pub const WRITE_ONLY_IMM: u8 = 11;
    pub const READ_REQUEST: u8 = 12;
    pub const READ_RESPONSE_FIRST: u8 = 13;
    pub const READ_RESPONSE_ONLY: u8 = 16;
    pub const ACK: u8 = 17;
    pub const ATOMIC_ACK: u8 = 18;
    pub const CMP_SWAP: u8 = 19;
    pub const FETCH_ADD: u8 = 20;
}

/// AETH syndromes (IBA 9.7.5.2.8 / 9.7.5.2.3): ACK `000cccc`, RNR NAK `001ttttt`, NAK
/// `011nnnnn`.
mod syndrome {
    pub const fn rnr(timer: u8) -> u8 {
        0x20 | timer
    }
    pub const INVALID_REQUEST: u8 = 0x61;
    pub const REMOTE_ACCESS: u8 = 0x62;
    pub fn is_ack(s: u8) -> bool {
        s >> 5 == 0
    }
}

const FIELDS: [&str; 12] = [
    "frame.comment",
    "infiniband.bth.opcode",
    "infiniband.bth.psn",
    "infiniband.bth.destqp",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
];

/// A packet as tshark dissected it.
#[derive(Clone, Debug, Default)]
struct Pkt {
    opcode: u8,
    psn: u32,
    /// The destination QP.
    qp: u32,
    syndrome: Option<u8>,
    msn: Option<u32>,
    /// RETH or AtomicETH: virtual address, rkey (and the RETH's DMA length).
    va: Option<u64>,
    rkey: Option<u32>,
    dmalen: Option<u64>,
    swap_add: Option<u64>,
    compare: Option<u64>,
    orig: Option<u64>,
}

impl Pkt {
    fn is_response(&self) -> bool {
        (op::READ_RESPONSE_FIRST..=op::ATOMIC_ACK).contains(&self.opcode)
    }
}

/// A WR as the capture recorded its post: wr_id, opcode name, length, remote address
/// and rkey.
#[derive(Clone, Debug)]
struct Posted {
    opcode: String,
    len: u64,
    remote: Option<(u64, u32)>,
}

/// A case's capture: its packets and the verbs context around them.
#[derive(Debug, Default)]
struct Captured {
    pkts: Vec<Pkt>,
    posted: Vec<Posted>,
    notes: Vec<String>,
}

fn num(s: &str) -> Option<u64> {
    let s = s.split(',').next()?.trim();
    if s.is_empty() {
        None
    } else if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// `... post_send wr_id 0x1 RdmaWrite length 64 remote 0x7f.. rkey 0x.. signaled`.
fn posted(note: &str) -> Option<Posted> {
    let rest = note.split_once(": post_send ")?.1;
    let w: Vec<&str> = rest.split(' ').collect();
    let at = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1)).copied();
    Some(Posted {
        opcode: w.get(2)?.to_string(),
        len: at("length")?.parse().ok()?,
        remote: at("remote")
            .and_then(num)
            .zip(at("rkey").and_then(num).map(|k| k as u32)),
    })
}

fn read(path: &Path) -> Captured {
    let mut c = Captured::default();
    for r in well_formed(path, &FIELDS) {
        let Some(opcode) = num(&r[1]) else {
            if !r[0].is_empty() {
                c.posted.extend(posted(&r[0]));
                c.notes.push(r[0].clone());
            }
            continue;
        };
        c.pkts.push(Pkt {
            opcode: opcode as u8,
            psn: num(&r[2]).unwrap() as u32,
            qp: num(&r[3]).unwrap() as u32,
            syndrome: num(&r[4]).map(|s| s as u8),
            msn: num(&r[5]).map(|m| m as u32),
            va: num(&r[6]),
            rkey: num(&r[7]).map(|k| k as u32),
            dmalen: num(&r[8]),
            swap_add: num(&r[9]),
            compare: num(&r[10]),
            orig: num(&r[11]),
        });
    }
    c
}

impl Captured {
    fn requests(&self) -> Vec<&Pkt> {
        self.pkts.iter().filter(|p| !p.is_response()).collect()
    }

    fn responses(&self) -> Vec<&Pkt> {
        self.pkts.iter().filter(|p| p.is_response()).collect()
    }

    /// The AETH syndromes of the NAKs and RNR NAKs, in order.
    fn naks(&self) -> Vec<u8> {
        self.responses()
            .iter()
            .filter_map(|p| p.syndrome)
            .filter(|s| !syndrome::is_ack(*s))
            .collect()
    }

    fn opcodes(&self) -> Vec<u8> {
        self.pkts.iter().map(|p| p.opcode).collect()
    }

    fn has_note(&self, text: &str) -> bool {
        self.notes.iter().any(|n| n.contains(text))
    }

    /// Every request that opens a message (its first or only packet) carries the RETH
    /// or AtomicETH of its WR as posted, in posting order, a resend the same as the first
    /// time; a message's other packets carry none.
    fn check_remote_headers(&self, id: &str) {
        let wrs: Vec<&Posted> = self.posted.iter().filter(|w| w.remote.is_some()).collect();
        let mut seen = std::collections::BTreeMap::new();
        for p in self.requests() {
            let Some(va) = p.va else {
                assert!(
                    !matches!(
                        p.opcode,
                        op::WRITE_FIRST
                            | op::WRITE_ONLY
                            | op::WRITE_ONLY_IMM
                            | op::READ_REQUEST
                            | op::CMP_SWAP
                            | op::FETCH_ADD
                    ),
                    "{id}: {p:?} lacks its RETH/AtomicETH"
                );
                continue;
            };
            let n = seen.len();
            let k = *seen.entry((p.qp, p.psn)).or_insert(n);
            let wr = wrs
                .get(k)
                .unwrap_or_else(|| panic!("{id}: {p:?} names no WR posted: {wrs:?}"));
            assert_eq!(
                Some((va, p.rkey.unwrap())),
                wr.remote,
                "{id}: the address and rkey of {p:?} (WR {wr:?})"
            );
            if let Some(len) = p.dmalen {
                assert_eq!(len, wr.len, "{id}: the RETH's DMA length of {p:?} (WR {wr:?})");
            } else {
                assert!(wr.opcode.starts_with("Atomic"), "{id}: {p:?} for {wr:?}");
            }
        }
        assert_eq!(
            seen.len(),
            wrs.len(),
            "{id}: one first packet per RDMA or atomic WR: {:?}",
            self.pkts
        );
    }

    /// On each connection the requests' new PSNs follow each other, one per packet, a
    /// READ taking one per response packet of the path MTU (modulo 2^24); a resend repeats
    /// an earlier PSN. The READs are answered in turn, their responses' PSNs counting on
    /// from the request's. The responder's MSNs never go back.
    fn check_sequence(&self, id: &str) {
        let mut next = std::collections::BTreeMap::new();
        let mut reads = Vec::new();
        for p in self.requests() {
            let next = next.entry(p.qp).or_insert(p.psn);
            let back = next.wrapping_sub(p.psn) & 0xff_ffff;
            if back != 0 {
                assert!(
                    back < 1 << 23,
                    "{id}: PSN {} where {next} was next: a gap in {:?}",
                    p.psn,
                    self.pkts
                );
                continue;
            }
            let n = if p.opcode == op::READ_REQUEST {
                let n = p.dmalen.unwrap().div_ceil(MTU).max(1) as u32;
                reads.push((p.psn, n));
                n
            } else {
                1
            };
            *next = (*next + n) & 0xff_ffff;
        }
        let resp: Vec<u32> = self
            .pkts
            .iter()
            .filter(|p| (op::READ_RESPONSE_FIRST..=op::READ_RESPONSE_ONLY).contains(&p.opcode))
            .map(|p| p.psn)
            .collect();
        // (A READ refused with a NAK has no response.)
        let naked: Vec<u32> = self
            .responses()
            .iter()
            .filter(|p| p.syndrome.is_some_and(|s| !syndrome::is_ack(s)))
            .map(|p| p.psn)
            .collect();
        let want: Vec<u32> = reads
            .iter()
            .filter(|(psn, _)| !naked.contains(psn))
            .flat_map(|&(psn, n)| (0..n).map(move |i| (psn + i) & 0xff_ffff))
            .collect();
        assert_eq!(resp, want, "{id}: READ response PSNs");
        let mut msn = std::collections::BTreeMap::new();
        for p in self.responses() {
            if let Some(m) = p.msn {
                let last = msn.entry(p.qp).or_insert(m);
                assert!(*last <= m, "{id}: MSN {m} after {last} in {:?}", self.pkts);
                *last = m;
            }
        }
    }
}

/// What a case's capture must show, given the capture and the case's id.
type Check = fn(&Captured, &str);

/// The cases checked, with what each implies beyond the checks every case gets.
fn expectations() -> Vec<(&'static str, Check)> {
    vec![
        ("rnr.exhausted", |c, id| {
            // rnr_retry 0: the SEND once, its RNR NAK with B's min_rnr_timer (1).
            assert_eq!(c.opcodes(), [op::SEND_ONLY, op::ACK], "{id}");
            assert_eq!(c.naks(), [syndrome::rnr(1)], "{id}");
            assert_eq!(c.pkts[0].psn, c.pkts[1].psn, "{id}: the NAK's PSN");
            assert!(c.has_note("status RnrRetryExcErr"), "{id}: {:?}", c.notes);
        }),
        ("rnr.retry-count", |c, id| {
            // rnr_retry 3: the SEND and 3 resends of its PSN, each RNR NAKed with timer 27.
            let reqs = c.requests();
            assert_eq!(reqs.len(), 4, "{id}: {:?}", c.pkts);
            assert!(
                reqs.iter()
                    .all(|p| p.opcode == op::SEND_ONLY && p.psn == reqs[0].psn),
                "{id}"
            );
            assert_eq!(c.naks(), [syndrome::rnr(27); 4], "{id}");
        }),
        ("rnr.recovery", |c, id| {
            // RNR NAKs with timer 14 until the receive is posted, then the SEND's ACK.
            let naks = c.naks();
            assert!(
                !naks.is_empty() && naks.iter().all(|&s| s == syndrome::rnr(14)),
                "{id}: {naks:?}"
            );
            let reqs = c.requests();
            assert!(
                reqs.iter()
                    .all(|p| p.opcode == op::SEND_ONLY && p.psn == reqs[0].psn),
                "{id}"
            );
            let last = c.pkts.last().unwrap();
            assert!(
                last.opcode == op::ACK && syndrome::is_ack(last.syndrome.unwrap()),
                "{id}: {last:?}"
            );
            assert_eq!(last.msn, Some(1), "{id}");
        }),
        ("rnr.write-imm", |c, id| {
            assert_eq!(c.opcodes(), [op::WRITE_ONLY_IMM, op::ACK], "{id}");
            assert_eq!(c.naks(), [syndrome::rnr(1)], "{id}");
        }),
        ("rnr.write-needs-no-receive", |c, id| {
            assert_eq!(c.opcodes(), [op::WRITE_ONLY, op::ACK], "{id}");
            assert!(c.naks().is_empty(), "{id}");
        }),
        ("access.write-bad-rkey", |c, id| {
            assert_eq!(c.opcodes(), [op::WRITE_ONLY, op::ACK], "{id}");
            assert_eq!(c.naks(), [syndrome::REMOTE_ACCESS], "{id}");
            assert!(c.has_note("status RemAccessErr"), "{id}");
        }),
        ("access.read-no-remote-read", |c, id| {
            assert_eq!(c.opcodes(), [op::READ_REQUEST, op::ACK], "{id}");
            assert_eq!(c.naks(), [syndrome::REMOTE_ACCESS], "{id}");
        }),
        ("access.atomic-no-remote-atomic", |c, id| {
            let reqs = c.requests();
            assert_eq!(reqs.len(), 1, "{id}");
            assert!(matches!(reqs[0].opcode, op::CMP_SWAP | op::FETCH_ADD), "{id}");
            assert_eq!(c.naks(), [syndrome::REMOTE_ACCESS], "{id}");
            assert!(c.pkts.iter().all(|p| p.orig.is_none()), "{id}: no original value");
        }),
        ("errors.recv-too-small", |c, id| {
            assert_eq!(c.opcodes(), [op::SEND_ONLY, op::ACK], "{id}");
            assert_eq!(c.naks(), [syndrome::INVALID_REQUEST], "{id}");
            assert!(c.has_note("status RemInvReqErr"), "{id}");
        }),
        ("errors.no-responder-resources", |c, id| {
            // A READ, a CMP_AND_SWP and a FETCH_AND_ADD (a pair each): invalid requests.
            let reqs: Vec<u8> = c.requests().iter().map(|p| p.opcode).collect();
            assert_eq!(reqs, [op::READ_REQUEST, op::CMP_SWAP, op::FETCH_ADD], "{id}");
            assert_eq!(c.naks(), [syndrome::INVALID_REQUEST; 3], "{id}");
        }),
        ("atomic.fetch-add", |c, id| {
            atomic(c, id, op::FETCH_ADD, 5, None, 37)
        }),
        ("atomic.cmp-swap-hit", |c, id| {
            atomic(c, id, op::CMP_SWAP, 1, Some(0), 0)
        }),
        ("atomic.cmp-swap-miss", |c, id| {
            atomic(c, id, op::CMP_SWAP, 1, Some(0), 1)
        }),
        ("atomic.wrap", |c, id| {
            atomic(c, id, op::FETCH_ADD, 2, None, u64::MAX)
        }),
        ("rdma.write", |c, id| {
            // 1 B, 4095 B, 64 KiB, 1 MiB: 1 + 4 + 64 + 1024 packets, each message acked.
            let reqs = c.requests();
            assert_eq!(reqs.len(), 1 + 4 + 64 + 1024, "{id}");
            let firsts = reqs
                .iter()
                .filter(|p| matches!(p.opcode, op::WRITE_FIRST | op::WRITE_ONLY))
                .count();
            let lasts = reqs
                .iter()
                .filter(|p| matches!(p.opcode, op::WRITE_LAST | op::WRITE_ONLY))
                .count();
            assert_eq!((firsts, lasts), (4, 4), "{id}");
            assert_eq!(
                reqs.iter().filter(|p| p.opcode == op::WRITE_MIDDLE).count(),
                2 + 62 + 1022,
                "{id}"
            );
            assert!(c.naks().is_empty(), "{id}");
            assert_eq!(c.responses().last().unwrap().msn, Some(4), "{id}");
        }),
        ("rdma.read", |c, id| {
            let reqs = c.requests();
            assert!(reqs.iter().all(|p| p.opcode == op::READ_REQUEST), "{id}");
            assert_eq!(reqs.len(), 4, "{id}");
            assert_eq!(c.responses().len(), 1 + 4 + 64 + 1024, "{id}");
            assert_eq!(c.responses().last().unwrap().msn, Some(4), "{id}");
        }),
        ("rdma.psn-per-packet", |c, id| {
            // From two below the wrap: 4 + 2 + 3 + 1 PSNs, through 0.
            assert!(
                c.pkts.iter().any(|p| p.psn == 0xff_ffff) && c.pkts.iter().any(|p| p.psn == 0),
                "{id}"
            );
        }),
        ("order.mixed-completions", |c, id| {
            // Five WRs in one post: five consecutive PSNs, the MSN at five.
            let reqs = c.requests();
            let ops: Vec<u8> = reqs.iter().map(|p| p.opcode).collect();
            assert_eq!(
                ops,
                [
                    op::WRITE_ONLY,
                    op::READ_REQUEST,
                    op::SEND_ONLY,
                    op::FETCH_ADD,
                    op::WRITE_ONLY
                ],
                "{id}"
            );
            let psns: Vec<u32> = reqs.iter().map(|p| p.psn - reqs[0].psn).collect();
            assert_eq!(psns, [0, 1, 2, 3, 4], "{id}");
            // Each response's MSN counts the messages up to the one it answers (one PSN
            // each here), whether or not ACKs were coalesced.
            for r in c.responses() {
                assert_eq!(r.msn, Some(r.psn - reqs[0].psn + 1), "{id}: {r:?}");
            }
            assert_eq!(c.responses().last().unwrap().msn, Some(5), "{id}");
        }),
    ]
}

/// The atomic of `one()` in the atomic cases: its operands in the AtomicETH, the word's
/// original value in the AtomicAckETH, at the request's PSN.
fn atomic(c: &Captured, id: &str, opcode: u8, swap_add: u64, compare: Option<u64>, orig: u64) {
    assert_eq!(c.opcodes(), [opcode, op::ATOMIC_ACK], "{id}");
    let (req, ack) = (&c.pkts[0], &c.pkts[1]);
    assert_eq!(req.swap_add, Some(swap_add), "{id}: swap (or add) data");
    assert_eq!(
        req.compare.filter(|_| opcode == op::CMP_SWAP),
        compare,
        "{id}: compare data"
    );
    assert_eq!(req.va.map(|va| va % 8), Some(0), "{id}: the AtomicETH's address");
    assert_eq!(ack.orig, Some(orig), "{id}: the original remote data");
    assert_eq!(
        (ack.psn, ack.syndrome.map(syndrome::is_ack)),
        (req.psn, Some(true)),
        "{id}"
    );
}

#[test]
fn each_case_sends_the_packets_it_implies() {
    let dir = Scratch::dir("conformance-pcap");
    let backend = SimBackend::default();
    let cfg = Config {
        capture: Some(dir.path().to_owned()),
        ..Config::new("sim0")
    };
    let all = cases::<SimBackend>();
    let checks = expectations();
    for (id, check) in &checks {
        let case = all
            .iter()
            .find(|c| c.id == *id)
            .unwrap_or_else(|| panic!("no case {id}"));
        let r = run_case(&backend, &cfg, case);
        assert_eq!((r.status, r.detail.as_str()), ("pass", ""), "{id}");
        let c = read(&conformance::capture::path(dir.path(), id));
        assert!(!c.pkts.is_empty(), "{id}: nothing captured");
        c.check_remote_headers(id);
        c.check_sequence(id);
        check(&c, id);
    }
}
