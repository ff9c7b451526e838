//! Posting: what QP `j` may post now, built from its plan ([`Worker::post`]): the
//! payloads written, the slot bookkeeping that lets every WRITE be read back, the fence a
//! WRITE needs behind a READ of its slot, and the atomics' expected results.

use verbs_api::{Backend, MemoryRegion, QueuePair, SendWr, Sge, WrOp};

use super::plan::{chain_next, fill_payload, init_key, key, plan, Kind};
use super::worker::{Pending, Worker, INIT};

impl<B: Backend> Worker<'_, B> {
    /// Posts what QP `j` may post now (as one `ibv_post_send` list).
    pub(super) fn post(&mut self, j: usize, sges: &mut Vec<Sge>, ops: &mut Vec<(u64, WrOp, bool)>) {
        let lay = self.lay;
        let q = &self.qs[j];
        let room = lay.depth as u64 - (q.next_post - q.next_done);
        let until = (q.next_post + room).min(self.cfg.ops_per_qp);
        if until == q.next_post {
            return;
        }
        sges.clear();
        ops.clear();
        let first = q.next_post;
        for seq in first..until {
            let (pending, op, len, fence) = self.wr(j, seq);
            let off = lay.local(j, seq);
            let local = &self.dev.local;
            if op.is_atomic() {
                // A sentinel where the old value must land.
                local
                    .write_u64(off, 0xdead_beef_dead_beef)
                    .expect("slot inside the MR");
            }
            self.qs[j].pending[(seq % lay.depth as u64) as usize] = pending;
            sges.push(local.sge(off, len as usize).expect("slot inside the MR"));
            ops.push((((j as u64) << 40) | seq, op, fence));
            if fence {
                self.counts.write_fenced += 1;
            }
        }
        self.qs[j].next_post = until;
        let wrs: Vec<SendWr<'_>> = ops
            .iter()
            .zip(sges.iter())
            .map(|(&(wr_id, op, fence), sge)| {
                let wr = SendWr::new(wr_id, op, std::slice::from_ref(sge)).signaled();
                if fence {
                    wr.fence()
                } else {
                    wr
                }
            })
            .collect();
        if let Err(e) = self.dev.qps[j].post_send(&wrs) {
            self.problem(format!("QP {j}: post_send of seq {first}..{until}: {e}"));
        }
    }

    /// The WR of QP `j` at `seq`, from its plan: what it must produce, the operation, its
    /// length and whether it needs a fence. Its payload is written to its buffer and the
    /// QP's slot and atomic bookkeeping advanced.
    fn wr(&mut self, j: usize, seq: u64) -> (Pending, WrOp, u32, bool) {
        let (cfg, lay) = (self.cfg, self.lay);
        let q = &mut self.qs[j];
        let local = &self.dev.local;
        let p = plan(cfg, &self.mix, self.side, j, seq);
        let off = lay.local(j, seq);
        let slot_addr = |k: usize| self.peer_target.at(lay.target(j, k) as u64);
        let k = p.slot;
        let mut fence = false;
        let (pending, op, len) = match p.kind {
            Kind::Send => {
                let len = p.len as usize;
                fill_payload(&mut self.scratch[..len], key(cfg.seed, self.side, j, seq));
                local
                    .write(off, &self.scratch[..len])
                    .expect("slot inside the MR");
                (
                    Pending::Send { len: p.len },
                    WrOp::SendWithImm { imm_data: seq as u32 },
                    p.len,
                )
            }
            // A WRITE goes to a slot whose last WRITE was read back; otherwise this WR
            // reads it back instead.
            Kind::Write if !q.slot_dirty[k] => {
                let len = p.len as usize;
                fill_payload(&mut self.scratch[..len], key(cfg.seed, self.side, j, seq));
                local
                    .write(off, &self.scratch[..len])
                    .expect("slot inside the MR");
                q.slot_last[k] = (seq, p.len);
                q.slot_dirty[k] = true;
                // The responder may execute a WRITE before it has read out the data of
                // an earlier READ (IBA "RDMA Read relaxed ordering": only a fence keeps
                // a READ's data from reflecting later WRITEs to the same place).
                if q.slot_read[k].is_some_and(|r| r >= q.next_done) {
                    fence = true;
                }
                (
                    Pending::Write { len: p.len },
                    WrOp::RdmaWrite { remote: slot_addr(k) },
                    p.len,
                )
            }
            Kind::Write | Kind::Read => {
                let (last, last_len) = q.slot_last[k];
                let (key, len) = if last == INIT {
                    (init_key(cfg.seed, self.side, j, k), p.len)
                } else {
                    (key(cfg.seed, self.side, j, last), last_len)
                };
                q.slot_dirty[k] = false;
                q.slot_read[k] = Some(seq);
                (
                    Pending::Read { key, len },
                    WrOp::RdmaRead { remote: slot_addr(k) },
                    len,
                )
            }
            Kind::FetchAdd => (
                Pending::FetchAdd { counter: p.counter },
                WrOp::AtomicFetchAndAdd {
                    remote: self.peer_atomics.at(lay.counter(p.counter) as u64),
                    add: 1,
                },
                8,
            ),
            Kind::CasChain => {
                let compare = q.chain_value;
                q.chain_value = chain_next(compare);
                (
                    Pending::CasChain { compare },
                    WrOp::AtomicCmpAndSwp {
                        remote: self.peer_atomics.at(lay.chain(j) as u64),
                        compare,
                        swap: q.chain_value,
                    },
                    8,
                )
            }
            Kind::CasShared => {
                let compare = q.shared_guess;
                (
                    Pending::CasShared { compare },
                    WrOp::AtomicCmpAndSwp {
                        remote: self.peer_atomics.at(lay.shared() as u64),
                        compare,
                        swap: compare + 1,
                    },
                    8,
                )
            }
        };
        (pending, op, len, fence)
    }
}
