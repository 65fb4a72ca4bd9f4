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

use chrono::{DateTime, Utc};
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

impl Backend for SledStore {
    fn flush(&self) -> Result<()> {
        self.flush_among(0)
    }

    fn flush_among(&self, others: usize) -> Result<()> {
        super::group::off_runtime(|| {
            self.group.flush_among(others, || {
                FLUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let delay = flush_delay().unwrap_or_default();
                std::thread::sleep(delay / 2);
                let flushed = self.db.flush().map(|_| ());
                std::thread::sleep(delay - delay / 2);
                flushed
            })
        })?;
        Ok(())
    }

    fn put_run(&self, run: &RunRecord) -> Result<()> {
        // Index first: a crash between the two leaves an index entry without a record
        // (readers skip it, pruning removes it), never a record pruning cannot see.
        self.index_run(run)?;
        self.put(&self.runs, &run.run_id, run)?;
        if run.state == RunState::Running {
            self.active.insert(run.run_id.as_bytes(), &[])?;
        } else {
            self.active.remove(run.run_id.as_bytes())?;
            if self.finished_since_prune.fetch_add(1, Ordering::Relaxed) + 1 >= PRUNE_EVERY {
                self.finished_since_prune.store(0, Ordering::Relaxed);
                self.prune_runs(Utc::now())?;
            }
        }
        Ok(())
    }

    fn set_retention(&self, retention: Retention) {
        *self.retention.lock().unwrap_or_else(|p| p.into_inner()) = retention;
    }

    fn prune_runs(&self, now: DateTime<Utc>) -> Result<usize> {
        let retention = *self.retention.lock().unwrap_or_else(|p| p.into_inner());
        // Run ids start with their start time, so key order is age order.
        let cutoff = (now - chrono::Duration::days(i64::from(retention.days)))
            .format("%Y%m%dT%H%M%S%3f")
            .to_string();
        // Oldest first, and only as far as the doomed go: the runs beyond the newest
        // `retention.runs`, and the expired. A walk over every run would pull each
        // record into memory (tens of MiB with 100,000 runs) to keep almost all of them.
        let excess = self.run_count()?.saturating_sub(retention.runs as u64);
        let mut doomed = Vec::new();
        for (older, key) in self.run_meta.iter().keys().enumerate() {
            let key = key?;
            if older as u64 >= excess && key.as_ref() >= cutoff.as_bytes() {
                break;
            }
            if self.active.contains_key(&key)? || self.review.contains_key(&key)? {
                continue;
            }
            doomed.push(key);
        }
        for key in &doomed {
            self.runs.remove(key)?;
            if let Some(meta) = self.run_meta.remove(key)? {
                self.unindex(&String::from_utf8_lossy(key), &meta)?;
                self.count_runs(-1)?;
            }
        }
        if !doomed.is_empty() {
            tracing::debug!(pruned = doomed.len(), "old run records pruned");
        }
        Ok(doomed.len())
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        get(&self.runs, "runs", id)
    }

