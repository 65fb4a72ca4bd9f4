//! The dead-man's switch (`[expect]`): a schedule's successful run is due `within` of
//! each slot, a file or queue workflow's `at_least` so many per period. The daemon looks
//! once at start-up — so a machine that was off reports on boot — and then every few
//! seconds; a slot overdue (steward down, a run stuck, a trigger starved) raises one
//! `overdue` alert. It also raises `too_often` when a schedule's workflow ran far more
//! often in the last hour than its slots allow.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};

use crate::alert::{Alert, Event};
use crate::config::{Config, Trigger, Workflow};
use crate::governed::{Engine, Result};
use crate::store::{RunQuery, RunRecord, RunState};

/// How often the daemon looks.
pub const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs looked at per check at most.
const MAX_RECORDS: usize = 5_000;

/// More runs in an hour than this many times the slots (plus a few) is "far more often".
const TOO_OFTEN_FACTOR: usize = 3;

/// What the switch already alerted about, so each lapse is told once.
#[derive(Default)]
pub struct Watch {
    /// Started watching (the daemon's start): `at_least` is judged only over whole periods.
    pub since: Option<DateTime<Utc>>,
    overdue_slot: HashMap<String, DateTime<Utc>>,
    at_least_told: HashMap<String, DateTime<Utc>>,
    too_often_told: HashMap<String, DateTime<Utc>>,
}

impl Watch {
    pub fn new(now: DateTime<Utc>) -> Watch {
        Watch {
            since: Some(now),
            ..Default::default()
        }
    }

    /// One look at every workflow with `[expect]` (and every schedule, for `too_often`).
    pub fn check(&mut self, engine: &Engine, config: &Config, now: DateTime<Utc>) {
        for wf in config.workflows.values() {
            if let Err(e) = self.check_one(engine, wf, now) {
                tracing::error!(workflow = %wf.id, "cannot check when a run is due: {e}");
            }
        }
    }

    fn check_one(&mut self, engine: &Engine, wf: &Workflow, now: DateTime<Utc>) -> Result<()> {
        // A paused workflow is not expected to run: its pause was alerted or chosen.
        let expect = match engine.pause_of(&wf.id)? {
            Some(_) => None,
            None => wf.expect.as_ref(),
        };
        if let (Some(within), Some(sched)) = (expect.and_then(|e| e.within), wf.schedule()) {
            let within = Duration::from_std(within).unwrap_or(Duration::days(1));
            if let Some(slot) = sched.last_at_or_before(now - within) {
                let told = self.overdue_slot.get(&wf.id) == Some(&slot);
                if !told && !succeeded_since(engine, &wf.id, slot)? {
                    self.overdue_slot.insert(wf.id.clone(), slot);
                    engine.alerts.raise(Alert::new(
                        Event::Overdue,
                        &wf.id,
                        format!(
                            "no run ended successfully within {} of the slot at {} (steward down, a run stuck, or its trigger starved) — `steward why {}`",
                            humantime::format_duration(within.to_std().unwrap_or_default()),
                            sched.local(slot),
                            wf.id
                        ),
                    ));
                }
            }
        }
        if let Some((count, period)) = expect.and_then(|e| e.at_least) {
            let period = Duration::from_std(period).unwrap_or(Duration::days(1));
            let from = now - period;
            let watched =
                self.since.is_some_and(|s| s <= from) || has_runs_before(engine, &wf.id, from)?;
            let recent = self.at_least_told.get(&wf.id).is_some_and(|t| *t > from);
            if watched && !recent {
                let ok = successes(&records_since(engine, &wf.id, from)?);
                if ok < count as usize {
                    self.at_least_told.insert(wf.id.clone(), now);
                    engine.alerts.raise(Alert::new(
                        Event::Overdue,
                        &wf.id,
                        format!(
                            "{ok} successful run(s) in the last {}, expected at least {count}",
                            humantime::format_duration(period.to_std().unwrap_or_default())
                        ),
                    ));
                }
            }
        }
        if matches!(wf.trigger, Trigger::Schedule(_)) && engine.alerts.wants(Event::TooOften) {
            self.too_often(engine, wf, now)?;
        }
        Ok(())
    }

    fn too_often(&mut self, engine: &Engine, wf: &Workflow, now: DateTime<Utc>) -> Result<()> {
        let Some(sched) = wf.schedule() else {
            return Ok(());
        };
        let from = now - Duration::hours(1);
        if self.too_often_told.get(&wf.id).is_some_and(|t| *t > from) {
            return Ok(());
        }
        let allowed = sched.fires_between(from, now).len() * TOO_OFTEN_FACTOR + 3;
        let ran = records_since(engine, &wf.id, from)?
            .iter()
            .filter(|r| !matches!(r.state, RunState::Missed))
            .count();
        if ran > allowed {
            self.too_often_told.insert(wf.id.clone(), now);
            engine.alerts.raise(Alert::new(
                Event::TooOften,
                &wf.id,
                format!(
                    "{ran} runs in the last hour, where its schedule has {} slot(s): something fires it outside its schedule",
                    sched.fires_between(from, now).len()
                ),
            ));
        }
        Ok(())
    }
}

fn records_since(engine: &Engine, workflow: &str, from: DateTime<Utc>) -> Result<Vec<RunRecord>> {
    Ok(engine.store.run_page(&RunQuery {
        workflow: Some(workflow.to_string()),
        since: Some(from),
        limit: MAX_RECORDS,
        ..Default::default()
    })?)
}

fn successes(records: &[RunRecord]) -> usize {
    records
        .iter()
        .filter(|r| matches!(r.state, RunState::Success | RunState::CleanNoOp))
        .count()
}

/// Whether a run that started at or after `slot` ended successfully.
fn succeeded_since(engine: &Engine, workflow: &str, slot: DateTime<Utc>) -> Result<bool> {
    Ok(successes(&records_since(engine, workflow, slot)?) > 0)
}

fn has_runs_before(engine: &Engine, workflow: &str, t: DateTime<Utc>) -> Result<bool> {
    Ok(!engine
        .store
        .run_page(&RunQuery {
            workflow: Some(workflow.to_string()),
            until: Some(t),
            limit: 1,
            ..Default::default()
        })?
        .is_empty())
}
