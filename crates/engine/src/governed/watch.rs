//! After each run ends, the workflow is looked at over time, not just this once: does
//! its breaker open, has its spend window (`[budget.window]`) been reached, and does how
//! the run ended call for an alert (`dead_letter`, `review_waiting`, `in_doubt`, the
//! first success after failures: `recovered`)? The runner calls [`Engine::after_run`]
//! for every run it carried out, whatever road it came by.

use chrono::Utc;

use super::{Engine, Result};
use crate::alerts::{Alert, Event};
use crate::budget::Figures;
use crate::store::{KeyPhase, PauseCause, RunQuery, RunRecord, RunState};
use crate::workflow::{SpendWindow, Workflow};

/// Run records read per page when summing a spend window.
const WINDOW_PAGE: usize = 500;

impl Engine {
    /// Everything that follows a run's end; errors are logged, never the run's.
    pub fn after_run(&self, wf: &Workflow, rec: &RunRecord) {
        if let Err(e) = self.watch(wf, rec) {
            tracing::error!(workflow = %wf.id, run = %rec.run_id, "cannot check the workflow after its run: {e}");
        }
    }

    fn watch(&self, wf: &Workflow, rec: &RunRecord) -> Result<()> {
        if matches!(rec.state, RunState::Skipped | RunState::Missed) {
            return Ok(());
        }
        let alerts = &self.alerts;
        if rec.state.dead_letters() {
            alerts.raise(
                Alert::new(
                    Event::DeadLetter,
                    &wf.id,
                    format!(
                        "run ended {}: {} — `steward dead-letter show {}`",
                        rec.state, rec.reason, rec.run_id
                    ),
                )
                .run(&rec.run_id),
            );
            if alerts.wants(Event::InDoubt) && self.key_in_doubt(rec)? {
                alerts.raise(
                    Alert::new(
                        Event::InDoubt,
                        &wf.id,
                        "its commit may or may not have happened: settle it with `steward in-doubt resolve`",
                    )
                    .run(&rec.run_id),
                );
            }
            if let Some(p) = self.check_breaker(wf)? {
                alerts.raise(Alert::new(
                    Event::BreakerOpen,
                    &wf.id,
                    format!(
                        "breaker open, workflow paused: {} — `steward resume {}` when it is fixed",
                        p.reason, wf.id
                    ),
                ));
            }
        }
        if rec.state == RunState::ApprovalRequired {
            alerts.raise(
                Alert::new(
                    Event::ReviewWaiting,
                    &wf.id,
                    format!(
                        "the checker escalated: {} — `steward approve {}` or `steward reject {}`",
                        rec.reason, rec.run_id, rec.run_id
                    ),
                )
                .run(&rec.run_id),
            );
        }
        if matches!(rec.state, RunState::Success | RunState::CleanNoOp)
            && alerts.wants(Event::Recovered)
            && self.after_failures(wf, rec)?
        {
            alerts.raise(
                Alert::new(
                    Event::Recovered,
                    &wf.id,
                    format!("ran {} again after failing", rec.state),
                )
                .run(&rec.run_id),
            );
        }
        if let Some(window) = &wf.spend_window {
            self.check_window(wf, window)?;
        }
        Ok(())
    }

    fn key_in_doubt(&self, rec: &RunRecord) -> Result<bool> {
        let Some(key) = &rec.idempotency_key else {
            return Ok(false);
        };
        Ok(self
            .store
            .key(&rec.workflow, key)?
            .is_some_and(|k| k.phase == KeyPhase::InDoubt && k.run_id == rec.run_id))
    }

    /// Whether the run before `rec` (skipped and missed fires passed over) failed.
    fn after_failures(&self, wf: &Workflow, rec: &RunRecord) -> Result<bool> {
        let before = self
            .store
            .recent_states(&wf.id, 50)?
            .into_iter()
            .filter(|(id, s)| {
                id != &rec.run_id && !matches!(s, RunState::Skipped | RunState::Missed)
            })
            .find(|(id, _)| id < &rec.run_id);
        Ok(before.is_some_and(|(_, s)| s.dead_letters()))
    }

    /// Pauses the workflow (reason `budget`) and alerts when its window's sums reach a limit.
    fn check_window(&self, wf: &Workflow, window: &SpendWindow) -> Result<()> {
        let spent = self.window_spend(&wf.id, window)?;
        let Some(reached) = spent.reached(window) else {
            return Ok(());
        };
        if self.store.paused(&wf.id)?.is_some() {
            return Ok(());
        }
        let period = humantime::format_duration(window.period);
        let reason = format!("{reached} in the last {period}");
        tracing::warn!(workflow = %wf.id, "spend window reached: {reason}; paused until an operator resumes it");
        self.set_pause(&wf.id, PauseCause::Budget, &reason)?;
        self.alerts.raise(Alert::new(
            Event::BudgetWindow,
            &wf.id,
            format!(
                "spend window reached, workflow paused: {reason} — `steward resume {}` to let it run again",
                wf.id
            ),
        ));
        Ok(())
    }

    /// The sums over the workflow's runs that started within the window, newest first,
    /// read until a limit is reached (all that is asked) or the window is done.
    fn window_spend(&self, workflow: &str, window: &SpendWindow) -> Result<WindowSpend> {
        let since = Utc::now()
            - chrono::Duration::from_std(window.period).unwrap_or(chrono::Duration::days(3650));
        let mut spend = WindowSpend::default();
        let mut before = None;
        loop {
            let page = self.store.run_page(&RunQuery {
                workflow: Some(workflow.to_string()),
                since: Some(since),
                before: before.take(),
                limit: WINDOW_PAGE,
                ..Default::default()
            })?;
            for rec in &page {
                spend.add(rec);
            }
            if spend.reached(window).is_some() {
                return Ok(spend);
            }
            match page.last() {
                Some(last) if page.len() == WINDOW_PAGE => before = Some(last.run_id.clone()),
                _ => return Ok(spend),
            }
        }
    }
}

/// What the runs of a window spent together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowSpend {
    pub runs: u64,
    pub tokens: u64,
    pub cost_usd: f64,
}

impl WindowSpend {
    fn add(&mut self, rec: &RunRecord) {
        if matches!(rec.state, RunState::Skipped | RunState::Missed) {
            return;
        }
        let spent = spent(rec);
        self.runs += 1;
        self.tokens += spent.tokens;
        self.cost_usd += spent.cost_usd;
    }

    /// The first limit the sums reached, in words; None while all are below.
    pub fn reached(&self, w: &SpendWindow) -> Option<String> {
        if let Some(cap) = w.cost_usd {
            if self.cost_usd + 1e-9 >= cap {
                return Some(format!("cost ${:.4} of ${cap:.4}", self.cost_usd));
            }
        }
        if let Some(cap) = w.tokens {
            if self.tokens >= cap {
                return Some(format!("{} tokens of {cap}", self.tokens));
            }
        }
        if let Some(cap) = w.runs {
            if self.runs >= cap {
                return Some(format!("{} runs of {cap}", self.runs));
            }
        }
        None
    }
}

/// What a run spent over all its attempts.
fn spent(rec: &RunRecord) -> Figures {
    if rec.attempts.is_empty() {
        return rec.figures.clone();
    }
    let mut total = Figures::default();
    for a in &rec.attempts {
        total.tokens += a.figures.tokens;
        total.cost_usd += a.figures.cost_usd;
    }
    total
}
