//! The sled backend: one database under `STATE/store`.
//!
//! Trees: `runs` (run records), `active` (runs not yet terminal), `keys` (idempotency
//! keys and their phase), `dead_letter` (full copies of failed, exhausted and stagnated
//! runs), `review` (runs waiting for an operator), `approvals` (go-live approvals bound to
//! a config hash), `meta` (last slots, first loads, retention counters, spend per
//! workflow and day), `case_events`,
//! `deliveries` (the webhook deliveries accepted, until a replay could no longer verify),
//! `owed` (what the daemon owes across a restart: pending alerts, rate windows, lapses told).
//!
//! sled admits one process per folder and flushes on its own every [`BACKGROUND_FLUSH_MS`],
//! so the store is opened once and shared, and flushed at every point that must survive a
//! crash. A flush never holds a runtime worker (see [`super::group`]).
//!
//! `STEWARD_FLUSH_DELAY_MS` makes every flush take that much longer, half before sled's
//! flush and half after it: the benchmarks' stand-in for a slow disk, and the crash
//! harness's way to land kills inside a flush that runs are waiting for.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::Utc;
use serde::{de::DeserializeOwned, Serialize};

use super::model::*;

/// sled's own flusher: what is written and not flushed by a caller is on disk this soon.
pub const BACKGROUND_FLUSH_MS: u64 = 500;

/// The slow-disk stand-in's delay, read once.
fn flush_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let ms: u64 = std::env::var("STEWARD_FLUSH_DELAY_MS").ok()?.parse().ok()?;
        Some(std::time::Duration::from_millis(ms))
    })
}

pub struct SledStore {
    /// steward's own lock on the state folder, held as long as any handle lives.
    _lock: Arc<nix::fcntl::Flock<std::fs::File>>,
    db: sled::Db,
    retention: Arc<std::sync::Mutex<Retention>>,
    finished_since_prune: Arc<AtomicU64>,
    runs: sled::Tree,
    active: sled::Tree,
    keys: sled::Tree,
    dead_letter: sled::Tree,
    review: sled::Tree,
    approvals: sled::Tree,
    meta: sled::Tree,
    case_events: sled::Tree,
    /// Run id → `state\0workflow`: what the run index files it under.
    run_meta: sled::Tree,
    /// Empty values under `w\0WORKFLOW\0ID`, `s\0STATE\0ID`, `x\0WORKFLOW\0STATE\0ID`.
    run_index: sled::Tree,
    /// Workflow id → [`Pause`], for each paused workflow.
    pauses: sled::Tree,
    /// `WORKFLOW\0DELIVERY` → [`SeenDelivery`]: the webhook deliveries accepted.
    deliveries: sled::Tree,
    /// What the daemon owes across a restart (alert outbox, rate windows, lapses told).
    owed: sled::Tree,
    /// Flushes shared by concurrent callers.
    group: Arc<super::group::GroupFlush>,
}

/// ` (pid N: cmdline)` for the processes that hold `dir` open, as far as /proc shows.
fn holders(dir: &Path) -> String {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let fds = std::fs::read_dir(entry.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten();
        if fds
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|t| t == dir)
        {
            let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            found.push(format!("pid {pid}: {}", cmd.trim()));
        }
    }
    if found.is_empty() {
        String::new()
    } else {
        format!(" ({})", found.join("; "))
    }
}

