//! The dispatched member's turn: its own governed run, through the runner, capped by
//! what the case has left; its run id is the receipt.

use std::sync::Arc;

use serde_json::{json, Value};

use super::case::{append, log, reload, Case, CaseError, Dispatch, EventKind, Receipt};
use crate::config::Config;
use crate::governed::Fire;
use crate::live::Ask;
use crate::runner::{Job, Runner};
use crate::store::{RunRecord, RunState};

/// Runs the dispatched member as its own governed run through the runner (caps,
/// overlap, forced dry-run and shutdown grace apply as to any run), capped by what the
/// case has left, and records the receipt. A run that ended without a result of its own
/// (interrupted, skipped) is recorded as unfinished and its dispatch stays pending.
/// How the member's run went, and the case after its receipt.
pub(super) struct MemberRun {
    pub case: Case,
    pub dispatch: Dispatch,
    pub run: RunRecord,
    /// Interrupted or skipped: the dispatch stays to be redone.
    pub unfinished: bool,
}

pub(super) async fn run_member(
    runner: &Runner,
    config: &Config,
    case: Case,
    d: Dispatch,
) -> Result<MemberRun, CaseError> {
    let engine = runner.engine();
    let mut wf = config.workflows.get(&d.skill).cloned().ok_or_else(|| {
        CaseError::Refused(format!(
            "member {} runs workflow `{}`, which is not in the config",
            d.member, d.skill
        ))
    })?;
    let remaining = (case.agency.limits.max_spend_usd - case.spend_usd).max(0.0);
    // Never widen a cap: the tighter of the workflow's and the case's remaining spend.
    wf.caps.max_cost_usd = wf.caps.max_cost_usd.min(remaining);
    let cap = wf.caps.max_cost_usd;
    // The dispatch reaches the member as trigger.payload, like any manual payload.
    let fire = Fire::new(
        "agency",
        None,
        json!({ "payload": { "agency": case.agency.id, "case_id": case.case_id, "turn": d.turn, "member": d.member, "task": d.task, "needed_scope": d.needed_scope } }),
    );
    let rec = runner.run(Job::fire(Arc::new(wf), fire, Ask::Auto)).await?;
    let receipt = Receipt {
        turn: d.turn,
        member: d.member.clone(),
        run_id: rec.run_id.clone(),
        state: rec.state.name().to_string(),
        output: rec.output.clone().unwrap_or(Value::Null),
        spend_usd: rec.figures.cost_usd.min(cap),
    };
    let unfinished = matches!(rec.state, RunState::Interrupted | RunState::Skipped);
    let (kind, key) = if unfinished {
        (
            EventKind::MemberUnfinished,
            format!("{}:{}:unfinished:{}", case.case_id, d.turn, rec.run_id),
        )
    } else {
        (
            EventKind::MemberResult,
            format!("{}:{}:result", case.case_id, d.turn),
        )
    };
    append(
        engine,
        &case,
        &key,
        kind,
        serde_json::to_value(&receipt).unwrap_or_default(),
    )?;
    log(
        engine,
        &case.agency.id,
        &case.case_id,
        if unfinished { "unfinished" } else { "receipt" },
        format!(
            "turn {} {}: run {} ended {}",
            d.turn, d.member, rec.run_id, rec.state
        ),
    );
    Ok(MemberRun {
        case: reload(engine, &case.case_id)?,
        dispatch: d,
        run: rec,
        unfinished,
    })
}
