//! What a turn tells: the seed's `agency_turn` object, its status with the exit code
//! `steward case advance` gives it, and a person's view of it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::case::{predicates, Case, Dispatch};

/// The `agency_turn` object of the seed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Turn {
    pub schema: String,
    pub status: TurnStatus,
    pub case_id: String,
    pub turn: u64,
    pub dispatch: Option<Dispatch>,
    pub approval_prompt: Option<String>,
    pub resolution: Option<Value>,
    pub predicates: Value,
    pub reason: Option<String>,
    pub next: String,
    /// The member run's id, when this turn ran it (`--run`).
    pub receipt: Option<String>,
}

/// How a turn ended: the `status` of the seed's `agency_turn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// A move was made (a member ran, or the case took a step of its own).
    Advanced,
    /// The case waits for an operator's approval.
    AwaitingApproval,
    /// The planner asks for input the case does not have.
    NeedsInput,
    /// A move was held back (a cap, a pause, the daemon's rules).
    Held,
    /// The move was refused (scope, roster, a lease held by another driver).
    Refused,
    Resolved,
    Failed,
}

impl TurnStatus {
    pub fn name(self) -> &'static str {
        match self {
            TurnStatus::Advanced => "advanced",
            TurnStatus::AwaitingApproval => "awaiting_approval",
            TurnStatus::NeedsInput => "needs_input",
            TurnStatus::Held => "held",
            TurnStatus::Refused => "refused",
            TurnStatus::Resolved => "resolved",
            TurnStatus::Failed => "failed",
        }
    }

    /// The exit code `steward case advance` reports for a turn that ended so.
    pub fn exit_code(self) -> i32 {
        match self {
            TurnStatus::Refused => 4,
            TurnStatus::Failed => 5,
            TurnStatus::Held => 9,
            TurnStatus::Advanced
            | TurnStatus::AwaitingApproval
            | TurnStatus::NeedsInput
            | TurnStatus::Resolved => 0,
        }
    }
}

impl std::fmt::Display for TurnStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The schema of the `agency_turn` object.
pub const SCHEMA: &str = "runx.agency.turn.v1";

/// A turn of `case` that ended with `status`.
pub(super) fn turn(case: &Case, status: TurnStatus, reason: Option<String>, next: &str) -> Turn {
    Turn {
        schema: SCHEMA.into(),
        status,
        case_id: case.case_id.clone(),
        turn: case.turns,
        dispatch: None,
        approval_prompt: None,
        resolution: case.resolution.clone(),
        predicates: predicates(case).0,
        reason,
        next: next.into(),
        receipt: None,
    }
}

/// A person's view of a turn.
pub fn render(t: &Turn) -> String {
    let mut s = format!("case {} turn {}: {}", t.case_id, t.turn, t.status);
    if let Some(d) = &t.dispatch {
        s.push_str(&format!(
            "\n  dispatch: {} ({}) — {} [scope: {}]",
            d.member,
            d.skill,
            d.task,
            d.needed_scope.join(", ")
        ));
    }
    if let Some(r) = &t.receipt {
        s.push_str(&format!("\n  receipt: run {r}"));
    }
    if let Some(p) = &t.approval_prompt {
        s.push_str(&format!("\n  approval: {p}"));
    }
    if let Some(r) = &t.reason {
        s.push_str(&format!("\n  reason: {r}"));
    }
    if let Some(r) = &t.resolution {
        s.push_str(&format!("\n  resolution: {r}"));
    }
    s.push_str(&format!(
        "\n  predicates: {}\n  next: {}",
        t.predicates, t.next
    ));
    s
}
