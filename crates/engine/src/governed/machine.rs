//! The governed run as a state machine: [`Phase`] says where a run stands, `transition`
//! is the one function that moves it on, and `finish` ([`super::end`]) the one place that writes its
//! terminal record (run record, key, dead-letter or review entry, runlog `end` line).
//!
//! ```text
//! Fired ──► Attempt{n} ──► Passed ──► (live) commit ──► Ended
//!   │           │  ▲           └──► (dry) ───────────────┘
//!   │           ▼  │ Backoff{n} (failed or stagnated, attempts left)
//!   └─────────► Ended (key taken, key template broken, maker or checker ended it)
//! ```
//!
//! An operator's approval of an escalated run enters at `Passed`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::env::{step_env, step_vars, StepEnv};
use super::outcome::{failure, key_taken, parse_output, stopped, verdict_of, End, Verdict};
use super::{Engine, EngineError, Fire, Result};
use crate::budget::{BudgetGuard, Figures};
use crate::live::Mode;
use crate::step::{Ending, Exit, StepKind};
use crate::store::{AttemptRecord, KeyPhase, RunRecord, RunState, VerifyRecord};
use crate::template;
use crate::workflow::Workflow;

/// Where a run stands between two transitions.
enum Phase {
    /// Fired: the idempotency key is looked at (and, live, reserved) next.
    Fired,
    /// Attempt `n` of maker and checker, under a fresh budget.
    Attempt {
        n: u32,
    },
    /// Attempt `n` ended in a retryable way (`last`): attempt n+1 after `delay`, unless
    /// the run is cancelled meanwhile, which ends it as `last`.
    Backoff {
        n: u32,
        delay: Duration,
        last: End,
    },
    /// The checker passed (or an operator approved): commit if live.
    Passed {
        output: Value,
        approved: bool,
    },
    Ended(End),
}

/// A run in progress: its record and what every transition needs.
struct Run<'a> {
    wf: &'a Workflow,
    rec: RunRecord,
    env: StepEnv,
    /// The context the maker and checker get (`attempt` is set per attempt).
    ctx: Value,
    live: bool,
    cancel: &'a CancellationToken,
}

/// What one attempt of maker and checker came to.
struct Tried {
    passed: std::result::Result<Value, End>,
    figures: Figures,
    /// The maker's output as the checker and commit see it (not redacted).
    output: Option<Value>,
    verify: Option<VerifyRecord>,
}

/// One run counted in flight until dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn count(runs: &'a AtomicUsize) -> InFlight<'a> {
        runs.fetch_add(1, Ordering::Relaxed);
        InFlight(runs)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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
        stderr: Default::default(),
        notes: Vec::new(),
        attempts: Vec::new(),
        retry_of: fire.retry_of.clone(),
        summary: None,
        dry_run_reason: None,
        model_spend: None,
        misreported: None,
        daemon: None,
        sandbox: None,
    }
}

