//! Lines that could repeat in a loop — an accept that keeps failing, a library that
//! logs the same error thousands of times a second — let through at most once per
//! [`LOG_EVERY`], with a count of what was held back, so a bad moment cannot flood the
//! journal or the disk.
//!
//! [`Throttle`] is for steward's own loops. [`LibraryLines`] is a layer of the daemon's
//! log that does the same for every line a library logs (the cron scheduler, hyper,
//! sled…), per place in the library's code; [`report_held_back`] tells the counts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing_subscriber::layer::Context;

/// How often a repeating line is logged at most.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// A line that could repeat in a loop, let through at most once per [`LOG_EVERY`]; the
/// times it was held back in between are counted and told with the next.
#[derive(Debug)]
pub struct Throttle {
    last: Option<Instant>,
    held: u64,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new()
    }
}

impl Throttle {
    pub const fn new() -> Throttle {
        Throttle {
            last: None,
            held: 0,
        }
    }

    /// Some(times it happened since the last line, this one included) when it is time to
    /// log; None to hold this one back.
    pub fn due(&mut self, now: Instant) -> Option<u64> {
        self.held += 1;
        if self.last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

/// A [`Throttle`] shared by tasks (each request of a listener, say).
#[derive(Debug, Default)]
pub struct Shared(Mutex<Throttle>);

impl Shared {
    /// [`Throttle::due`] now.
    pub fn due(&self) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .due(Instant::now())
    }
}

/// The daemon's log filter that throttles library warnings and errors: each place in a
/// library's code gets one line per [`LOG_EVERY`]; steward's own lines, and a library's
/// quieter ones (which the level filter judges), pass untouched.
pub struct LibraryLines;

/// Per library callsite: when a line last went out, and how many were held back since.
struct Held {
    last: Instant,
    count: u64,
    target: &'static str,
    place: String,
}

static LIBRARY: Mutex<Option<HashMap<Identifier, Held>>> = Mutex::new(None);

impl<S: tracing::Subscriber> tracing_subscriber::layer::Filter<S> for LibraryLines {
    fn enabled(&self, _: &tracing::Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &tracing::Event<'_>, _: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        if meta.target().starts_with("steward") || *meta.level() > tracing::Level::WARN {
            return true;
        }
        let now = Instant::now();
        let mut map = LIBRARY.lock().unwrap_or_else(|p| p.into_inner());
        let held = map
            .get_or_insert_with(HashMap::new)
            .entry(meta.callsite())
            .or_insert_with(|| Held {
                last: now - LOG_EVERY,
                count: 0,
                target: meta.target(),
                place: format!(
                    "{}:{}",
                    meta.file().unwrap_or("?"),
                    meta.line().unwrap_or(0)
                ),
            });
        if now.duration_since(held.last) < LOG_EVERY {
            held.count += 1;
            return false;
        }
        held.last = now;
        true
    }
}

/// Logs how many library lines [`LibraryLines`] held back since the last report, one
/// line per place; the daemon calls it every [`LOG_EVERY`].
pub fn report_held_back() {
    let mut map = LIBRARY.lock().unwrap_or_else(|p| p.into_inner());
    for held in map.iter_mut().flat_map(|m| m.values_mut()) {
        if held.count > 0 {
            tracing::warn!(
                "{} more line(s) like the last from {} ({}) held back in the last {}s",
                std::mem::take(&mut held.count),
                held.target,
                held.place,
                LOG_EVERY.as_secs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_lets_one_line_through_per_interval_and_counts_the_rest() {
        let mut t = Throttle::new();
        let start = Instant::now();
        assert_eq!(t.due(start), Some(1));
        for i in 1..1000 {
            assert_eq!(t.due(start + Duration::from_millis(i)), None);
        }
        assert_eq!(
            t.due(start + LOG_EVERY + Duration::from_millis(1)),
            Some(1000)
        );
    }

    /// Counts the events that reach it.
    #[derive(Clone)]
    struct Count(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
        fn on_event(&self, _: &tracing::Event<'_>, _: Context<'_, S>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_library_line_in_a_loop_goes_out_once_and_steward_s_own_lines_all_do() {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Two outputs under one throttle, as the daemon's stderr and log file are.
        let subscriber = tracing_subscriber::registry().with(
            Count(seen.clone())
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
                .and_then(
                    Count(seen.clone()).with_filter(tracing_subscriber::filter::LevelFilter::INFO),
                )
                .with_filter(LibraryLines),
        );
        tracing::subscriber::with_default(subscriber, || {
            let seen = || seen.load(std::sync::atomic::Ordering::SeqCst);
            for _ in 0..10_000 {
                tracing::error!(target: "tokio_cron_scheduler::deleter", "Error sending deletion");
            }
            assert_eq!(seen(), 2, "once, in each output");
            for _ in 0..10 {
                tracing::warn!(target: "steward::daemon", "one of ours");
                tracing::info!(target: "hyper::server", "a library's quieter line");
            }
            assert_eq!(seen(), 42);
            report_held_back();
            // The count, as one line of steward's own.
            assert_eq!(seen(), 44);
        });
    }
}
