//! The dead-man's switch (`[expect]`): a schedule's successful run is due `within` of
//! each slot, a file or queue workflow's `at_least` so many per period. The daemon looks
//! once at start-up — so a machine that was off reports on boot — and then every second;
//! a slot overdue (steward down, a run stuck, a trigger starved) raises one `overdue`
//! alert. Every ten seconds it also raises `too_often` when a schedule's workflow ran far
//! more often in the last hour than its slots allow (when a channel wants that event).
//!
//! Each look costs a few reads of the run index per workflow with `[expect]`, each
//! bounded by what it needs to know (the successes it counts up to, not every run), and
//! nothing for a workflow without it.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};

use crate::alert::{Alert, Event};
use crate::config::{Config, Trigger, Workflow};
use crate::governed::{Engine, Result};
use crate::store::{RunQuery, RunState};

/// How often the daemon looks.
pub const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Seconds between two looks at a workflow's firing rate (`too_often`).
const RATE_EVERY: i64 = 10;

/// More runs in an hour than this many times the slots (plus a few) is "far more often".
const TOO_OFTEN_FACTOR: usize = 3;

/// Records when a daemon first loaded each workflow of `config` with this state folder
/// (at start-up and after every config swap); the switch judges nothing before it. A
/// workflow that already has records or a fired slot (a store from before this date was
/// kept) counts as loaded since ever, as it was judged then.
pub fn note_loaded(engine: &Engine, config: &Config, now: DateTime<Utc>) {
    for id in config.workflows.keys() {
        let note = || -> Result<()> {
            if engine.store.first_loaded(id)?.is_some() {
                return Ok(());
            }
            let known =
                engine.store.last_slot(id)?.is_some() || runs(engine, id, None, None, None, 1)? > 0;
            let at = if known { DateTime::UNIX_EPOCH } else { now };
            engine.store.set_first_loaded(id, at)?;
            Ok(())
        };
        if let Err(e) = note() {
            tracing::error!(workflow = %id, "cannot record when the workflow was first loaded: {e}");
        }
    }
}

/// What the switch already alerted about, so each lapse is told once — across a restart
/// too: what it told is kept in the store's `owed` tree (`expect/KIND/WORKFLOW`).
#[derive(Default)]
pub struct Watch {
    overdue_slot: HashMap<String, DateTime<Utc>>,
    at_least_told: HashMap<String, DateTime<Utc>>,
    rate_looked: HashMap<String, DateTime<Utc>>,
    too_often_told: HashMap<String, DateTime<Utc>>,
}

/// The kinds of lapse the switch remembers telling, as the store keys them.
const OVERDUE: &str = "expect/overdue/";
const AT_LEAST: &str = "expect/at_least/";
const TOO_OFTEN: &str = "expect/too_often/";

