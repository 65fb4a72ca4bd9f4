//! Live or dry: the one place that decides whether a run may make its side effect, and
//! says why.
//!
//! A run is live only when every one of these holds: the file says `dry_run = false`,
//! an operator approved go-live of this exact config (its sha256), the config was not
//! edited since, no forced dry-run (SIGUSR1) is on, and — for a run asked for by hand —
//! the operator asked for live (`--live`). [`decide`] checks them in that order and
//! returns the first that fails as the [`DryReason`]; the runner calls it for every road
//! a run can take, and the reason is written into the runlog's `trigger` line and the
//! run record.

use serde::{Deserialize, Serialize};

use crate::store::{Approval, Store, StoreError};
use crate::workflow::Workflow;

/// What the workflow's file and its go-live approval allow.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveStatus {
    /// The file says `dry_run = true` (or does not say).
    DryRunInConfig,
    /// `dry_run = false`, but no operator approved go-live.
    NotApproved,
    /// Approved once, but the file changed since: dry-run until approved again.
    ApprovalStale(Approval),
    Live(Approval),
}

impl LiveStatus {
    /// Reads the workflow's approval from the store.
    pub fn of(store: &Store, wf: &Workflow) -> Result<LiveStatus, StoreError> {
        if wf.dry_run {
            return Ok(LiveStatus::DryRunInConfig);
        }
        Ok(match store.approval(&wf.id)? {
            None => LiveStatus::NotApproved,
            Some(a) if a.config_hash == wf.config_hash => LiveStatus::Live(a),
            Some(a) => LiveStatus::ApprovalStale(a),
        })
    }

    pub fn is_live(&self) -> bool {
        matches!(self, LiveStatus::Live(_))
    }

    pub fn describe(&self, workflow: &str) -> String {
        match self {
            LiveStatus::DryRunInConfig => "dry-run (the config says dry_run = true; set it to false, then `steward go-live`)".to_string(),
            LiveStatus::NotApproved => format!("dry-run (waiting for an operator: `steward go-live {workflow}`)"),
            LiveStatus::ApprovalStale(a) => format!(
                "dry-run (the config changed after go-live was approved on {}; approve again with `steward go-live {workflow}`)",
                a.approved_at.format("%Y-%m-%d %H:%M UTC")
            ),
            LiveStatus::Live(a) => format!(
                "live (approved by {} on {})",
                a.approved_by,
                a.approved_at.format("%Y-%m-%d %H:%M UTC")
            ),
        }
    }
}

/// What the road that started a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// A trigger, a catch-up, a case turn, a retry of a live run: live whenever allowed.
    Auto,
    /// The operator asked for live (`steward run --live`): refused if not approved.
    Live,
    /// The operator did not ask for live (`steward run` without `--live`, a preview).
    Dry,
    /// A follower of a dry upstream run: a rehearsal of the whole chain runs dry.
    DryUpstream,
}

/// Why a run is dry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DryReason {
    /// The file says `dry_run = true`.
    ConfigSaysDryRun,
    /// No operator approved go-live.
    NotApproved,
    /// The config was edited after go-live was approved.
    ConfigEdited,
    /// SIGUSR1 forced dry-run for every workflow.
    ForcedDryRun,
    /// The operator did not ask for a live run.
    LiveNotAsked,
    /// The run being resumed (an approval of an escalated run) was itself a dry-run.
    RunWasDry,
    /// The upstream run that fired it (an `after` trigger) was a dry-run.
    UpstreamWasDry,
}

impl DryReason {
    pub fn describe(self) -> &'static str {
        match self {
            DryReason::ConfigSaysDryRun => "the config says dry_run = true",
            DryReason::NotApproved => "go-live not approved (`steward go-live`)",
            DryReason::ConfigEdited => "the config was edited after go-live was approved",
            DryReason::ForcedDryRun => "forced dry-run is on (SIGUSR1; SIGUSR2 lifts it)",
            DryReason::LiveNotAsked => "live not asked for (`--live` not given)",
            DryReason::RunWasDry => "the run was a dry-run",
            DryReason::UpstreamWasDry => "the upstream run that fired it was a dry-run",
        }
    }
}