    fn runs(&self, keep: &dyn Fn(&RunRecord) -> bool, limit: usize) -> Result<Vec<RunRecord>> {
        let mut out = Vec::new();
        for item in self.runs.iter().rev() {
            let (k, v) = item?;
            let run: RunRecord = decode("runs", &k, &v)?;
            if keep(&run) {
                out.push(run);
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn run_page(&self, q: &RunQuery) -> Result<Vec<RunRecord>> {
        let prefix = match (&q.workflow, q.state) {
            (Some(w), Some(s)) => format!("x\0{w}\0{}\0", s.name()),
            (Some(w), None) => format!("w\0{w}\0"),
            (None, Some(s)) => format!("s\0{}\0", s.name()),
            (None, None) => String::new(),
        };
        let low = format!("{prefix}{}", q.since.map(run_id_prefix).unwrap_or_default());
        let mut high = q.until.map(run_id_prefix);
        if let Some(before) = &q.before {
            high = Some(high.map_or(before.clone(), |h| h.min(before.clone())));
        }
        let high = match high {
            Some(h) => format!("{prefix}{h}").into_bytes(),
            // Past every id under the prefix (ids are ASCII, below 0xff).
            None => format!("{prefix}\u{7f}").into_bytes(),
        };
        let tree = if prefix.is_empty() {
            &self.runs
        } else {
            &self.run_index
        };
        let keep = |r: &RunRecord| {
            q.workflow.as_ref().is_none_or(|w| &r.workflow == w)
                && q.state.is_none_or(|s| r.state == s)
        };
        let mut out = Vec::new();
        for key in tree.range(low.into_bytes()..high).keys().rev() {
            let key = key?;
            let id = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
            if let Some(run) = self.run(&id)?.filter(keep) {
                out.push(run);
                if out.len() >= q.limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn recent_states(&self, workflow: &str, limit: usize) -> Result<Vec<(String, RunState)>> {
        let prefix = format!("w\0{workflow}\0");
        let mut out = Vec::new();
        for key in self.run_index.scan_prefix(prefix.as_bytes()).keys().rev() {
            let key = key?;
            let Some(meta) = self.run_meta.get(&key[prefix.len()..])? else {
                continue;
            };
            let meta = String::from_utf8_lossy(&meta).into_owned();
            let state = meta.split('\0').next().and_then(RunState::from_name);
            if let Some(state) = state {
                out.push((
                    String::from_utf8_lossy(&key[prefix.len()..]).into_owned(),
                    state,
                ));
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn counts(&self) -> Result<Counts> {
        let mut in_doubt = 0;
        for value in self.keys.iter().values() {
            // Read without decoding: a scrape must stay cheap with many keys.
            if memchr::memmem::find(&value?, b"\"in-doubt\"").is_some() {
                in_doubt += 1;
            }
        }
        Ok(Counts {
            dead_letters: self.dead_letter.len(),
            review_waiting: self.review.len(),
            keys_in_doubt: in_doubt,
        })
    }

    fn last_slot(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        get(&self.meta, "meta", &format!("last_slot/{workflow}"))
    }

    fn set_last_slot(&self, workflow: &str, slot: DateTime<Utc>) -> Result<()> {
        self.put(&self.meta, &format!("last_slot/{workflow}"), &slot)
    }

    fn remember_delivery(
        &self,
        workflow: &str,
        id: &str,
        seen: &SeenDelivery,
        now: DateTime<Utc>,
    ) -> Result<Option<SeenDelivery>> {
        let key = format!("{workflow}\0{id}");
        let new = encode(seen);
        let mut expected: Option<sled::IVec> = None;
        loop {
            match self.deliveries.compare_and_swap(
                key.as_bytes(),
                expected.clone(),
                Some(new.clone()),
            )? {
                Ok(()) => break,
                Err(current) => {
                    let Some(bytes) = current.current else {
                        expected = None;
                        continue;
                    };
                    let earlier: SeenDelivery = decode("deliveries", key.as_bytes(), &bytes)?;
                    if earlier.until >= now {
                        return Ok(Some(earlier));
                    }
                    // Remembered, but past its time: take its place.
                    expected = Some(bytes);
                }
            }
        }
        // No flush of its own on the request's path: sled's own (every 500 ms), the run's
        // key reservation and the daemon's last flush carry it; the delivery id is the
        // run's idempotency key too, so one lost in a crash still never commits twice.
        Ok(None)
    }

    fn forget_deliveries(&self, now: DateTime<Utc>) -> Result<usize> {
        let mut gone = 0;
        for item in self.deliveries.iter() {
            let (k, v) = item?;
            let seen: SeenDelivery = decode("deliveries", &k, &v)?;
            if seen.until < now
                && self
                    .deliveries
                    .compare_and_swap(&k, Some(v), None::<sled::IVec>)?
                    .is_ok()
            {
                gone += 1;
            }
        }
        Ok(gone)
    }

    fn add_day_spend(
        &self,
        workflow: &str,
        day: chrono::NaiveDate,
        spend: &DaySpend,
    ) -> Result<()> {
        let key = format!("spend/{workflow}/{day}");
        self.meta.update_and_fetch(key.as_bytes(), |old| {
            let mut sum: DaySpend = old
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or_default();
            sum.cost_usd = (sum.cost_usd + spend.cost_usd).min(f64::MAX);
            sum.tokens = sum.tokens.saturating_add(spend.tokens);
            sum.runs += spend.runs;
            serde_json::to_vec(&sum).ok()
        })?;
        Ok(())
    }

    fn day_spend(&self, workflow: &str, day: chrono::NaiveDate) -> Result<DaySpend> {
        Ok(get(&self.meta, "meta", &format!("spend/{workflow}/{day}"))?.unwrap_or_default())
    }

    fn put_owed(&self, key: &str, bytes: &[u8]) -> Result<()> {
        self.owed.insert(key.as_bytes(), bytes)?;
        Ok(())
    }

    fn remove_owed(&self, key: &str) -> Result<()> {
        self.owed.remove(key.as_bytes())?;
        Ok(())
    }

    fn owed(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.owed
            .scan_prefix(prefix.as_bytes())
            .map(|item| {
                let (k, v) = item?;
                Ok((String::from_utf8_lossy(&k).into_owned(), v.to_vec()))
            })
            .collect()
    }

    fn update_owed(&self, key: &str, next: &OwedUpdate<'_>) -> Result<bool> {
        loop {
            let now = self.owed.get(key.as_bytes())?;
            let Some(new) = next(now.as_deref()) else {
                return Ok(false);
            };
            if self
                .owed
                .compare_and_swap(key.as_bytes(), now, Some(new))?
                .is_ok()
            {
                return Ok(true);
            }
        }
    }

    fn first_loaded(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        get(&self.meta, "meta", &format!("first_loaded/{workflow}"))
    }

    fn set_first_loaded(&self, workflow: &str, at: DateTime<Utc>) -> Result<()> {
        self.put(&self.meta, &format!("first_loaded/{workflow}"), &at)
    }

    fn case_events(&self, case: &str) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut prefix = case.as_bytes().to_vec();
        prefix.push(0);
        self.case_events
            .scan_prefix(&prefix)
            .map(|item| {
                let (k, v) = item?;
                let mut ver = [0u8; 8];
                ver.copy_from_slice(&k[k.len().saturating_sub(8)..]);
                Ok((u64::from_be_bytes(ver), v.to_vec()))
            })
            .collect()
    }

    fn append_case_event(&self, case: &str, version: u64, event: &[u8]) -> Result<bool> {
        let key = Self::case_key(case, version);
        match self
            .case_events
            .compare_and_swap(&key, None as Option<&[u8]>, Some(event))?
        {
            Ok(()) => {
                self.flush()?;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    fn overwrite_case_event_for_tests(&self, case: &str, version: u64, event: &[u8]) -> Result<()> {
        self.case_events
            .insert(Self::case_key(case, version), event)?;
        self.flush()
    }

    fn case_ids(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for item in self.case_events.iter().keys() {
            let k = item?;
            let id = String::from_utf8_lossy(&k[..k.len().saturating_sub(9)]).into_owned();
            if out.last() != Some(&id) {
                out.push(id);
            }
        }
        Ok(out)
    }

    fn key(&self, workflow: &str, key: &str) -> Result<Option<KeyRecord>> {
        let id = Self::key_id(workflow, key);
        match self.keys.get(&id)? {
            Some(v) => Ok(Some(decode("keys", &id, &v)?)),
            None => Ok(None),
        }
    }

    fn set_key(&self, workflow: &str, key: &str, run_id: &str, phase: KeyPhase) -> Result<()> {
        let rec = KeyRecord {
            workflow: workflow.to_string(),
            key: key.to_string(),
            run_id: run_id.to_string(),
            phase,
            found_in: None,
            updated_at: Utc::now(),
        };
        self.keys
            .insert(Self::key_id(workflow, key), encode(&rec))?;
        Ok(())
    }

    fn release_key(&self, workflow: &str, key: &str) -> Result<()> {
        self.keys.remove(Self::key_id(workflow, key))?;
        Ok(())
    }

    fn reserve_key(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<std::result::Result<(), KeyRecord>> {
        let id = Self::key_id(workflow, key);
        let rec = KeyRecord {
            workflow: workflow.to_string(),
            key: key.to_string(),
            run_id: run_id.to_string(),
            phase: KeyPhase::Reserved,
            found_in: None,
            updated_at: Utc::now(),
        };
        match self
            .keys
            .compare_and_swap(&id, None as Option<&[u8]>, Some(encode(&rec)))?
        {
            Ok(()) => Ok(Ok(())),
            Err(cas) => match cas.current {
                Some(v) => Ok(Err(decode("keys", &id, &v)?)),
                None => Ok(Err(rec)),
            },
        }
    }

    fn keys_in_doubt(&self) -> Result<Vec<KeyRecord>> {
        let mut out = Vec::new();
        for item in self.keys.iter() {
            let (k, v) = item?;
            let rec: KeyRecord = decode("keys", &k, &v)?;
            if rec.phase == KeyPhase::InDoubt {
                out.push(rec);
            }
        }
        Ok(out)
    }

    fn dead_letter(&self, run: &RunRecord) -> Result<()> {
        let entry = DeadLetter {
            run: run.clone(),
            dead_lettered_at: Utc::now(),
        };
        self.put(&self.dead_letter, &run.run_id, &entry)
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        all(&self.dead_letter, "dead_letter")
    }

    fn dead_letter_entry(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        get(&self.dead_letter, "dead_letter", run_id)
    }

    fn remove_dead_letter(&self, run_id: &str) -> Result<bool> {
        Ok(self.dead_letter.remove(run_id.as_bytes())?.is_some())
    }

    fn queue_review(&self, run_id: &str) -> Result<()> {
        self.review.insert(run_id.as_bytes(), encode(&Utc::now()))?;
        Ok(())
    }

    fn in_review(&self, run_id: &str) -> Result<bool> {
        Ok(self.review.contains_key(run_id.as_bytes())?)
    }

    fn remove_review(&self, run_id: &str) -> Result<bool> {
        Ok(self.review.remove(run_id.as_bytes())?.is_some())
    }

    fn review_queue(&self) -> Result<Vec<String>> {
        self.review
            .iter()
            .keys()
            .map(|k| Ok(String::from_utf8_lossy(&k?).into_owned()))
            .collect()
    }

    fn approval(&self, workflow: &str) -> Result<Option<Approval>> {
        get(&self.approvals, "approvals", workflow)
    }

    fn approve_go_live(&self, approval: &Approval) -> Result<()> {
        self.put(&self.approvals, &approval.workflow, approval)
    }

    fn revoke_go_live(&self, workflow: &str) -> Result<bool> {
        Ok(self.approvals.remove(workflow.as_bytes())?.is_some())
    }

    fn pause(&self, pause: &Pause) -> Result<()> {
        self.put(&self.pauses, &pause.workflow, pause)
    }

    fn resume(&self, workflow: &str) -> Result<Option<Pause>> {
        match self.pauses.remove(workflow.as_bytes())? {
            Some(v) => Ok(Some(decode("pauses", workflow.as_bytes(), &v)?)),
            None => Ok(None),
        }
    }

    fn paused(&self, workflow: &str) -> Result<Option<Pause>> {
        get(&self.pauses, "pauses", workflow)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Figures;
    use crate::store::Store;

    fn record(run_id: String, state: RunState) -> RunRecord {
        RunRecord {
            run_id,
            workflow: "wf".into(),
            config_hash: String::new(),
            state,
            reason: String::new(),
            dry_run: false,
            committed: false,
            attempt: 1,
            idempotency_key: None,
            trigger: serde_json::Value::Null,
            started_at: Utc::now(),
            ended_at: None,
            figures: Figures::default(),
            breach: None,
            output: None,
            verify: None,
            commit_output: None,
            stderr: Default::default(),
            notes: Vec::new(),
            attempts: Vec::new(),
            retry_of: None,
            summary: None,
            dry_run_reason: None,
            model_spend: None,
            misreported: None,
            daemon: None,
            sandbox: None,
        }
    }

    /// Every run id the store holds, newest first.
    fn run_ids(store: &dyn Backend) -> Vec<String> {
        store
            .runs(&|_| true, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect()
    }

    /// The page is what a scan of every record with the same filter would give, in the
    /// same order; a state change moves a run between index entries; pruning drops them.
    #[test]
    fn run_pages_match_a_full_scan_and_follow_state_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let base = Utc::now() - chrono::Duration::hours(1);
        let states = [RunState::Success, RunState::Failed, RunState::Skipped];
        let mut ids = Vec::new();
        for i in 0..60i64 {
            let t = base + chrono::Duration::seconds(i);
            let id = format!("{}-{i:06}", run_id_prefix(t));
            let mut r = record(id.clone(), RunState::Running);
            r.workflow = ["a", "b"][i as usize % 2].into();
            r.started_at = t;
            store.put_run(&r).unwrap();
            r.state = states[i as usize % 3];
            store.put_run(&r).unwrap();
            ids.push((id, r.workflow.clone(), r.state, t));
        }
        let check = |q: RunQuery| {
            let got: Vec<String> = store
                .run_page(&q)
                .unwrap()
                .into_iter()
                .map(|r| r.run_id)
                .collect();
            let want: Vec<String> = ids
                .iter()
                .rev()
                .filter(|(id, w, s, t)| {
                    q.workflow.as_ref().is_none_or(|x| x == w)
                        && q.state.is_none_or(|x| x == *s)
                        && q.since.is_none_or(|x| *t >= x)
                        && q.until.is_none_or(|x| *t < x)
                        && q.before.as_ref().is_none_or(|b| id < b)
                })
                .take(q.limit)
                .map(|(id, ..)| id.clone())
                .collect();
            assert_eq!(got, want, "{q:?}");
            assert!(!got.is_empty(), "{q:?}");
        };
        for workflow in [None, Some("a".to_string())] {
            for state in [None, Some(RunState::Failed)] {
                check(RunQuery {
                    workflow: workflow.clone(),
                    state,
                    limit: 7,
                    ..Default::default()
                });
                check(RunQuery {
                    workflow: workflow.clone(),
                    state,
                    since: Some(base + chrono::Duration::seconds(10)),
                    until: Some(base + chrono::Duration::seconds(50)),
                    before: Some(ids[40].0.clone()),
                    limit: 5,
                });
            }
        }
        // No running entry is left behind by the state changes.
        let running = RunQuery {
            state: Some(RunState::Running),
            limit: 100,
            ..Default::default()
        };
        assert!(store.run_page(&running).unwrap().is_empty());
        let strip = store.recent_states("b", 3).unwrap();
        assert_eq!(strip.len(), 3);
        assert_eq!(strip[0].0, ids[59].0);
        assert_eq!(strip[0].1, ids[59].2);
        store.set_retention(Retention { runs: 10, days: 30 });
        assert_eq!(store.prune_runs(Utc::now()).unwrap(), 50);
        let all = RunQuery {
            workflow: Some("a".into()),
            limit: 100,
            ..Default::default()
        };
        assert_eq!(store.run_page(&all).unwrap().len(), 5);
        assert_eq!(store.recent_states("a", 100).unwrap().len(), 5);
    }

    #[test]
    fn retention_prunes_the_oldest_and_the_expired_but_never_running_or_reviewed_runs() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let now = Utc::now();
        // Run i started i hours ago; 40 days ago and older for the last five.
        let id = |hours: i64| {
            format!(
                "{}-000000",
                (now - chrono::Duration::hours(hours)).format("%Y%m%dT%H%M%S%3f")
            )
        };
        let ages: Vec<i64> = (0..20).chain(960..965).collect();
        for &h in &ages {
            store.put_run(&record(id(h), RunState::Success)).unwrap();
        }
        // An old run still awaiting review and one still running (as far as the store knows).
        store
            .put_run(&record(id(970), RunState::ApprovalRequired))
            .unwrap();
        store.queue_review(&id(970)).unwrap();
        store.put_run(&record(id(971), RunState::Running)).unwrap();

        store.set_retention(Retention { runs: 12, days: 30 });
        let pruned = store.prune_runs(now).unwrap();
        let left = run_ids(&*store);
        let mut expected: Vec<String> = (0..12).map(id).collect();
        expected.extend([id(970), id(971)]);
        assert_eq!(left, expected, "newest 12 kept, plus reviewed and running");
        assert_eq!(pruned, 8 + 5);

        // Age alone: with room for 1000 records, only the expired go.
        store.set_retention(Retention {
            runs: 1000,
            days: 0,
        });
        store.prune_runs(now + chrono::Duration::hours(1)).unwrap();
        assert_eq!(store.runs(&|_| true, usize::MAX).unwrap().len(), 2);
    }

    /// The count pruning trusts follows new runs (not state changes), prunes and a
    /// reopen, and a store from before it existed gets one.
    #[test]
    fn the_run_count_follows_puts_prunes_and_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<String> = (0..5)
            .map(|i| format!("20261201T00000{i}000-000000"))
            .collect();
        {
            let (store, _) = SledStore::open(dir.path()).unwrap();
            for id in &ids {
                store
                    .put_run(&record(id.clone(), RunState::Running))
                    .unwrap();
                store
                    .put_run(&record(id.clone(), RunState::Success))
                    .unwrap();
            }
            assert_eq!(store.run_count().unwrap(), 5);
            store.set_retention(Retention {
                runs: 3,
                days: 3650,
            });
            assert_eq!(store.prune_runs(Utc::now()).unwrap(), 2);
            assert_eq!(store.run_count().unwrap(), 3);
            store.meta.remove(RUN_COUNT).unwrap(); // as a store written before the count
            store.flush().unwrap();
        }
        // sled's flusher thread lets go of the file lock a moment after the drop.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let store = loop {
            match SledStore::open(dir.path()) {
                Ok((store, _)) => break store,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                Err(e) => panic!("cannot reopen the store: {e}"),
            }
        };
        assert_eq!(store.run_count().unwrap(), 3);
        let left = run_ids(&store);
        assert_eq!(left, vec![ids[4].clone(), ids[3].clone(), ids[2].clone()]);
    }
}
