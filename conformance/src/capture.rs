//! `--pcap DIR`: on the sim, the traffic of each case's device as the RoCE v2 packets an
//! HCA would send, with the verbs context as comments ([`backend_sim::capture`]), in
//! `DIR/<case id>.pcapng`, so that a case's packets can be checked against what the case
//! implies (the opcodes, PSNs and AETH syndromes; `tests/capture.rs`) and looked at in
//! Wireshark. A device that is not the sim's has its wire for `tcpdump` to capture.
//!
//! The context a case runs in ([`Env::ctx`](crate::Env)) is captured: the QPs of a
//! [`Pair`](crate::Pair) are both on it, so both directions are in the file; a second
//! device a case opens itself is not.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::Failure;

/// A case's capture, flushed when the case is done (dropped after its context).
pub struct CaseCapture(Arc<backend_sim::capture::Capture>);

impl Drop for CaseCapture {
    fn drop(&mut self) {
        self.0.flush();
    }
}

/// The file case `id` is captured to in `dir`.
pub fn path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.pcapng"))
}

/// Captures `ctx`'s traffic to [`path`]`(dir, id)` if `ctx` is a sim device (each packet
/// kept as `RDMA_SIM_PCAP_SNAPLEN` says, its headers by default); `None` for another
/// backend's.
pub fn start<C: Any>(ctx: &C, dir: &Path, id: &str) -> Result<Option<CaseCapture>, Failure> {
    let Some(sim) = (ctx as &dyn Any).downcast_ref::<backend_sim::SimContext>() else {
        return Ok(None);
    };
    let file = path(dir, id);
    let w = std::fs::File::create(&file)
        .map_err(|e| Failure(format!("--pcap: cannot create {}: {e}", file.display())))?;
    let cap = sim
        .capture_to(w, backend_sim::capture::Snaplen::from_env())
        .map_err(|e| Failure(format!("--pcap: {e} (RDMA_SIM_PCAP set as well?)")))?;
    Ok(Some(CaseCapture(cap)))
}
