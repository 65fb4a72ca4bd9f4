//! The operator's acts on runs and workflows: go-live and back, rejecting a run under
//! review, settling an in-doubt key; and the runlog lines that record who did them.

use chrono::Utc;

use super::env::StepEnv;
use super::{Engine, EngineError, Result};
use crate::redact::Redactor;
use crate::runlog::Entry;
use crate::store::{Approval, KeyPhase, KeyRecord, RunRecord, RunState};
use crate::workflow::Workflow;

impl Engine {
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
            approved_by: login_name(),
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

    /// The run waiting for review under `run_id`, or why there is none.
    pub fn review_item(&self, run_id: &str) -> Result<RunRecord> {
        self.pending_review(run_id)
    }

    /// `steward reject RUN`: the operator refuses an escalated run; its key is freed.
    pub fn reject(&self, run_id: &str, why: Option<&str>) -> Result<RunRecord> {
        let mut rec = self.pending_review(run_id)?;
        let env = StepEnv::none();
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

    pub(super) fn pending_review(&self, run_id: &str) -> Result<RunRecord> {
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

    pub(super) fn entry(&self, rec: &RunRecord, step: &str, status: &str) -> Entry {
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

    pub(super) fn log_operator_run(
        &self,
        rec: &RunRecord,
        step: &str,
        detail: &str,
        redactor: &Redactor,
    ) -> Result<()> {
        let mut e = self.entry(rec, step, "operator");
        e.detail = format!("{detail} (by {})", login_name());
        self.runlog.record(&e, redactor)?;
        Ok(())
    }

    pub(super) fn log_operator(&self, workflow: &str, step: &str, detail: &str) -> Result<()> {
        let detail = format!("{detail} (by {})", login_name());
        self.log_workflow(workflow, step, "operator", &detail)
    }

    /// A runlog line about a workflow rather than one of its runs.
    pub(super) fn log_workflow(
        &self,
        workflow: &str,
        step: &str,
        status: &str,
        detail: &str,
    ) -> Result<()> {
        let e = Entry {
            ts: Utc::now(),
            run_id: String::new(),
            workflow: workflow.to_string(),
            attempt: 0,
            step: step.to_string(),
            status: status.to_string(),
            figures: None,
            duration_ms: None,
            detail: detail.to_string(),
            data: None,
        };
        self.runlog.record(&e, &Redactor::default())?;
        Ok(())
    }
}

/// Who is acting, for approvals, the runlog and a case turn's default driver: the user
/// behind `sudo`, else the login name of the uid (from the user database), else `$USER`
/// or `$LOGNAME`, else the uid itself. Never empty, so it works in a root container
/// where `$USER` is unset.
pub fn login_name() -> String {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let uid = nix::unistd::getuid();
    env("SUDO_USER")
        .or_else(|| {
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .or_else(|| env("USER"))
        .or_else(|| env("LOGNAME"))
        .unwrap_or_else(|| format!("uid {uid}"))
}
