//! The invariants, checked after every step: completions exactly as posted and in order
//! ([`Harness::check_completions`]), what is queued for the peer bounded
//! ([`Harness::check_bounds`]), and memory ([`Harness::check`]): canaries intact,
//! regions that must not change unchanged, nothing written once the QP is in ERR.

use verbs_api::{WcOpcode, WcStatus};

use crate::harness::Harness;
use crate::limits::{MAX_UNSENT_READS, NON_REPLY_SLACK};
use crate::regions::{CANARY, DEAD, FOREIGN, MR_MAX, READONLY, REGION_LEN, TARGET};
use backend_sim_proto::wire::MAX_HDR_LEN;

impl Harness {
    /// Completions: receives exactly as posted and in order; sends in order, once.
    pub(crate) fn check_completions(&mut self) {
        for (wc, _) in self.recv_wc.drain(..) {
            let (id, cap) = self
                .recvs
                .pop_front()
                .unwrap_or_else(|| panic!("a receive completion with none posted: {wc:?}"));
            assert_eq!(wc.wr_id, id, "receive completions out of order");
            assert_eq!(wc.qp_num, 2);
            if wc.status == WcStatus::Success {
                assert!(matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm));
                if wc.opcode == WcOpcode::Recv {
                    assert!(
                        wc.byte_len as u64 <= cap,
                        "{} bytes into a {cap}-byte receive",
                        wc.byte_len
                    );
                }
            }
        }
        for wc in self.send_wc.drain(..) {
            assert!(
                !(self.send_ids_done && self.err),
                "a send completion after the QP was flushed: {wc:?}"
            );
            assert!(
                wc.wr_id > self.last_send_id && wc.wr_id < self.next_id,
                "send completion {} after {} (posted up to {})",
                wc.wr_id,
                self.last_send_id,
                self.next_id - 1
            );
            self.last_send_id = wc.wr_id;
        }
    }

    /// What is queued for the peer stays bounded.
    pub(crate) fn check_bounds(&mut self) {
        let replies = self.tx.unsent_replies();
        assert!(replies <= MAX_UNSENT_READS + 1, "{replies} responses queued");
        let bound = replies * (MR_MAX + MAX_HDR_LEN) + NON_REPLY_SLACK;
        assert!(
            self.tx.pending() <= bound,
            "{} bytes queued for a peer that does not read ({replies} responses)",
            self.tx.pending()
        );
        if self.err {
            assert!(
                self.tx.pending() <= self.err_pending,
                "a QP in ERR queued more for the peer"
            );
        }
    }

    /// Memory invariants.
    pub fn check(&mut self) {
        let now = self.bytes().to_vec();
        let mut at = 0;
        for (r, end) in self.offs.iter().copied().chain([self.total]).enumerate() {
            if let Some(i) = now[at..end].iter().position(|&b| b != CANARY) {
                panic!("canary at byte {} (before region {r}) overwritten", at + i);
            }
            at = end + REGION_LEN.get(r).copied().unwrap_or(0);
        }
        let same = |r: usize| {
            let o = self.offs[r];
            now[o..o + REGION_LEN[r]] == self.initial[o..o + REGION_LEN[r]]
        };
        assert!(same(READONLY), "a region without remote write access changed");
        assert!(same(FOREIGN), "a region of another PD changed");
        assert!(same(DEAD), "a deregistered region changed");
        if !self.target_writable {
            assert!(
                same(TARGET),
                "TARGET changed though the QP grants no remote write or atomic"
            );
        }
        for (r, was) in &self.frozen {
            let o = self.offs[*r];
            assert!(
                now[o..o + REGION_LEN[*r]] == was[..],
                "region {r} changed after it was deregistered"
            );
        }
        if self.err && !self.rx.in_payload() {
            match &self.err_snapshot {
                None => self.err_snapshot = Some(now),
                Some(s) => assert!(*s == now, "memory changed while the QP was in ERR"),
            }
        }
    }
}
