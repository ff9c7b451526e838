//! The one-sided fast path's shared state (design in `docs/sim.md`,
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
//! [`owner`] is a device's side (what it publishes and revokes, the setting), [`link`]
//! one connection's (the requester's check and copy, offered to the protocol core),
//! [`exchange`] the setup messages that pass the segments. Copies go with
//! `process_vm_writev`/`readv` ([`cma`]) or, in map mode, with `memcpy` on the peer's
//! regions, whose pages the owner moved into memfds ([`swap`]) and the requester maps
//! ([`mapped`]); READs and atomics only the latter way (a cross-process copy is no
//! atomic operation, and a READ placed early has caveats the comparison modes should
//! not carry: docs/sim.md, map mode). RC WRITE and WRITE_WITH_IMM take the path; READ and atomics are offered to
//! the protocol core ([`link::Link`]'s `read` and `atomic`).

pub mod cma;
pub mod exchange;
pub mod link;
#[cfg(test)]
mod map_tests;
pub mod mapped;
pub mod owner;
mod segment;
pub mod swap;
pub mod table;
#[cfg(test)]
mod tests;
pub mod usage;
#[cfg(test)]
mod verbs_tests;
