//! A `tracing` subscriber for tests that records every event (level, fields, message) on
//! the thread that installs it, so a test can check what the sans-IO core logs: the core
//! runs on the test's thread in the in-memory link of `link_tests`.

use std::fmt;
use std::sync::{Arc, Mutex};

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
    /// Runs `f` with this subscriber as the thread's default and returns its result.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        tracing::subscriber::with_default(self.clone(), f)
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
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            fields,
        });
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
