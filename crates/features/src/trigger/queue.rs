//! Queues: a spool folder per queue, `STATE/queues/<name>/`, one JSON file per item.
//!
//! Items are written atomically (a temp file renamed into place) with names that sort in
//! arrival order, processed one at a time in that order, each as a governed run, and
//! removed only once their run reached a terminal state. An item that cannot be read or
//! parsed moves to `rejected/` with a `.reason` file beside it; nothing is deleted
//! silently. A workflow on a queue gets `{{ trigger.item_id }}` as its idempotency key
//! unless it sets one, so an item replayed after a crash never commits twice.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config;
use crate::governed::Fire;
use crate::store::RunState;

/// Largest item accepted; a bigger one is rejected, not loaded.
pub const MAX_ITEM_BYTES: u64 = 1 << 20;
/// How long a fire the overlap policy skipped waits before the item is offered again.
const SKIPPED_RETRY: Duration = Duration::from_millis(200);

pub fn spool_dir(state: &Path, queue: &str) -> PathBuf {
    state.join("queues").join(queue)
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Why an item could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error("`{0}` is not a valid queue name: use 1-64 of a-z, 0-9, `-`, `_`")]
    BadName(String),
    #[error("item is {0} bytes; a queue item holds at most {MAX_ITEM_BYTES}")]
    TooBig(usize),
    #[error("the item is not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("cannot create {}: {why}", .path.display())]
    Create { path: PathBuf, why: std::io::Error },
    #[error("cannot write {}: {why}", .path.display())]
    Write { path: PathBuf, why: std::io::Error },
}

/// Writes one item atomically; returns its id. The name sorts in arrival order.
pub fn write_item(state: &Path, queue: &str, payload: &Value) -> Result<String, EnqueueError> {
    if !config::valid_id(queue) {
        return Err(EnqueueError::BadName(queue.to_string()));
    }
    let dir = spool_dir(state, queue);
    let tmp_dir = dir.join(".tmp");
    std::fs::create_dir_all(&tmp_dir).map_err(|why| EnqueueError::Create {
        path: tmp_dir.clone(),
        why,
    })?;
    let bytes = serde_json::to_vec(payload)?;
    if bytes.len() as u64 > MAX_ITEM_BYTES {
        return Err(EnqueueError::TooBig(bytes.len()));
    }
    let now = chrono::Utc::now();
    let id = format!(
        "{}-{:06}-{}",
        now.format("%Y%m%dT%H%M%S%6f"),
        SEQ.fetch_add(1, Ordering::Relaxed) % 1_000_000,
        std::process::id()
    );
    let tmp = tmp_dir.join(format!("{id}.json"));
    let final_name = dir.join(format!("{id}.json"));
    let written = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &final_name)?;
        // The rename is durable only once the folder itself is synced.
        std::fs::File::open(&dir)?.sync_all()
    })();
    written.map_err(|why| EnqueueError::Write { path: tmp, why })?;
    Ok(id)
}

/// Items waiting in a queue, oldest first: regular `*.json` files only.
pub fn pending(state: &Path, queue: &str) -> Vec<PathBuf> {
    spool(state, queue).0
}

/// The spool's items, oldest first, and the `*.json` entries that are not items: a
/// symlink (never followed: its target could be any file steward can read) or anything
/// else that is not a regular file.
fn spool(state: &Path, queue: &str) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut items, mut refused) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir(spool_dir(state, queue))
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        // The entry's own type: a symlink is a symlink, whatever it points at.
        match e.file_type() {
            Ok(t) if t.is_file() => items.push(path),
            _ => refused.push(path),
        }
    }
    items.sort();
    (items, refused)
}

/// Moves a bad item to `rejected/` with the reason beside it.
fn reject(state: &Path, queue: &str, item: &Path, reason: &str) {
    let dir = spool_dir(state, queue).join("rejected");
    let name = item
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    let target = dir.join(&name);
    let result = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::rename(item, &target))
        .and_then(|_| {
            std::fs::write(
                dir.join(format!("{}.reason", name.to_string_lossy())),
                format!("{reason}\n"),
            )
        });
    match result {
        Ok(()) => tracing::warn!(queue, item = %target.display(), "queue item rejected: {reason}"),
        Err(e) => {
            tracing::error!(queue, item = %item.display(), "queue item is bad ({reason}) and could not be moved aside: {e}")
        }
    }
}

