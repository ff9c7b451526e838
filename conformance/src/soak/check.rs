//! The checks of completions ([`Worker::on_wc`]): every send WR once, in order, with its
//! opcode and result (READ data, FETCH_AND_ADD old values each once, CMP_AND_SWP chains
//! and the shared word's hits); every receive the peer's next SEND, whole.

use std::sync::atomic::Ordering;

use verbs_api::{Backend, MemoryRegion, QueuePair, RecvWr, WcOpcode, WcStatus, WorkCompletion};

use super::plan::{counter_init, key, payload_mismatch, plan, Kind, SHARED_INIT};
use super::worker::{Pending, Worker, RECV_BIT, SEQ_MASK};

impl<B: Backend> Worker<'_, B> {
    /// Checks one completion and what it must have produced.
    pub(super) fn on_wc(&mut self, wc: &WorkCompletion) {
        let j = ((wc.wr_id & !RECV_BIT) >> 40) as usize;
        if j >= self.lay.n {
            return self.problem(format!("completion with an unknown wr_id {:#x}", wc.wr_id));
        }
        let qpn = self.dev.qps[j].qp_num();
        if wc.qp_num != qpn {
            return self.problem(format!(
                "wr_id {:#x} (QP {j}, qp_num {qpn:#x}) completed on qp_num {:#x}",
                wc.wr_id, wc.qp_num
            ));
        }
        if wc.status != WcStatus::Success {
            return self.problem(format!(
                "QP {j}: wr_id {:#x} completed with {:?} ({})",
                wc.wr_id, wc.status, wc.status
            ));
        }
        if wc.wr_id & RECV_BIT != 0 {
            self.on_recv(j, wc);
        } else {
            self.on_send(j, wc);
        }
    }

    /// A send WR completed: in order, with its opcode and what it must have produced.
    fn on_send(&mut self, j: usize, wc: &WorkCompletion) {
        let seq = wc.wr_id & SEQ_MASK;
        let lay = self.lay;
        let q = &mut self.qs[j];
        if seq != q.next_done || seq >= q.next_post {
            let what = if seq < q.next_done {
                "duplicate"
            } else {
                "out of order or never posted"
            };
            let expect = q.next_done;
            return self.problem(format!(
                "QP {j}: {what} completion of seq {seq} (expected seq {expect})"
            ));
        }
        q.next_done += 1;
        let i = (seq % lay.depth as u64) as usize;
        let pending = std::mem::replace(&mut q.pending[i], Pending::Free);
        let off = lay.local(j, seq);
        let want_opcode = match pending {
            Pending::Send { .. } => WcOpcode::Send,
            Pending::Write { .. } => WcOpcode::RdmaWrite,
            Pending::Read { .. } => WcOpcode::RdmaRead,
            Pending::FetchAdd { .. } => WcOpcode::FetchAdd,
            Pending::CasChain { .. } | Pending::CasShared { .. } => WcOpcode::CompSwap,
            Pending::Free => return self.problem(format!("QP {j}: seq {seq} has no pending record")),
        };
        if wc.opcode != want_opcode {
            return self.problem(format!(
                "QP {j} seq {seq}: opcode {:?}, expected {want_opcode:?}",
                wc.opcode
            ));
        }
        self.progress.fetch_add(1, Ordering::Relaxed);
        let old = || self.dev.local.read_u64(off).expect("slot inside the MR");
        match pending {
            Pending::Send { len } => {
                self.counts.send += 1;
                self.bytes += len as u64;
            }
            Pending::Write { len } => {
                self.counts.write += 1;
                self.bytes += len as u64;
            }
            Pending::Read { key, len } => {
                self.counts.read += 1;
                self.bytes += len as u64;
                if wc.byte_len != len {
                    return self.problem(format!(
                        "QP {j} seq {seq}: READ byte_len {}, expected {len}",
                        wc.byte_len
                    ));
                }
                let buf = &mut self.scratch[..len as usize];
                self.dev.local.read(off, buf).expect("slot inside the MR");
                if let Some(at) = payload_mismatch(buf, key) {
                    self.problem(format!(
                        "QP {j} seq {seq}: READ of {len} B returned wrong data from byte {at}"
                    ));
                }
            }
            Pending::FetchAdd { counter } => self.fetch_add_done(j, seq, counter, old()),
            Pending::CasChain { compare } => {
                self.counts.cmp_swap_chain += 1;
                let old = old();
                if old != compare {
                    self.problem(format!(
                        "QP {j} seq {seq}: chain CMP_AND_SWP missed: returned {old:#x}, the chain was at {compare:#x}"
                    ));
                }
            }
            Pending::CasShared { compare } => self.cas_shared_done(j, seq, compare, old()),
            Pending::Free => unreachable!("checked above"),
        }
    }

    /// A FETCH_AND_ADD on `counter` returned `old`: one of the values the counter passes
    /// through, each returned once.
    fn fetch_add_done(&mut self, j: usize, seq: u64, counter: usize, old: u64) {
        self.counts.fetch_add += 1;
        let base = counter_init(counter);
        let i = old.wrapping_sub(base);
        if i >= self.adds_planned[counter] || !self.add_bits[counter].set(i) {
            return self.problem(format!(
                "QP {j} seq {seq}: FETCH_AND_ADD on counter {counter} returned {old:#x}: \
                 {} (counter starts at {base:#x}, {} adds planned)",
                if i >= self.adds_planned[counter] {
                    "out of range"
                } else {
                    "returned twice"
                },
                self.adds_planned[counter]
            ));
        }
        self.adds_done[counter] += 1;
    }

    /// A CMP_AND_SWP(compare, compare + 1) on the shared word returned `old`: a value the
    /// word holds at some point; a hit swaps each value once.
    fn cas_shared_done(&mut self, j: usize, seq: u64, compare: u64, old: u64) {
        self.counts.cmp_swap_shared += 1;
        let cap = self.shared_bits.capacity();
        if old < SHARED_INIT || old - SHARED_INIT > cap {
            return self.problem(format!(
                "QP {j} seq {seq}: shared CMP_AND_SWP returned {old}, outside {SHARED_INIT}..={}",
                SHARED_INIT + cap
            ));
        }
        let q = &mut self.qs[j];
        if old == compare {
            self.counts.cmp_swap_shared_hits += 1;
            if !self.shared_bits.set(compare - SHARED_INIT) {
                return self.problem(format!(
                    "QP {j} seq {seq}: shared CMP_AND_SWP swapped {compare} -> {} a second time",
                    compare + 1
                ));
            }
            q.shared_guess = q.shared_guess.max(compare + 1);
        } else {
            q.shared_guess = q.shared_guess.max(old);
        }
    }

    /// A receive completed: the peer's next SEND, whole; the receive is posted again.
    fn on_recv(&mut self, j: usize, wc: &WorkCompletion) {
        let r = (wc.wr_id & SEQ_MASK) as usize;
        if r >= self.lay.depth {
            return self.problem(format!("QP {j}: receive with unknown wr_id {:#x}", wc.wr_id));
        }
        if wc.opcode != WcOpcode::Recv {
            return self.problem(format!("QP {j}: receive completed as {:?}", wc.opcode));
        }
        let Some(imm) = wc.imm() else {
            return self.problem(format!("QP {j}: receive without immediate data"));
        };
        let seq = imm as u64;
        let q = &mut self.qs[j];
        if q.last_imm.is_some_and(|l| seq <= l) {
            let last = q.last_imm;
            return self.problem(format!(
                "QP {j}: SEND {seq} received after SEND {last:?} (duplicate or reordered)"
            ));
        }
        q.last_imm = Some(seq);
        q.recvs += 1;
        let peer = 1 - self.side;
        let p = plan(self.cfg, &self.mix, peer, j, seq);
        if p.kind != Kind::Send || seq >= self.cfg.ops_per_qp {
            return self.problem(format!(
                "QP {j}: received immediate {seq}, which is not a SEND of the peer's plan"
            ));
        }
        if wc.byte_len != p.len {
            return self.problem(format!(
                "QP {j}: SEND {seq} received with byte_len {}, sent {}",
                wc.byte_len, p.len
            ));
        }
        let off = self.lay.recv(j, r);
        let buf = &mut self.scratch[..p.len as usize];
        self.dev.recv.read(off, buf).expect("slot inside the MR");
        if let Some(at) = payload_mismatch(buf, key(self.cfg.seed, peer, j, seq)) {
            return self.problem(format!(
                "QP {j}: SEND {seq} of {} B received with wrong data from byte {at}",
                p.len
            ));
        }
        self.recv_done += 1;
        // Scribble over the buffer so that a stale copy cannot pass the next check.
        self.scratch[..p.len as usize].fill(0xee);
        self.dev
            .recv
            .write(off, &self.scratch[..p.len as usize])
            .expect("slot inside the MR");
        let sge = [self.dev.recv.sge(off, self.lay.max).expect("slot inside the MR")];
        if let Err(e) = self.dev.qps[j].post_recv(&[RecvWr::new(wc.wr_id, &sge)]) {
            self.problem(format!("QP {j}: post_recv: {e}"));
        }
    }
}
