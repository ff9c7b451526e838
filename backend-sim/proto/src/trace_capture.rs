//! A `tracing` subscriber for tests that records every event (level, fields, message) on
//! the thread that installs it, so a test can check what the sans-IO core logs: the core
//! runs on the test's thread in the in-memory link of `link_tests`.
//!
//! The capture is reached through one process-wide subscriber (`Router`) installed on
//! first use, which hands each event to the capture of the thread that emits it. A
//! scoped dispatcher per test (`tracing::subscriber::with_default`) is not enough when
//! tests run in parallel: a callsite that another thread registers for the first time
//! while a test installs its dispatcher caches "never" for good, and the test misses
//! the event. The global router is registered before any capture runs, so every
//! callsite's interest includes it.

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::subscriber::Interest;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One recorded event.
#[derive(Clone, Debug)]
pub struct Captured {
    /// Its level.
    pub level: Level,
    /// Its fields as text, `message` among them, in the order they were given.
    pub fields: Vec<(String, String)>,
}

impl Captured {
    /// The value of field `name`, if the event has one.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The event's message.
    pub fn message(&self) -> &str {
        self.field("message").unwrap_or("")
    }
}

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.push((field.name().to_string(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }
}

/// Records every event into a shared list.
#[derive(Clone, Default)]
pub struct Capture {
    events: Arc<Mutex<Vec<Captured>>>,
}

impl Capture {
    /// Runs `f` with this capture recording the thread's events and returns its result.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        if !Router::install() {
            // Another global subscriber owns the process: fall back to a scoped one,
            // and recompute interests so callsites registered earlier include it.
            return tracing::subscriber::with_default(self.clone(), || {
                tracing::callsite::rebuild_interest_cache();
                f()
            });
        }
        struct Restore(Option<Capture>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let prev = self.0.take();
                CURRENT.with(|c| *c.borrow_mut() = prev);
            }
        }
        let prev = CURRENT.with(|c| c.borrow_mut().replace(self.clone()));
        let _restore = Restore(prev);
        f()
    }

    /// Adds `event` to the list.
    fn push(&self, event: &Event<'_>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            fields,
        });
    }

    /// The events recorded so far.
    pub fn events(&self) -> Vec<Captured> {
        self.events.lock().unwrap().clone()
    }

    /// The events at `level` whose message contains `text`.
    pub fn find(&self, level: Level, text: &str) -> Vec<Captured> {
        self.events()
            .into_iter()
            .filter(|e| e.level == level && e.message().contains(text))
            .collect()
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        self.push(event);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

thread_local! {
    /// The capture recording this thread's events, if any.
    static CURRENT: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// The process-wide subscriber: enabled on a thread while a capture runs there.
struct Router;

impl Router {
    /// Installs the router as the global default once; false if another global
    /// subscriber was there first.
    fn install() -> bool {
        static OURS: OnceLock<bool> = OnceLock::new();
        *OURS.get_or_init(|| tracing::subscriber::set_global_default(Router).is_ok())
    }

    fn current() -> Option<Capture> {
        CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
    }
}

impl Subscriber for Router {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        CURRENT.try_with(|c| c.borrow().is_some()).unwrap_or(false)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        if let Some(c) = Self::current() {
            c.push(event);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