/// Runs a queue: each item, in order, as one governed run, until `cancel`.
/// `submit` starts a run and resolves to its record (None if the daemon is stopping).
pub async fn run<F, Fut>(
    state: PathBuf,
    queue: String,
    wake: Arc<Notify>,
    submit: F,
    cancel: CancellationToken,
) where
    F: Fn(Fire) -> Fut,
    Fut: std::future::Future<Output = Option<crate::store::RunRecord>>,
{
    let _ = std::fs::create_dir_all(spool_dir(&state, &queue));
    // Items arriving by other means than `steward enqueue` wake us through the folder watch.
    let _watch = crate::trigger::watch_folder(&spool_dir(&state, &queue), wake.clone());
    let mut told = std::collections::HashSet::new();
    loop {
        let (items, refused) = spool(&state, &queue);
        for path in refused {
            if told.insert(path.clone()) {
                tracing::warn!(queue, item = %path.display(), "not a regular file (a symlink is never followed): skipped, left in place");
            }
        }
        if items.is_empty() {
            tokio::select! {
                _ = wake.notified() => continue,
                _ = cancel.cancelled() => return,
            }
        }
        for item in items {
            if cancel.is_cancelled() {
                return;
            }
            let item_id = item
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !item.exists() {
                continue; // taken care of meanwhile
            }
            let payload = match read_item(&item) {
                Ok(p) => p,
                Err(reason) => {
                    reject(&state, &queue, &item, &reason.to_string());
                    continue;
                }
            };
            loop {
                let fire = Fire::new(
                    "queue",
                    None,
                    json!({ "queue": queue, "item_id": item_id, "payload": payload }),
                );
                let Some(rec) = submit(fire).await else {
                    return;
                };
                match rec.state {
                    // Not done with it: the daemon is stopping, or overlap skipped the fire.
                    RunState::Interrupted => return,
                    RunState::Skipped => {
                        tokio::select! {
                            _ = tokio::time::sleep(SKIPPED_RETRY) => continue,
                            _ = cancel.cancelled() => return,
                        }
                    }
                    _ => {
                        if let Err(e) = std::fs::remove_file(&item) {
                            tracing::error!(queue, item = %item.display(), "item ran ({}) but could not be removed: {e}", rec.state);
                        }
                        break;
                    }
                }
            }
        }
    }
}

/// Why a queue item was refused (moved to `rejected/` with this beside it).
#[derive(Debug, thiserror::Error)]
pub enum BadItem {
    #[error("cannot read: {0}")]
    Unreadable(#[from] std::io::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error("item is {0} bytes; at most {MAX_ITEM_BYTES}")]
    TooLarge(u64),
    #[error("not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
}

fn read_item(item: &Path) -> Result<Value, BadItem> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // O_NOFOLLOW: an item swapped for a symlink since it was listed is refused, not read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(item)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(BadItem::NotAFile);
    }
    if meta.len() > MAX_ITEM_BYTES {
        return Err(BadItem::TooLarge(meta.len()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ITEM_BYTES + 1).read_to_end(&mut bytes)?;
    decode_item(&bytes)
}

/// A queue item's payload: any JSON value. Never panics, whatever the bytes (a fuzz
/// target holds it to that); the size cap is applied before the bytes are read.
pub fn decode_item(bytes: &[u8]) -> Result<Value, BadItem> {
    Ok(serde_json::from_slice(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the queue_item fuzz target: a number must survive the trip into a run's
    /// context (serialize, parse again) unchanged.
    #[test]
    fn payload_numbers_round_trip_exactly() {
        let item = decode_item(b"3333333300000000000001122270935").unwrap();
        let again: Value = serde_json::from_str(&item.to_string()).unwrap();
        assert_eq!(item, again);
    }

    #[test]
    fn items_sort_in_arrival_order_and_bad_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<String> = (0..50)
            .map(|i| write_item(dir.path(), "q", &json!(i)).unwrap())
            .collect();
        let names: Vec<String> = pending(dir.path(), "q")
            .iter()
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ids);
        for bad in ["../x", "/abs", "a\0b", ""] {
            assert!(write_item(dir.path(), bad, &json!(1)).is_err(), "{bad:?}");
        }
    }
}
