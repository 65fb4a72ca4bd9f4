//! The dispatcher: every fire of the daemon goes through here.
//!
//! It applies the workflow's overlap policy (what a fire does while the previous run is
//! still active: `skip`, `buffer_one`, `buffer_all`, `cancel_other`, `allow_all`; a fire
//! not run is recorded `skipped`), a global cap on concurrent runs, and the forced dry-run
//! of SIGUSR1; it knows which runs are in flight and stops them on shutdown: first a grace
//! period to finish, then their process groups are killed and they end `interrupted`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Overlap, Workflow};
use crate::governed::{Engine, Fire};
use crate::store::RunRecord;

/// How a run should decide live or dry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A trigger fired: live if the operator approved this config and no forced dry-run.
    Triggered,
    /// `steward run`: live only when asked (`--live`) and allowed.
    Manual { live: bool },
}

pub type Outcome = Result<RunRecord, String>;

struct Pending {
    wf: Arc<Workflow>,
    fire: Fire,
    mode: Mode,
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
}

#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

impl Dispatcher {
    pub fn new(engine: Engine, max_concurrent: usize) -> Dispatcher {
        Dispatcher {
            inner: Arc::new(Inner {
                engine,
                forced_dry_run: AtomicBool::new(false),
                accepting: AtomicBool::new(true),
                permits: Arc::new(Semaphore::new(max_concurrent.max(1))),
                slots: Mutex::new(HashMap::new()),
                tracker: TaskTracker::new(),
                stop_runs: CancellationToken::new(),
            }),
        }
    }

    pub fn set_forced_dry_run(&self, on: bool) {
        self.inner.forced_dry_run.store(on, Ordering::SeqCst);
    }

    pub fn forced_dry_run(&self) -> bool {
        self.inner.forced_dry_run.load(Ordering::SeqCst)
    }

    /// Hands a fire over; the receiver resolves when its run reached a terminal state (or
    /// was recorded skipped). An error says why nothing ran (the daemon is stopping, a
    /// live run was refused).
    pub fn submit(&self, wf: Arc<Workflow>, fire: Fire, mode: Mode) -> oneshot::Receiver<Outcome> {
        let (reply, rx) = oneshot::channel();
        if !self.inner.accepting.load(Ordering::SeqCst) {
            let _ = reply.send(Err("the daemon is stopping: no new runs".into()));
            return rx;
        }
        if mode == (Mode::Manual { live: true }) && self.forced_dry_run() {
            let _ = reply.send(Err(
                "forced dry-run is on (SIGUSR1): live runs are refused until SIGUSR2 lifts it"
                    .into(),
            ));
            return rx;
        }
        let p = Pending {
            wf,
            fire,
            mode,
            reply,
        };
        let mut slots = self.lock();
        let slot = slots.entry(p.wf.id.clone()).or_default();
        if slot.active.is_empty() || p.wf.overlap == Overlap::AllowAll {
            self.start(slot, p);
            return rx;
        }
        let busy = slot
            .active
            .iter()
            .map(|a| a.run_id.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        match p.wf.overlap {
            Overlap::Skip => self.skip(p, format!("overlap = skip: run {busy} is still active")),
            Overlap::BufferOne if !slot.pending.is_empty() => self.skip(
                p,
                format!("overlap = buffer_one: run {busy} is active and one fire already waits"),
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
            Overlap::AllowAll => unreachable!("handled above"),
        }
        rx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.inner.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn skip(&self, p: Pending, reason: String) {
        tracing::info!(workflow = %p.wf.id, "fire skipped: {reason}");
        let out = self
            .inner
            .engine
            .record_skipped(&p.wf, p.fire, reason)
            .map_err(|e| e.to_string());
        let _ = p.reply.send(out);
    }

    fn start(&self, slot: &mut Slot, p: Pending) {
        let cancel = self.inner.stop_runs.child_token();
        let run_id = p.fire.run_id.clone();
        slot.active.push(Active {
            run_id: run_id.clone(),
            started_at: Utc::now(),
            cancel: cancel.clone(),
        });
        let this = self.clone();
        self.inner.tracker.spawn(async move {
            let Pending { wf, fire, mode, reply } = p;
            let outcome = async {
                let _permit = this.inner.permits.clone().acquire_owned().await.map_err(|e| e.to_string())?;
                let engine = &this.inner.engine;
                let live = match mode {
                    Mode::Manual { live } => live,
                    Mode::Triggered => !this.forced_dry_run() && engine.live_status(&wf).map_err(|e| e.to_string())?.is_live(),
                };
                engine.execute_until(&wf, fire, live, &cancel).await.map_err(|e| e.to_string())
            }
            .await;
            if let Err(e) = &outcome {
                tracing::error!(workflow = %wf.id, run = %run_id, "run could not be carried out: {e}");
            }
            // Free the slot first: a submitter that fires again as soon as it hears the
            // outcome (a queue or file task) must not find its own finished run "active"
            // and be skipped by the overlap policy.
            this.finished(&wf.id, &run_id);
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
                if self.inner.accepting.load(Ordering::SeqCst) {
                    self.start(slot, next);
                } else {
                    let _ = next
                        .reply
                        .send(Err("the daemon is stopping: buffered fire not run".into()));
                }
            }
        }
    }

    /// Runs in flight, for `steward status`.
    pub fn in_flight(&self) -> Vec<Value> {
        let slots = self.lock();
        let mut out: Vec<Value> = slots
            .iter()
            .flat_map(|(wf, s)| s.active.iter().map(move |a| json!({ "workflow": wf, "run_id": a.run_id, "started_at": a.started_at.to_rfc3339() })))
            .collect();
        out.sort_by(|a, b| a["run_id"].as_str().cmp(&b["run_id"].as_str()));
        out
    }

    /// Fires buffered behind an active run (`buffer_one`, `buffer_all`, `cancel_other`).
    pub fn waiting(&self) -> Vec<Value> {
        let slots = self.lock();
        slots
            .iter()
            .flat_map(|(wf, s)| {
                s.pending
                    .iter()
                    .map(move |p| json!({ "workflow": wf, "run_id": p.fire.run_id }))
            })
            .collect()
    }

    /// Stops taking fires, lets runs finish within `grace`, then kills what is left
    /// (recorded `interrupted`). `now` cuts the grace short (a second SIGTERM).
    pub async fn shutdown(&self, grace: Duration, now: CancellationToken) {
        self.inner.accepting.store(false, Ordering::SeqCst);
        {
            let mut slots = self.lock();
            for slot in slots.values_mut() {
                for p in slot.pending.drain(..) {
                    let _ = p
                        .reply
                        .send(Err("the daemon is stopping: buffered fire not run".into()));
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