impl Engine {
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
        let mut rec = new_record(wf, &fire, !live, RunState::Running);
        rec.dry_run_reason = mode.dry_reason().map(|r| r.describe().to_string());
        let env = match step_env(wf) {
            Ok(env) => env,
            Err((why, redactor)) => {
                let env = StepEnv {
                    vars: Vec::new(),
                    redactor,
                };
                return self.finish(wf, rec, &env, End::Failed { why });
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
            "run_id": rec.run_id,
            "workflow": wf.id,
            "attempt": 1,
            "dry_run": !live,
            "trigger": fire.trigger,
        });
        let run = Run {
            wf,
            rec,
            env,
            ctx,
            live,
            cancel,
        };
        self.drive(run, Phase::Fired).await
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
            let held = format!(
                "approval held: {}; the run stays in review",
                reason.describe()
            );
            self.log_operator_run(&rec, "approve", &held, &env.redactor)?;
            return Err(EngineError::NotLive(format!(
                "cannot commit run {run_id} of workflow `{}` now: {}; it stays in the review queue",
                wf.id,
                reason.describe()
            )));
        }
        self.store.remove_review(run_id)?;
        self.log_operator_run(&rec, "approve", "approved by operator", &env.redactor)?;
        let output = rec.output.clone().unwrap_or(Value::Null);
        let run = Run {
            wf,
            live: !rec.dry_run,
            rec,
            env,
            ctx: Value::Null,
            cancel,
        };
        self.drive(
            run,
            Phase::Passed {
                output,
                approved: true,
            },
        )
        .await
    }

    /// Records a fire the overlap policy did not run.
    pub fn record_skipped(&self, wf: &Workflow, fire: Fire, why: String) -> Result<RunRecord> {
        let rec = new_record(wf, &fire, true, RunState::Skipped);
        self.finish(wf, rec, &StepEnv::none(), End::Skipped { why })
    }

    /// Records a fire given up on before any run of it ended (a cluster's queue item
    /// delivered past its attempts, each daemon it went to gone before acknowledging it):
    /// failed, so it is dead-lettered, alerted, and `dead-letter retry` can run it.
    pub fn record_given_up(&self, wf: &Workflow, fire: Fire, why: String) -> Result<RunRecord> {
        let rec = new_record(wf, &fire, false, RunState::Failed);
        self.finish(wf, rec, &StepEnv::none(), End::Failed { why })
    }

    /// Records a scheduled slot that passed while steward was not running.
    pub fn record_missed(&self, wf: &Workflow, fire: Fire, why: String) -> Result<RunRecord> {
        let rec = new_record(wf, &fire, true, RunState::Missed);
        self.finish(wf, rec, &StepEnv::none(), End::Missed { why })
    }

    /// Moves the run from `phase` to its end, then writes the terminal record.
    async fn drive(&self, mut run: Run<'_>, mut phase: Phase) -> Result<RunRecord> {
        let _counted = InFlight::count(&self.in_flight);
        loop {
            phase = match phase {
                Phase::Ended(end) => {
                    return self.finish_durably(run.wf, run.rec, &run.env, end).await
                }
                phase => self.transition(&mut run, phase).await?,
            };
        }
    }

    /// The one transition function.
    async fn transition(&self, run: &mut Run<'_>, phase: Phase) -> Result<Phase> {
        Ok(match phase {
            Phase::Fired => self.take_key(run).await?,
            Phase::Attempt { n } => self.attempt(run, n).await?,
            Phase::Backoff { n, delay, last } => tokio::select! {
                _ = tokio::time::sleep(delay) => Phase::Attempt { n: n + 1 },
                _ = run.cancel.cancelled() => Phase::Ended(last),
            },
            Phase::Passed { output, approved } => self.passed(run, output, approved).await?,
            Phase::Ended(end) => Phase::Ended(end),
        })
    }

    /// Renders the idempotency key; a live run reserves it, durably, before any step.
    ///
    /// A run that reserves nothing (a dry run, a workflow without a key) does not wait for
    /// its `running` record to reach the disk: the maker starts at once, and the record is
    /// on disk with the next flush — at the latest the one before its commit, or sled's
    /// own within [`crate::store::BACKGROUND_FLUSH_MS`]. A crash before then loses a run
    /// that had done nothing irrevocable, as a crash just before its fire would have.
    async fn take_key(&self, run: &mut Run<'_>) -> Result<Phase> {
        let (wf, rec) = (run.wf, &mut run.rec);
        let mut reserved = false;
        if let Some(source) = &wf.idempotency_key {
            let what = format!("the idempotency_key of workflow `{}`", wf.id);
            let key = match template::render_bounded(&what, source, &run.ctx).await {
                Ok(k) => k,
                Err(e) => {
                    let why = format!("idempotency_key could not be rendered: {e}");
                    return Ok(Phase::Ended(End::Failed { why }));
                }
            };
            rec.idempotency_key = Some(key.clone());
            let existing = match self.store.key(&wf.id, &key)? {
                Some(k) => Some(k),
                None if run.live => {
                    reserved = true;
                    self.store.reserve_key(&wf.id, &key, &rec.run_id)?.err()
                }
                None => None,
            };
            if let Some(existing) = existing {
                return Ok(Phase::Ended(key_taken(&existing)));
            }
        }
        self.store.put_run(rec)?;
        if reserved {
            self.durable().await?;
        }
        Ok(Phase::Attempt { n: 1 })
    }

    /// Attempt `n`: maker and checker; then retry, pass or end.
    async fn attempt(&self, run: &mut Run<'_>, n: u32) -> Result<Phase> {
        run.rec.attempt = n;
        run.ctx["attempt"] = json!(n);
        let tried = self.try_once(run).await?;
        let rec = &mut run.rec;
        let (state, reason) = match &tried.passed {
            Ok(_) => (RunState::Success, "verify passed".to_string()),
            Err(end) => (end.state(), end.reason()),
        };
        rec.attempts.push(AttemptRecord {
            attempt: n,
            state,
            reason: reason.clone(),
            figures: tried.figures.clone(),
        });
        rec.figures = tried.figures;
        rec.output = tried.output.map(|mut v| {
            run.env.redactor.redact_json(&mut v);
            v
        });
        rec.verify = tried.verify;
        let end = match tried.passed {
            Ok(output) => {
                return Ok(Phase::Passed {
                    output,
                    approved: false,
                })
            }
            Err(end) => end,
        };
        let attempts = run.wf.retry.attempts.max(1);
        if !end.retryable() || n >= attempts {
            return Ok(Phase::Ended(end));
        }
        let delay = run.wf.retry.delay_before(n + 1);
        let mut e = self.entry(rec, "retry", "scheduled");
        e.detail = format!(
            "attempt {n} ended {state}: {reason}; attempt {} in {:.1}s",
            n + 1,
            delay.as_secs_f64()
        );
        self.runlog.record(&e, &run.env.redactor)?;
        Ok(Phase::Backoff {
            n,
            delay,
            last: end,
        })
    }

    /// Runs maker and checker once under a fresh budget.
    async fn try_once(&self, run: &mut Run<'_>) -> Result<Tried> {
        let wf = run.wf;
        let mut guard = BudgetGuard::new(wf.caps.clone());
        let vars = step_vars(wf, &run.rec, &run.env, &self.state_dir);
        let ended = |end: End, guard: &BudgetGuard, output: Option<Value>| Tried {
            passed: Err(end),
            figures: guard.figures(),
            output,
            verify: None,
        };
        let (ctx, env, cancel) = (&run.ctx, &run.env, run.cancel);
        let maker = self
            .step(
                wf,
                &mut run.rec,
                StepKind::Run,
                &wf.run,
                ctx,
                &vars,
                Some(&mut guard),
                None,
                env,
                cancel,
            )
            .await?;
        if let Some(end) = stopped(&maker) {
            return Ok(ended(end, &guard, None));
        }
        if let Some(reason) = &maker.block {
            let why = format!("blocked: {reason}");
            return Ok(ended(End::Blocked { why }, &guard, None));
        }
        if !maker.succeeded() {
            let why = failure("run", &maker);
            return Ok(ended(End::Failed { why }, &guard, None));
        }
        let output = parse_output(&maker.stdout);
        if maker.noop || output == json!({"noop": true}) {
            let why = "the maker found nothing to do".to_string();
            return Ok(ended(End::CleanNoOp { why }, &guard, Some(output)));
        }

        let mut vctx = ctx.clone();
        vctx["output"] = output.clone();
        let verify = self
            .step(
                wf,
                &mut run.rec,
                StepKind::Verify,
                &wf.verify,
                &vctx,
                &vars,
                Some(&mut guard),
                None,
                env,
                cancel,
            )
            .await?;
        if let Some(end) = stopped(&verify) {
            return Ok(ended(end, &guard, Some(output)));
        }
        let (verdict, detail) = verdict_of(&verify);
        let record = VerifyRecord {
            verdict,
            reason: detail.clone(),
            confidence: verify.confidence.clone(),
            output: Some(parse_output(&verify.stdout)),
        };
        let passed = match verdict {
            Verdict::Pass => Ok(output.clone()),
            Verdict::Escalate => Err(End::ApprovalRequired { detail }),
            Verdict::Fail => Err(End::Failed {
                why: format!("verify failed: {detail}"),
            }),
        };
        Ok(Tried {
            passed,
            figures: guard.figures(),
            output: Some(output),
            verify: Some(record),
        })
    }

    /// Verify passed (or an operator approved): commit when live, else end dry.
    async fn passed(&self, run: &mut Run<'_>, output: Value, approved: bool) -> Result<Phase> {
        if !run.live {
            let why = if approved {
                "approved by operator; dry-run: commit skipped"
            } else if run.wf.commit.is_some() {
                "verify passed; dry-run: commit skipped"
            } else {
                "verify passed; dry-run (no commit step)"
            };
            return Ok(Phase::Ended(End::Success {
                why,
                committed: false,
            }));
        }
        let ctx = json!({
            "run_id": run.rec.run_id,
            "workflow": run.wf.id,
            "attempt": run.rec.attempt,
            "dry_run": false,
            "trigger": run.rec.trigger,
            "output": output,
        });
        Ok(Phase::Ended(self.commit(run, &ctx).await?))
    }

    /// The commit step, bracketed by durable key phases.
    async fn commit(&self, run: &mut Run<'_>, ctx: &Value) -> Result<End> {
        let wf = run.wf;
        let Some(commit) = &wf.commit else {
            if let Some(key) = &run.rec.idempotency_key {
                self.store
                    .set_key(&wf.id, key, &run.rec.run_id, KeyPhase::Committed)?;
            }
            return Ok(End::Success {
                why: "verify passed; no commit step configured",
                committed: false,
            });
        };
        if let Some(key) = &run.rec.idempotency_key {
            self.store
                .set_key(&wf.id, key, &run.rec.run_id, KeyPhase::Committing)?;
        }
        self.store.put_run(&run.rec)?;
        self.durable().await?;
        let vars = step_vars(wf, &run.rec, &run.env, &self.state_dir);
        let out = self
            .step(
                wf,
                &mut run.rec,
                StepKind::Commit,
                commit,
                ctx,
                &vars,
                None,
                commit.timeout,
                &run.env,
                run.cancel,
            )
            .await?;
        run.rec.commit_output = Some(parse_output(&out.stdout));
        if out.succeeded() {
            if let Some(key) = &run.rec.idempotency_key {
                self.store
                    .set_key(&wf.id, key, &run.rec.run_id, KeyPhase::Committed)?;
            }
            return Ok(End::Success {
                why: "verify passed; committed",
                committed: true,
            });
        }
        // A commit that exited with a failure status says it did not commit; one that was
        // killed or crashed may have done half of it, so its key is left in doubt.
        let clean_failure = out.ending == Ending::Exited && matches!(out.exit, Some(Exit::Code(_)));
        let why = failure("commit", &out);
        if clean_failure || matches!(out.ending, Ending::SpawnFailed(_)) {
            return Ok(End::Failed { why });
        }
        if let Some(key) = &run.rec.idempotency_key {
            self.store
                .set_key(&wf.id, key, &run.rec.run_id, KeyPhase::InDoubt)?;
        }
        Ok(End::CommitInDoubt {
            why,
            interrupted: out.ending == Ending::Cancelled,
        })
    }
}
