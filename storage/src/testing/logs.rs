//! Capture of the `tracing` events a closure emits on the current thread: what a test asserts a log
//! line says — and, as much, what it never says (stored bytes, keys).
//!
//! Owns nothing global: [`capture`] installs a subscriber as the thread's default for the closure's
//! duration only (`tracing::subscriber::with_default`), so tests running in parallel on other threads
//! neither see nor disturb each other's events. Every store method is synchronous on the caller's
//! thread, so a store call inside the closure logs into it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// One captured event: its level, its message and every other field, formatted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub level: Level,
    pub message: String,
    /// Field name → value (a `&str` field as is, anything else by its `Debug`).
    pub fields: BTreeMap<String, String>,
}

impl Logged {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// Everything the line says — message, field names and values — for "never mentions" checks.
    pub fn text(&self) -> String {
        let mut out = self.message.clone();
        for (k, v) in &self.fields {
            out.push_str(&format!(" {k}={v}"));
        }
        out
    }
}

/// Run `f` with a capturing subscriber as this thread's default; answers its result and the events it
/// logged, in order.
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<Logged>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let subscriber = Capture {
        events: events.clone(),
        next_span: AtomicU64::new(1),
    };
    let out = tracing::subscriber::with_default(subscriber, f);
    let logged = std::mem::take(
        &mut *events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    (out, logged)
}

/// The subscriber behind [`capture`]: records events, ignores spans (it hands out ids and nothing more).
struct Capture {
    /// Shared with [`capture`], which takes the events once the closure returns.
    events: Arc<Mutex<Vec<Logged>>>,
    next_span: AtomicU64,
}

impl Subscriber for Capture {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // Asked again per event: another thread's default may not want what this one does.
        Interest::sometimes()
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.next_span.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or_default();
        let logged = Logged {
            level: *event.metadata().level(),
            message,
            fields: fields.0,
        };
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(logged);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}
