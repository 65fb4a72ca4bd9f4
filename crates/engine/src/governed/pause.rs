//! Pausing a workflow: by the operator (`steward pause`), or by its circuit breaker
//! (`[breaker] after = N` consecutive runs ending failed, exhausted or stagnated), or by
//! its spend window (`[budget.window]`, see `watch`). While
//! paused, every fire of the workflow is recorded `skipped` with the pause as its reason
//! (the runner checks, so no road around it); only an operator resumes it.

use chrono::Utc;

use super::{Engine, EngineError, Result};
use crate::store::{Pause, PauseCause, RunState};
use crate::workflow::Workflow;

/// Runs of a workflow looked at for a failure streak at most (beyond the breaker's N,
/// skipped and missed records are passed over).
const STREAK_LOOKBACK: usize = 200;

impl Engine {
    /// `steward pause WF [--reason TEXT]`.
    pub fn pause(&self, workflow: &str, reason: Option<&str>) -> Result<Pause> {
        if let Some(p) = self.store.paused(workflow)? {
            return Err(EngineError::Refused(format!(
                "{workflow} is already paused ({}), since {}: `steward resume {workflow}` lifts it",
                describe(&p),
                p.since.to_rfc3339()
            )));
        }
        let reason = reason.unwrap_or("paused by the operator");
        self.set_pause(workflow, PauseCause::Operator, reason)
    }

    /// `steward resume WF`: lifts the pause, whoever set it; returns what it was.
    pub fn resume(&self, workflow: &str) -> Result<Pause> {
        let p = self.store.resume(workflow)?.ok_or_else(|| {
            EngineError::Refused(format!("{workflow} is not paused: nothing to resume"))
        })?;
        self.store.flush()?;
        self.log_operator(
            workflow,
            "resume",
            &format!("resumed (was paused: {})", describe(&p)),
        )?;
        Ok(p)
    }

    /// Why fires of `workflow` are not run now, if they are not.
    pub fn pause_of(&self, workflow: &str) -> Result<Option<Pause>> {
        Ok(self.store.paused(workflow)?)
    }

    /// After a run of `wf` ended: opens its breaker when the newest `after` runs (skipped
    /// and missed fires passed over) all failed. Returns the pause it set.
    pub fn check_breaker(&self, wf: &Workflow) -> Result<Option<Pause>> {
        let Some(after) = wf.breaker_after else {
            return Ok(None);
        };
        let after = after as usize;
        let streak: Vec<(String, RunState)> = self
            .store
            .recent_states(&wf.id, STREAK_LOOKBACK)?
            .into_iter()
            .filter(|(_, s)| !matches!(s, RunState::Skipped | RunState::Missed))
            .take(after)
            .collect();
        if streak.len() < after || !streak.iter().all(|(_, s)| s.dead_letters()) {
            return Ok(None);
        }
        if self.store.paused(&wf.id)?.is_some() {
            return Ok(None);
        }
        let runs: Vec<String> = streak.iter().map(|(id, s)| format!("{id} {s}")).collect();
        let reason = format!("the last {after} runs failed ({})", runs.join(", "));
        tracing::warn!(workflow = %wf.id, "{reason}: paused until an operator resumes it");
        self.set_pause(&wf.id, PauseCause::Breaker, &reason)
            .map(Some)
    }

    pub(super) fn set_pause(
        &self,
        workflow: &str,
        cause: PauseCause,
        reason: &str,
    ) -> Result<Pause> {
        let p = Pause {
            workflow: workflow.to_string(),
            cause,
            reason: reason.to_string(),
            since: Utc::now(),
            by: match cause {
                PauseCause::Operator => super::operator::login_name(),
                PauseCause::Breaker | PauseCause::Budget => "steward".into(),
            },
        };
        self.store.pause(&p)?;
        self.store.flush()?;
        match cause {
            PauseCause::Operator => self.log_operator(workflow, "pause", &describe(&p))?,
            cause => self.log_workflow(workflow, "pause", cause.name(), &p.reason)?,
        }
        Ok(p)
    }
}

/// A pause in a few words: `breaker: …` or `operator: …`.
pub fn describe(p: &Pause) -> String {
    format!("{}: {}", p.cause.name(), p.reason)
}
