//! Catch-up: the fires missed while steward was down, and the drain of queue markers —
//! carried out in one place for the daemon (at start-up, staggered) and for
//! `steward drain` (one job after the other).
//!
//! At start-up each schedule's missed slots are recorded as `missed` runs; with
//! `catchup = "latest"` a marker is left for the newest one inside the window, with
//! `"all"` each slot in the window becomes a run of its own, with `"none"` nothing runs.
//! The drain then groups markers by job, runs the newest unexpired one and deletes it and
//! every older one once its run ended (a run that was interrupted or skipped keeps them
//! for next time); expired markers are deleted unrun; unreadable ones are kept.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::config::{Config, Workflow};
use crate::drain;
use crate::governed::{Engine, Fire};
use crate::live::Ask;
use crate::runner::{Job, Outcome, Runner};
use crate::schedule::Catchup;
use crate::store::RunState;

/// Missed fires recorded one by one at start-up; beyond this they are only counted.
const MAX_MISSED_RECORDS: usize = 100;

/// One run the catch-up owes: a job's slot, and the marker files its end settles.
#[derive(Debug, Clone, PartialEq)]
pub struct Due {
    pub job: String,
    pub slot: DateTime<Utc>,
    /// The marker that asked for the run, if one did.
    pub marker: Option<PathBuf>,
    /// Deleted once the run ended: the marker and the older ones of its job.
    pub files: Vec<PathBuf>,
}

/// What the drain found in the marker folder.
#[derive(Debug, Default)]
pub struct Drain {
    pub due: Vec<Due>,
    /// Past their job's expiry: deleted without running.
    pub expired: Vec<PathBuf>,
    /// Left in place, with why (unreadable, unknown job).
    pub kept: Vec<(PathBuf, String)>,
}

/// Plans the drain of `config`'s marker folder as of `now`.
pub fn plan(config: &Config, now: DateTime<Utc>) -> Drain {
    let dir = drain::marker_dir(&config.vault());
    let (markers, bad) = drain::scan(&dir);
    let mut kept: Vec<(PathBuf, String)> = bad
        .into_iter()
        .map(|(path, why)| (path, why.to_string()))
        .collect();
    let windows = drain::windows(config, now);
    let plan = drain::plan(markers, |job| windows.get(job).copied(), now);
    kept.extend(plan.left);
    let due = plan
        .run
        .into_iter()
        .map(|(m, older)| {
            let mut files = older;
            files.push(m.path.clone());
            Due {
                job: m.job,
                slot: m.scheduled_for,
                marker: Some(m.path),
                files,
            }
        })
        .collect();
    Drain {
        due,
        expired: plan.expired,
        kept,
    }
}

/// At start-up: records the fires each schedule missed while steward was down, leaves
/// markers for them (`latest`), and returns the runs `catchup = "all"` owes.
pub fn missed_while_down(engine: &Engine, config: &Config, now: DateTime<Utc>) -> Vec<Due> {
    missed_while_down_claiming(engine, config, now, &|_, _| true)
}

