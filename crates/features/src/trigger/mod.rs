//! Trigger kinds. Each turns its source into fires for one workflow: [`schedule`] (cron,
//! DST-correct), [`file`] (files dropped into a watched folder), [`queue`] (a spool
//! folder fed by `steward enqueue`) and [`webhook`] (signed HTTP POSTs). Manual fires come
//! from `steward run`.

pub mod cluster_queue;
pub mod file;
pub mod queue;

pub mod webhook;

pub use crate::{calendar, schedule};

use std::path::Path;
use std::sync::Arc;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

/// Wakes `wake` whenever something changes in `dir` (not recursive). The watcher stops
/// when the returned value is dropped. None (logged) if the folder cannot be watched; the
/// caller then relies on its own periodic look.
pub fn watch_folder(dir: &Path, wake: Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    let handler = move |res: notify::Result<notify::Event>| {
        if res.is_ok_and(|event| changes_the_folder(&event.kind)) {
            wake.notify_one();
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(folder = %dir.display(), "cannot watch folder: {e}");
            return None;
        }
    };
    if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
        tracing::error!(folder = %dir.display(), "cannot watch folder: {e}");
        return None;
    }
    Some(watcher)
}

/// Whether an event can mean a new or changed file. Opening or reading is not: every wake
/// makes the trigger list the folder, and inotify reports that listing as an open of the
/// folder; waking on it would make the watch wake itself for ever (a busy idle daemon).
/// A file closed after writing is a change: a writer has just finished it.
fn changes_the_folder(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}
