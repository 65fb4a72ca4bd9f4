//! The durable state: one sled database under `STATE/store`.
//!
//! Trees: `runs` (run records), `active` (runs not yet terminal), `keys` (idempotency
//! keys and their phase), `dead_letter` (full copies of failed, exhausted and stagnated
//! runs), `review` (runs waiting for an operator), `approvals` (go-live approvals bound to
//! a config hash), `meta`.
//!
//! sled admits one process per folder and flushes on its own only every 500 ms, so the
//! store is opened once and cloned, and [`Store::flush`] is called at every point that must
//! survive a crash: before a maker starts, before a commit starts, after a commit.
//! [`Store::open`] also recovers from a crash: runs left `running` become `interrupted`
//! and their reserved keys become *in doubt*, which only an operator can settle.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::budget::Figures;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state folder {} is in use by another steward process{} (a running daemon or `steward run`); stop it or wait for it to finish", .dir.display(), .holders)]
    Locked { dir: PathBuf, holders: String },
    #[error("cannot open the store in {path}: {source}")]
    Open { path: PathBuf, source: sled::Error },
    #[error("cannot lock state folder {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store error: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt record in store tree `{tree}` at key `{key}`: {source}")]
    Corrupt {
        tree: &'static str,
        key: String,
        source: serde_json::Error,
    },
}

pub type Result<T> = std::result::Result<T, StoreError>;

static FLUSHES: AtomicU64 = AtomicU64::new(0);

/// Durable flushes made by this process so far (what the benchmarks count per run).
pub fn flush_count() -> u64 {
    FLUSHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Where a run is, or how it ended. The seven terminal states of the workflow standard,
/// plus `running` and `interrupted` (steward stopped or crashed while it ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunState {
    Running,
    Success,
    CleanNoOp,
    Blocked,
    ApprovalRequired,
    Exhausted,
    Stagnated,
    Failed,
    Interrupted,
    /// A fire the overlap policy did not run (recorded, never silently dropped).
    Skipped,
    /// A scheduled slot that passed while steward was not running.
    Missed,
}

impl RunState {
    pub fn name(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Success => "success",
            RunState::CleanNoOp => "clean-no-op",
            RunState::Blocked => "blocked",
            RunState::ApprovalRequired => "approval-required",
            RunState::Exhausted => "exhausted",
            RunState::Stagnated => "stagnated",
            RunState::Failed => "failed",
            RunState::Interrupted => "interrupted",
            RunState::Skipped => "skipped",
            RunState::Missed => "missed",
        }
    }

    /// States that land in the dead-letter queue.
    pub fn dead_letters(self) -> bool {
        matches!(
            self,
            RunState::Failed | RunState::Exhausted | RunState::Stagnated
        )
    }

    /// The process exit code `steward run` reports for this state.
    pub fn exit_code(self) -> i32 {
        match self {
            RunState::Success | RunState::CleanNoOp => 0,
            RunState::ApprovalRequired => 3,
            RunState::Blocked => 4,
            RunState::Failed => 5,
            RunState::Exhausted => 6,
            RunState::Stagnated => 7,
            RunState::Interrupted | RunState::Running => 8,
            RunState::Skipped | RunState::Missed => 9,
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The verify step's verdict as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyRecord {
    pub verdict: String,
    pub reason: String,
    pub confidence: Option<String>,
    pub output: Option<serde_json::Value>,
}

/// One attempt of a run, in brief.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt: u32,
    pub state: RunState,
    pub reason: String,
    pub figures: Figures,
}

/// Everything known about one run: the full context a dead-letter entry needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub workflow: String,
    pub config_hash: String,
    pub state: RunState,
    /// Why it ended as it did, for a person.
    pub reason: String,
    pub dry_run: bool,
    pub committed: bool,
    pub attempt: u32,
    pub idempotency_key: Option<String>,
    pub trigger: serde_json::Value,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub figures: Figures,
    /// The breached cap and figures, e.g. `tokens 20412/20000`.
    pub breach: Option<String>,
    pub output: Option<serde_json::Value>,
    pub verify: Option<VerifyRecord>,
    pub commit_output: Option<serde_json::Value>,
    /// Last lines of stderr per step.
    pub stderr: std::collections::BTreeMap<String, String>,
    pub notes: Vec<String>,
    pub attempts: Vec<AttemptRecord>,
    /// The dead-lettered run this one retries.
    pub retry_of: Option<String>,
    /// A digest agent's summary line (step 12).
    #[serde(default)]
    pub summary: Option<String>,
    /// Why the run was dry (none for a live run): the runner's decision, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run_reason: Option<String>,
}

