//! What the store holds — run records and their states, idempotency keys, dead letters,
//! approvals, the retention policy — and [`Backend`], the operations on it.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

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
    /// The cluster's shared store refused or could not be reached (see `crate::cluster`).
    #[error("{0}")]
    Shared(String),
    #[error("corrupt record in store tree `{tree}` at key `{key}`: {source}")]
    Corrupt {
        tree: &'static str,
        key: String,
        source: serde_json::Error,
    },
}

pub type Result<T> = std::result::Result<T, StoreError>;

pub(crate) static FLUSHES: AtomicU64 = AtomicU64::new(0);

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
    pub const ALL: [RunState; 11] = [
        RunState::Running,
        RunState::Success,
        RunState::CleanNoOp,
        RunState::Blocked,
        RunState::ApprovalRequired,
        RunState::Exhausted,
        RunState::Stagnated,
        RunState::Failed,
        RunState::Interrupted,
        RunState::Skipped,
        RunState::Missed,
    ];

    /// The state a name (as [`RunState::name`] gives it) stands for.
    pub fn from_name(name: &str) -> Option<RunState> {
        RunState::ALL.into_iter().find(|s| s.name() == name)
    }

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

/// The checker's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    Escalate,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Escalate => "escalate",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The verify step's verdict as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyRecord {
    pub verdict: Verdict,
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
    /// How its maker and checker were confined: `full; no network`, `partial (no TCP
    /// rules); …`, `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// What its steps spent on model calls through the gateway, as metered (all attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_spend: Option<ModelSpend>,
    /// Where the maker's fd-3 reports fell short of the meter, e.g.
    /// `reported tokens 0 of 1500 metered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub misreported: Option<String>,
    /// In a cluster, the daemon that ran it (none on one machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<String>,
}

/// What a workflow's runs spent on one day (UTC), as their budgets counted it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DaySpend {
    pub cost_usd: f64,
    pub tokens: u64,
    pub runs: u64,
}

/// A run's model calls through the gateway, summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSpend {
    pub calls: u64,
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
    pub tool_calls: u64,
    pub cost_usd: f64,
    /// Calls whose answer told no usage: each was charged its whole reservation.
    #[serde(default)]
    pub unreported: u64,
    /// Streams cut at the cap.
    #[serde(default)]
    pub cut: u64,
    /// Calls refused before they were forwarded: the budget could not cover them.
    #[serde(default)]
    pub refused: u64,
    /// Tokens charged for calls that told no usage (their reservations).
    #[serde(default)]
    pub reserved_tokens: u64,
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

impl KeyRecord {
    /// `workflow`'s `key`, held by `run_id` in `phase`, as of now.
    pub fn now(workflow: &str, key: &str, run_id: &str, phase: KeyPhase) -> KeyRecord {
        KeyRecord {
            workflow: workflow.to_string(),
            key: key.to_string(),
            run_id: run_id.to_string(),
            phase,
            found_in: None,
            updated_at: Utc::now(),
        }
    }
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

/// Why a workflow is paused: its fires are recorded `skipped` until an operator resumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseCause {
    /// `steward pause`.
    Operator,
    /// `[breaker]`: too many failing runs in a row.
    Breaker,
    /// `[budget.window]`: the spend of the rolling window was reached.
    Budget,
}

impl PauseCause {
    pub fn name(self) -> &'static str {
        match self {
            PauseCause::Operator => "operator",
            PauseCause::Breaker => "breaker",
            PauseCause::Budget => "budget",
        }
    }
}

/// A webhook delivery steward already accepted: the run it started, and until when a
/// replay of it could still verify.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeenDelivery {
    pub run_id: String,
    pub until: DateTime<Utc>,
}

/// A paused workflow: since when, why, by whom.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pause {
    pub workflow: String,
    pub cause: PauseCause,
    /// The operator's `--reason`, or what tripped the breaker.
    pub reason: String,
    pub since: DateTime<Utc>,
    pub by: String,
}

/// How [`Backend::update_owed`] moves an entry on: from what is kept (None: nothing), to
/// what to keep (None: leave it).
pub type OwedUpdate<'a> = dyn Fn(Option<&[u8]>) -> Option<Vec<u8>> + 'a;

