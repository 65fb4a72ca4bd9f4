//! The daemon's trigger tasks: one per triggered workflow, started, kept or stopped as the
//! config changes, plus the catch-up of missed schedules and the drain of queue markers
//! at start-up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use serde_json::json;
use tokio_cron_scheduler::JobScheduler;
use tokio_util::sync::CancellationToken;

use super::shared::Shared;
use super::task::Task;
use crate::catchup;
use crate::cluster::slots::Claim;
use crate::config::{Trigger, Workflow};
use crate::governed::Fire;
use crate::store::RunState;
use crate::trigger::{file, queue, schedule, webhook};

pub struct Triggers {
    shared: Arc<Shared>,
    scheduler: JobScheduler,
    tasks: HashMap<String, Task>,
    routes: webhook::Routes,
    webhook_server: Option<Task>,
    /// Per job with a catch-up run: opened once that run is handed to the dispatcher,
    /// so the job's schedule cannot take a new fire before its catch-up ("drain first").
    gates: HashMap<String, CancellationToken>,
    /// The daemon's own case drives, waited for at shutdown so a turn whose member run
    /// was interrupted is recorded before the store's last flush.
    drives: tokio_util::task::TaskTracker,
}

/// Identifies a trigger task: the workflow and its trigger's definition. A reload that
/// leaves both unchanged keeps the task (and whatever run it is waiting on).
fn key(wf: &Workflow) -> String {
    format!(
        "{}|{}",
        wf.id,
        serde_json::to_string(&wf.trigger).unwrap_or_default()
    )
}

/// Advances each open case of `agency` until it stops (bounded by its turn limit).
async fn drive_agency(shared: &Arc<Shared>, agency: &str) {
    let config = shared.config();
    let engine = &shared.engine;
    let runner = &shared.runner;
    let ids = match engine.store.case_ids() {
        Ok(ids) => ids,
        Err(e) => {
            tracing::error!(agency, "cannot list cases: {e}");
            return;
        }
    };
    for id in ids {
        let Ok(Some((case, _))) = crate::agency::load(engine, &id) else {
            continue;
        };
        if case.agency.id != agency || !matches!(case.status, crate::agency::CaseStatus::Open) {
            continue;
        }
        for _ in 0..=case.agency.limits.max_turns {
            if !runner.accepting() {
                return;
            }
            match crate::agency::advance(runner, &config, &id, "daemon", None, true).await {
                Ok(t) if t.status == crate::agency::TurnStatus::Advanced => continue,
                Ok(t) => {
                    tracing::info!(agency, case = %id, status = %t.status, "case stopped: {}", t.reason.unwrap_or_default());
                    break;
                }
                Err(e) => {
                    tracing::warn!(agency, case = %id, "advance: {e}");
                    break;
                }
            }
        }
    }
}

