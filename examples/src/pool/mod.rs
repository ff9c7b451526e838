//! param-pool's parts besides the verbs calls (those are in `src/bin/param-pool.rs`):
//! the slot format with its versions and checksum ([`slot`], re-exported here), what the
//! owner tells its readers ([`PoolInfo`]), what the readers print ([`report`]) and the
//! command-line options ([`opts`]).

pub mod opts;
pub mod report;
pub mod slot;

pub use slot::*;

use serde::{Deserialize, Serialize};

/// What an owner tells its readers besides the MR descriptor (the cm private data).
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
pub struct PoolInfo {
    /// Vectors in the pool.
    pub vectors: u32,
    /// Parameters (f32) per vector.
    pub dim: u32,
    /// Bytes per slot ([`slot_size`] of `dim`).
    pub slot_size: u64,
}
