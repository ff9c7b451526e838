//! What a case's difference is, when it is one the comparison knows: the sim's ACK
//! coalescing (its requester sets AckReq on one SEND or WRITE in every half of its
//! outstanding WQEs and its responder answers a stream with few ACKs, where rxe asks for
//! and sends an ACK per message: docs/performance.md, "Delayed ACK and ACK coalescing"),
//! RNR retries counted in a wait of fixed length (their number is the RNR timer's
//! against the time the case waits, which an emulated CPU stretches), packets sent
//! again (after a retransmit timeout, or a READ asked again after a NAK in its
//! responses), requests the sim sent behind a failing one before its NAK came back,
//! cases where the sim put nothing on the wire (a local SGE refused before the request
//! goes, a QP moved to ERR before the engine sent what was posted), the order in which
//! the packets of concurrent QP pairs interleave, and the AckReq bit on UC packets
//! (nothing acknowledges UC: rxe leaves it clear, and so does the sim's capture).

use std::collections::{BTreeMap, BTreeSet};

use backend_sim_proto::capture::opcode::{self, op};

use crate::seq::{rows, step, Pkt, Seq};

/// A case's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The same packets.
    Same,
    /// The same but for plain ACKs and AckReq bits.
    AckCoalescing,
    /// The same, ACKs aside, but for how many times an RNR NAK and a resend come (and
    /// in which order, when a resend of a timed-out request crosses a NAK).
    RnrRetries,
    /// The same packets once the ones sent again are set aside (a request or response
    /// at a PSN sent before, a READ asked again from a PSN already answered), ACKs and
    /// RNR NAKs aside, in the same order or, across concurrent QP pairs, in another:
    /// resent after a timeout or a NAK.
    Resends,
    /// The same but for the AckReq bit of UC packets, which rxe leaves clear (no ACK
    /// ever answers a UC request) and the sim's capture clears: a regression of it.
    UcAckReq,
    /// The same once the requests sent after the one a NAK answers are set aside: the
    /// sim sent the WRs behind a failing request before its NAK came back, rxe0's NAK
    /// came back before it sent them.
    BehindNak,
    /// The sim put nothing on the wire where rxe0 did: it refuses a READ's or atomic's
    /// local SGE before sending the request, where rxe sends it and fails the WR when
    /// the response lands; or the case moved the QP to ERR before the sim's engine had
    /// sent what was posted, where rxe sends within the post call.
    RxeOnly,
    /// The same packets, ACKs aside, in another order across or within QP pairs (PSN
    /// and MSN steps aside: they follow the order).
    Interleaving,
    /// Something else.
    Differs,
}

impl Verdict {
    /// How the summary names it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Same => "same",
            Verdict::AckCoalescing => "ACK coalescing",
            Verdict::RnrRetries => "RNR retries in a timed wait",
            Verdict::Resends => "resends",
            Verdict::UcAckReq => "AckReq on UC",
            Verdict::BehindNak => "requests behind a NAK",
            Verdict::RxeOnly => "sent on rxe0 only",
            Verdict::Interleaving => "interleaving",
            Verdict::Differs => "**differs**",
        }
    }
}

/// A row without its AckReq flag.
fn no_ack_req(row: &str) -> String {
    row.replace(" A ", " ").trim_end_matches(" A").to_string()
}

/// Whether a row is a UC packet's.
fn is_uc(row: &str) -> bool {
    row.get(3..).is_some_and(|r| r.starts_with("UC "))
}

/// A row with what ACK coalescing changes taken out: `None` for a plain ACK (an
/// ACKNOWLEDGE whose syndrome is an ACK), the AckReq flag dropped from the others but
/// UC's (which no ACK coalescing explains).
fn without_acks(row: &str) -> Option<String> {
    if row.contains(" ACKNOWLEDGE ") && row.contains(" ACK msn") && !row.contains("ATOMIC") {
        return None;
    }
    Some(if is_uc(row) {
        row.to_string()
    } else {
        no_ack_req(row)
    })
}

