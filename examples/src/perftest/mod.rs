//! perf's parts besides its default measurement loops (those are in `src/bin/perf/`):
//! the command line and the tests ([`opts`]), what a run measures ([`params`]), one side
//! of a connection with its ping-pong primitives ([`side`]), perftest's output
//! ([`report`]), and for `--perftest` perftest's own loops ([`loops`]), clock ([`clock`])
//! and arithmetic ([`cycle_stats`]), its address walk ([`walk`]), `--mw`'s windows ([`mw`]), and the reduction of a perftest-against-perf sitting
//! ([`versus`]).

pub mod clock;
pub mod cycle_stats;
pub mod loops;
pub mod mw;
pub mod opts;
pub mod params;
pub mod report;
pub mod side;
pub mod versus;
pub mod walk;