impl Watch {
    /// A watch that remembers what an earlier daemon on this state folder told.
    pub fn load(engine: &Engine) -> Watch {
        let read = |prefix: &str| -> HashMap<String, DateTime<Utc>> {
            engine
                .store
                .owed(prefix)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(k, v)| {
                    let at = serde_json::from_slice(&v).ok()?;
                    Some((k.strip_prefix(prefix)?.to_string(), at))
                })
                .collect()
        };
        Watch {
            overdue_slot: read(OVERDUE),
            at_least_told: read(AT_LEAST),
            rate_looked: HashMap::new(),
            too_often_told: read(TOO_OFTEN),
        }
    }

    /// Whether to tell `what` for `workflow` now: unless the store says it was told
    /// already (`told_already` judges the time kept — by an earlier daemon on this state
    /// folder, or by another daemon of the cluster), `at` is kept and this daemon tells
    /// it. Of two daemons deciding at once, one tells.
    fn tell(
        map: &mut HashMap<String, DateTime<Utc>>,
        engine: &Engine,
        what: &str,
        workflow: &str,
        at: DateTime<Utc>,
        told_already: impl Fn(DateTime<Utc>) -> bool,
    ) -> bool {
        let key = format!("{what}{workflow}");
        let kept =
            |bytes: Option<&[u8]>| -> Option<DateTime<Utc>> { serde_json::from_slice(bytes?).ok() };
        let decided = engine.store.update_owed(&key, &|now| {
            if kept(now).is_some_and(&told_already) {
                None
            } else {
                serde_json::to_vec(&at).ok()
            }
        });
        match decided {
            Ok(true) => {
                map.insert(workflow.to_string(), at);
                true
            }
            Ok(false) => {
                // Told elsewhere: remember when, so the next looks need not ask.
                let elsewhere = engine
                    .store
                    .owed(&key)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|(k, _)| *k == key)
                    .and_then(|(_, v)| kept(Some(&v)));
                map.insert(workflow.to_string(), elsewhere.unwrap_or(at));
                false
            }
            Err(e) => {
                // Better told twice than not at all.
                tracing::error!(workflow, "cannot keep what the dead-man's switch told: {e}");
                map.insert(workflow.to_string(), at);
                true
            }
        }
    }

    /// One look at every workflow with `[expect]` (and every schedule, for `too_often`).
    pub fn check(&mut self, engine: &Engine, config: &Config, now: DateTime<Utc>) {
        let rates = engine.alerts.wants(Event::TooOften);
        for wf in config.workflows.values() {
            let rate = rates && self.rate_due(wf, now);
            if wf.expect.is_none() && !rate {
                continue;
            }
            if let Err(e) = self.check_one(engine, wf, rate, now) {
                tracing::error!(workflow = %wf.id, "cannot check when a run is due: {e}");
            }
        }
    }

    /// Whether a schedule's firing rate is due for a look (every [`RATE_EVERY`] seconds).
    fn rate_due(&mut self, wf: &Workflow, now: DateTime<Utc>) -> bool {
        if !matches!(wf.trigger, Trigger::Schedule(_)) {
            return false;
        }
        let last = self.rate_looked.get(&wf.id);
        if last.is_some_and(|t| now - *t < Duration::seconds(RATE_EVERY)) {
            return false;
        }
        self.rate_looked.insert(wf.id.clone(), now);
        true
    }

    fn check_one(
        &mut self,
        engine: &Engine,
        wf: &Workflow,
        rate: bool,
        now: DateTime<Utc>,
    ) -> Result<()> {
        // A paused workflow is not expected to run: its pause was alerted or chosen.
        if engine.pause_of(&wf.id)?.is_some() {
            return Ok(());
        }
        let expect = wf.expect.as_ref();
        // Nothing is due before the workflow was first loaded here (a first start, a
        // workflow just added); not yet noted means it is being loaded right now.
        let loaded = engine.store.first_loaded(&wf.id)?.unwrap_or(now);
        if let Some(within) = expect.and_then(|e| e.within) {
            self.within(engine, wf, within, loaded, now)?;
        }
        if let Some((count, period)) = expect.and_then(|e| e.at_least) {
            self.at_least(engine, wf, count, period, loaded, now)?;
        }
        if rate {
            self.too_often(engine, wf, now)?;
        }
        Ok(())
    }

    /// `within`: the newest slot whose time is up must have a successful run since.
    fn within(
        &mut self,
        engine: &Engine,
        wf: &Workflow,
        within: std::time::Duration,
        loaded: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let Some(sched) = wf.schedule() else {
            return Ok(());
        };
        let grace = Duration::from_std(within).unwrap_or(Duration::days(1));
        let Some(slot) = sched.last_at_or_before(now - grace) else {
            return Ok(());
        };
        if slot < loaded {
            return Ok(());
        }
        if self.overdue_slot.get(&wf.id) == Some(&slot) || successes(engine, &wf.id, slot, 1)? > 0 {
            return Ok(());
        }
        if !Self::tell(&mut self.overdue_slot, engine, OVERDUE, &wf.id, slot, |t| {
            t == slot
        }) {
            return Ok(());
        }
        engine.alerts.raise(Alert::new(
            Event::Overdue,
            &wf.id,
            format!(
                "no run ended successfully within {} of the slot at {} (steward down, a run stuck, or its trigger starved) — `steward why {}`",
                humantime::format_duration(within),
                sched.local(slot),
                wf.id
            ),
        ));
        Ok(())
    }

    /// `at_least`: `count` successful runs in every `period` (judged once the workflow
    /// was loaded a whole period ago); told once per period.
    fn at_least(
        &mut self,
        engine: &Engine,
        wf: &Workflow,
        count: u32,
        period: std::time::Duration,
        loaded: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let from = now - Duration::from_std(period).unwrap_or(Duration::days(1));
        if loaded > from || self.at_least_told.get(&wf.id).is_some_and(|t| *t > from) {
            return Ok(());
        }
        let ok = successes(engine, &wf.id, from, count as usize)?;
        if ok >= count as usize {
            return Ok(());
        }
        if !Self::tell(
            &mut self.at_least_told,
            engine,
            AT_LEAST,
            &wf.id,
            now,
            |t| t > from,
        ) {
            return Ok(());
        }
        engine.alerts.raise(Alert::new(
            Event::Overdue,
            &wf.id,
            format!(
                "{ok} successful run(s) in the last {}, expected at least {count}",
                humantime::format_duration(period)
            ),
        ));
        Ok(())
    }

    /// `too_often`: more runs in the last hour than its schedule's slots allow, told at
    /// most once an hour.
    fn too_often(&mut self, engine: &Engine, wf: &Workflow, now: DateTime<Utc>) -> Result<()> {
        let Some(sched) = wf.schedule() else {
            return Ok(());
        };
        let from = now - Duration::hours(1);
        if self.too_often_told.get(&wf.id).is_some_and(|t| *t > from) {
            return Ok(());
        }
        let slots = sched.fires_between(from, now).len();
        let allowed = slots * TOO_OFTEN_FACTOR + 3;
        let ran = runs(engine, &wf.id, None, Some(from), None, allowed + 1)?;
        // Slots recorded `missed` at a start-up are not fires.
        let missed = || {
            runs(
                engine,
                &wf.id,
                Some(RunState::Missed),
                Some(from),
                None,
                ran,
            )
        };
        if ran <= allowed || ran - missed()? <= allowed {
            return Ok(());
        }
        if !Self::tell(
            &mut self.too_often_told,
            engine,
            TOO_OFTEN,
            &wf.id,
            now,
            |t| t > from,
        ) {
            return Ok(());
        }
        engine.alerts.raise(Alert::new(
            Event::TooOften,
            &wf.id,
            format!(
                "more than {allowed} runs in the last hour, where its schedule has {slots} slot(s): something fires it outside its schedule"
            ),
        ));
        Ok(())
    }
}

/// Runs of `workflow` (in `state`, if given) started in `[since, until)`, counted up to
/// `limit`.
fn runs(
    engine: &Engine,
    workflow: &str,
    state: Option<RunState>,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    limit: usize,
) -> Result<usize> {
    Ok(engine
        .store
        .run_page(&RunQuery {
            workflow: Some(workflow.to_string()),
            state,
            since,
            until,
            limit,
            ..Default::default()
        })?
        .len())
}

/// Successful runs (`success`, `clean-no-op`) of `workflow` started since `since`,
/// counted up to `enough`.
fn successes(
    engine: &Engine,
    workflow: &str,
    since: DateTime<Utc>,
    enough: usize,
) -> Result<usize> {
    let mut n = 0;
    for state in [RunState::Success, RunState::CleanNoOp] {
        n += engine
            .store
            .run_page(&RunQuery {
                workflow: Some(workflow.to_string()),
                state: Some(state),
                since: Some(since),
                limit: enough - n.min(enough),
                ..Default::default()
            })?
            .len();
        if n >= enough {
            break;
        }
    }
    Ok(n)
}
