//! A world's link to the tokio runtime it is attached to: one clock for both (the
//! world's virtual time is the runtime's paused time since the attachment), the runtime
//! the world is bound to, the count of verbs that may have changed what happens next
//! and the waits to wake then, and the count of empty polls at one instant. What an
//! attachment means, and how an async wait uses it, is [`crate::paused`]'s.
//!
//! A world is bound to the runtime it was attached in, by the runtime's id
//! (`tokio::runtime::Handle::id`): another runtime's paused clock starts and jumps on
//! its own, so a verb called from it would run the world by a clock that is not the
//! world's. It is refused, naming both runtimes.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::{Handle, Id};
use tokio::time::Instant;
use verbs_api::Result;

use crate::refuse::refused;
use crate::world::{World, IDLE_POLLS};

/// The verbs that only wait or look (an async wait's own steps): they wake no other
/// wait, or two waits would wake each other for ever and tokio's clock never move.
const WAITING_VERBS: [&str; 5] = [
    "attach to tokio",
    "ibv_poll_cq",
    "ibv_req_notify_cq",
    "ibv_get_cq_event",
    "ibv_get_async_event",
];

/// Where the world's clock and tokio's meet: made at the attachment.
#[derive(Clone, Copy)]
struct Anchor {
    /// tokio's instant at the attachment.
    at: Instant,
    /// The world's time then.
    base: Duration,
    /// The runtime the world is bound to.
    runtime: Id,
}

/// A world's link to the tokio runtime it is attached to.
#[derive(Default)]
pub(crate) struct Runtime {
    anchor: Mutex<Option<Anchor>>,
    /// Verbs that may have changed what happens next, counted.
    changes: AtomicU64,
    /// Waits to wake at the next change.
    wakers: Mutex<Vec<Waker>>,
    /// The virtual time of the last empty poll, and how many in a row were made then.
    empty_polls: Mutex<(Duration, u32)>,
}

impl Runtime {
    /// Attaches the world, whose time is `world_now`, to the runtime this is called in,
    /// and binds it to that runtime (once: a later call changes nothing).
    pub(crate) fn attach_here(&self, handle: &Handle, world_now: Duration) {
        let mut anchor = self.anchor.lock();
        if anchor.is_none() {
            *anchor = Some(Anchor {
                at: Instant::now(),
                base: world_now,
                runtime: handle.id(),
            });
        }
    }

    /// Refuses verb `call` from inside a tokio runtime other than the one the world is
    /// bound to. Outside any runtime (sync code beside the runtime) it may run.
    pub(crate) fn check_runtime(&self, call: &str) -> Result<()> {
        let Some(bound) = self.anchor.lock().map(|a| a.runtime) else {
            return Ok(());
        };
        let Ok(here) = Handle::try_current().map(|h| h.id()) else {
            return Ok(());
        };
        if here == bound {
            return Ok(());
        }
        Err(refused(format!(
            "{call} from tokio runtime {here}, but this deterministic world is bound to tokio \
             runtime {bound}, the first it was awaited in: its virtual clock is that runtime's \
             paused clock, which another runtime's does not follow. Use one runtime per world \
             (spawn every task of the world on runtime {bound}), or build a world per runtime \
             (Det::builder()..build() for each)"
        )))
    }

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

    /// tokio's now as world time, when attached and called inside the runtime the world
    /// is bound to.
    pub(crate) fn virtual_now(&self) -> Option<Duration> {
        let a = (*self.anchor.lock())?;
        if Handle::try_current().ok()?.id() != a.runtime {
            return None;
        }
        Some(a.base + Instant::now().saturating_duration_since(a.at))
    }

    /// Whether the world is attached and this is called inside its runtime.
    pub(crate) fn attached_here(&self) -> bool {
        self.virtual_now().is_some()
    }

    /// The tokio instant of world time `t` (not before the attachment).
    pub(crate) fn instant(&self, t: Duration) -> Option<Instant> {
        let a = (*self.anchor.lock())?;
        Some(a.at + t.saturating_sub(a.base))
    }

    /// How many verbs that may have changed what happens next were called so far.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        for w in std::mem::take(&mut *self.wakers.lock()) {
            w.wake();
        }
    }

    /// Resolves once a verb changed the world after `seen` changes.
    pub(crate) async fn changed_since(&self, seen: u64) {
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