/// [`missed_while_down`] where a missed slot is this daemon's to handle only if `claim`
/// gives it (a cluster: a slot another daemon ran, or is handling, is not missed here, so
/// the catch-up of a whole cluster's outage is planned once). Only the newest
/// [`MAX_MISSED_RECORDS`] slots are claimed; older ones are counted.
pub fn missed_while_down_claiming(
    engine: &Engine,
    config: &Config,
    now: DateTime<Utc>,
    claim: &dyn Fn(&str, DateTime<Utc>) -> bool,
) -> Vec<Due> {
    let marker_dir = drain::marker_dir(&config.vault());
    let mut owed = Vec::new();
    for wf in config.workflows.values() {
        let Some(sched) = wf.schedule() else {
            continue;
        };
        let last = match engine.store.last_slot(&wf.id) {
            Ok(Some(l)) => l,
            Ok(None) => continue, // never fired: nothing can have been missed
            Err(e) => {
                tracing::error!(workflow = %wf.id, "cannot read the last fired slot: {e}");
                continue;
            }
        };
        // A slot whose jittered fire is still ahead is not missed: the schedule's task
        // fires it at its time.
        let passed: Vec<DateTime<Utc>> = sched
            .fires_between(last, now)
            .into_iter()
            .filter(|s| sched.fire_at(*s) <= now)
            .collect();
        let newest_first = passed.len().saturating_sub(MAX_MISSED_RECORDS);
        let missed: Vec<DateTime<Utc>> = passed
            .iter()
            .enumerate()
            .filter(|(i, s)| *i < newest_first || claim(&wf.id, **s))
            .map(|(_, s)| *s)
            .collect();
        if missed.len() < passed.len() {
            tracing::info!(workflow = %wf.id, "{} slot(s) passed while this daemon was down were run or handled by another daemon of the cluster", passed.len() - missed.len());
        }
        if missed.is_empty() {
            if let Some(&newest) = passed.last() {
                if let Err(e) = engine.store.set_last_slot(&wf.id, newest) {
                    tracing::error!(workflow = %wf.id, "cannot record the passed slots as handled: {e}");
                }
            }
        }
        let Some(&newest) = missed.last() else {
            continue;
        };
        let window = sched.window(now);
        let fresh: Vec<DateTime<Utc>> = missed
            .iter()
            .copied()
            .filter(|s| (now - *s).to_std().map_or(true, |age| age <= window))
            .collect();
        tracing::warn!(workflow = %wf.id, missed = missed.len(), within_window = fresh.len(), "fires missed while steward was down");
        // With `latest`, the one run for the newest slot in the window stands for the
        // older ones: they were coalesced into it (`steward why` says so).
        let runs_for = match sched.catchup {
            Catchup::Latest => fresh.last().copied(),
            _ => None,
        };
        record_missed(engine, wf, &missed, runs_for, |slot| sched.local(slot));
        engine.alerts.raise(crate::alert::Alert::new(
            crate::alert::Event::Missed,
            &wf.id,
            format!(
                "{} slot(s) passed while steward was not running, the newest at {}; catchup = {} {}",
                missed.len(),
                sched.local(newest),
                sched.catchup.name(),
                match (sched.catchup, fresh.is_empty()) {
                    (Catchup::None, _) => "runs none of them".to_string(),
                    (_, true) => "runs none: all are older than the catch-up window".to_string(),
                    (Catchup::Latest, false) => "runs the newest inside the window".to_string(),
                    (Catchup::All, false) => format!("runs the {} inside the window", fresh.len()),
                }
            ),
        ));
        match sched.catchup {
            Catchup::Latest => {
                if let Some(&slot) = fresh.last() {
                    let date = slot.with_timezone(&sched.tz).date_naive();
                    if let Err(e) = drain::write_marker(&marker_dir, &wf.id, date, slot) {
                        tracing::error!(workflow = %wf.id, "cannot write the catch-up marker: {e}");
                    }
                }
            }
            Catchup::All => owed.extend(fresh.iter().map(|&slot| Due {
                job: wf.id.clone(),
                slot,
                marker: None,
                files: Vec::new(),
            })),
            Catchup::None => {}
        }
        if let Err(e) = engine
            .store
            .set_last_slot(&wf.id, newest)
            .and_then(|_| engine.store.flush())
        {
            tracing::error!(workflow = %wf.id, "cannot record the missed slots as handled: {e}");
        }
    }
    owed
}

fn record_missed(
    engine: &Engine,
    wf: &Workflow,
    missed: &[DateTime<Utc>],
    runs_for: Option<DateTime<Utc>>,
    local: impl Fn(DateTime<Utc>) -> String,
) {
    for slot in missed.iter().rev().take(MAX_MISSED_RECORDS) {
        let mut fields = json!({ "missed": true });
        let mut why = format!("missed: steward was not running at {}", local(*slot));
        if let Some(run_slot) = runs_for.filter(|r| r > slot) {
            fields["coalesced_into"] = json!(run_slot.to_rfc3339());
            why.push_str(&format!(
                "; coalesced into the catch-up run for {}",
                local(run_slot)
            ));
        }
        let fire = Fire::new("schedule", Some(*slot), fields);
        if let Err(e) = engine.record_missed(wf, fire, why) {
            tracing::error!(workflow = %wf.id, "cannot record a missed fire: {e}");
        }
    }
}

