//! Helpers shared by the integration tests that check READs come back (each test file
//! is its own crate; this module is included with `mod common;`).

// Each test crate uses a part of it.
#![allow(dead_code)]

use std::time::Duration;
use verbs_api::*;

/// How long one READ may take before the test calls it lost.
pub const WAIT: Duration = Duration::from_secs(5);

/// A 4 KiB region on each side of a READ: `local` (LOCAL_WRITE, where data lands) and
/// `remote` (LOCAL_WRITE | REMOTE_READ, what is read).
pub fn read_mrs<P: ProtectionDomain>(local: &P, remote: &P) -> (MrOf<P::Backend>, MrOf<P::Backend>) {
    let l = local.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let r = remote
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    (l, r)
}

/// Writes `v` at `off` of `mrb`, READs it over `qp` into the same offset of `mra` and
/// checks it arrived (each wait bounded).
pub fn read_back<Q: QueuePair, C: CompletionQueue, M: MemoryRegion>(
    qp: &Q,
    cq: &C,
    mra: &M,
    mrb: &M,
    off: usize,
    v: u64,
    what: &str,
) {
    mrb.write_u64(off, v).unwrap();
    qp.post_send(&[SendWr::read(v, &[mra.sge(off, 8).unwrap()], mrb.remote().at(off as u64)).signaled()])
        .unwrap();
    let w = poll_n(cq, 1, WAIT).unwrap_or_else(|e| panic!("{what}: lost: {e}"));
    assert!(w[0].is_ok(), "{what}: {w:?}");
    assert_eq!(mra.read_u64(off).unwrap(), v, "{what}");
}
