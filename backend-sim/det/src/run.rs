//! One run of a user's test in one world, as the harness and the shrinker both make
//! it: the test's error, or its panic as a failure like an error (an `assert!` in a test
//! is how most tests fail), with the panic's printing held back, since the failure will
//! be reported with its seed and schedule.

use std::cell::Cell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use crate::det::Det;

thread_local! {
    /// Whether a panic of this thread is the harness's to report (not printed).
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `test` in `det`: its error, or the message of its panic (an `assert!` in the
/// test is a failure like an `Err`, with a seed and a schedule to shrink). The panic is
/// not printed, as the failure will be; other threads' panics print as before.
pub(crate) fn run_test<E: fmt::Display>(
    test: &mut impl FnMut(&Det) -> Result<(), E>,
    det: &Det,
) -> Result<(), String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let r = panic::catch_unwind(AssertUnwindSafe(|| test(det)));
    QUIET.with(|q| q.set(false));
    match r {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(format!("panicked: {msg}"))
        }
    }
}
