//! File drops: files matching a glob in a watched folder fire a run each.
//!
//! A file is taken only once it is complete: its size and modification time unchanged
//! for the debounce window (a file renamed into place is complete at once, and passes
//! the same check one window later). It is then claimed by moving it out of the watched
//! folder into `STATE/claimed/<workflow>/`, so no later event can fire it twice; after the
//! run it moves to `done/` or `failed/` beside it. Files already present at start-up are
//! picked up, and files a crash left in `claimed/` run again first (their idempotency
//! key, by default the content's sha256, stops a second commit). Symlinks are not
//! followed; names starting with `.` are ignored (partial uploads).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use globset::GlobMatcher;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::governed::Fire;
use crate::store::{RunRecord, RunState, Store};

pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(500);
/// A look at the folder even without events, in case the watch missed one.
const RESCAN: Duration = Duration::from_secs(30);
const SKIPPED_RETRY: Duration = Duration::from_millis(200);

pub struct FileWatch {
    pub workflow: String,
    pub dir: PathBuf,
    pub matcher: GlobMatcher,
    pub debounce: Duration,
    /// The store that decides first whether a file is this daemon's to take (in a
    /// cluster, whose folder may be shared between machines); none: moving it decides.
    pub claims: Option<Store>,
}

/// Size and mtime last seen, and since when they have not changed.
struct Seen {
    size: u64,
    mtime: Option<SystemTime>,
    since: Instant,
}

pub fn claimed_dir(state: &Path, workflow: &str) -> PathBuf {
    state.join("claimed").join(workflow)
}

pub async fn run<F, Fut>(watch: FileWatch, state: PathBuf, submit: F, cancel: CancellationToken)
where
    F: Fn(Fire) -> Fut,
    Fut: std::future::Future<Output = Option<RunRecord>>,
{
    let claimed = claimed_dir(&state, &watch.workflow);
    if let Err(e) =
        std::fs::create_dir_all(&watch.dir).and_then(|_| std::fs::create_dir_all(&claimed))
    {
        tracing::error!(workflow = %watch.workflow, "cannot prepare {} or {}: {e}", watch.dir.display(), claimed.display());
        return;
    }
    // A crash between claim and finish left these here: run them again first.
    for file in files_in(&claimed) {
        if !fire_claimed(&watch, &claimed, &file, None, &submit, &cancel).await {
            return;
        }
    }
    let wake = Arc::new(Notify::new());
    let _watcher = crate::trigger::watch_folder(&watch.dir, wake.clone());
    let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
    let mut warned: std::collections::HashSet<PathBuf> = Default::default();
    loop {
        let now = Instant::now();
        let mut ready = Vec::new();
        let mut next_check: Option<Instant> = None;
        let mut present = std::collections::HashSet::new();
        for path in files_in(&watch.dir) {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                if warned.insert(path.clone()) {
                    tracing::warn!(workflow = %watch.workflow, file = %path.display(), "the file's name is not UTF-8: ignored (rename it to fire)");
                }
                continue;
            };
            if name.starts_with('.') || !watch.matcher.is_match(name) {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.file_type().is_symlink() || !meta.is_file() {
                if warned.insert(path.clone()) {
                    tracing::warn!(workflow = %watch.workflow, file = %path.display(), "not a regular file (symlinks are not followed): ignored");
                }
                continue;
            }
            present.insert(path.clone());
            let (size, mtime) = (meta.len(), meta.modified().ok());
            // A file last written a while ago (or renamed into place after it was
            // written) has been stable since its mtime, not since we first saw it.
            let quiet_for = mtime
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .unwrap_or(Duration::ZERO);
            let first_seen = now.checked_sub(quiet_for).unwrap_or(now);
            let entry = seen.entry(path.clone()).or_insert(Seen {
                size,
                mtime,
                since: first_seen,
            });
            if entry.size != size || entry.mtime != mtime {
                *entry = Seen {
                    size,
                    mtime,
                    since: now,
                };
            }
            let due = entry.since + watch.debounce;
            if due <= now {
                ready.push(path);
            } else {
                next_check = Some(next_check.map_or(due, |n: Instant| n.min(due)));
            }
        }
        seen.retain(|p, _| present.contains(p));
        ready.sort();
        for path in ready {
            seen.remove(&path);
            let Some(id) = taken_here(&watch, &path) else {
                continue;
            };
            let target = claim(&path, &claimed);
            if let (Some(store), Some(id)) = (&watch.claims, id) {
                if let Err(e) = store.release_file(&watch.workflow, &id) {
                    tracing::warn!(workflow = %watch.workflow, file = %path.display(), "cannot let go of the file's claim in the store ({e}); it lapses in a day");
                }
            }
            let Some(target) = target else {
                continue;
            };
            if !fire_claimed(&watch, &claimed, &target, Some(&path), &submit, &cancel).await {
                return;
            }
        }
        let sleep = next_check.map_or(RESCAN, |t| t.saturating_duration_since(Instant::now()));
        tokio::select! {
            _ = wake.notified() => {
                // Let a burst of events settle into one scan.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            _ = tokio::time::sleep(sleep) => {}
            _ = cancel.cancelled() => return,
        }
    }
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()));
    files.sort();
    files
}

