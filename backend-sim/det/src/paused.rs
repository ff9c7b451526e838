//! The world on a paused tokio runtime: tokio tasks (a client and a server in one
//! thread) awaiting completions (`verbs_api::aio::AsyncCq`) on the virtual clock.
//!
//! A world becomes *attached* the first time something async waits on it (a completion
//! channel's [`event_wait`](verbs_api::CompletionChannel::event_wait), the in-memory
//! rendezvous) inside a tokio runtime, which must be a `current_thread` one with paused
//! time (`#[tokio::test(start_paused = true)]`): anything else is refused, saying so.
//! From then on one clock rules both: the world's virtual time is tokio's paused time
//! since the attachment (plus the world's time then).
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

use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::time::Instant;
use verbs_api::Result;

use crate::refuse::refused;
use crate::rendezvous::Listeners;
use crate::world::{Shared, World};
use crate::IDLE_POLLS;

/// How long, in virtual time, an async wait waits on a world where nothing is left to
/// happen (no frame in flight, no timer armed) and no verb changes it, before it fails:
/// the awaited event would never come.
pub const IDLE_WAIT: Duration = Duration::from_secs(3600);

/// The verbs that only wait or look (an async wait's own steps): they wake no other
/// wait, or two waits would wake each other for ever and tokio's clock never move.
const WAITING_VERBS: [&str; 5] = [
    "attach to tokio",
    "ibv_poll_cq",
    "ibv_req_notify_cq",
    "ibv_get_cq_event",
    "ibv_get_async_event",
];

/// A world's link to the tokio runtime it is attached to, and its listeners.
#[derive(Default)]
pub(crate) struct Runtime {
    /// tokio's instant and the world's time at the attachment.
    anchor: Mutex<Option<(Instant, Duration)>>,
    /// Verbs that may have changed what happens next, counted.
    changes: AtomicU64,
    /// Waits to wake at the next change.
    wakers: Mutex<Vec<Waker>>,
    /// The virtual time of the last empty poll, and how many in a row were made then.
    empty_polls: Mutex<(Duration, u32)>,
    /// The in-memory rendezvous' listeners.
    pub(crate) listeners: Mutex<Listeners>,
}

impl Runtime {
    /// Called by every verb as it enters the world: wakes the waits (unless the verb
    /// only waits) and runs the world up to tokio's now.
    pub(crate) fn on_enter(&self, call: &str, w: &mut World) {
        if !WAITING_VERBS.contains(&call) {
            self.changed();
        }
        if let Some(now) = self.virtual_now() {
            // What is due by now runs (a world ahead of tokio stays where it is).
            let now = now.max(w.net.now());
            while w.advance(Some(now)) {}
        }
    }

    /// tokio's now as world time, when attached and called inside a runtime.
    pub(crate) fn virtual_now(&self) -> Option<Duration> {
        let (at, base) = (*self.anchor.lock())?;
        Handle::try_current().ok()?;
        Some(base + Instant::now().saturating_duration_since(at))
    }

    /// Whether the world is attached and this is called inside the runtime.
    pub(crate) fn attached_here(&self) -> bool {
        self.virtual_now().is_some()
    }

    /// The tokio instant of world time `t` (not before the attachment).
    fn instant(&self, t: Duration) -> Option<Instant> {
        let (at, base) = (*self.anchor.lock())?;
        Some(at + t.saturating_sub(base))
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        for w in std::mem::take(&mut *self.wakers.lock()) {
            w.wake();
        }
    }

    /// Resolves once a verb changed the world after `seen` changes.
    async fn changed_since(&self, seen: u64) {
        poll_fn(|cx| {
            if self.changes.load(Ordering::SeqCst) != seen {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.lock();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// An empty poll of CQ `cq` on an attached world: fine now and then, refused when
    /// made [`IDLE_POLLS`] times at one virtual instant (a loop that never awaits).
    pub(crate) fn empty_poll(&self, w: &World, cq: u32) -> Result<()> {
        let mut p = self.empty_polls.lock();
        let now = w.net.now();
        if p.0 != now {
            *p = (now, 0);
        }
        p.1 += 1;
        if p.1 <= IDLE_POLLS {
            return Ok(());
        }
        *p = (now, 0);
        Err(refused(format!(
            "CQ {cq} was polled {IDLE_POLLS} times at virtual time {now:?} without finding a \
             completion, inside a tokio task of a world on a paused runtime: there the clock \
             moves only when every task awaits a timer, so a polling loop that does not await \
             waits for ever. Await the completion (verbs_api::aio::AsyncCq) or sleep \
             (tokio::time::sleep) between polls"
        )))
    }

    /// A poll that found completions restarts the empty count.
    pub(crate) fn progressed(&self) {
        self.empty_polls.lock().1 = 0;
    }
}

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
    let mut anchor = shared.rt.anchor.lock();
    if anchor.is_none() {
        *anchor = Some((Instant::now(), w.net.now()));
    }
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
            let seen = shared.rt.changes.load(Ordering::SeqCst);
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
                if next.is_none() && shared.rt.changes.load(Ordering::SeqCst) == seen {
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
