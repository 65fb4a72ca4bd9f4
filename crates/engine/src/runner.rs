//! The runner: the one road every governed run takes.
//!
//! Whatever asks for a run — a trigger, a catch-up or a drain, an operator's `steward run`
//! or `dead-letter retry` over the socket or in the CLI's own process, a review approval,
//! an agency case turn — hands a [`Job`] to [`Runner::submit`] and only describes what it
//! wants. The runner alone applies, in this order: the daemon is still taking work; the
//! workflow's overlap policy (`skip`, `buffer_one`, `buffer_all`, `cancel_other`,
//! `allow_all`; a fire not run is recorded `skipped`); a pause (a paused workflow's fire is
//! recorded `skipped` as it would start); the global cap on concurrent runs;
//! the live/dry decision ([`crate::live::decide`], forced dry-run included), taken when the
//! run starts; and the in-flight list `steward status` shows. After a run ends it hands
//! it to [`Engine::after_run`]: the breaker, the spend window, the alerts. On
//! shutdown it stops taking work, gives runs their grace, then cancels them: each run
//! kills its step's process group and cgroup and ends `interrupted` with a runlog `end`
//! line.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{oneshot, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::governed::{Engine, EngineError, Fire};
use crate::live::{self, Ask, DryReason, LiveRefused, Mode};
use crate::store::RunRecord;
use crate::workflow::{Overlap, Workflow};

/// One request for a run.
#[derive(Debug, Clone)]
pub struct Job {
    /// The workflow as the run should see it (an agency member's caps already narrowed).
    pub wf: Arc<Workflow>,
    pub work: Work,
}

/// What the job asks the runner to do.
#[derive(Debug, Clone)]
pub enum Work {
    /// A governed run from the start: maker, checker, commit.
    Fire { fire: Fire, ask: Ask },
    /// The commit of an escalated run an operator approved.
    Approve { run_id: String },
}

impl Job {
    pub fn fire(wf: Arc<Workflow>, fire: Fire, ask: Ask) -> Job {
        Job {
            wf,
            work: Work::Fire { fire, ask },
        }
    }

    pub fn approve(wf: Arc<Workflow>, run_id: &str) -> Job {
        Job {
            wf,
            work: Work::Approve {
                run_id: run_id.to_string(),
            },
        }
    }

    /// The id of the run this job carries out.
    fn run_id(&self) -> &str {
        match &self.work {
            Work::Fire { fire, .. } => &fire.run_id,
            Work::Approve { run_id } => run_id,
        }
    }
}

/// Why a job did not reach a terminal state of its own.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the daemon is stopping: no new runs")]
    Stopping,
    #[error("the daemon is stopping: the buffered fire was not run")]
    DroppedAtStop,
    #[error(transparent)]
    Live(#[from] LiveRefused),
    /// An approval the overlap policy could not start now; the run stays in review.
    #[error("{0}; the approval was not carried out and the run stays in the review queue")]
    Held(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub type Outcome = Result<RunRecord, RunError>;

/// A run holding its workflow's place (running, or waiting for the global cap).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InFlight {
    pub workflow: String,
    pub run_id: String,
    pub started_at: String,
}

/// A fire buffered behind an active run of its workflow.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Waiting {
    pub workflow: String,
    pub run_id: String,
}

struct Pending {
    job: Job,
    reply: oneshot::Sender<Outcome>,
}

struct Active {
    run_id: String,
    started_at: DateTime<Utc>,
    cancel: CancellationToken,
}

#[derive(Default)]
struct Slot {
    active: Vec<Active>,
    pending: VecDeque<Pending>,
}

struct Inner {
    engine: Engine,
    forced_dry_run: AtomicBool,
    accepting: AtomicBool,
    permits: Arc<Semaphore>,
    slots: Mutex<HashMap<String, Slot>>,
    tracker: TaskTracker,
    /// Parent of every run's token: cancelled when the shutdown grace runs out.
    stop_runs: CancellationToken,
    /// Woken whenever a run ends (for [`Runner::idle`]).
    ended: Notify,
}

/// A handle on the runner; clones share it.
#[derive(Clone)]
pub struct Runner {
    inner: Arc<Inner>,
}

impl Runner {
    pub fn new(engine: Engine, max_concurrent: usize) -> Runner {
        Runner {
            inner: Arc::new(Inner {
                engine,
                forced_dry_run: AtomicBool::new(false),
                accepting: AtomicBool::new(true),
                permits: Arc::new(Semaphore::new(max_concurrent.max(1))),
                slots: Mutex::new(HashMap::new()),
                tracker: TaskTracker::new(),
                stop_runs: CancellationToken::new(),
                ended: Notify::new(),
            }),
        }
    }

    pub fn set_forced_dry_run(&self, on: bool) {
        self.inner.forced_dry_run.store(on, Ordering::SeqCst);
    }

