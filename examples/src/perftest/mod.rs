//! perf's parts besides its measurement loops (those are in `src/bin/perf.rs`): the
//! command line and the tests ([`opts`]), what a run measures ([`params`]), one side of a
//! connection with its ping-pong primitives ([`side`]), and perftest's output
//! ([`report`]).

pub mod opts;
pub mod params;
pub mod report;
pub mod side;
