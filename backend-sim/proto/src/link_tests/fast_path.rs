//! The model check with the one-sided fast path: the requester's driver executes
//! WRITEs, READs and atomics on the responder's region itself (in process, through the
//! responder's own access check), as a same-host driver does through shared memory, and
//! frames are lost on the way. Whatever the driver takes and whatever is resent, the
//! run must match the sequential model: each atomic executed once, each READ seeing the
//! memory of its place in the stream, every completion once and in order.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::memory::{Seg, Target};
use crate::requester::{DirectAtomic, DirectWrite};

/// A driver that executes an operation on the responder's region when the bit of
/// `pattern` for the how-many-eth request it is asked is set, and refuses it otherwise.
pub(super) struct InProcess {
    table: MrTable,
    target: Target,
    pattern: u64,
    asked: AtomicU32,
}

impl InProcess {
    /// The driver of a connection to the link's responder, whose region is `region`.
    pub(super) fn new(pattern: u64, region: &Arc<MrShared>) -> Arc<InProcess> {
        let table = MrTable::default();
        table.insert(region.clone());
        Arc::new(InProcess {
            table,
            target: Target {
                pd: PD,
                qpn: 2,
                access: AccessFlags::REMOTE,
                region_bounds: false,
            },
            pattern,
            asked: AtomicU32::new(0),
        })
    }

    /// The responder's region under `rkey` for `len` bytes at `addr`, if this request
    /// is to be executed here and passes the access check.
    fn grant(&self, rkey: u32, addr: u64, len: u64, need: AccessFlags) -> Option<Seg> {
        let n = self.asked.fetch_add(1, Ordering::Relaxed);
        if self.pattern >> (n % 64) & 1 == 0 {
            return None;
        }
        self.table
            .resolve_remote(&self.target, rkey, addr, len, need)
            .ok()
            .flatten()
    }
}

impl DirectWrite for InProcess {
    fn min_len(&self) -> u64 {
        1
    }

    fn write(&self, _: u32, rkey: u32, addr: u64, segs: &[Seg]) -> bool {
        let len = segs.iter().map(|s| s.len).sum::<usize>();
        let Some(dst) = self.grant(rkey, addr, len as u64, AccessFlags::REMOTE_WRITE) else {
            return false;
        };
        let mut at = 0;
        for s in segs {
            let mut b = vec![0u8; s.len];
            if !s.copy_out(0, &mut b) || !dst.copy_in(at, &b) {
                return false;
            }
            at += s.len;
        }
        true
    }

    fn read(&self, _: u32, rkey: u32, addr: u64, segs: &[Seg]) -> bool {
        let len = segs.iter().map(|s| s.len).sum::<usize>();
        let Some(src) = self.grant(rkey, addr, len as u64, AccessFlags::REMOTE_READ) else {
            return false;
        };
        let mut at = 0;
        for s in segs {
            let mut b = vec![0u8; s.len];
            if !src.copy_out(at, &mut b) || !s.copy_in(0, &b) {
                return false;
            }
            at += s.len;
        }
        true
    }

    fn atomic(&self, _: u32, rkey: u32, addr: u64, op: DirectAtomic) -> Option<u64> {
        let word = self.grant(rkey, addr, 8, AccessFlags::REMOTE_ATOMIC)?;
        word.atomic(|w| match op {
            DirectAtomic::FetchAdd { add } => w.fetch_add(add, std::sync::atomic::Ordering::SeqCst),
            DirectAtomic::CompareSwap { compare, swap } => {
                match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        })
    }
}

/// The model check's operations, and now and then frames lost on the way.
fn lossy_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => op(),
        1 => Just(Op::LoseRequests),
        1 => Just(Op::LoseResponses),
        1 => Just(Op::LoseConnection),
    ]
}

proptest! {
    /// Random posts, pumps, ticks and lost frames, with the driver executing the
    /// operations the random pattern picks: the run matches the sequential model of RC
    /// exactly as without the fast path.
    #[test]
    fn random_operations_on_the_fast_path_match_the_model(
        ops in proptest::collection::vec(lossy_op(), 1..60),
        pattern in any::<u64>(),
    ) {
        check_model(ops, Some(pattern))?;
    }
}