/// Where an idempotency key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyPhase {
    /// A live run holds it; its maker may be running.
    Reserved,
    /// Verify escalated; an operator decides.
    AwaitingApproval,
    /// The commit step has started.
    Committing,
    /// Committed (or ended clean-no-op): a re-fire is a clean-no-op.
    Committed,
    /// Found reserved or committing after a crash: never committed again without an operator.
    InDoubt,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub workflow: String,
    pub key: String,
    pub run_id: String,
    pub phase: KeyPhase,
    /// For an in-doubt key: the phase it was found in (`committing` means the commit may
    /// have happened; `reserved` means the commit step never started).
    pub found_in: Option<KeyPhase>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub run: RunRecord,
    pub dead_lettered_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub workflow: String,
    pub config_hash: String,
    pub approved_at: DateTime<Utc>,
    pub approved_by: String,
}

/// What [`Store::open`] found left over from a crash.
#[derive(Debug, Default, Clone)]
pub struct Recovery {
    pub interrupted_runs: Vec<String>,
    pub keys_in_doubt: Vec<KeyRecord>,
}

/// How many finished run records the store keeps. Dead letters keep their own copy of
/// the run, and runs still running or awaiting review are never pruned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retention {
    /// At most this many run records (newest kept).
    pub runs: usize,
    /// And none older than this many days.
    pub days: u32,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            runs: 10_000,
            days: 30,
        }
    }
}

/// Finished runs recorded between two retention sweeps: a sweep reads every run key, so
/// it runs now and then, not per run.
const PRUNE_EVERY: u64 = 1_000;

#[derive(Clone)]
pub struct Store {
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

impl Store {
    /// Opens (creating) the store under `state_dir` and recovers from any crash.
    pub fn open(state_dir: &Path) -> Result<(Store, Recovery)> {
        let lock = lock_state_dir(state_dir)?;
        let path = state_dir.join("store");
        let db = sled::Config::new()
            .path(&path)
            .cache_capacity(64 << 20)
            .open()
            .map_err(|e| StoreError::Open {
                path: path.clone(),
                source: e,
            })?;
        let store = Store {
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
            db,
        };
        let recovery = store.recover()?;
        Ok((store, recovery))
    }