/// Entries of the `owed` tree under this prefix are work one process carries out (alert
/// deliveries). In a cluster each is owned by the daemon that keeps it, and listed only
/// to that daemon, or, once it is gone, to the daemon that takes it over.
pub const OWNED_OWED: &str = "alert/outbox/";

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

/// Which runs a page holds: any of workflow, state and a start-time window, and where
/// the page starts (older than the run id `before`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunQuery {
    pub workflow: Option<String>,
    pub state: Option<RunState>,
    /// Runs started at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Runs started before this time.
    pub until: Option<DateTime<Utc>>,
    /// Runs older than this run id (the last id of the previous page).
    pub before: Option<String>,
    pub limit: usize,
}

/// Sizes an operator watches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub dead_letters: usize,
    pub review_waiting: usize,
    pub keys_in_doubt: usize,
}

/// The prefix of run ids started at `t` (run ids start with their start time).
pub fn run_id_prefix(t: DateTime<Utc>) -> String {
    t.format("%Y%m%dT%H%M%S%3f").to_string()
}

/// Finished runs recorded between two retention sweeps: a sweep walks the oldest index
/// entries, so it runs now and then, not per run.
pub(crate) const PRUNE_EVERY: u64 = 1_000;

/// Everything steward keeps, as operations. Implemented by [`sled_store::SledStore`].
pub trait Backend: Send + Sync {
    /// Makes everything written so far durable.
    fn flush(&self) -> Result<()>;

    /// [`Backend::flush`] for a run with `others` other runs in flight, which may share
    /// it (group commit).
    fn flush_among(&self, others: usize) -> Result<()> {
        let _ = others;
        self.flush()
    }

    // ---- runs ----
    /// Writes a run record; a `running` run is also listed as active for crash recovery.
    fn put_run(&self, run: &RunRecord) -> Result<()>;

    /// Sets how many run records are kept; takes effect at the next sweep.
    fn set_retention(&self, retention: Retention);

    /// Deletes run records beyond the retention (the oldest first); returns how many.
    /// Called every [`PRUNE_EVERY`] finished runs and at daemon start.
    fn prune_runs(&self, now: DateTime<Utc>) -> Result<usize>;

    fn run(&self, id: &str) -> Result<Option<RunRecord>>;

    /// Newest first. Run ids start with their start time, so key order is time order.
    fn runs(&self, keep: &dyn Fn(&RunRecord) -> bool, limit: usize) -> Result<Vec<RunRecord>>;

    /// One page of runs, newest first, found through the run index (workflow, state,
    /// start time), so a page costs its own size however many runs the store holds.
    fn run_page(&self, query: &RunQuery) -> Result<Vec<RunRecord>>;

    /// The newest runs of a workflow, as (run id, state): what a strip of recent runs shows.
    fn recent_states(&self, workflow: &str, limit: usize) -> Result<Vec<(String, RunState)>>;

    /// How many entries the dead-letter and review queues hold, and keys in doubt.
    fn counts(&self) -> Result<Counts>;

    // ---- schedules ----
    /// The last slot a schedule fired (or handled as missed).
    fn last_slot(&self, workflow: &str) -> Result<Option<DateTime<Utc>>>;

    fn set_last_slot(&self, workflow: &str, slot: DateTime<Utc>) -> Result<()>;

    /// When a daemon first loaded the workflow with this state folder: the dead-man's
    /// switch judges no slot and no period before it, so a first start raises nothing.
    fn first_loaded(&self, workflow: &str) -> Result<Option<DateTime<Utc>>>;

    fn set_first_loaded(&self, workflow: &str, at: DateTime<Utc>) -> Result<()>;

    // ---- spend per day ----
    /// Adds an ended run's spend to its workflow's day (atomic: runs may end together).
    fn add_day_spend(&self, workflow: &str, day: chrono::NaiveDate, spend: &DaySpend)
        -> Result<()>;

    /// A workflow's spend on `day` (zero when nothing was spent).
    fn day_spend(&self, workflow: &str, day: chrono::NaiveDate) -> Result<DaySpend>;

    // ---- what the daemon owes across a restart ----
    /// Keeps `bytes` under `key` in the `owed` tree: pending alert deliveries, the alert
    /// channels' rate windows, the lapses already told (each module keeps its own prefix).
    fn put_owed(&self, key: &str, bytes: &[u8]) -> Result<()>;

