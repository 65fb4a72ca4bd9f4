//! A run's end: its terminal record written once (run record, key, dead-letter or review
//! entry, spend, runlog `end` line), made durable, then told (metrics, hooks, alerts).

use std::sync::atomic::Ordering;

use super::env::StepEnv;
use super::outcome::End;
use super::{Engine, EngineError, Result};
use crate::workflow::Workflow;
use chrono::Utc;
use serde_json::json;

use crate::store::{KeyPhase, RunRecord, RunState};

impl Engine {
    /// Writes the terminal record: run record, key, queues, runlog; then flushes.
    pub(super) fn finish(
        &self,
        wf: &Workflow,
        rec: RunRecord,
        env: &StepEnv,
        end: End,
    ) -> Result<RunRecord> {
        let (rec, state) = self.write_end(wf, rec, env, end)?;
        self.store.flush()?;
        self.tell_end(rec, state, env)
    }

    /// [`Engine::finish`] on a run's own road: the flush off the runtime's threads.
    pub(super) async fn finish_durably(
        &self,
        wf: &Workflow,
        rec: RunRecord,
        env: &StepEnv,
        end: End,
    ) -> Result<RunRecord> {
        let (rec, state) = self.write_end(wf, rec, env, end)?;
        self.durable().await?;
        self.tell_end(rec, state, env)
    }

    /// Makes what was written durable, off the runtime's threads (a slow disk must not
    /// stall the triggers and the control socket), in a flush concurrent runs share.
    pub(super) async fn durable(&self) -> Result<()> {
        let store = self.store.clone();
        let others = self.in_flight.load(Ordering::Relaxed).saturating_sub(1);
        match tokio::task::spawn_blocking(move || store.flush_among(others)).await {
            Ok(flushed) => Ok(flushed?),
            Err(e) => Err(EngineError::RunLog(std::io::Error::other(format!(
                "the store's flush was lost: {e}"
            )))),
        }
    }

    /// The terminal record and what goes with it (key, dead letter, review, spend),
    /// written but not yet flushed.
    pub(super) fn write_end(
        &self,
        wf: &Workflow,
        mut rec: RunRecord,
        env: &StepEnv,
        end: End,
    ) -> Result<(RunRecord, RunState)> {
        let state = end.state();
        rec.state = state;
        // A run waiting for an approval keeps its scratch folder for the commit to come.
        if state != RunState::ApprovalRequired {
            let _ = std::fs::remove_dir_all(super::env::scratch_dir(&self.state_dir, &rec.run_id));
        }
        rec.reason = env.redactor.redact(&end.reason()).into_owned();
        rec.ended_at = Some(Utc::now());
        if let Some(breach) = end.breach() {
            rec.breach = Some(breach);
        }
        if let End::Success {
            committed: true, ..
        } = end
        {
            rec.committed = true;
        }
        if wf.agent.is_some() && !matches!(state, RunState::Skipped | RunState::Missed) {
            self.agent_summary(&mut rec, env)?;
        }
        if let (Some(key), false) = (&rec.idempotency_key, rec.dry_run || end.key_in_doubt()) {
            // Only the run that holds the key may change it (a refused re-fire must not).
            let holds = self
                .store
                .key(&wf.id, key)?
                .is_some_and(|k| k.run_id == rec.run_id);
            if holds {
                let phase = match state {
                    RunState::Success | RunState::CleanNoOp => Some(KeyPhase::Committed),
                    RunState::ApprovalRequired => Some(KeyPhase::AwaitingApproval),
                    _ => None,
                };
                match phase {
                    Some(phase) => self.store.set_key(&wf.id, key, &rec.run_id, phase)?,
                    None => self.store.release_key(&wf.id, key)?,
                }
            }
        }
        self.store.put_run(&rec)?;
        if state.dead_letters() {
            self.store.dead_letter(&rec)?;
        }
        if state == RunState::ApprovalRequired {
            self.store.queue_review(&rec.run_id)?;
        }
        if !matches!(state, RunState::Skipped | RunState::Missed) {
            self.store.add_day_spend(
                &rec.workflow,
                rec.started_at.date_naive(),
                &crate::store::DaySpend {
                    cost_usd: rec.figures.cost_usd,
                    tokens: rec.figures.tokens,
                    runs: 1,
                },
            )?;
        }
        Ok((rec, state))
    }

    /// Once the terminal record is durable: the runlog's end line, the metrics, the hook.
    pub(super) fn tell_end(
        &self,
        rec: RunRecord,
        state: RunState,
        env: &StepEnv,
    ) -> Result<RunRecord> {
        let mut e = self.entry(&rec, "end", state.name());
        e.detail = rec.reason.clone();
        e.figures = Some(rec.figures.clone());
        e.duration_ms = rec
            .ended_at
            .map(|end| (end - rec.started_at).num_milliseconds().max(0) as u64);
        e.data = Some(json!({
            "dry_run": rec.dry_run,
            "committed": rec.committed,
            "breach": rec.breach,
            "dead_lettered": state.dead_letters(),
            "idempotency_key": rec.idempotency_key,
        }));
        self.runlog.record(&e, &env.redactor)?;
        self.metrics.run_ended(&rec);
        if let Some(ended) = &self.ended {
            ended(&rec);
        }
        Ok(rec)
    }
}
