//! The governed run: trigger → run (maker) → verify (checker) → commit, under the budget.
//!
//! Order of durable writes, so a crash at any point loses nothing and commits nothing
//! twice: the idempotency key is reserved and the run recorded `running` and flushed
//! *before* the maker starts; the key is marked `committing` and flushed *before* the
//! commit step starts; the key is marked `committed` and flushed *after* it. A crash leaves
//! a `running` record and a reserved or committing key, which [`Store::open`] turns into an
//! interrupted run and a key *in doubt*. A run that reserves no key does not wait for its
//! `running` record before the maker: it is on disk with the next flush, at the latest
//! the one before its commit.
//!
//! Commit runs only when the run is live (the runner decided so, see [`crate::live`])
//! **and** verify said `pass`. A dry-run never touches an idempotency key.
//!
//! The parts: `machine` (the run's phases, its one transition function and its one
//! terminal write), [`outcome`] (how a run ends, and how a step's outcome is read),
//! `steps` (one step, recorded), `env` (what steps get), `gateway` (a step's key to the
//! model gateway and how its calls are charged and recorded), `operator` (go-live, reject,
//! in-doubt), [`pause`] (pause, resume, the circuit breaker), `watch` (after each run: the
//! breaker, the spend window, and the alerts a run's end calls for).

mod end;
mod env;
mod gateway;
mod machine;
pub mod operator;
pub mod outcome;
pub mod pause;
mod steps;
mod watch;

use std::path::{Path, PathBuf};

use chrono::Utc;
use serde_json::{json, Value};

use crate::live::LiveStatus;
use crate::runlog::RunLog;
use crate::store::{RunRecord, Store, StoreError};
use crate::workflow::Workflow;
use env::StepEnv;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot write the runlog: {0}")]
    RunLog(#[from] std::io::Error),
    #[error("{0}")]
    Refused(String),
    /// A commit the go-live rules do not allow now (an approval under forced dry-run, or
    /// of a workflow no longer live).
    #[error("{0}")]
    NotLive(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;

/// What fired a run: its id (known before it starts, so the daemon can list it in
/// flight) and the trigger part of the context (`kind`, `fired_at`, …).
#[derive(Debug, Clone)]
pub struct Fire {
    pub run_id: String,
    pub trigger: Value,
    pub retry_of: Option<String>,
}

impl Fire {
    /// A fire of `kind` with the kind's own fields in `fields` (an object).
    pub fn new(kind: &str, scheduled_for: Option<chrono::DateTime<Utc>>, fields: Value) -> Fire {
        let mut trigger = json!({
            "kind": kind,
            "fired_at": now_rfc3339(),
            "scheduled_for": scheduled_for.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        });
        if let (Some(obj), Value::Object(extra)) = (trigger.as_object_mut(), fields) {
            obj.extend(extra);
        }
        Fire {
            run_id: new_run_id(),
            trigger,
            retry_of: None,
        }
    }

    /// A fire by the operator (`steward run`), with an optional JSON payload.
    pub fn manual(payload: Option<Value>) -> Fire {
        Fire::new(
            "manual",
            None,
            json!({ "payload": payload.unwrap_or(Value::Null) }),
        )
    }
}

pub fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The engine every governed run goes through (started only by the runner).
#[derive(Clone)]
pub struct Engine {
    pub store: Store,
    pub runlog: RunLog,
    pub state_dir: PathBuf,
    /// Counts every run that ends (served at the dashboard's `/metrics`).
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Where alerts go (the daemon's dispatcher; sends nothing by default).
    pub alerts: crate::alerts::Alerts,
    /// The model gateway that steps of workflows with `[gateway]` call (none: such steps
    /// fail to start, saying so).
    pub gateway: Option<std::sync::Arc<dyn crate::metering::ModelGateway>>,
    /// Told of every run's terminal record, once it is durable: the daemon's followers
    /// (`after` triggers) hear of their upstream's end through it. Must not block.
    pub ended: Option<RunEnded>,
    /// What a digest agent's run adds at its end (its email's fate and its summary line):
    /// the digest feature's, installed by whoever opens the engine for one.
    pub summarize: Option<std::sync::Arc<dyn Summarize>>,
    /// What starts each step's process: real processes, or a stand-in in tests.
    pub launcher: std::sync::Arc<dyn crate::step::Launcher>,
    /// Runs between their fire and their terminal record: a run's flush waits for the
    /// others to share it when there are several (see `crate::store::Backend::flush_among`).
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A hook told of each terminal run record.
pub type RunEnded = std::sync::Arc<dyn Fn(&RunRecord) + Send + Sync>;

/// What a digest agent's run adds before its terminal record (its steps 11 and 12).
pub trait Summarize: Send + Sync {
    /// Why its digest was not emailed, when its commit did not run.
    fn email_skipped(&self, rec: &RunRecord) -> Option<String>;
    /// Its one summary line.
    fn summary_line(&self, rec: &RunRecord) -> String;
}

impl Engine {
    pub fn live_status(&self, wf: &Workflow) -> Result<LiveStatus> {
        Ok(LiveStatus::of(&self.store, wf)?)
    }

    /// A digest agent's steps 11 (when its commit did not run) and 12, the summary line.
    fn agent_summary(&self, rec: &mut RunRecord, env: &StepEnv) -> Result<()> {
        let Some(summarize) = &self.summarize else {
            return Ok(());
        };
        if let Some(why) = summarize.email_skipped(rec) {
            let dry = why.starts_with("dry-run");
            let mut e = self.entry(rec, "maybe_email", if dry { "skipped" } else { "failed" });
            e.detail = why;
            self.runlog.record(&e, &env.redactor)?;
        }
        let line = summarize.summary_line(rec);
        let mut e = self.entry(rec, "emit_summary", "ok");
        e.detail = line.clone();
        self.runlog.record(&e, &env.redactor)?;
        rec.summary = Some(env.redactor.redact(&line).into_owned());
        Ok(())
    }
}

/// A run id that sorts by start time: `20261202T190512345-3fa2c1`.
pub fn new_run_id() -> String {
    let mut rand = [0u8; 3];
    // A failing OS random source is not worth failing a run over: the clock still orders.
    let _ = getrandom::fill(&mut rand);
    format!(
        "{}-{}",
        Utc::now().format("%Y%m%dT%H%M%S%3f"),
        hex::encode(rand)
    )
}

/// Opens the engine on a state folder (creating it), reporting crash recovery.
pub fn open(
    state_dir: &Path,
) -> std::result::Result<(Engine, crate::store::Recovery), EngineError> {
    std::fs::create_dir_all(state_dir)?;
    let (store, recovery) = Store::open(state_dir)?;
    Ok((with_store(store, state_dir)?, recovery))
}

/// The engine on `store`, its runlog and scratch folders under `state_dir`: with
/// [`crate::store::MemoryStore`] and a [`crate::step::TestLauncher`], the engine's rules
/// run in-process with nothing kept.
pub fn with_store(store: Store, state_dir: &Path) -> Result<Engine> {
    std::fs::create_dir_all(state_dir)?;
    Ok(Engine {
        store,
        runlog: RunLog::open(state_dir)?,
        state_dir: state_dir.to_path_buf(),
        metrics: Default::default(),
        alerts: Default::default(),
        gateway: None,
        ended: None,
        summarize: None,
        launcher: std::sync::Arc::new(crate::step::Processes),
        in_flight: Default::default(),
    })
}