/// One steward process per state folder: an exclusive `flock` on the folder itself
/// (a read-only open, so a read-only filesystem still reports its own error later).
/// sled takes a lock of its own too, but tells it apart from other errors only in text.
fn lock_state_dir(state_dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use nix::fcntl::{Flock, FlockArg};
    let dir = std::fs::File::open(state_dir).map_err(|source| StoreError::Lock {
        path: state_dir.to_path_buf(),
        source,
    })?;
    // A steward that was just killed can hold the lock for a moment while the kernel
    // tears it down: give that a second before calling the folder taken.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut dir = dir;
    loop {
        match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((back, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < deadline => {
                dir = back;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let dir = std::fs::canonicalize(state_dir).unwrap_or(state_dir.to_path_buf());
                let holders = holders(&dir);
                return Err(StoreError::Locked { dir, holders });
            }
            Err((_, errno)) => {
                return Err(StoreError::Lock {
                    path: state_dir.to_path_buf(),
                    source: errno.into(),
                })
            }
        }
    }
}

impl SledStore {
    /// Opens (creating) the store under `state_dir` and recovers from any crash.
    pub fn open(state_dir: &Path) -> Result<(SledStore, Recovery)> {
        let lock = lock_state_dir(state_dir)?;
        let path = state_dir.join("store");
        let db = sled::Config::new()
            .path(&path)
            .cache_capacity(64 << 20)
            .flush_every_ms(Some(BACKGROUND_FLUSH_MS))
            .open()
            .map_err(|e| StoreError::Open {
                path: path.clone(),
                source: e,
            })?;
        let store = SledStore {
            _lock: Arc::new(lock),
            retention: Arc::default(),
            finished_since_prune: Arc::default(),
            runs: db.open_tree("runs")?,
            active: db.open_tree("active")?,
            keys: db.open_tree("keys")?,
            dead_letter: db.open_tree("dead_letter")?,
            review: db.open_tree("review")?,
            approvals: db.open_tree("approvals")?,
            meta: db.open_tree("meta")?,
            case_events: db.open_tree("case_events")?,
            run_meta: db.open_tree("run_meta")?,
            run_index: db.open_tree("run_index")?,
            pauses: db.open_tree("pauses")?,
            deliveries: db.open_tree("deliveries")?,
            owed: db.open_tree("owed")?,
            group: Arc::default(),
            db,
        };
        store.build_run_index()?;
        let recovery = store.recover()?;
        Ok((store, recovery))
    }

    fn recover(&self) -> Result<Recovery> {
        let mut rec = Recovery::default();
        for item in self.active.iter() {
            let (k, _) = item?;
            let id = String::from_utf8_lossy(&k).into_owned();
            if let Some(mut run) = self.run(&id)? {
                if run.state == RunState::Running {
                    run.state = RunState::Interrupted;
                    run.reason = "steward stopped while this run was in flight".into();
                    run.ended_at = Some(Utc::now());
                    // Refiled too: `runs --status interrupted` reads through the index.
                    self.index_run(&run)?;
                    self.put(&self.runs, &id, &run)?;
                }
            }
            self.active.remove(&k)?;
            rec.interrupted_runs.push(id);
        }
        for item in self.keys.iter() {
            let (k, v) = item?;
            let mut key: KeyRecord = decode("keys", &k, &v)?;
            if matches!(key.phase, KeyPhase::Reserved | KeyPhase::Committing) {
                key.found_in = Some(key.phase);
                key.phase = KeyPhase::InDoubt;
                key.updated_at = Utc::now();
                self.keys.insert(&k, encode(&key))?;
                rec.keys_in_doubt.push(key);
            }
        }
        if !rec.interrupted_runs.is_empty() || !rec.keys_in_doubt.is_empty() {
            self.flush()?;
        }
        Ok(rec)
    }

    /// A store written before the run index existed gets one, once.
    fn build_run_index(&self) -> Result<()> {
        if self.run_meta.is_empty() && !self.runs.is_empty() {
            for item in self.runs.iter() {
                let (k, v) = item?;
                let run: RunRecord = decode("runs", &k, &v)?;
                self.index_run(&run)?;
            }
            tracing::info!(runs = self.run_meta.len(), "built the run index");
        }
        if self.meta.get(RUN_COUNT)?.is_none() {
            let n = self.run_meta.len() as u64;
            self.meta.insert(RUN_COUNT, &n.to_be_bytes())?;
        }
        Ok(())
    }

    /// Runs in the index, kept beside it so pruning need not walk every run to know.
    fn run_count(&self) -> Result<u64> {
        Ok(self
            .meta
            .get(RUN_COUNT)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes))
    }

    /// Adds `delta` to the run count, atomically against other writers.
    fn count_runs(&self, delta: i64) -> Result<()> {
        self.meta.update_and_fetch(RUN_COUNT, |old| {
            let n = old
                .and_then(|v| <[u8; 8]>::try_from(v).ok())
                .map_or(0, u64::from_be_bytes);
            Some(n.saturating_add_signed(delta).to_be_bytes().to_vec())
        })?;
        Ok(())
    }

    /// Files a run under its workflow, its state and both, replacing its old entries
    /// when its state changed. The index may hold a stale entry after a crash between
    /// two writes: readers check each record against what they asked.
    fn index_run(&self, run: &RunRecord) -> Result<()> {
        let meta = format!("{}\0{}", run.state.name(), run.workflow);
        let old = self
            .run_meta
            .insert(run.run_id.as_bytes(), meta.as_bytes())?;
        if old.as_deref() == Some(meta.as_bytes()) {
            return Ok(());
        }
        match old {
            Some(old) => self.unindex(&run.run_id, &old)?,
            None => self.count_runs(1)?,
        }
        for key in index_keys(&run.run_id, &meta) {
            self.run_index.insert(key, &[])?;
        }
        Ok(())
    }

    fn unindex(&self, run_id: &str, meta: &[u8]) -> Result<()> {
        for key in index_keys(run_id, &String::from_utf8_lossy(meta)) {
            self.run_index.remove(key)?;
        }
        Ok(())
    }

    fn put<T: Serialize>(&self, tree: &sled::Tree, key: &str, value: &T) -> Result<()> {
        tree.insert(key.as_bytes(), encode(value))?;
        Ok(())
    }

    // ---- agency case events ----
    fn case_key(case: &str, version: u64) -> Vec<u8> {
        let mut k = case.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(&version.to_be_bytes());
        k
    }

    // ---- idempotency keys ----
    fn key_id(workflow: &str, key: &str) -> Vec<u8> {
        let mut k = workflow.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(key.as_bytes());
        k
    }
}

/// The `meta` key holding how many runs the index files (a big-endian u64).
const RUN_COUNT: &str = "run_count";

/// A run's three index keys, from its `state\0workflow` meta.
fn index_keys(run_id: &str, meta: &str) -> [Vec<u8>; 3] {
    let (state, workflow) = meta.split_once('\0').unwrap_or((meta, ""));
    [
        format!("w\0{workflow}\0{run_id}").into_bytes(),
        format!("s\0{state}\0{run_id}").into_bytes(),
        format!("x\0{workflow}\0{state}\0{run_id}").into_bytes(),
    ]
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing our own plain records cannot fail (no maps with non-string keys).
    serde_json::to_vec(value).unwrap_or_default()
}

fn decode<T: DeserializeOwned>(tree: &'static str, key: &[u8], bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        tree,
        key: String::from_utf8_lossy(key).replace('\0', "/"),
        source,
    })
}

fn get<T: DeserializeOwned>(tree: &sled::Tree, name: &'static str, key: &str) -> Result<Option<T>> {
    match tree.get(key.as_bytes())? {
        Some(v) => Ok(Some(decode(name, key.as_bytes(), &v)?)),
        None => Ok(None),
    }
}

fn all<T: DeserializeOwned>(tree: &sled::Tree, name: &'static str) -> Result<Vec<T>> {
    tree.iter()
        .map(|item| {
            let (k, v) = item?;
            decode(name, &k, &v)
        })
        .collect()
}

mod backend;
#[cfg(test)]
mod tests;
