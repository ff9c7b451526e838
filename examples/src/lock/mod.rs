//! dist-lock's parts besides the verbs calls (those are in `src/bin/dist-lock.rs`): how
//! a waiting client backs off ([`backoff`]), what the server and clients print and how
//! the demo reads it back ([`report`]), and their command-line options ([`opts`]).

pub mod backoff;
pub mod opts;
pub mod report;