/// The decision for one run.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Live(Approval),
    Dry(DryReason),
}

impl Mode {
    pub fn is_live(&self) -> bool {
        matches!(self, Mode::Live(_))
    }

    pub fn dry_reason(&self) -> Option<DryReason> {
        match self {
            Mode::Live(_) => None,
            Mode::Dry(r) => Some(*r),
        }
    }

    /// `live` or `dry-run: <why>`, as the runlog says it.
    pub fn describe(&self) -> String {
        match self {
            Mode::Live(_) => "live".to_string(),
            Mode::Dry(r) => format!("dry-run: {}", r.describe()),
        }
    }
}

/// A live run asked for by hand that the workflow's approval does not allow.
#[derive(Debug, Clone, thiserror::Error)]
#[error("workflow `{workflow}` cannot run live: {status}")]
pub struct LiveRefused {
    pub workflow: String,
    pub status: String,
}

/// Live or dry, and why. An explicit `--live` that the approval or a forced dry-run does
/// not allow is refused rather than quietly run dry; a forced dry-run makes any other run
/// dry, whatever started it.
pub fn decide(
    status: &LiveStatus,
    forced: bool,
    ask: Ask,
    workflow: &str,
) -> Result<Mode, LiveRefused> {
    if ask == Ask::Live && !status.is_live() {
        return Err(LiveRefused {
            workflow: workflow.to_string(),
            status: status.describe(workflow),
        });
    }
    if ask == Ask::Live && forced {
        return Err(LiveRefused {
            workflow: workflow.to_string(),
            status: DryReason::ForcedDryRun.describe().to_string(),
        });
    }
    let approval = match status {
        LiveStatus::DryRunInConfig => return Ok(Mode::Dry(DryReason::ConfigSaysDryRun)),
        LiveStatus::NotApproved => return Ok(Mode::Dry(DryReason::NotApproved)),
        LiveStatus::ApprovalStale(_) => return Ok(Mode::Dry(DryReason::ConfigEdited)),
        LiveStatus::Live(a) => a,
    };
    if forced {
        return Ok(Mode::Dry(DryReason::ForcedDryRun));
    }
    if ask == Ask::Dry {
        return Ok(Mode::Dry(DryReason::LiveNotAsked));
    }
    if ask == Ask::DryUpstream {
        return Ok(Mode::Dry(DryReason::UpstreamWasDry));
    }
    Ok(Mode::Live(approval.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval() -> Approval {
        Approval {
            workflow: "w".into(),
            config_hash: "h".into(),
            approved_at: chrono::Utc::now(),
            approved_by: "op".into(),
        }
    }

    #[test]
    fn every_reason_in_its_order() {
        let live = LiveStatus::Live(approval());
        let d = |s: &LiveStatus, forced, ask| decide(s, forced, ask, "w").map(|m| m.dry_reason());
        assert_eq!(
            d(&LiveStatus::DryRunInConfig, true, Ask::Auto).unwrap(),
            Some(DryReason::ConfigSaysDryRun)
        );
        assert_eq!(
            d(&LiveStatus::NotApproved, false, Ask::Auto).unwrap(),
            Some(DryReason::NotApproved)
        );
        assert_eq!(
            d(&LiveStatus::ApprovalStale(approval()), false, Ask::Dry).unwrap(),
            Some(DryReason::ConfigEdited)
        );
        assert_eq!(
            d(&live, true, Ask::Auto).unwrap(),
            Some(DryReason::ForcedDryRun)
        );
        assert!(d(&live, true, Ask::Live).is_err());
        assert_eq!(
            d(&live, false, Ask::Dry).unwrap(),
            Some(DryReason::LiveNotAsked)
        );
        assert_eq!(d(&live, false, Ask::Auto).unwrap(), None);
        assert_eq!(d(&live, false, Ask::Live).unwrap(), None);
        assert!(d(&LiveStatus::NotApproved, false, Ask::Live).is_err());
    }
}