fn normalized(s: &Seq) -> Vec<Vec<String>> {
    s.convs
        .iter()
        .map(|c| c.iter().filter_map(|r| without_acks(r)).collect())
        .collect()
}

/// A conversation's packets up to its first NAK (not an RNR NAK) and the requests
/// at PSNs up to the one it answers; all of them when there is none.
fn before_nak(pkts: &[Pkt]) -> Vec<Pkt> {
    let nak = pkts.iter().find_map(|p| {
        let a = p.headers.aeth?;
        (a.syndrome >> 5 == 3).then_some(p.headers.bth.psn)
    });
    pkts.iter()
        .filter(|p| {
            let b = &p.headers.bth;
            nak.is_none_or(|n| opcode::is_response(b.opcode) || step(n, b.psn) <= 0)
        })
        .cloned()
        .collect()
}

/// The multiset of the rows with their PSN and MSN steps taken out.
fn multiset(convs: &[Vec<String>]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in convs.iter().flatten() {
        let r: Vec<&str> = r
            .split(' ')
            .filter(|w| !w.starts_with("psn") && !w.starts_with("msn") && *w != "first")
            .collect();
        *m.entry(r.join(" ")).or_default() += 1;
    }
    m
}

/// A conversation's packets with those sent again set aside, and every ACKNOWLEDGE
/// (ACKs and NAKs alike), rendered as rows: the first of each (destination, PSN), and no
/// READ request at a PSN a packet of the conversation already had (a READ asked again
/// from a response already received, as rxe asks after a NAK in the responses).
fn first_sends(pkts: &[Pkt]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let kept: Vec<Pkt> = pkts
        .iter()
        .filter(|p| {
            let b = &p.headers.bth;
            let again = if b.opcode & 0x1f == op::READ_REQUEST {
                seen.iter().any(|&(_, psn)| psn == b.psn)
            } else {
                seen.contains(&(b.dst_qpn, b.psn))
            };
            let ack = b.opcode & 0x1f == op::ACKNOWLEDGE;
            if !ack {
                seen.insert((b.dst_qpn, b.psn));
            }
            !again && !ack
        })
        .cloned()
        .collect();
    rows(&kept)
        .into_iter()
        .map(|r| r.replace(" A ", " ").trim_end_matches(" A").to_string())
        .collect()
}

