//! A C program (tests/c/signals.c) run with this library preloaded: `ibv_get_cq_event`
//! and `ibv_get_async_event` are a `read(2)` of their descriptor as in libibverbs, so a
//! signal interrupts them (EINTR) unless its handler was installed with `SA_RESTART`,
//! and a descriptor made `O_NONBLOCK` answers EAGAIN at once. (qperf ends its timed tests
//! with SIGALRM and relies on the EINTR.)

mod common;

use std::time::Duration;

#[test]
fn event_waits_meet_signals_as_a_read_does() {
    common::run_c_check("signals", &[], &[], Duration::from_secs(60));
}
