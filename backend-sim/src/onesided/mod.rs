//! The one-sided fast path's shared state (issue 43, item 2; design in `docs/sim.md`,
//! "The one-sided fast path"): a device's table of the regions and QPs a same-host peer
//! may reach directly, the per-connection use counts that let deregistration and QP
//! errors revoke that reach before they return, and the cross-process copies
//! (`process_vm_readv`/`writev`) a requester makes once its check passed.
//!
//! The remote access check is the one `MrTable::resolve_remote` runs (IBA 9.7.4.1.4: rkey,
//! PD of the QP, the QP's and the region's rights, bounds), here run by the requester on
//! what the responder published. Anything it refuses goes over the rings, where the
//! responder runs its own check and NAKs or errors exactly as before.
//!
//! The data path does not use it yet: `RDMA_SIM_ONE_SIDED` ([`enabled`]) is off by
//! default and, on, changes nothing until the requester and responder are wired to it.

pub mod cma;
mod segment;
pub mod table;
#[cfg(test)]
mod tests;
pub mod usage;

/// The setting that turns the fast path on (`on`; anything else, or unset, is off).
pub const SETTING: &str = "RDMA_SIM_ONE_SIDED";

/// Whether `RDMA_SIM_ONE_SIDED=on`, read once per process.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(SETTING).is_ok_and(|v| v.trim() == "on"))
}