/// What a queue or file task calls per fire: runs it and resolves to its record.
fn submitter(
    shared: Arc<Shared>,
    id: String,
) -> impl Fn(
    Fire,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Option<crate::store::RunRecord>> + Send>,
> {
    move |fire: Fire| {
        let shared = shared.clone();
        let id = id.clone();
        Box::pin(async move {
            let rec = shared.fire(&id, fire).await;
            // Skipped by overlap: the item is still there. Wait for the run in the way to
            // end before the task offers it again, so the skip is recorded once, not once
            // per retry.
            if rec.as_ref().is_some_and(|r| r.state == RunState::Skipped) {
                shared.runner.idle(&id).await;
                // Paused: the item waits for the resume, recorded skipped once, not once
                // per retry (until the daemon stops taking work).
                while shared.runner.accepting()
                    && matches!(shared.engine.pause_of(&id), Ok(Some(_)))
                {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
            rec
        })
    }
}

/// In a cluster, how many times an item is handed out before it is dead-lettered (a
/// daemon killed with it, each time).
const QUEUE_ATTEMPTS: u32 = 5;

/// Whether this daemon fires `workflow`'s `slot`: always alone; in a cluster, when it
/// claimed the slot (another daemon fires it otherwise). A store it cannot reach fires
/// nothing: the slot is told missed, as when the daemon was down.
async fn claimed(shared: &Shared, workflow: &str, slot: DateTime<Utc>) -> Option<Option<Claim>> {
    let Some(member) = &shared.member else {
        return Some(None);
    };
    match member.claim_slot(workflow, slot).await {
        Ok(Some(claim)) => Some(Some(claim)),
        Ok(None) => {
            tracing::debug!(workflow, %slot, "cluster: another daemon claimed this slot");
            None
        }
        Err(e) => {
            tracing::warn!(workflow, %slot, "cluster: cannot claim the slot ({e}); not firing it");
            None
        }
    }
}

/// After a claimed slot's run: the slot is finished, unless the run was cut short by a
/// stop (then another daemon takes it over and runs it, once this one is gone).
async fn finished(shared: &Shared, claim: Option<Claim>, rec: Option<&crate::store::RunRecord>) {
    let (Some(member), Some(claim)) = (&shared.member, claim) else {
        return;
    };
    if rec.is_some_and(|r| r.state != RunState::Interrupted) {
        member.finish_slot(claim).await;
    }
}

/// Runs a slot taken over from a gone daemon (see [`crate::cluster::slots`]).
pub(super) async fn run_taken_over(shared: Arc<Shared>, taken: crate::cluster::member::TakenSlot) {
    let fire = Fire::new(
        "schedule",
        Some(taken.slot),
        json!({ "taken_over_from": taken.from }),
    );
    let rec = shared.fire(&taken.workflow, fire).await;
    finished(&shared, Some(taken.claim), rec.as_ref()).await;
}

impl Triggers {
    pub async fn start(shared: Arc<Shared>) -> Result<Triggers> {
        let scheduler = JobScheduler::new()
            .await
            .context("cannot create the cron scheduler")?;
        scheduler
            .start()
            .await
            .context("cannot start the cron scheduler")?;
        Ok(Triggers {
            shared,
            scheduler,
            tasks: HashMap::new(),
            routes: Default::default(),
            webhook_server: None,
            gates: HashMap::new(),
            drives: tokio_util::task::TaskTracker::new(),
        })
    }

    /// Starts tasks for new or changed triggers and stops those no longer configured.
    pub async fn reconcile(&mut self) {
        let config = self.shared.config();
        self.shared.config_swapped(&config);
        crate::expect::note_loaded(&self.shared.engine, &config, Utc::now());
        crate::chain::note_followers(&self.shared.engine.store, &config, Utc::now());
        let wanted: HashMap<String, &Workflow> = config
            .workflows
            .values()
            .filter(|w| w.trigger != Trigger::Manual)
            .map(|w| (key(w), w))
            .collect();
        self.tasks.retain(|k, t| {
            let keep = wanted.contains_key(k) || k.starts_with("agency|");
            if !keep {
                t.cancel.cancel();
            }
            keep
        });
        let mut routes = HashMap::new();
        for (k, wf) in &wanted {
            if let Trigger::Webhook(w) = &wf.trigger {
                let secret = crate::secret::lookup(&w.secret_env)
                    .filter(|s| !s.is_empty())
                    .map(String::into_bytes);
                if secret.is_none() {
                    tracing::error!(workflow = %wf.id, "webhook secret {} is not set ({}): its endpoint answers 503", w.secret_env, crate::secret::where_to_set(&w.secret_env));
                }
                routes.insert(
                    w.path.clone(),
                    webhook::Route {
                        workflow: wf.id.clone(),
                        format: w.format,
                        secret,
                        max_body: w.max_body_bytes.unwrap_or(webhook::DEFAULT_MAX_BODY),
                    },
                );
                continue;
            }
            if !self.tasks.contains_key(k) {
                if let Some(task) = self.spawn(wf) {
                    self.tasks.insert(k.clone(), task);
                }
            }
        }
        // Agencies with a schedule: the daemon drives their open cases.
        for agency in config.agencies.values() {
            let Some(spec) = &agency.trigger.schedule else {
                continue;
            };
            let k = format!(
                "agency|{}|{}",
                agency.id,
                serde_json::to_string(spec).unwrap_or_default()
            );
            if !self.tasks.contains_key(&k) {
                if let Some(task) = self.spawn_agency_driver(&agency.id, spec) {
                    self.tasks.insert(k, task);
                }
            }
        }
        let agency_keys: std::collections::HashSet<String> = config
            .agencies
            .values()
            .filter_map(|a| {
                a.trigger.schedule.as_ref().map(|s| {
                    format!(
                        "agency|{}|{}",
                        a.id,
                        serde_json::to_string(s).unwrap_or_default()
                    )
                })
            })
            .collect();
        self.tasks.retain(|k, t| {
            let keep = !k.starts_with("agency|") || agency_keys.contains(k);
            if !keep {
                t.cancel.cancel();
            }
            keep
        });
        let any_webhook = !routes.is_empty();
        *self.routes.write().unwrap_or_else(|p| p.into_inner()) = routes;
        if any_webhook && self.webhook_server.is_none() {
            self.start_webhook_server(config.settings.webhook_listen.as_deref())
                .await;
        }
    }

    fn spawn(&self, wf: &Workflow) -> Option<Task> {
        let cancel = CancellationToken::new();
        let shared = self.shared.clone();
        let id = wf.id.clone();
        let handle = match &wf.trigger {
            Trigger::Schedule(_) => {
                let sched = wf.schedule()?;
                let store = shared.engine.store.clone();
                let last = match store.last_slot(&id) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::error!(workflow = %id, "cannot read the last fired slot: {e}; schedule not started");
                        return None;
                    }
                };
                // Written, not waited for: the slot's run starts at once, and the record
                // is on disk with the next flush (its run's commit flushes first).
                let persist: Arc<dyn Fn(DateTime<Utc>) -> bool + Send + Sync> = {
                    let id = id.clone();
                    Arc::new(move |slot| match store.set_last_slot(&id, slot) {
                        Ok(()) => true,
                        Err(e) => {
                            tracing::error!(workflow = %id, "cannot record the slot {slot} as fired: {e}; not firing it");
                            false
                        }
                    })
                };
                let on_fire: schedule::OnFire = {
                    let shared = shared.clone();
                    let id = id.clone();
                    Arc::new(move |slot| {
                        let shared = shared.clone();
                        let id = id.clone();
                        tokio::spawn(async move {
                            let Some(claim) = claimed(&shared, &id, slot).await else {
                                return;
                            };
                            let rec = shared
                                .fire(&id, Fire::new("schedule", Some(slot), json!({})))
                                .await;
                            finished(&shared, claim, rec.as_ref()).await;
                        });
                    })
                };
                let gate = self.gates.get(&id).cloned();
                let run = schedule::run(
                    self.scheduler.clone(),
                    sched,
                    last,
                    persist,
                    on_fire,
                    cancel.clone(),
                );
                tokio::spawn(async move {
                    if let Some(gate) = gate {
                        gate.cancelled().await;
                    }
                    run.await
                })
            }
            Trigger::Queue { queue: name } if shared.member.is_some() => {
                let member = shared.member.clone()?;
                let submit = submitter(shared.clone(), id.clone());
                let (owner, workflow) = (shared.clone(), id.clone());
                let given_up = move |fire, why| {
                    let recorded = owner
                        .workflow(&workflow)
                        .map(|wf| owner.engine.record_given_up(&wf, fire, why));
                    if let Some(Err(e)) = recorded {
                        tracing::error!(workflow = %workflow, "cannot record a queue item given up on: {e}");
                    }
                };
                tokio::spawn(crate::trigger::cluster_queue::run(
                    member,
                    name.clone(),
                    QUEUE_ATTEMPTS,
                    submit,
                    given_up,
                    cancel.clone(),
                ))
            }
            Trigger::Queue { queue: name } => {
                let wake = shared.queue_wake(name);
                let submit = submitter(shared.clone(), id.clone());
                tokio::spawn(queue::run(
                    shared.state_dir.clone(),
                    name.clone(),
                    wake,
                    submit,
                    cancel.clone(),
                ))
            }
            Trigger::File(f) => {
                let matcher = match globset::Glob::new(&f.pattern) {
                    Ok(g) => g.compile_matcher(),
                    Err(e) => {
                        tracing::error!(workflow = %id, "bad pattern: {e}");
                        return None;
                    }
                };
                let watch = file::FileWatch {
                    workflow: id.clone(),
                    dir: self.shared.config().base().join(&f.path),
                    matcher,
                    debounce: f
                        .debounce_ms
                        .map(Duration::from_millis)
                        .unwrap_or(file::DEFAULT_DEBOUNCE),
                    claims: Some(shared.engine.store.clone()),
                };
                let submit = submitter(shared.clone(), id.clone());
                tokio::spawn(file::run(
                    watch,
                    shared.state_dir.clone(),
                    submit,
                    cancel.clone(),
                ))
            }
            // A follower is fired by its upstream's end (`crate::chain`), not by a task.
            Trigger::Webhook(_) | Trigger::Manual | Trigger::After(_) => return None,
        };
        Some(Task { cancel, handle })
    }

    /// On each slot, advances every open case of the agency (running its members) until
    /// it stops: awaiting approval, needing input, resolved or failed.
    fn spawn_agency_driver(
        &self,
        agency: &str,
        spec: &crate::config::ScheduleTrigger,
    ) -> Option<Task> {
        let sched = schedule::Schedule::parse(spec).ok()?;
        let shared = self.shared.clone();
        let store = shared.engine.store.clone();
        let slot_key = format!("agency:{agency}");
        let last = store.last_slot(&slot_key).ok().flatten();
        let persist: Arc<dyn Fn(DateTime<Utc>) -> bool + Send + Sync> = Arc::new(move |slot| {
            // As a workflow's slot: on disk with the next flush, not waited for.
            store.set_last_slot(&slot_key, slot).is_ok()
        });
        let running = Arc::new(tokio::sync::Mutex::new(()));
        let id = agency.to_string();
        let drives = self.drives.clone();
        let on_fire: schedule::OnFire = Arc::new(move |_slot| {
            let shared = shared.clone();
            let id = id.clone();
            let running = running.clone();
            drives.spawn(async move {
                // One drive at a time per agency; a slot that finds one going is skipped.
                let Ok(_guard) = running.try_lock() else {
                    return;
                };
                drive_agency(&shared, &id).await;
            });
        });
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(schedule::run(
            self.scheduler.clone(),
            sched,
            last,
            persist,
            on_fire,
            cancel.clone(),
        ));
        Some(Task { cancel, handle })
    }

    async fn start_webhook_server(&mut self, listen: Option<&str>) {
        let addr = match webhook::listen_addr(listen) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!("{e}: webhooks disabled");
                return;
            }
        };
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("cannot listen for webhooks on {addr}: {e}");
                return;
            }
        };
        let bound = listener.local_addr().unwrap_or(addr);
        *self
            .shared
            .webhook_addr
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(bound);
        let _ = std::fs::write(
            self.shared.state_dir.join("webhook.addr"),
            format!("{bound}\n"),
        );
        tracing::info!("webhooks listening on http://{bound}");
        let shared = self.shared.clone();
        let submit: webhook::Submit = Arc::new(move |workflow: String, fire: Fire| {
            let shared = shared.clone();
            tokio::spawn(async move {
                shared.fire(&workflow, fire).await;
            });
        });
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(webhook::serve(
            listener,
            self.routes.clone(),
            submit,
            self.shared.engine.store.clone(),
            cancel.clone(),
        ));
        self.webhook_server = Some(Task { cancel, handle });
    }

    /// Stops every trigger (runs already started go on; the dispatcher decides their end).
    pub async fn stop_all(&mut self) {
        for (_, t) in self.tasks.drain() {
            t.cancel.cancel();
            // A task waiting on its run's end returns once the run is settled.
            drop(t.handle);
        }
        if let Some(w) = self.webhook_server.take() {
            w.cancel.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(2), w.handle).await;
        }
    }

    /// Waits (at most 30 s) for the daemon's case drives to record their last turn.
    pub async fn wait_for_drives(&self) {
        self.drives.close();
        if tokio::time::timeout(Duration::from_secs(30), self.drives.wait())
            .await
            .is_err()
        {
            tracing::error!("case drives did not finish within 30s of the runs' end");
        }
    }

    pub async fn shutdown_scheduler(&mut self) {
        if let Err(e) = self.scheduler.shutdown().await {
            tracing::warn!("cron scheduler shutdown: {e}");
        }
    }

    /// At start-up: record the fires missed while down, leave markers for them, and drain
    /// the marker queue (staggered) before new fires are taken.
    pub async fn catch_up_and_drain(&mut self) {
        let config = self.shared.config();
        let now = Utc::now();
        // Pauses lifted while no daemon ran: their catch-up, as a resume here would run it.
        for (id, _pause, slots) in catchup::resumed_while_down(&self.shared.engine, &config, now) {
            if let Some(wf) = self.shared.workflow(&id) {
                tracing::info!(workflow = %id, slots = slots.len(), "resumed while steward was not running: catching up what the pause skipped");
                self.shared.catch_up_slots(&wf, slots);
            }
        }
        let owed = match self.shared.member.clone() {
            None => catchup::missed_while_down(&self.shared.engine, &config, now),
            // In a cluster each missed slot is claimed like a fire: a slot another
            // daemon ran or handles is not missed here.
            Some(member) => {
                let claim = move |workflow: &str, slot: DateTime<Utc>| {
                    let cluster = member.cluster.clone();
                    let workflow = workflow.to_string();
                    let claimed = tokio::task::block_in_place(|| {
                        member
                            .bridge
                            .block(async move { cluster.claim_slot(&workflow, slot).await })
                    });
                    match claimed {
                        Ok(c) => c.is_some(),
                        Err(e) => {
                            tracing::warn!(
                                "cluster: cannot claim a missed slot ({e}); not handled here"
                            );
                            false
                        }
                    }
                };
                catchup::missed_while_down_claiming(&self.shared.engine, &config, now, &claim)
            }
        };
        // The same instant as the catch-up, so a marker it just wrote cannot expire.
        let plan = catchup::plan(&config, now);
        for (path, why) in &plan.kept {
            tracing::warn!(marker = %path.display(), "queue marker left in place: {why}");
        }
        for path in &plan.expired {
            tracing::info!(marker = %path.display(), "queue marker expired: deleted without running");
            let _ = std::fs::remove_file(path);
        }
        let stagger = catchup::stagger(&config);
        for (i, due) in plan.due.into_iter().chain(owed).enumerate() {
            let shared = self.shared.clone();
            let delay = stagger * i as u32;
            // The job's schedule waits for its catch-up to be handed over ("drain first").
            let gate = self.gates.entry(due.job.clone()).or_default().clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let Some(wf) = shared.workflow(&due.job) else {
                    gate.cancel();
                    return;
                };
                let outcome = catchup::run_due(&shared.runner, wf, &due, || gate.cancel()).await;
                if !matches!(&outcome, Ok(rec) if !catchup::left_undone(rec.state)) {
                    tracing::warn!(job = %due.job, "catch-up run did not finish: its markers stay for the next start");
                }
            });
        }
    }
}
