//! The governed run: trigger → run (maker) → verify (checker) → commit, under the budget.
//!
//! Order of durable writes, so a crash at any point loses nothing and commits nothing
//! twice: the idempotency key is reserved and the run recorded `running` and flushed
//! *before* the maker starts; the key is marked `committing` and flushed *before* the
//! commit step starts; the key is marked `committed` and flushed *after* it. A crash leaves
//! a `running` record and a reserved or committing key, which [`Store::open`] turns into an
//! interrupted run and a key *in doubt*.
//!
//! Commit runs only when the run is live (the operator approved this exact config) **and**
//! verify said `pass`. A dry-run never touches an idempotency key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::budget::{BudgetGuard, Figures};
use crate::config::{EnvValue, Workflow};
use crate::live::{LiveStatus, Mode};
use crate::redact::Redactor;
use crate::runlog::{Entry, RunLog};
use crate::step::{run_step, Ending, Exit, StepKind, StepOutcome, StepRequest};
use crate::store::{
    Approval, AttemptRecord, KeyPhase, KeyRecord, RunRecord, RunState, Store, StoreError,
    VerifyRecord,
};
use crate::template;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot write the runlog: {0}")]
    RunLog(#[from] std::io::Error),
    #[error("{0}")]
    Refused(String),
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

/// The engine every trigger and operator command goes through.
#[derive(Clone)]
pub struct Engine {
    pub store: Store,
    pub runlog: RunLog,
    pub state_dir: PathBuf,
}

/// How one attempt ended, before commit.
struct Attempt {
    state: RunState,
    reason: String,
    breach: Option<String>,
    figures: Figures,
    /// The maker's output as the checker and commit see it (not redacted).
    output: Option<Value>,
    verify: Option<VerifyRecord>,
    passed: bool,
}

/// A fresh record for a fire, before any step ran.
fn new_record(wf: &Workflow, fire: &Fire, dry_run: bool, state: RunState) -> RunRecord {
    RunRecord {
        run_id: fire.run_id.clone(),
        workflow: wf.id.clone(),
        config_hash: wf.config_hash.clone(),
        state,
        reason: String::new(),
        dry_run,
        committed: false,
        attempt: if state == RunState::Running { 1 } else { 0 },
        idempotency_key: None,
        trigger: fire.trigger.clone(),
        started_at: Utc::now(),
        ended_at: None,
        figures: Figures::default(),
        breach: None,
        output: None,
        verify: None,
        commit_output: None,
        stderr: BTreeMap::new(),
        notes: Vec::new(),
        attempts: Vec::new(),
        retry_of: fire.retry_of.clone(),
        summary: None,
        dry_run_reason: None,
    }
}

fn ended(state: RunState, reason: String, guard: &BudgetGuard, breach: Option<String>) -> Attempt {
    Attempt {
        state,
        reason,
        breach,
        figures: guard.figures(),
        output: None,
        verify: None,
        passed: false,
    }
}

/// What a workflow's steps get besides the context: env and the redactor for its secrets.
struct StepEnv {
    vars: Vec<(String, String)>,
    redactor: Redactor,
}

impl Engine {
    pub fn live_status(&self, wf: &Workflow) -> Result<LiveStatus> {
        Ok(LiveStatus::of(&self.store, wf)?)
    }

    /// Records the operator's approval of the workflow's current config.
    pub fn go_live(&self, wf: &Workflow) -> Result<Approval> {
        if wf.dry_run {
            return Err(EngineError::Refused(format!(
                "{} says dry_run = true: set dry_run = false in the file first, then approve that exact config with `steward go-live {}`",
                wf.file.display(),
                wf.id
            )));
        }
        let approval = Approval {
            workflow: wf.id.clone(),
            config_hash: wf.config_hash.clone(),
            approved_at: Utc::now(),
            approved_by: operator(),
        };
        self.store.approve_go_live(&approval)?;
        self.store.flush()?;
        self.log_operator(
            &wf.id,
            "go-live",
            &format!("approved config sha256 {}", wf.config_hash),
        )?;
        Ok(approval)
    }

    pub fn dry_run(&self, wf: &Workflow) -> Result<bool> {
        let had = self.store.revoke_go_live(&wf.id)?;
        self.store.flush()?;
        self.log_operator(&wf.id, "dry-run", "go-live approval withdrawn")?;
        Ok(had)
    }

    /// Runs one governed run to its terminal state, live or dry as `mode` says; stops
    /// (state `interrupted`) when `cancel` fires. Only the runner calls this: it alone
    /// decides the mode and applies the caps, overlap and shutdown grace.
    pub(crate) async fn execute(
        &self,
        wf: &Workflow,
        fire: Fire,
        mode: &Mode,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let live = mode.is_live();
        let dry_run = !live;
        let run_id = fire.run_id.clone();
        let mut rec = new_record(wf, &fire, dry_run, RunState::Running);
        rec.dry_run_reason = mode.dry_reason().map(|r| r.describe().to_string());
        let env = match step_env(wf) {
            Ok(env) => env,
            Err((why, redactor)) => {
                let env = StepEnv {
                    vars: Vec::new(),
                    redactor,
                };
                return self.finish(wf, rec, &env, RunState::Failed, why, false);
            }
        };
        let mut entry = self.entry(&rec, "trigger", "fired");
        entry.detail = format!(
            "{} trigger, {}",
            fire.trigger["kind"].as_str().unwrap_or("unknown"),
            mode.describe()
        );
        entry.data = Some(fire.trigger.clone());
        self.runlog.record(&entry, &env.redactor)?;

        let ctx = json!({
            "run_id": run_id,
            "workflow": wf.id,
            "attempt": 1,
            "dry_run": dry_run,
            "trigger": fire.trigger,
        });
        if let Some(source) = &wf.idempotency_key {
            let key = match template::render(source, &ctx) {
                Ok(k) => k,
                Err(e) => {
                    let why = format!("idempotency_key could not be rendered: {e}");
                    return self.finish(wf, rec, &env, RunState::Failed, why, false);
                }
            };
            rec.idempotency_key = Some(key.clone());
            let existing = match self.store.key(&wf.id, &key)? {
                Some(k) => Some(k),
                None if live => self.store.reserve_key(&wf.id, &key, &run_id)?.err(),
                None => None,
            };
            if let Some(existing) = existing {
                let (state, why) = key_taken(&existing);
                return self.finish(wf, rec, &env, state, why, false);
            }
        }
        self.store.put_run(&rec)?;
        self.store.flush()?;

        let attempts = wf.retry.attempts.max(1);
        let mut attempt_no = 1;
        let outcome = loop {
            rec.attempt = attempt_no;
            let mut ctx = ctx.clone();
            ctx["attempt"] = json!(attempt_no);
            let result = self.attempt(wf, &mut rec, &ctx, &env, cancel).await?;
            rec.attempts.push(AttemptRecord {
                attempt: attempt_no,
                state: result.state,
                reason: result.reason.clone(),
                figures: result.figures.clone(),
            });
            let retryable = matches!(result.state, RunState::Failed | RunState::Stagnated);
            if retryable && attempt_no < attempts {
                let delay = wf.retry.delay_before(attempt_no + 1);
                let mut e = self.entry(&rec, "retry", "scheduled");
                e.detail = format!(
                    "attempt {attempt_no} ended {}: {}; attempt {} in {:.1}s",
                    result.state,
                    result.reason,
                    attempt_no + 1,
                    delay.as_secs_f64()
                );
                self.runlog.record(&e, &env.redactor)?;
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = cancel.cancelled() => break result,
                }
                attempt_no += 1;
                continue;
            }
            break result;
        };
        rec.figures = outcome.figures.clone();
        rec.breach = outcome.breach.clone();
        rec.output = outcome.output.clone().map(|mut v| {
            env.redactor.redact_json(&mut v);
            v
        });
        rec.verify = outcome.verify.clone();

        if !outcome.passed {
            return self.finish(wf, rec, &env, outcome.state, outcome.reason, false);
        }
        if dry_run {
            let why = if wf.commit.is_some() {
                "verify passed; dry-run: commit skipped"
            } else {
                "verify passed; dry-run (no commit step)"
            };
            return self.finish(wf, rec, &env, RunState::Success, why.to_string(), false);
        }
        let ctx = json!({
            "run_id": run_id,
            "workflow": wf.id,
            "attempt": rec.attempt,
            "dry_run": false,
            "trigger": rec.trigger,
            "output": outcome.output,
        });
        self.commit(wf, rec, &ctx, &env, cancel).await
    }

    /// Records a fire the overlap policy did not run.
    pub fn record_skipped(&self, wf: &Workflow, fire: Fire, reason: String) -> Result<RunRecord> {
        self.record_state(wf, fire, RunState::Skipped, reason)
    }

    /// Records a fire that ran nothing (`skipped`, `missed`).
    pub fn record_state(
        &self,
        wf: &Workflow,
        fire: Fire,
        state: RunState,
        reason: String,
    ) -> Result<RunRecord> {
        let rec = new_record(wf, &fire, true, state);
        let env = StepEnv {
            vars: Vec::new(),
            redactor: Redactor::default(),
        };
        self.finish(wf, rec, &env, state, reason, false)
    }

    /// Runs maker and checker once under a fresh budget.
    async fn attempt(
        &self,
        wf: &Workflow,
        rec: &mut RunRecord,
        ctx: &Value,
        env: &StepEnv,
        cancel: &CancellationToken,
    ) -> Result<Attempt> {
        let mut guard = BudgetGuard::new(wf.caps.clone());
        let vars = step_vars(wf, rec, env, &self.state_dir);
        let fail = ended;

        let run = self
            .step(
                wf,
                rec,
                StepKind::Run,
                &wf.run.argv,
                ctx,
                &vars,
                Some(&mut guard),
                None,
                env,
                cancel,
            )
            .await?;
        if let Some(end) = stopped(&run) {
            return Ok(fail(end.0, end.1, &guard, end.2));
        }
        if let Some(reason) = &run.block {
            return Ok(fail(
                RunState::Blocked,
                format!("blocked: {reason}"),
                &guard,
                None,
            ));
        }
        if !run.succeeded() {
            return Ok(fail(RunState::Failed, failure("run", &run), &guard, None));
        }
        let output = parse_output(&run.stdout);
        if run.noop || output == json!({"noop": true}) {
            let mut a = fail(
                RunState::CleanNoOp,
                "the maker found nothing to do".to_string(),
                &guard,
                None,
            );
            a.output = Some(output);
            return Ok(a);
        }

        let mut vctx = ctx.clone();
        vctx["output"] = output.clone();
        let verify = self
            .step(
                wf,
                rec,
                StepKind::Verify,
                &wf.verify.argv,
                &vctx,
                &vars,
                Some(&mut guard),
                None,
                env,
                cancel,
            )
            .await?;
        if let Some(end) = stopped(&verify) {
            let mut a = fail(end.0, end.1, &guard, end.2);
            a.output = Some(output);
            return Ok(a);
        }
        let (verdict, detail) = verdict_of(&verify);
        let record = VerifyRecord {
            verdict: verdict.to_string(),
            reason: detail.clone(),
            confidence: verify.confidence.clone(),
            output: Some(parse_output(&verify.stdout)),
        };
        let (state, reason, passed) = match verdict {
            "pass" => (RunState::Success, "verify passed".to_string(), true),
            "escalate" => (
                RunState::ApprovalRequired,
                format!("verify escalated: {detail}"),
                false,
            ),
            _ => (RunState::Failed, format!("verify failed: {detail}"), false),
        };
        Ok(Attempt {
            state,
            reason,
            breach: None,
            figures: guard.figures(),
            output: Some(output),
            verify: Some(record),
            passed,
        })
    }

    /// Runs one step, records it in the runlog and keeps its stderr tail and notes.
    #[allow(clippy::too_many_arguments)]
    async fn step(
        &self,
        wf: &Workflow,
        rec: &mut RunRecord,
        kind: StepKind,
        argv: &[String],
        ctx: &Value,
        vars: &[(String, String)],
        guard: Option<&mut BudgetGuard>,
        timeout: Option<Duration>,
        env: &StepEnv,
        cancel: &CancellationToken,
    ) -> Result<StepOutcome> {
        let req = StepRequest {
            kind,
            argv,
            cwd: &wf.cwd,
            env: vars,
            stdin: serde_json::to_vec(ctx).unwrap_or_default(),
            timeout,
            kill_grace: wf.caps.kill_grace,
            stall_timeout: if kind == StepKind::Commit {
                None
            } else {
                wf.caps.stall_timeout
            },
            cancel: cancel.clone(),
        };
        let figures_before = guard.is_some();
        let mut guard = guard;
        let mut out = run_step(req, guard.as_deref_mut()).await;
        scrub(&mut out, &env.redactor);

        for line in &out.malformed {
            let mut e = self.entry(rec, kind.name(), "control-ignored");
            e.detail = line.clone();
            self.runlog.record(&e, &env.redactor)?;
        }
        for (name, status, detail) in &out.steps {
            let mut e = self.entry(rec, name, status);
            e.detail = detail.clone();
            self.runlog.record(&e, &env.redactor)?;
        }
        for note in &out.notes {
            let mut e = self.entry(rec, kind.name(), "note");
            e.detail = note.clone();
            self.runlog.record(&e, &env.redactor)?;
            rec.notes.push(note.clone());
        }
        if !out.stderr_tail.is_empty() {
            rec.stderr
                .insert(kind.name().to_string(), out.stderr_tail.clone());
        }
        let (status, detail) = match &out.ending {
            Ending::Exited => match (kind, out.exit) {
                (StepKind::Verify, _) => ("done", format!("verdict {}", verdict_of(&out).0)),
                (_, Some(Exit::Code(0))) => ("ok", String::new()),
                (_, Some(exit)) => ("error", exit.to_string()),
                (_, None) => ("error", "exit status unknown".to_string()),
            },
            Ending::Breach(b) => (
                "breach",
                format!("budget exhausted: {b}; process group killed"),
            ),
            Ending::Stalled(d) => (
                "stalled",
                format!(
                    "no progress for {:.1}s; process group killed",
                    d.as_secs_f64()
                ),
            ),
            Ending::TimedOut(d) => (
                "timeout",
                format!(
                    "still running after {:.1}s; process group killed",
                    d.as_secs_f64()
                ),
            ),
            Ending::SpawnFailed(e) => ("error", e.clone()),
            Ending::Cancelled => (
                "cancelled",
                "steward stopped the run; process group killed".to_string(),
            ),
        };
        let mut e = self.entry(rec, kind.name(), status);
        e.detail = detail;
        e.duration_ms = Some(out.duration.as_millis() as u64);
        if figures_before {
            e.figures = guard.map(|g| g.figures());
        }
        if let Ending::Breach(b) = &out.ending {
            e.data = Some(json!({"cap": b.cap.name(), "used": b.used, "limit": b.limit}));
        }
        self.runlog.record(&e, &env.redactor)?;
        Ok(out)
    }

    /// The commit step, bracketed by durable key phases.
    async fn commit(
        &self,
        wf: &Workflow,
        mut rec: RunRecord,
        ctx: &Value,
        env: &StepEnv,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let Some(commit) = &wf.commit else {
            if let Some(key) = &rec.idempotency_key {
                self.store
                    .set_key(&wf.id, key, &rec.run_id, KeyPhase::Committed)?;
            }
            return self.finish(
                wf,
                rec,
                env,
                RunState::Success,
                "verify passed; no commit step configured".into(),
                false,
            );
        };
        if let Some(key) = &rec.idempotency_key {
            self.store
                .set_key(&wf.id, key, &rec.run_id, KeyPhase::Committing)?;
        }
        self.store.put_run(&rec)?;
        self.store.flush()?;
        let vars = step_vars(wf, &rec, env, &self.state_dir);
        let out = self
            .step(
                wf,
                &mut rec,
                StepKind::Commit,
                &commit.argv,
                ctx,
                &vars,
                None,
                commit.timeout,
                env,
                cancel,
            )
            .await?;
        rec.commit_output = Some(parse_output(&out.stdout));
        if out.succeeded() {
            rec.committed = true;
            if let Some(key) = &rec.idempotency_key {
                self.store
                    .set_key(&wf.id, key, &rec.run_id, KeyPhase::Committed)?;
            }
            return self.finish(
                wf,
                rec,
                env,
                RunState::Success,
                "verify passed; committed".into(),
                false,
            );
        }
        // A commit that exited with a failure status says it did not commit; one that was
        // killed or crashed may have done half of it, so its key is left in doubt.
        let clean_failure = out.ending == Ending::Exited && matches!(out.exit, Some(Exit::Code(_)));
        let in_doubt = !clean_failure && !matches!(out.ending, Ending::SpawnFailed(_));
        if in_doubt {
            if let Some(key) = &rec.idempotency_key {
                self.store
                    .set_key(&wf.id, key, &rec.run_id, KeyPhase::InDoubt)?;
            }
        }
        let mut why = failure("commit", &out);
        if in_doubt {
            why.push_str("; the commit may have partly happened: its idempotency key is in doubt");
        }
        let state = if out.ending == Ending::Cancelled {
            RunState::Interrupted
        } else {
            RunState::Failed
        };
        self.finish(wf, rec, env, state, why, in_doubt)
    }

    /// Records the terminal state: run record, queues, key, runlog; then flushes.
    fn finish(
        &self,
        wf: &Workflow,
        mut rec: RunRecord,
        env: &StepEnv,
        state: RunState,
        reason: String,
        key_in_doubt: bool,
    ) -> Result<RunRecord> {
        rec.state = state;
        rec.reason = env.redactor.redact(&reason).into_owned();
        rec.ended_at = Some(Utc::now());
        if wf.agent.is_some() && !matches!(state, RunState::Skipped | RunState::Missed) {
            self.agent_summary(&mut rec, env)?;
        }
        if let (Some(key), false) = (&rec.idempotency_key, rec.dry_run || key_in_doubt) {
            // Only the run that holds the key may change it (a refused re-fire must not).
            let holds = self
                .store
                .key(&wf.id, key)?
                .is_some_and(|k| k.run_id == rec.run_id);
            if holds {
                match state {
                    RunState::Success | RunState::CleanNoOp => {
                        self.store
                            .set_key(&wf.id, key, &rec.run_id, KeyPhase::Committed)?
                    }
                    RunState::ApprovalRequired => {
                        self.store
                            .set_key(&wf.id, key, &rec.run_id, KeyPhase::AwaitingApproval)?
                    }
                    _ => self.store.release_key(&wf.id, key)?,
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
        self.store.flush()?;
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
        Ok(rec)
    }

    /// A digest agent's steps 11 (when its commit did not run) and 12, the summary line.
    fn agent_summary(&self, rec: &mut RunRecord, env: &StepEnv) -> Result<()> {
        if let Some(why) = crate::agent::email_skipped_reason(rec) {
            let dry = why.starts_with("dry-run");
            let mut e = self.entry(rec, "maybe_email", if dry { "skipped" } else { "failed" });
            e.detail = why;
            self.runlog.record(&e, &env.redactor)?;
        }
        let line = crate::agent::summary_line(rec);
        let mut e = self.entry(rec, "emit_summary", "ok");
        e.detail = line.clone();
        self.runlog.record(&e, &env.redactor)?;
        rec.summary = Some(env.redactor.redact(&line).into_owned());
        Ok(())
    }

    /// The run waiting for review under `run_id`, or why there is none.
    pub fn review_item(&self, run_id: &str) -> Result<RunRecord> {
        self.pending_review(run_id)
    }

    /// `steward approve RUN`: the operator accepts an escalated run; a live one commits
    /// when `mode` (decided by the runner) is live. A live run that may not commit now
    /// stays in the review queue and the refusal says why.
    pub(crate) async fn approve(
        &self,
        wf: &Workflow,
        run_id: &str,
        mode: &Mode,
        cancel: &CancellationToken,
    ) -> Result<RunRecord> {
        let rec = self.pending_review(run_id)?;
        let env = step_env(wf).map_err(|(why, _)| EngineError::Refused(why))?;
        if let (false, Some(reason)) = (rec.dry_run, mode.dry_reason()) {
            self.log_operator_run(
                &rec,
                "approve",
                &format!(
                    "approval held: {}; the run stays in review",
                    reason.describe()
                ),
                &env.redactor,
            )?;
            return Err(EngineError::Refused(format!(
                "cannot commit run {run_id} of workflow `{}` now: {}; it stays in the review queue",
                wf.id,
                reason.describe()
            )));
        }
        self.store.remove_review(run_id)?;
        self.log_operator_run(&rec, "approve", "approved by operator", &env.redactor)?;
        if rec.dry_run {
            return self.finish(
                wf,
                rec,
                &env,
                RunState::Success,
                "approved by operator; dry-run: commit skipped".into(),
                false,
            );
        }
        let ctx = json!({
            "run_id": rec.run_id,
            "workflow": wf.id,
            "attempt": rec.attempt,
            "dry_run": false,
            "trigger": rec.trigger,
            "output": rec.output,
        });
        self.commit(wf, rec, &ctx, &env, cancel).await
    }

    /// `steward reject RUN`: the operator refuses an escalated run; its key is freed.
    pub fn reject(&self, run_id: &str, why: Option<&str>) -> Result<RunRecord> {
        let mut rec = self.pending_review(run_id)?;
        let env = StepEnv {
            vars: Vec::new(),
            redactor: Redactor::default(),
        };
        self.store.remove_review(run_id)?;
        if let (Some(key), false) = (&rec.idempotency_key, rec.dry_run) {
            self.store.release_key(&rec.workflow, key)?;
        }
        rec.state = RunState::Failed;
        rec.reason = format!(
            "rejected by operator{}",
            why.map(|w| format!(": {w}")).unwrap_or_default()
        );
        rec.ended_at = Some(Utc::now());
        self.store.put_run(&rec)?;
        self.store.flush()?;
        self.log_operator_run(&rec, "reject", &rec.reason, &env.redactor)?;
        Ok(rec)
    }

    fn pending_review(&self, run_id: &str) -> Result<RunRecord> {
        let rec = self.store.run(run_id)?.ok_or_else(|| {
            EngineError::Refused(format!("no run with id `{run_id}` (see `steward runs`)"))
        })?;
        if rec.state != RunState::ApprovalRequired || !self.store.in_review(run_id)? {
            return Err(EngineError::Refused(format!(
                "run {run_id} is not waiting for review (it is {}): nothing to approve or reject",
                rec.state
            )));
        }
        Ok(rec)
    }

    /// `steward in-doubt resolve`: the operator says whether an in-doubt key committed.
    pub fn settle_key(&self, workflow: &str, key: &str, committed: bool) -> Result<KeyRecord> {
        let rec = self
            .store
            .key(workflow, key)?
            .filter(|k| k.phase == KeyPhase::InDoubt)
            .ok_or_else(|| EngineError::Refused(format!("no in-doubt key `{key}` for workflow `{workflow}` (see `steward in-doubt list`)")))?;
        if committed {
            self.store
                .set_key(workflow, key, &rec.run_id, KeyPhase::Committed)?;
        } else {
            self.store.release_key(workflow, key)?;
        }
        self.store.flush()?;
        let what = if committed {
            "marked committed: re-fires are clean no-ops"
        } else {
            "released: the next fire runs again"
        };
        self.log_operator(
            workflow,
            "in-doubt",
            &format!("key `{key}` of run {} {what}", rec.run_id),
        )?;
        Ok(rec)
    }

    fn entry(&self, rec: &RunRecord, step: &str, status: &str) -> Entry {
        Entry {
            ts: Utc::now(),
            run_id: rec.run_id.clone(),
            workflow: rec.workflow.clone(),
            attempt: rec.attempt,
            step: step.to_string(),
            status: status.to_string(),
            figures: None,
            duration_ms: None,
            detail: String::new(),
            data: None,
        }
    }

    fn log_operator_run(
        &self,
        rec: &RunRecord,
        step: &str,
        detail: &str,
        redactor: &Redactor,
    ) -> Result<()> {
        let mut e = self.entry(rec, step, "operator");
        e.detail = format!("{detail} (by {})", operator());
        self.runlog.record(&e, redactor)?;
        Ok(())
    }

    fn log_operator(&self, workflow: &str, step: &str, detail: &str) -> Result<()> {
        let e = Entry {
            ts: Utc::now(),
            run_id: String::new(),
            workflow: workflow.to_string(),
            attempt: 0,
            step: step.to_string(),
            status: "operator".to_string(),
            figures: None,
            duration_ms: None,
            detail: format!("{detail} (by {})", operator()),
            data: None,
        };
        self.runlog.record(&e, &Redactor::default())?;
        Ok(())
    }
}

/// Who is acting: the login name, for approvals and the runlog.
fn operator() -> String {
    std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| format!("uid {}", nix::unistd::getuid()))
}

/// A re-fire whose key is already taken: what it ends as, without starting a process.
fn key_taken(k: &KeyRecord) -> (RunState, String) {
    match k.phase {
        KeyPhase::Committed => (
            RunState::CleanNoOp,
            format!("idempotency key `{}` already committed by run {}: nothing to do", k.key, k.run_id),
        ),
        KeyPhase::InDoubt => (
            RunState::Blocked,
            format!(
                "idempotency key `{}` is in doubt: run {} was interrupted {}; settle it with `steward in-doubt resolve {} {} --committed|--not-committed`",
                k.key,
                k.run_id,
                if k.found_in == Some(KeyPhase::Committing) { "during its commit" } else { "before its commit" },
                k.workflow,
                k.key
            ),
        ),
        KeyPhase::AwaitingApproval => (
            RunState::Blocked,
            format!("idempotency key `{}` waits for operator review of run {} (`steward approve|reject {}`)", k.key, k.run_id, k.run_id),
        ),
        KeyPhase::Reserved | KeyPhase::Committing => (
            RunState::Blocked,
            format!("idempotency key `{}` is held by run {}, still in flight", k.key, k.run_id),
        ),
    }
}

/// A step that was stopped by the guard (or never started): state, reason, breach.
fn stopped(out: &StepOutcome) -> Option<(RunState, String, Option<String>)> {
    match &out.ending {
        Ending::Exited => None,
        Ending::Breach(b) => Some((
            RunState::Exhausted,
            format!("budget exhausted: {b}"),
            Some(b.to_string()),
        )),
        Ending::Stalled(d) => Some((
            RunState::Stagnated,
            format!(
                "stagnated: no tick, charge or output for {:.1}s",
                d.as_secs_f64()
            ),
            None,
        )),
        Ending::TimedOut(d) => Some((
            RunState::Failed,
            format!("timed out after {:.1}s", d.as_secs_f64()),
            None,
        )),
        Ending::SpawnFailed(e) => Some((RunState::Failed, e.clone(), None)),
        Ending::Cancelled => Some((
            RunState::Interrupted,
            "interrupted: steward stopped the run before its commit".to_string(),
            None,
        )),
    }
}

fn failure(step: &str, out: &StepOutcome) -> String {
    let how = match (&out.ending, out.exit) {
        (Ending::SpawnFailed(e), _) => e.clone(),
        (Ending::TimedOut(d), _) => format!("timed out after {:.1}s", d.as_secs_f64()),
        (Ending::Cancelled, _) => "stopped by steward".to_string(),
        (_, Some(exit)) => exit.to_string(),
        (_, None) => "ended without an exit status".to_string(),
    };
    match out.stderr_tail.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(last) => format!("{step} step failed ({how}): {}", last.trim()),
        None => format!("{step} step failed ({how})"),
    }
}

/// The checker's verdict: its first stdout line if that is a verdict word, else its exit
/// code (0 pass, 1 fail, 2 escalate); anything else is a fail with the reason.
fn verdict_of(out: &StepOutcome) -> (&'static str, String) {
    let mut lines = out.stdout.lines();
    let first = lines.next().unwrap_or("").trim();
    let rest: String = lines
        .collect::<Vec<_>>()
        .join(" ")
        .trim()
        .chars()
        .take(300)
        .collect();
    let stderr_last = out
        .stderr_tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string();
    let detail = |fallback: String| {
        if !rest.is_empty() {
            rest.clone()
        } else if !stderr_last.is_empty() {
            stderr_last.clone()
        } else {
            fallback
        }
    };
    match first {
        "pass" => return ("pass", detail("checker said pass".into())),
        "fail" => return ("fail", detail("checker said fail".into())),
        "escalate" => return ("escalate", detail("checker asked for a human".into())),
        _ => {}
    }
    let first_line_detail = || {
        if !first.is_empty() {
            first.chars().take(300).collect()
        } else if !stderr_last.is_empty() {
            stderr_last.clone()
        } else {
            String::new()
        }
    };
    match out.exit {
        Some(Exit::Code(0)) => ("pass", "checker exited 0".into()),
        Some(Exit::Code(1)) => ("fail", non_empty(first_line_detail(), "checker exited 1")),
        Some(Exit::Code(2)) => (
            "escalate",
            non_empty(first_line_detail(), "checker exited 2"),
        ),
        Some(exit) => (
            "fail",
            format!("checker ended abnormally ({exit}) {}", first_line_detail())
                .trim()
                .to_string(),
        ),
        None => ("fail", "checker ended without an exit status".into()),
    }
}

fn non_empty(s: String, fallback: &str) -> String {
    if s.is_empty() {
        fallback.to_string()
    } else {
        s
    }
}

/// stdout as JSON when it parses, else as text; empty is null.
fn parse_output(stdout: &str) -> Value {
    let t = stdout.trim();
    if t.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(t).unwrap_or_else(|_| Value::String(stdout.to_string()))
}

fn scrub(out: &mut StepOutcome, r: &Redactor) {
    if r.is_empty() {
        return;
    }
    out.stdout = r.redact(&out.stdout).into_owned();
    out.stderr_tail = r.redact(&out.stderr_tail).into_owned();
    out.block = out.block.as_deref().map(|b| r.redact(b).into_owned());
    for s in out.notes.iter_mut().chain(out.malformed.iter_mut()) {
        *s = r.redact(s).into_owned();
    }
}

/// Resolves the workflow's `[env]`; on failure returns why, with whatever redactor it has.
fn step_env(wf: &Workflow) -> std::result::Result<StepEnv, (String, Redactor)> {
    let mut vars = crate::step::base_env();
    let mut secrets = Vec::new();
    let mut missing = Vec::new();
    for (name, value) in &wf.env {
        let v = match value {
            EnvValue::Literal { value, .. } => value.clone(),
            EnvValue::FromEnv { var, .. } => {
                match crate::secret::require(var, &format!("env.{name} needs ${var}, which")) {
                    Ok(v) => v,
                    Err(why) => {
                        missing.push(why);
                        continue;
                    }
                }
            }
        };
        if value.is_secret() {
            secrets.push((name.clone(), v.clone()));
        }
        vars.retain(|(k, _)| k != name);
        vars.push((name.clone(), v));
    }
    let redactor = Redactor::new(secrets);
    if !missing.is_empty() {
        return Err((missing.join("; "), redactor));
    }
    Ok(StepEnv { vars, redactor })
}

/// The full child environment for one attempt.
fn step_vars(
    wf: &Workflow,
    rec: &RunRecord,
    env: &StepEnv,
    state_dir: &Path,
) -> Vec<(String, String)> {
    let mut vars = env.vars.clone();
    vars.extend([
        ("STEWARD_RUN_ID".to_string(), rec.run_id.clone()),
        ("STEWARD_WORKFLOW".to_string(), wf.id.clone()),
        (
            "STEWARD_DRY_RUN".to_string(),
            if rec.dry_run { "1" } else { "0" }.to_string(),
        ),
        ("STEWARD_ATTEMPT".to_string(), rec.attempt.to_string()),
        ("STEWARD_CONTROL_FD".to_string(), "3".to_string()),
        // The file sits in CONFIG/workflows/ or CONFIG/agents/.
        (
            "STEWARD_CONFIG_DIR".to_string(),
            wf.file
                .parent()
                .and_then(Path::parent)
                .unwrap_or(&wf.cwd)
                .to_string_lossy()
                .into_owned(),
        ),
        (
            "STEWARD_STATE_DIR".to_string(),
            state_dir.to_string_lossy().into_owned(),
        ),
    ]);
    vars.extend(wf.caps.env());
    vars
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
    let runlog = RunLog::open(state_dir)?;
    Ok((
        Engine {
            store,
            runlog,
            state_dir: state_dir.to_path_buf(),
        },
        recovery,
    ))
}