/// The id a file is claimed by in the store: its name, size and modification time, the
/// same for every daemon watching a shared folder (and kept by a rename into place).
pub fn claim_id(path: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let name = path.file_name()?.to_string_lossy();
    Some(format!("{name}\0{}\0{mtime}", meta.len()))
}

/// Whether this daemon may take `path` (Some), with the [`claim_id`] it claimed it by in
/// the store. Not while the store cannot answer: the file stays for a later look.
fn taken_here(watch: &FileWatch, path: &Path) -> Option<Option<String>> {
    let Some(store) = &watch.claims else {
        return Some(None);
    };
    let id = claim_id(path)?;
    match store.claim_file(&watch.workflow, &id) {
        Ok(mine) => mine.then_some(Some(id)),
        Err(e) => {
            tracing::warn!(workflow = %watch.workflow, file = %path.display(), "cannot claim the file in the store ({e}): left for a later look");
            None
        }
    }
}

/// Moves a complete file out of the watched folder; None (logged) if it is gone or stuck.
fn claim(path: &Path, claimed: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let mut target = claimed.join(name);
    let mut n = 1;
    while target.exists() {
        target = claimed.join(format!("{}.{n}", name.to_string_lossy()));
        n += 1;
    }
    match std::fs::rename(path, &target) {
        Ok(()) => Some(target),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            // Another filesystem: copy, make it durable, then remove the original.
            let copied = std::fs::copy(path, &target)
                .and_then(|_| std::fs::File::open(&target)?.sync_all())
                .and_then(|_| std::fs::remove_file(path));
            match copied {
                Ok(()) => Some(target),
                Err(e) => {
                    tracing::error!(file = %path.display(), "cannot claim file: {e}");
                    let _ = std::fs::remove_file(&target);
                    None
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::error!(file = %path.display(), "cannot claim file: {e}");
            None
        }
    }
}

/// Hashes the claimed file, runs the workflow on it, and files it under done/ or failed/.
/// Returns false when the daemon is stopping.
async fn fire_claimed<F, Fut>(
    watch: &FileWatch,
    claimed: &Path,
    file: &Path,
    original: Option<&Path>,
    submit: &F,
    cancel: &CancellationToken,
) -> bool
where
    F: Fn(Fire) -> Fut,
    Fut: std::future::Future<Output = Option<RunRecord>>,
{
    let (size, sha256) = match hash_file(file) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(workflow = %watch.workflow, file = %file.display(), "cannot read claimed file: {e}");
            settle(claimed, file, "failed");
            return true;
        }
    };
    loop {
        let fire = Fire::new(
            "file",
            None,
            json!({
                "path": file,
                "original_path": original.unwrap_or(file),
                "name": file.file_name().map(|n| n.to_string_lossy().into_owned()),
                "size": size,
                "sha256": sha256,
            }),
        );
        let Some(rec) = submit(fire).await else {
            return false;
        };
        match rec.state {
            RunState::Interrupted => return false, // stays claimed: runs again at start-up
            RunState::Skipped => {
                tokio::select! {
                    _ = tokio::time::sleep(SKIPPED_RETRY) => continue,
                    _ = cancel.cancelled() => return false,
                }
            }
            RunState::Success | RunState::CleanNoOp | RunState::ApprovalRequired => {
                settle(claimed, file, "done")
            }
            _ => settle(claimed, file, "failed"),
        }
        return true;
    }
}

fn settle(claimed: &Path, file: &Path, outcome: &str) {
    let dir = claimed.join(outcome);
    let Some(name) = file.file_name() else { return };
    let result = std::fs::create_dir_all(&dir).and_then(|_| std::fs::rename(file, dir.join(name)));
    if let Err(e) = result {
        tracing::error!(file = %file.display(), "cannot move claimed file to {outcome}/: {e}");
    }
}

/// Size and sha256 of a file, streamed (memory stays bounded whatever its size).
pub fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((size, hex::encode(hasher.finalize())))
}
