//! kv-rpc's parts besides the verbs calls (those are in `src/bin/kv-rpc/`): the wire
//! format ([`wire`], re-exported here), the store the server runs requests against
//! ([`store`]) and its bookkeeping of each connection's slots ([`slots`]) and of its
//! shared receive queue ([`srq`]), what a client
//! asks and what it must get back ([`workload`]) and its request window ([`window`]),
//! what both sides print ([`report`]) and their command-line options ([`opts`]).

pub mod opts;
pub mod report;
pub mod slots;
pub mod srq;
pub mod store;
pub mod window;
pub mod wire;
pub mod workload;

pub use wire::*;
