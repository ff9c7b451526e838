//! The world on a paused tokio runtime: tokio tasks (a client and a server in one
//! thread) awaiting completions (`verbs_api::aio::AsyncCq`) on the virtual clock.
//!
//! A world becomes *attached* the first time something async waits on it (a completion
//! channel's [`event_wait`](verbs_api::CompletionChannel::event_wait), the in-memory
//! rendezvous) inside a tokio runtime, which must be a `current_thread` one with paused
//! time (`#[tokio::test(start_paused = true)]`): anything else is refused, saying so.
//! From then on one clock rules both: the world's virtual time is tokio's paused time
//! since the attachment (plus the world's time then), and the world is bound to that
//! runtime: a verb or a wait from inside another runtime is refused, naming both
//! ([`crate::clock`]).
//!
//! - Every verb called inside the runtime first runs the world up to tokio's now, so a
//!   post after `tokio::time::sleep(10 s)` happens 10 s later in the world too, and
//!   whatever the network and the timers did meanwhile has happened.
//! - A wait for a channel's event sleeps on a tokio timer set at the world's next event
//!   (a frame's arrival, a requester's timer); when every task waits, tokio's paused
//!   clock jumps to the earliest timer, so the run takes no wall time. A verb that may
//!   make an earlier event (a post, a modify) wakes the waits, which look again.
//! - An empty CQ poll does not move the clock (tokio's timers do): a sync polling loop
//!   inside a task, which never lets tokio's clock move, is refused after
//!   [`IDLE_POLLS`](crate::IDLE_POLLS) empty polls at one instant, saying to await.
//! - A wait with nothing left to happen in the world (no frame, no timer) and nothing
//!   changing it for [`IDLE_WAIT`] of virtual time fails, saying what is missing,
//!   instead of hanging.

use std::time::Duration;

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::time::Instant;
use verbs_api::Result;

use crate::refuse::refused;
use crate::shared::Shared;

/// How long, in virtual time, an async wait waits on a world where nothing is left to
/// happen (no frame in flight, no timer armed) and no verb changes it, before it fails:
/// the awaited event would never come.
pub const IDLE_WAIT: Duration = Duration::from_secs(3600);

/// Checks that `what` waits inside a current_thread tokio runtime with paused time, and
/// attaches the world to it (once).
pub(crate) fn attach(shared: &Shared, what: &str) -> Result<()> {
    const USE: &str = "use a current_thread runtime with paused time: \
                       #[tokio::test(start_paused = true)], or \
                       tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true)";
    let Ok(handle) = Handle::try_current() else {
        return Err(refused(format!(
            "{what} outside a tokio runtime: a deterministic world's async waits follow a \
             paused tokio clock; {USE}"
        )));
    };
    if handle.runtime_flavor() != RuntimeFlavor::CurrentThread {
        return Err(refused(format!(
            "{what} on a multi-thread tokio runtime: its worker threads' timing is not the \
             seed's to decide, and a deterministic world is single-threaded; {USE}"
        )));
    }
    if !paused() {
        return Err(refused(format!(
            "{what} on a tokio runtime whose time is not paused: its timers would follow the \
             wall clock, not the world's virtual one; {USE}"
        )));
    }
    let w = shared.enter("attach to tokio")?;
    shared.rt.attach_here(&handle, w.net.now());
    Ok(())
}

/// Whether tokio's clock is paused here: a paused clock does not move while the thread
/// runs, a running one moves with the wall clock.
fn paused() -> bool {
    let before = Instant::now();
    let wall = std::time::Instant::now();
    while std::time::Instant::now() == wall {}
    Instant::now() == before
}

/// Waits until completion channel `ch` holds an event, on tokio's (paused) clock.
pub(crate) async fn channel_event(shared: &Shared, ch: u32) -> Result<()> {
    attach(shared, "an async wait on a completion channel")?;
    loop {
        let (next, now, seen) = {
            let seen = shared.rt.changes();
            let mut w = shared.enter("ibv_get_cq_event")?;
            if w.channels.get(ch as usize).is_some_and(|c| !c.is_empty()) {
                return Ok(());
            }
            w.pump();
            (w.next_event(), w.net.now(), seen)
        };
        let wake = next.unwrap_or(now + IDLE_WAIT);
        let Some(at) = shared.rt.instant(wake) else {
            return Err(refused("the world lost its tokio runtime"));
        };
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {
                if next.is_none() && shared.rt.changes() == seen {
                    return Err(refused(format!(
                        "an async wait on a completion channel waited {IDLE_WAIT:?} of virtual \
                         time with nothing left to happen in the deterministic world (no frame \
                         in flight, no timer armed) and no verb called: the event waited for \
                         will never come. Arm the CQ and post the work that completes on it \
                         (e.g. the peer's receive or send) in another task before awaiting"
                    )));
                }
            }
            _ = shared.rt.changed_since(seen) => {}
        }
    }
}
