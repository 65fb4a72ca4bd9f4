//! How a run ends: [`End`], the terminal state with what it carries, and the readings
//! of a step's outcome that decide it (the checker's verdict, a step's failure).

use std::time::Duration;

use serde_json::Value;

use crate::budget::Breach;
use crate::step::{Ending, Exit, StepOutcome};
use crate::store::{KeyPhase, KeyRecord, RunState};

pub use crate::store::Verdict;

/// A run's end, with what each end carries. [`super::Engine`]'s `finish` is the one
/// place that turns it into the terminal record.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// Verify passed; committed (live) or commit skipped (dry-run).
    Success { why: &'static str, committed: bool },
    /// The maker found nothing to do, or the key already committed.
    CleanNoOp { why: String },
    /// `block` on fd 3, or the key is held elsewhere.
    Blocked { why: String },
    /// Verify escalated: the run waits for an operator.
    ApprovalRequired { detail: String },
    /// A budget cap was crossed; the group was killed.
    Exhausted { breach: Breach },
    /// No tick, charge or output for the stall timeout.
    Stagnated { idle: Duration },
    /// A step failed or verify said fail.
    Failed { why: String },
    /// The commit step was killed or crashed: it may have partly happened, so the key is
    /// in doubt. `interrupted` when steward stopped it.
    CommitInDoubt { why: String, interrupted: bool },
    /// steward stopped the run before its commit.
    Interrupted { why: String },
    /// A fire the overlap policy did not run.
    Skipped { why: String },
    /// A scheduled slot that passed while steward was not running.
    Missed { why: String },
}

impl End {
    pub fn state(&self) -> RunState {
        match self {
            End::Success { .. } => RunState::Success,
            End::CleanNoOp { .. } => RunState::CleanNoOp,
            End::Blocked { .. } => RunState::Blocked,
            End::ApprovalRequired { .. } => RunState::ApprovalRequired,
            End::Exhausted { .. } => RunState::Exhausted,
            End::Stagnated { .. } => RunState::Stagnated,
            End::Failed { .. } => RunState::Failed,
            End::CommitInDoubt {
                interrupted: true, ..
            } => RunState::Interrupted,
            End::CommitInDoubt { .. } => RunState::Failed,
            End::Interrupted { .. } => RunState::Interrupted,
            End::Skipped { .. } => RunState::Skipped,
            End::Missed { .. } => RunState::Missed,
        }
    }

    /// Why, for a person.
    pub fn reason(&self) -> String {
        match self {
            End::Success { why, .. } => why.to_string(),
            End::Exhausted { breach } => format!("budget exhausted: {breach}"),
            End::Stagnated { idle } => format!(
                "stagnated: no tick, charge or output for {:.1}s",
                idle.as_secs_f64()
            ),
            End::ApprovalRequired { detail } => format!("verify escalated: {detail}"),
            End::CommitInDoubt { why, .. } => format!(
                "{why}; the commit may have partly happened: its idempotency key is in doubt"
            ),
            End::CleanNoOp { why }
            | End::Blocked { why }
            | End::Failed { why }
            | End::Interrupted { why }
            | End::Skipped { why }
            | End::Missed { why } => why.clone(),
        }
    }

    pub fn breach(&self) -> Option<String> {
        match self {
            End::Exhausted { breach } => Some(breach.to_string()),
            _ => None,
        }
    }

    /// A failed or retried attempt worth another try: failed and stagnated only.
    pub fn retryable(&self) -> bool {
        matches!(self, End::Failed { .. } | End::Stagnated { .. })
    }

    pub fn key_in_doubt(&self) -> bool {
        matches!(self, End::CommitInDoubt { .. })
    }
}

/// A re-fire whose key is already taken: how it ends, without starting a process.
pub(super) fn key_taken(k: &KeyRecord) -> End {
    match k.phase {
        KeyPhase::Committed => End::CleanNoOp {
            why: format!("idempotency key `{}` already committed by run {}: nothing to do", k.key, k.run_id),
        },
        KeyPhase::InDoubt => End::Blocked {
            why: format!(
                "idempotency key `{}` is in doubt: run {} was interrupted {}; settle it with `steward in-doubt resolve {} {} --committed|--not-committed`",
                k.key,
                k.run_id,
                if k.found_in == Some(KeyPhase::Committing) { "during its commit" } else { "before its commit" },
                k.workflow,
                k.key
            ),
        },
        KeyPhase::AwaitingApproval => End::Blocked {
            why: format!("idempotency key `{}` waits for operator review of run {} (`steward approve|reject {}`)", k.key, k.run_id, k.run_id),
        },
        KeyPhase::Reserved | KeyPhase::Committing => End::Blocked {
            why: format!("idempotency key `{}` is held by run {}, still in flight", k.key, k.run_id),
        },
    }
}

/// A step that was stopped by the guard (or never started): how the run ends.
pub(super) fn stopped(out: &StepOutcome) -> Option<End> {
    match &out.ending {
        Ending::Exited => None,
        Ending::Breach(b) => Some(End::Exhausted { breach: b.clone() }),
        Ending::Stalled(d) => Some(End::Stagnated { idle: *d }),
        Ending::TimedOut(d) => Some(End::Failed {
            why: format!("timed out after {:.1}s", d.as_secs_f64()),
        }),
        Ending::SpawnFailed(e) => Some(End::Failed { why: e.clone() }),
        Ending::Cancelled => Some(End::Interrupted {
            why: "interrupted: steward stopped the run before its commit".to_string(),
        }),
    }
}

pub(super) fn failure(step: &str, out: &StepOutcome) -> String {
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
pub(super) fn verdict_of(out: &StepOutcome) -> (Verdict, String) {
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
        "pass" => return (Verdict::Pass, detail("checker said pass".into())),
        "fail" => return (Verdict::Fail, detail("checker said fail".into())),
        "escalate" => {
            return (
                Verdict::Escalate,
                detail("checker asked for a human".into()),
            )
        }
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
        Some(Exit::Code(0)) => (Verdict::Pass, "checker exited 0".into()),
        Some(Exit::Code(1)) => (
            Verdict::Fail,
            non_empty(first_line_detail(), "checker exited 1"),
        ),
        Some(Exit::Code(2)) => (
            Verdict::Escalate,
            non_empty(first_line_detail(), "checker exited 2"),
        ),
        Some(exit) => (
            Verdict::Fail,
            format!("checker ended abnormally ({exit}) {}", first_line_detail())
                .trim()
                .to_string(),
        ),
        None => (Verdict::Fail, "checker ended without an exit status".into()),
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
pub(super) fn parse_output(stdout: &str) -> Value {
    let t = stdout.trim();
    if t.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(t).unwrap_or_else(|_| Value::String(stdout.to_string()))
}