    fn remove_owed(&self, key: &str) -> Result<()>;

    /// Every entry under `prefix`, in key order.
    fn owed(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;

    /// Moves `key` on by `next`, atomically: `next` sees what is kept now and says what to
    /// keep instead (None: leave it). True when this call changed it. Of two daemons of a
    /// cluster deciding at once whether a lapse was told, one tells it.
    fn update_owed(&self, key: &str, next: &OwedUpdate<'_>) -> Result<bool>;

    // ---- files of watched folders ----
    /// Claims file `file` (its name, size and modification time) of `workflow`'s watched
    /// folder for this process: true when it is this process's to take. On one machine
    /// moving the file out of the folder claims it, and this says yes; in a cluster, where
    /// a folder may be shared between machines, the cluster decides first.
    fn claim_file(&self, _workflow: &str, _file: &str) -> Result<bool> {
        Ok(true)
    }

    /// Lets go of a file claimed, once it is out of the folder (the same file dropped
    /// again later is a new drop).
    fn release_file(&self, _workflow: &str, _file: &str) -> Result<()> {
        Ok(())
    }

    // ---- webhook deliveries ----
    /// Remembers a verified delivery `id` of `workflow`'s webhook as `seen`, unless it is
    /// remembered already (and not past its `until` at `now`): then that earlier sighting
    /// is returned and nothing changes. Atomic, so of two copies racing in one wins.
    fn remember_delivery(
        &self,
        workflow: &str,
        id: &str,
        seen: &SeenDelivery,
        now: DateTime<Utc>,
    ) -> Result<Option<SeenDelivery>>;

    /// Forgets the deliveries whose `until` is before `now`; returns how many.
    fn forget_deliveries(&self, now: DateTime<Utc>) -> Result<usize>;

    /// The raw events of a case, in version order.
    fn case_events(&self, case: &str) -> Result<Vec<(u64, Vec<u8>)>>;

    /// Appends event `version` of a case only if that version is free (compare-and-swap):
    /// Ok(false) is a version conflict, someone else appended first. Flushed when Ok(true).
    fn append_case_event(&self, case: &str, version: u64, event: &[u8]) -> Result<bool>;

    /// Every case id with at least one event.
    fn case_ids(&self) -> Result<Vec<String>>;

    fn key(&self, workflow: &str, key: &str) -> Result<Option<KeyRecord>>;

    fn set_key(&self, workflow: &str, key: &str, run_id: &str, phase: KeyPhase) -> Result<()>;

    /// Frees a key so the next fire may run (failed, exhausted, stagnated, rejected, released).
    fn release_key(&self, workflow: &str, key: &str) -> Result<()>;

    /// Reserves a key for a live run, atomically: fails with the current record if taken.
    fn reserve_key(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<std::result::Result<(), KeyRecord>>;

    fn keys_in_doubt(&self) -> Result<Vec<KeyRecord>>;

    // ---- dead letter ----
    fn dead_letter(&self, run: &RunRecord) -> Result<()>;

    fn dead_letters(&self) -> Result<Vec<DeadLetter>>;

    fn dead_letter_entry(&self, run_id: &str) -> Result<Option<DeadLetter>>;

    fn remove_dead_letter(&self, run_id: &str) -> Result<bool>;

    // ---- review queue ----
    fn queue_review(&self, run_id: &str) -> Result<()>;

    fn in_review(&self, run_id: &str) -> Result<bool>;

    fn remove_review(&self, run_id: &str) -> Result<bool>;

    fn review_queue(&self) -> Result<Vec<String>>;

    // ---- go-live approvals ----
    fn approval(&self, workflow: &str) -> Result<Option<Approval>>;

    fn approve_go_live(&self, approval: &Approval) -> Result<()>;

    fn revoke_go_live(&self, workflow: &str) -> Result<bool>;

    // ---- pauses ----
    fn pause(&self, pause: &Pause) -> Result<()>;

    /// Lifts a pause; returns it, or None when the workflow was not paused.
    fn resume(&self, workflow: &str) -> Result<Option<Pause>>;

    fn paused(&self, workflow: &str) -> Result<Option<Pause>>;
}
