//! After the traffic ([`final_checks`]): every WR and receive completed, the target
//! memory holds each slot's last WRITE, the atomic words their expected values, and no
//! completion comes after the end.

use std::time::Duration;

use verbs_api::{Backend, CompletionQueue, MemoryRegion, WorkCompletion};

use super::config::SoakConfig;
use super::device::Device;
use super::layout::Layout;
use super::plan::{counter_init, init_key, key, payload_mismatch, SHARED_INIT};
use super::worker::{Worker, INIT, MAX_PROBLEMS};

/// After the traffic: totals, memory contents and atomic words, and no stray completion.
pub(super) fn final_checks<B: Backend>(
    cfg: &SoakConfig,
    lay: &Layout,
    devs: &[Device<B>; 2],
    workers: &[Worker<'_, B>],
    problems: &mut Vec<String>,
) {
    let mut push = |p: String| {
        if problems.len() < MAX_PROBLEMS {
            problems.push(p);
        }
    };
    let mut buf = vec![0u8; lay.max];
    for (side, w) in workers.iter().enumerate() {
        let peer = &devs[1 - side];
        let me = &devs[side].name;
        for (j, q) in w.qs.iter().enumerate() {
            if q.next_done != cfg.ops_per_qp || q.recvs != w.recv_expect[j] {
                push(format!(
                    "{me}: QP {j}: {} of {} send WRs and {} of {} receives completed",
                    q.next_done, cfg.ops_per_qp, q.recvs, w.recv_expect[j]
                ));
            }
            // The last WRITE to every slot, in the target memory.
            for (k, &(seq, len)) in q.slot_last.iter().enumerate() {
                let (key, len) = if seq == INIT {
                    (init_key(cfg.seed, side, j, k), lay.max as u32)
                } else {
                    (key(cfg.seed, side, j, seq), len)
                };
                let b = &mut buf[..len as usize];
                if let Err(e) = peer.target.read(lay.target(j, k), b) {
                    push(format!("{}: reading slot {k} of QP {j}: {e}", peer.name));
                } else if let Some(at) = payload_mismatch(b, key) {
                    push(format!(
                        "{}: slot {k} of {me}'s QP {j} differs from its last WRITE (seq {seq}) at byte {at}",
                        peer.name
                    ));
                }
            }
            let chain = peer.atomics.read_u64(lay.chain(j)).unwrap_or(0);
            if chain != q.chain_value {
                push(format!(
                    "{}: chain word of {me}'s QP {j} is {chain:#x}, expected {:#x}",
                    peer.name, q.chain_value
                ));
            }
        }
        for c in 0..lay.counters {
            let v = peer.atomics.read_u64(lay.counter(c)).unwrap_or(0);
            let want = counter_init(c) + w.adds_done[c];
            if w.adds_done[c] != w.adds_planned[c] || v != want {
                push(format!(
                    "{}: counter {c} is {v:#x}, expected {want:#x} ({} of {} adds from {me} completed)",
                    peer.name, w.adds_done[c], w.adds_planned[c]
                ));
            }
        }
        let shared = peer.atomics.read_u64(lay.shared()).unwrap_or(0);
        let hits = w.counts.cmp_swap_shared_hits;
        if shared != SHARED_INIT + hits || !w.shared_bits.all_set_below(hits) {
            push(format!(
                "{}: shared CAS word is {shared}, expected {} after {hits} hits from {me} (each value once)",
                peer.name,
                SHARED_INIT + hits
            ));
        }
    }
    // Nothing more may complete.
    std::thread::sleep(Duration::from_millis(20));
    let mut wcs = [WorkCompletion::default(); 16];
    for d in devs {
        for (c, cq) in d.cqs.iter().enumerate() {
            match cq.poll(&mut wcs) {
                Ok(0) => {}
                Ok(k) => push(format!(
                    "{}: CQ {c}: {k} completions after the end, e.g. wr_id {:#x} {:?}",
                    d.name, wcs[0].wr_id, wcs[0].status
                )),
                Err(e) => push(format!("{}: CQ {c}: poll: {e}", d.name)),
            }
        }
    }
}