    pub fn forced_dry_run(&self) -> bool {
        self.inner.forced_dry_run.load(Ordering::SeqCst)
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// False once shutdown began: new jobs are refused.
    pub fn accepting(&self) -> bool {
        self.inner.accepting.load(Ordering::SeqCst)
    }

    /// Hands a job over; the receiver resolves when its run reached a terminal state (or
    /// was recorded skipped). An error says why nothing ran.
    pub fn submit(&self, job: Job) -> oneshot::Receiver<Outcome> {
        let (reply, rx) = oneshot::channel();
        if !self.accepting() {
            let _ = reply.send(Err(RunError::Stopping));
            return rx;
        }
        // An explicit --live the approval does not allow is refused before it waits.
        if let Work::Fire { ask: Ask::Live, .. } = job.work {
            if let Err(e) = self.decide(&job.wf, Ask::Live) {
                let _ = reply.send(Err(e));
                return rx;
            }
        }
        let p = Pending { job, reply };
        let mut slots = self.lock();
        let wf = p.job.wf.clone();
        let slot = slots.entry(wf.id.clone()).or_default();
        if slot.active.is_empty() {
            self.start(slot, p);
            return rx;
        }
        let busy = |slot: &Slot| {
            slot.active
                .iter()
                .map(|a| a.run_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match wf.overlap {
            Overlap::AllowAll => self.start(slot, p),
            Overlap::Skip => self.skip(
                p,
                format!("overlap = skip: run {} is still active", busy(slot)),
            ),
            Overlap::BufferOne if !slot.pending.is_empty() => self.skip(
                p,
                format!(
                    "overlap = buffer_one: run {} is active and one fire already waits",
                    busy(slot)
                ),
            ),
            Overlap::BufferOne | Overlap::BufferAll => slot.pending.push_back(p),
            Overlap::CancelOther => {
                for a in &slot.active {
                    a.cancel.cancel();
                }
                // Older waiting fires are superseded too.
                for old in slot.pending.drain(..) {
                    self.skip(
                        old,
                        "overlap = cancel_other: superseded by a newer fire".into(),
                    );
                }
                slot.pending.push_back(p);
            }
        }
        rx
    }

    /// Submits a job and waits for its outcome.
    pub async fn run(&self, job: Job) -> Outcome {
        self.submit(job)
            .await
            .unwrap_or(Err(RunError::DroppedAtStop))
    }

    /// Resolves once no run of `workflow` is in flight.
    pub async fn idle(&self, workflow: &str) {
        loop {
            let ended = self.inner.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self
                .lock()
                .get(workflow)
                .is_none_or(|s| s.active.is_empty())
            {
                return;
            }
            ended.await;
        }
    }

    /// Live or dry for a run of `wf` starting now.
    fn decide(&self, wf: &Workflow, ask: Ask) -> Result<Mode, RunError> {
        let status = self.inner.engine.live_status(wf)?;
        Ok(live::decide(&status, self.forced_dry_run(), ask, &wf.id)?)
    }

    /// A fire of a paused workflow, recorded skipped as it would have started; None when
    /// the job may run. An approval is the operator's own act and is not held back.
    fn paused(&self, job: &Job) -> Option<Outcome> {
        let Work::Fire { fire, .. } = &job.work else {
            return None;
        };
        let engine = &self.inner.engine;
        let why = match engine.pause_of(&job.wf.id) {
            Ok(None) => return None,
            Ok(Some(p)) => format!(
                "paused ({}); `steward resume {}` lifts it",
                crate::governed::pause::describe(&p),
                job.wf.id
            ),
            // Fail closed: a pause that cannot be read may be there.
            Err(e) => format!("cannot tell whether the workflow is paused: {e}"),
        };
        tracing::info!(workflow = %job.wf.id, "fire skipped: {why}");
        Some(
            engine
                .record_skipped(&job.wf, fire.clone(), why)
                .map_err(RunError::from),
        )
    }

    /// Carries out a job that holds its place and a permit.
    async fn carry_out(&self, job: Job, cancel: &CancellationToken) -> Outcome {
        let engine = &self.inner.engine;
        match job.work {
            Work::Fire { fire, ask } => {
                let mode = self.decide(&job.wf, ask)?;
                Ok(engine.execute(&job.wf, fire, &mode, cancel).await?)
            }
            Work::Approve { run_id } => {
                let rec = engine.review_item(&run_id)?;
                let mode = if rec.dry_run {
                    Mode::Dry(DryReason::RunWasDry)
                } else {
                    self.decide(&job.wf, Ask::Auto)?
                };
                Ok(engine.approve(&job.wf, &run_id, &mode, cancel).await?)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.inner.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn skip(&self, p: Pending, reason: String) {
        tracing::info!(workflow = %p.job.wf.id, "fire skipped: {reason}");
        let out = match p.job.work {
            Work::Fire { fire, .. } => self
                .inner
                .engine
                .record_skipped(&p.job.wf, fire, reason)
                .map_err(RunError::from),
            // The run under review keeps its record; the approval simply did not happen.
            Work::Approve { .. } => Err(RunError::Held(reason)),
        };
        let _ = p.reply.send(out);
    }

    fn start(&self, slot: &mut Slot, p: Pending) {
        let cancel = self.inner.stop_runs.child_token();
        let run_id = p.job.run_id().to_string();
        slot.active.push(Active {
            run_id: run_id.clone(),
            started_at: Utc::now(),
            cancel: cancel.clone(),
        });
        let this = self.clone();
        self.inner.tracker.spawn(async move {
            let Pending { job, reply } = p;
            let wf = job.wf.clone();
            let workflow = wf.id.clone();
            let outcome = match this.paused(&job) {
                Some(skipped) => skipped,
                None => match this.inner.permits.clone().acquire_owned().await {
                    Ok(_permit) => this.carry_out(job, &cancel).await,
                    Err(_) => Err(RunError::Stopping),
                },
            };
            match &outcome {
                Err(e) => {
                    tracing::warn!(workflow = %workflow, run = %run_id, "run not carried out: {e}")
                }
                // The breaker, the spend window and the alerts this end calls for.
                Ok(rec) => this.inner.engine.after_run(&wf, rec),
            }
            // Free the slot first: a submitter that fires again as soon as it hears the
            // outcome (a queue or file task) must not find its own finished run "active"
            // and be skipped by the overlap policy.
            this.finished(&workflow, &run_id);
            let _ = reply.send(outcome);
        });
    }

    /// A run ended: free its place and start the next buffered fire.
    fn finished(&self, workflow: &str, run_id: &str) {
        let mut slots = self.lock();
        let Some(slot) = slots.get_mut(workflow) else {
            return;
        };
        slot.active.retain(|a| a.run_id != run_id);
        if slot.active.is_empty() {
            if let Some(next) = slot.pending.pop_front() {
                if self.accepting() {
                    self.start(slot, next);
                } else {
                    let _ = next.reply.send(Err(RunError::DroppedAtStop));
                }
            }
        }
        drop(slots);
        self.inner.ended.notify_waiters();
    }

    /// Runs in flight, for `steward status`.
    pub fn in_flight(&self) -> Vec<InFlight> {
        let slots = self.lock();
        let mut out: Vec<InFlight> = slots
            .iter()
            .flat_map(|(wf, s)| {
                s.active.iter().map(move |a| InFlight {
                    workflow: wf.clone(),
                    run_id: a.run_id.clone(),
                    started_at: a.started_at.to_rfc3339(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        out
    }

    /// Fires buffered behind an active run (`buffer_one`, `buffer_all`, `cancel_other`).
    pub fn waiting(&self) -> Vec<Waiting> {
        let slots = self.lock();
        slots
            .iter()
            .flat_map(|(wf, s)| {
                s.pending.iter().map(move |p| Waiting {
                    workflow: wf.clone(),
                    run_id: p.job.run_id().to_string(),
                })
            })
            .collect()
    }

    /// Cancels every run in flight now (the CLI's own process on Ctrl-C or SIGTERM).
    pub fn cancel_all(&self) {
        self.inner.stop_runs.cancel();
    }

    /// Stops taking fires, lets runs finish within `grace`, then kills what is left
    /// (recorded `interrupted`). `now` cuts the grace short (a second SIGTERM).
    pub async fn shutdown(&self, grace: Duration, now: CancellationToken) {
        self.inner.accepting.store(false, Ordering::SeqCst);
        {
            let mut slots = self.lock();
            for slot in slots.values_mut() {
                for p in slot.pending.drain(..) {
                    let _ = p.reply.send(Err(RunError::DroppedAtStop));
                }
            }
        }
        self.inner.tracker.close();
        let in_flight = self.in_flight().len();
        if in_flight > 0 {
            tracing::info!(
                "waiting up to {:.1}s for {in_flight} run(s) in flight",
                grace.as_secs_f64()
            );
        }
        tokio::select! {
            _ = self.inner.tracker.wait() => return,
            _ = tokio::time::sleep(grace) => {
                tracing::warn!("grace period over: killing the runs still in flight");
            }
            _ = now.cancelled() => tracing::warn!("second stop signal: killing the runs in flight now"),
        }
        self.inner.stop_runs.cancel();
        // Each run now kills its group (SIGTERM, SIGKILL after its grace) and records itself.
        if tokio::time::timeout(Duration::from_secs(30), self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::error!("runs did not stop within 30s of being killed");
        }
    }
}