    /// Makes everything written so far durable.
    pub fn flush(&self) -> Result<()> {
        FLUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.db.flush()?;
        Ok(())
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

    fn put<T: Serialize>(&self, tree: &sled::Tree, key: &str, value: &T) -> Result<()> {
        tree.insert(key.as_bytes(), encode(value))?;
        Ok(())
    }

    // ---- runs ----

    /// Writes a run record; a `running` run is also listed as active for crash recovery.
    pub fn put_run(&self, run: &RunRecord) -> Result<()> {
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

    /// Sets how many run records are kept; takes effect at the next sweep.
    pub fn set_retention(&self, retention: Retention) {
        *self.retention.lock().unwrap_or_else(|p| p.into_inner()) = retention;
    }

    /// Deletes run records beyond the retention (the oldest first); returns how many.
    /// Called every [`PRUNE_EVERY`] finished runs and at daemon start.
    pub fn prune_runs(&self, now: DateTime<Utc>) -> Result<usize> {
        let retention = *self.retention.lock().unwrap_or_else(|p| p.into_inner());
        // Run ids start with their start time, so key order is age order.
        let cutoff = (now - chrono::Duration::days(i64::from(retention.days)))
            .format("%Y%m%dT%H%M%S%3f")
            .to_string();
        let mut doomed = Vec::new();
        for (newer, key) in self.runs.iter().keys().rev().enumerate() {
            let key = key?;
            if newer < retention.runs && key.as_ref() >= cutoff.as_bytes() {
                continue;
            }
            if self.active.contains_key(&key)? || self.review.contains_key(&key)? {
                continue;
            }
            doomed.push(key);
        }
        for key in &doomed {
            self.runs.remove(key)?;
        }
        if !doomed.is_empty() {
            tracing::debug!(pruned = doomed.len(), "old run records pruned");
        }
        Ok(doomed.len())
    }

    pub fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        get(&self.runs, "runs", id)
    }

    /// Newest first. Run ids start with their start time, so key order is time order.
    pub fn runs(
        &self,
        mut keep: impl FnMut(&RunRecord) -> bool,
        limit: usize,
    ) -> Result<Vec<RunRecord>> {
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

    // ---- schedules ----

    /// The last slot a schedule fired (or handled as missed).
    pub fn last_slot(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        get(&self.meta, "meta", &format!("last_slot/{workflow}"))
    }

    pub fn set_last_slot(&self, workflow: &str, slot: DateTime<Utc>) -> Result<()> {
        self.put(&self.meta, &format!("last_slot/{workflow}"), &slot)
    }

    // ---- agency case events ----

    fn case_key(case: &str, version: u64) -> Vec<u8> {
        let mut k = case.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(&version.to_be_bytes());
        k
    }

    /// The raw events of a case, in version order.
    pub fn case_events(&self, case: &str) -> Result<Vec<(u64, Vec<u8>)>> {
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

    /// Appends event `version` of a case only if that version is free (compare-and-swap):
    /// Ok(false) is a version conflict, someone else appended first. Flushed when Ok(true).
    pub fn append_case_event(&self, case: &str, version: u64, event: &[u8]) -> Result<bool> {
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

    /// Overwrites a stored event as is. Only for tests of tamper detection.
    #[doc(hidden)]
    pub fn overwrite_case_event_for_tests(
        &self,
        case: &str,
        version: u64,
        event: &[u8],
    ) -> Result<()> {
        self.case_events
            .insert(Self::case_key(case, version), event)?;
        self.flush()
    }

    /// Every case id with at least one event.
    pub fn case_ids(&self) -> Result<Vec<String>> {
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

    // ---- idempotency keys ----

    fn key_id(workflow: &str, key: &str) -> Vec<u8> {
        let mut k = workflow.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(key.as_bytes());
        k
    }

    pub fn key(&self, workflow: &str, key: &str) -> Result<Option<KeyRecord>> {
        let id = Self::key_id(workflow, key);
        match self.keys.get(&id)? {
            Some(v) => Ok(Some(decode("keys", &id, &v)?)),
            None => Ok(None),
        }
    }

    pub fn set_key(&self, workflow: &str, key: &str, run_id: &str, phase: KeyPhase) -> Result<()> {
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

    /// Frees a key so the next fire may run (failed, exhausted, stagnated, rejected, released).
    pub fn release_key(&self, workflow: &str, key: &str) -> Result<()> {
        self.keys.remove(Self::key_id(workflow, key))?;
        Ok(())
    }

    /// Reserves a key for a live run, atomically: fails with the current record if taken.
    pub fn reserve_key(
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

    pub fn keys_in_doubt(&self) -> Result<Vec<KeyRecord>> {
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

    // ---- dead letter ----

    pub fn dead_letter(&self, run: &RunRecord) -> Result<()> {
        let entry = DeadLetter {
            run: run.clone(),
            dead_lettered_at: Utc::now(),
        };
        self.put(&self.dead_letter, &run.run_id, &entry)
    }

    pub fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        all(&self.dead_letter, "dead_letter")
    }

    pub fn dead_letter_entry(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        get(&self.dead_letter, "dead_letter", run_id)
    }

    pub fn remove_dead_letter(&self, run_id: &str) -> Result<bool> {
        Ok(self.dead_letter.remove(run_id.as_bytes())?.is_some())
    }

    // ---- review queue ----

    pub fn queue_review(&self, run_id: &str) -> Result<()> {
        self.review.insert(run_id.as_bytes(), encode(&Utc::now()))?;
        Ok(())
    }

    pub fn in_review(&self, run_id: &str) -> Result<bool> {
        Ok(self.review.contains_key(run_id.as_bytes())?)
    }

    pub fn remove_review(&self, run_id: &str) -> Result<bool> {
        Ok(self.review.remove(run_id.as_bytes())?.is_some())
    }

    pub fn review_queue(&self) -> Result<Vec<String>> {
        self.review
            .iter()
            .keys()
            .map(|k| Ok(String::from_utf8_lossy(&k?).into_owned()))
            .collect()
    }

    // ---- go-live approvals ----

    pub fn approval(&self, workflow: &str) -> Result<Option<Approval>> {
        get(&self.approvals, "approvals", workflow)
    }

    pub fn approve_go_live(&self, approval: &Approval) -> Result<()> {
        self.put(&self.approvals, &approval.workflow, approval)
    }

    pub fn revoke_go_live(&self, workflow: &str) -> Result<bool> {
        Ok(self.approvals.remove(workflow.as_bytes())?.is_some())
    }
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
        }
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
        let left: Vec<String> = store
            .runs(|_| true, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
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
        assert_eq!(store.runs(|_| true, usize::MAX).unwrap().len(), 2);
    }
}