/// The verdict on sequences `a` and `b`.
pub fn verdict(a: &Seq, b: &Seq) -> Verdict {
    if a.convs == b.convs {
        return Verdict::Same;
    }
    let (na, nb) = (normalized(a), normalized(b));
    if na == nb {
        return Verdict::AckCoalescing;
    }
    let all_ack_req = |n: &[Vec<String>]| -> Vec<Vec<String>> {
        n.iter()
            .map(|c| c.iter().map(|r| no_ack_req(r)).collect())
            .collect()
    };
    if all_ack_req(&na) == all_ack_req(&nb) {
        return Verdict::UcAckReq;
    }
    // An RNR NAK and the resend it calls for (a request at the PSN of the one before).
    let rnr_blind = |convs: &[Vec<String>]| -> Vec<Vec<String>> {
        convs
            .iter()
            .map(|c| {
                c.iter()
                    .filter(|r| !(r.contains("RNR NAK") || r.starts_with("->") && r.contains(" psn+0")))
                    .cloned()
                    .collect()
            })
            .collect()
    };
    if rnr_blind(&na) == rnr_blind(&nb) {
        return Verdict::RnrRetries;
    }
    let resent = |s: &Seq| s.pkts.iter().map(|c| first_sends(c)).collect::<Vec<_>>();
    // (Sequences given as rows alone, without their packets, are not judged so.)
    if !a.pkts.is_empty() && resent(a) == resent(b) {
        return Verdict::Resends;
    }
    let cut = |s: &Seq| {
        s.pkts
            .iter()
            .map(|c| first_sends(&before_nak(c)))
            .collect::<Vec<_>>()
    };
    if !a.pkts.is_empty() && cut(a) == cut(b) {
        return Verdict::BehindNak;
    }
    if a.packets == 0 && b.packets > 0 {
        return Verdict::RxeOnly;
    }
    if multiset(&na) == multiset(&nb) {
        return Verdict::Interleaving;
    }
    // Packets sent again and concurrent QP pairs' packets in another order.
    if !a.pkts.is_empty() && multiset(&resent(a)) == multiset(&resent(b)) {
        return Verdict::Resends;
    }
    Verdict::Differs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(rows: &[&str]) -> Seq {
        Seq {
            convs: vec![rows.iter().map(|r| r.to_string()).collect()],
            ..Seq::default()
        }
    }

    #[test]
    fn ack_coalescing_is_told_from_a_difference() {
        let rxe = seq(&[
            "-> SEND_ONLY psn first A len=8",
            "<- ACKNOWLEDGE psn first ACK msn=1",
            "-> SEND_ONLY psn+1 A len=8",
            "<- ACKNOWLEDGE psn+1 ACK msn+1",
        ]);
        let sim = seq(&[
            "-> SEND_ONLY psn first len=8",
            "-> SEND_ONLY psn+1 A len=8",
            "<- ACKNOWLEDGE psn first ACK msn=2",
        ]);
        assert_eq!(verdict(&sim, &rxe), Verdict::AckCoalescing);
        let other = seq(&["-> SEND_ONLY psn first len=9", "-> SEND_ONLY psn+1 A len=8"]);
        assert_eq!(verdict(&other, &rxe), Verdict::Differs);
        let nak = seq(&[
            "-> SEND_ONLY psn first A len=8",
            "<- ACKNOWLEDGE psn first NAK rem-access msn=0",
        ]);
        assert_eq!(verdict(&nak, &rxe), Verdict::Differs);
    }

    #[test]
    fn rnr_retries_and_interleavings() {
        let rnr = |n: usize| {
            let mut r = vec!["-> SEND_ONLY psn first A len=8"];
            for _ in 0..n {
                r.extend([
                    "<- ACKNOWLEDGE psn first RNR NAK t=1 msn=0",
                    "-> SEND_ONLY psn+0 A len=8",
                ]);
            }
            seq(&r)
        };
        assert_eq!(verdict(&rnr(3), &rnr(3)), Verdict::Same);
        assert_eq!(verdict(&rnr(2), &rnr(5)), Verdict::RnrRetries);
        let two = |x: &str, y: &str| Seq {
            convs: vec![vec![x.to_string()], vec![y.to_string()]],
            ..Seq::default()
        };
        assert_eq!(verdict(&two("a", "b"), &two("b", "a")), Verdict::Interleaving);
    }

    #[test]
    fn uc_ack_req_is_not_ack_coalescing() {
        let rxe = seq(&[
            "-> UC SEND_FIRST psn first len=1024",
            "-> UC SEND_LAST psn+1 len=8",
        ]);
        let sim = seq(&[
            "-> UC SEND_FIRST psn first len=1024",
            "-> UC SEND_LAST psn+1 A len=8",
        ]);
        assert_eq!(verdict(&sim, &rxe), Verdict::UcAckReq);
        let rc = |a: &str| seq(&[&format!("-> SEND_ONLY psn first{a} len=8")]);
        assert_eq!(verdict(&rc(" A"), &rc("")), Verdict::AckCoalescing);
    }

    #[test]
    fn requests_behind_a_nak_and_nothing_sent() {
        let nak = |psn: u32| {
            let mut p = pkt(false, op::ACKNOWLEDGE, psn);
            p.headers.aeth = Some(backend_sim_proto::capture::headers::Aeth {
                syndrome: 0x62,
                msn: 0,
            });
            p
        };
        let sim = of(vec![
            pkt(true, op::WRITE_ONLY, 5),
            pkt(true, op::WRITE_ONLY, 6),
            pkt(true, op::WRITE_ONLY, 7),
            nak(5),
        ]);
        let rxe = of(vec![pkt(true, op::WRITE_ONLY, 5), nak(5)]);
        assert_eq!(verdict(&sim, &rxe), Verdict::BehindNak);
        // Without the NAK the missing requests are a difference.
        let sim = of(vec![pkt(true, op::WRITE_ONLY, 5), pkt(true, op::WRITE_ONLY, 6)]);
        let rxe = of(vec![pkt(true, op::WRITE_ONLY, 5)]);
        assert_eq!(verdict(&sim, &rxe), Verdict::Differs);
        let mut rxe = of(vec![pkt(true, op::READ_REQUEST, 1)]);
        rxe.packets = 1;
        assert_eq!(verdict(&Seq::default(), &rxe), Verdict::RxeOnly);
    }

    fn pkt(to_opener: bool, opcode: u8, psn: u32) -> Pkt {
        let dst = if to_opener { 0x12 } else { 0x11 };
        Pkt {
            to_opener,
            headers: backend_sim_proto::capture::headers::Headers::new(opcode, dst, psn),
            payload_len: 8,
            group: None,
        }
    }

    fn of(p: Vec<Pkt>) -> Seq {
        Seq {
            convs: vec![rows(&p)],
            pkts: vec![p],
            ..Seq::default()
        }
    }

    #[test]
    fn packets_sent_again_are_resends() {
        let sim = of(vec![
            pkt(true, op::SEND_ONLY, 1),
            pkt(true, op::SEND_ONLY, 2),
            pkt(false, op::ACKNOWLEDGE, 2),
        ]);
        let rxe = of(vec![
            pkt(true, op::SEND_ONLY, 1),
            pkt(true, op::SEND_ONLY, 2),
            pkt(true, op::SEND_ONLY, 1),
            pkt(true, op::SEND_ONLY, 2),
            pkt(false, op::ACKNOWLEDGE, 2),
        ]);
        assert_eq!(verdict(&sim, &rxe), Verdict::Resends);
        // A READ asked again from its third response on, after a NAK.
        let sim = of(vec![
            pkt(true, op::READ_REQUEST, 10),
            pkt(false, op::READ_RESPONSE_FIRST, 10),
            pkt(false, op::READ_RESPONSE_MIDDLE, 11),
            pkt(false, op::READ_RESPONSE_MIDDLE, 12),
            pkt(false, op::READ_RESPONSE_LAST, 13),
        ]);
        let rxe = of(vec![
            pkt(true, op::READ_REQUEST, 10),
            pkt(false, op::READ_RESPONSE_FIRST, 10),
            pkt(false, op::READ_RESPONSE_MIDDLE, 11),
            pkt(false, op::READ_RESPONSE_MIDDLE, 12),
            pkt(false, op::ACKNOWLEDGE, 10),
            pkt(true, op::READ_REQUEST, 12),
            pkt(false, op::READ_RESPONSE_MIDDLE, 12),
            pkt(false, op::READ_RESPONSE_LAST, 13),
        ]);
        assert_eq!(verdict(&sim, &rxe), Verdict::Resends);
        // Two QP pairs' atomics in another order, one of them sent again.
        let pair = |first: u64, again: bool| {
            let mut p = vec![pkt(true, op::FETCH_ADD, 3)];
            if again {
                p.push(pkt(true, op::FETCH_ADD, 3));
            }
            let mut ack = pkt(false, op::ATOMIC_ACKNOWLEDGE, 3);
            ack.headers.atomic_ack = Some(first);
            p.push(ack);
            p
        };
        let two = |x: Vec<Pkt>, y: Vec<Pkt>| Seq {
            convs: vec![rows(&x), rows(&y)],
            pkts: vec![x, y],
            ..Seq::default()
        };
        let sim = two(pair(0, false), pair(1, false));
        let rxe = two(pair(1, true), pair(0, false));
        assert_eq!(verdict(&sim, &rxe), Verdict::Resends);
        let short = of(vec![
            pkt(true, op::READ_REQUEST, 10),
            pkt(false, op::READ_RESPONSE_FIRST, 10),
        ]);
        assert_eq!(verdict(&sim, &short), Verdict::Differs);
    }
}
