//! A hostile peer on one connection of a simulated HCA: well-formed frames with fuzzed
//! fields, floods, corrupted headers and raw bytes, mixed with the application posting
//! work, the clock moving and the connection breaking. See `src/lib.rs` for the QP, its
//! regions and everything asserted after each step.

#![no_main]

use backend_sim_fuzz::{Harness, Input};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: Input| Harness::run(&input));