/// Runs one owed job through the runner, calling `submitted` once the runner has it, and
/// deletes its marker files when the run ended (not when it was interrupted or skipped).
pub async fn run_due(
    runner: &Runner,
    wf: Arc<Workflow>,
    due: &Due,
    submitted: impl FnOnce(),
) -> Outcome {
    let mut fields = json!({ "catchup": true });
    if let Some(marker) = &due.marker {
        fields["marker"] = json!(marker);
    }
    let fire = Fire::new("schedule", Some(due.slot), fields);
    let done = runner.submit(Job::fire(wf, fire, Ask::Auto));
    submitted();
    let outcome = done
        .await
        .unwrap_or(Err(crate::runner::RunError::DroppedAtStop));
    if let Ok(rec) = &outcome {
        if !left_undone(rec.state) {
            for f in &due.files {
                let _ = std::fs::remove_file(f);
            }
        }
    }
    outcome
}

/// A run that did not do its job: its markers stay for next time.
pub fn left_undone(state: RunState) -> bool {
    matches!(state, RunState::Interrupted | RunState::Skipped)
}

/// The slots a schedule owes once its pause is lifted at `now`: those since the pause
/// began that its catch-up policy keeps (`latest`: the newest inside the window; `all`:
/// each inside it; `none`: nothing). They were recorded skipped while paused.
pub fn after_pause(wf: &Workflow, since: DateTime<Utc>, now: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let Some(sched) = wf.schedule() else {
        return Vec::new();
    };
    let window = sched.window(now);
    let fresh: Vec<DateTime<Utc>> = sched
        .fires_between(since, now)
        .into_iter()
        .filter(|s| (now - *s).to_std().map_or(true, |age| age <= window))
        .collect();
    match sched.catchup {
        Catchup::Latest => fresh.last().copied().into_iter().collect(),
        Catchup::All => fresh,
        Catchup::None => Vec::new(),
    }
}

/// Where a resume taken without a daemon is kept until the next start.
const RESUMED: &str = "resumed/";

/// A resume taken with no daemon running: kept (durably) so the next daemon to start
/// runs what the catch-up policy keeps of the slots skipped while paused.
pub fn owe_resume(engine: &Engine, pause: &crate::store::Pause) -> crate::governed::Result<()> {
    let bytes = serde_json::to_vec(pause).unwrap_or_default();
    engine
        .store
        .put_owed(&format!("{RESUMED}{}", pause.workflow), &bytes)?;
    engine.store.flush()?;
    Ok(())
}

/// At start-up: the pauses lifted while no daemon ran, each with the slots its catch-up
/// owes — those skipped while paused (recorded by the daemon that was running then, so
/// not after the last slot it handled; later ones are [`missed_while_down`]'s). Taken
/// out of the store as they are returned.
pub fn resumed_while_down(
    engine: &Engine,
    config: &Config,
    now: DateTime<Utc>,
) -> Vec<(String, crate::store::Pause, Vec<DateTime<Utc>>)> {
    let mut out = Vec::new();
    for (key, bytes) in engine.store.owed(RESUMED).unwrap_or_default() {
        let _ = engine.store.remove_owed(&key);
        let Ok(pause) = serde_json::from_slice::<crate::store::Pause>(&bytes) else {
            continue;
        };
        let Some(wf) = config.workflows.get(&pause.workflow) else {
            continue;
        };
        let last = engine.store.last_slot(&wf.id).ok().flatten();
        let slots: Vec<DateTime<Utc>> = after_pause(wf, pause.since, now)
            .into_iter()
            .filter(|s| last.is_none_or(|l| *s <= l))
            .collect();
        out.push((wf.id.clone(), pause, slots));
    }
    out
}

/// How far apart start-up catch-up runs start.
pub fn stagger(config: &Config) -> Duration {
    config
        .settings
        .catchup_stagger_s
        .map(|s| Duration::from_secs_f64(s.clamp(0.0, 3600.0)))
        .unwrap_or(Duration::from_secs(1))
}
