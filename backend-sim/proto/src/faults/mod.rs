//! The faults the protocol core knows of, in one place: what a network does to frames
//! ([`network`]: loss, duplication, delay, cut messages and connection resets, decided per
//! frame by a seed, which the deterministic [`fabric`](crate::fabric) applies) and what a
//! test arms on a responder ([`ForcedRnr`]: RNR NAKs whatever its receive queue holds).
//! The driver's fault injection (`backend_sim::faults`) arms the latter per QP.

pub mod network;
mod rnr;

pub use rnr::ForcedRnr;
