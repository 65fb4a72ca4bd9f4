//! One turn of a case: fold, check the limits before any judgment, ask the planner for
//! one move, constrain it to the roster and the scope ceilings, append the turn at the
//! folded version (the lease), then — with `--run`, and always under the daemon — run the
//! member ([`super::member`]).

use serde_json::{json, Value};

use super::case::CaseError;
use super::case::{append, load, log, reload, Case, CaseStatus, Dispatch, EventKind, Receipt};
use super::limits::{over_limit, over_window};
use super::member::{run_member, MemberRun};
use super::outcome::{turn, Turn, TurnStatus};
use super::planner::{ask_planner, prompt, Proposal};
use crate::config::Config;
use crate::governed::Engine;
use crate::runner::Runner;
use crate::store::RunState;

/// `steward case advance`: one governed turn. `member_result` records a hand-run
/// member's outcome first; `run` runs the dispatched member right away.
pub async fn advance(
    runner: &Runner,
    config: &Config,
    case_id: &str,
    driver: &str,
    member_result: Option<Receipt>,
    run: bool,
) -> Result<Turn, CaseError> {
    if driver.trim().is_empty() {
        return Err(CaseError::Refused(
            "--driver is empty: name who drives this turn (it is part of the turn's key), or leave --driver out for your login name".into(),
        ));
    }
    let engine = runner.engine();
    let Some((mut case, _)) = load(engine, case_id)? else {
        return Err(CaseError::Refused(format!(
            "no case `{case_id}` (see `steward case list`; open one with `steward case open --agency AGENCY --case {case_id}`)"
        )));
    };
    if let Some(t) = closed(&case) {
        return Ok(t);
    }
    if let Some(r) = member_result {
        case = record_result(engine, &case, r)?;
    }
    if let Some(p) = case.pending.clone() {
        if !run {
            let mut t = turn(
                &case,
                TurnStatus::NeedsInput,
                Some(format!(
                    "turn {} dispatched {} and its result is not recorded",
                    p.turn, p.member
                )),
                "record it: --member-result FILE, or advance with --run",
            );
            t.dispatch = Some(p);
            return Ok(t);
        }
        // Run the dispatched member now (the turn event, the lease, is already there).
        return member_turn(run_member(runner, config, case, p).await?);
    }
    // The measurable gate comes before any judgment.
    if let Some(t) = over_limit(engine, &case, driver)? {
        return Ok(t);
    }
    if let Some(t) = over_window(engine, &case)? {
        return Ok(t);
    }
    if let Some(run_id) = case.awaiting_review.clone() {
        match settle_review(engine, &case, &run_id)? {
            Some(settled) => case = settled,
            None => {
                let reason = format!("member run {run_id} escalated: it waits in the review queue");
                let next = format!("steward approve {run_id} (or reject it), then advance");
                return Ok(turn(
                    &case,
                    TurnStatus::AwaitingApproval,
                    Some(reason),
                    &next,
                ));
            }
        }
    }
    if case.status == CaseStatus::AwaitingApproval {
        let mut t = turn(
            &case,
            TurnStatus::AwaitingApproval,
            Some("a consequential move waits for approval".into()),
            &format!("steward case approve {case_id}"),
        );
        t.approval_prompt = case.awaiting.as_ref().map(|p| prompt(&case, p));
        return Ok(t);
    }
    let proposal = match (&case.awaiting, case.approved) {
        (Some(p), true) => p.clone(),
        _ => ask_planner(&case, &config.root).await.map_err(|e| {
            log(
                engine,
                &case.agency.id,
                case_id,
                "refused",
                format!("planner: {e}"),
            );
            CaseError::Refused(format!("planner: {e}"))
        })?,
    };
    let key = format!("{case_id}:{}:{driver}", case.turns + 1);
    match Proposal::read(&proposal) {
        Proposal::Resolve { resolution, reason } => {
            resolve(engine, &case, &key, resolution, reason)
        }
        Proposal::Escalate { missing } => escalate(engine, &case, &key, &missing),
        Proposal::Dispatch {
            member,
            task,
            needed_scope,
        } => {
            let dispatch = match constrain(&case, &member, task, needed_scope) {
                Constrained::Go(d) => d,
                Constrained::Refused(why) => return refuse(engine, &case, why),
                Constrained::NeedsApproval { member } => {
                    return await_approval(engine, &case, &member, &proposal, &key)
                }
            };
            // The lease: this append lands before the member runs, or nothing runs.
            append(
                engine,
                &case,
                &key,
                EventKind::Turn,
                json!({ "decision": "dispatch", "dispatch": dispatch, "driver": driver }),
            )?;
            log(
                engine,
                &case.agency.id,
                case_id,
                "advanced",
                format!(
                    "turn {} → {}: {}",
                    dispatch.turn, dispatch.member, dispatch.task
                ),
            );
            let case = reload(engine, case_id)?;
            if run {
                return member_turn(run_member(runner, config, case, dispatch).await?);
            }
            let mut t = turn(
                &case,
                TurnStatus::Advanced,
                None,
                &format!(
                    "run {} ({}), then advance with its result",
                    dispatch.member, dispatch.skill
                ),
            );
            t.dispatch = Some(dispatch);
            Ok(t)
        }
        Proposal::Unknown(other) => refuse(
            engine,
            &case,
            format!("the planner proposed `{other}`: expected dispatch, resolve or escalate"),
        ),
    }
}

/// The turn a member's run makes.
fn member_turn(m: MemberRun) -> Result<Turn, CaseError> {
    let MemberRun {
        case,
        dispatch: d,
        run: rec,
        unfinished,
    } = m;
    let mut t = if unfinished {
        turn(
            &case,
            TurnStatus::NeedsInput,
            Some(format!(
                "{}'s run {} ended {} ({}): the turn is not done",
                d.member, rec.run_id, rec.state, rec.reason
            )),
            "advance with --run to redo it",
        )
    } else {
        turn(
            &case,
            TurnStatus::Advanced,
            Some(format!("{} ran: {} ({})", d.member, rec.state, rec.reason)),
            "advance again",
        )
    };
    t.dispatch = Some(d);
    t.receipt = Some(rec.run_id);
    Ok(t)
}

/// A resolved or failed case advances no further.
fn closed(case: &Case) -> Option<Turn> {
    let closed = "nothing: the case is closed";
    match case.status {
        CaseStatus::Resolved => Some(turn(
            case,
            TurnStatus::Resolved,
            Some("the case is resolved".into()),
            closed,
        )),
        CaseStatus::Failed => Some(turn(case, TurnStatus::Failed, case.reason.clone(), closed)),
        _ => None,
    }
}

/// Records a hand-run member's result against the pending dispatch.
fn record_result(engine: &Engine, case: &Case, mut r: Receipt) -> Result<Case, CaseError> {
    // No dispatch waits for a result: another driver recorded it first (or the case
    // moved on). Either way this driver's view is stale: a conflict, nothing runs.
    let Some(p) = case.pending.clone() else {
        return Err(CaseError::Conflict {
            case: case.case_id.clone(),
            version: case.version,
        });
    };
    r.turn = p.turn;
    r.member = p.member.clone();
    append(
        engine,
        case,
        &format!("{}:{}:result", case.case_id, p.turn),
        EventKind::MemberResult,
        serde_json::to_value(&r).unwrap_or_default(),
    )?;
    reload(engine, &case.case_id)
}

/// The escalated member run once an operator approved or rejected it: recorded on the
/// case, which goes on. None while it still waits for review.
fn settle_review(engine: &Engine, case: &Case, run_id: &str) -> Result<Option<Case>, CaseError> {
    let state = match engine.store.run(run_id)? {
        Some(rec) if rec.state == RunState::ApprovalRequired => return Ok(None),
        Some(rec) => rec.state,
        // Pruned past retention: nothing to wait for any more.
        None => RunState::Failed,
    };
    append(
        engine,
        case,
        &format!("{}:review:{run_id}", case.case_id),
        EventKind::ReviewSettled,
        json!({ "run_id": run_id, "state": state.name() }),
    )?;
    log(
        engine,
        &case.agency.id,
        &case.case_id,
        "review_settled",
        format!("member run {run_id} ended {state} after review"),
    );
    Ok(Some(reload(engine, &case.case_id)?))
}

fn resolve(
    engine: &Engine,
    case: &Case,
    key: &str,
    summary: Value,
    reason: Option<String>,
) -> Result<Turn, CaseError> {
    if case.receipts.is_empty() {
        let why = "the planner wants to resolve, but no work has a receipt yet".into();
        return refuse(engine, case, why);
    }
    let receipts: Vec<&str> = case.receipts.iter().map(|r| r.run_id.as_str()).collect();
    let resolution = json!({ "summary": summary, "receipts": receipts });
    append(
        engine,
        case,
        key,
        EventKind::Turn,
        json!({ "decision": "resolve", "resolution": resolution }),
    )?;
    log(
        engine,
        &case.agency.id,
        &case.case_id,
        "resolved",
        format!("receipts: {}", receipts.join(", ")),
    );
    let case = reload(engine, &case.case_id)?;
    Ok(turn(
        &case,
        TurnStatus::Resolved,
        reason,
        "nothing: the case is closed",
    ))
}

fn escalate(engine: &Engine, case: &Case, key: &str, missing: &str) -> Result<Turn, CaseError> {
    append(
        engine,
        case,
        key,
        EventKind::Turn,
        json!({ "decision": "escalate", "missing": missing }),
    )?;
    let contact = &case.agency.escalation_contact;
    let reason = format!("no member can act: missing {missing}; escalated to {contact}");
    log(
        engine,
        &case.agency.id,
        &case.case_id,
        "needs_input",
        reason.clone(),
    );
    let case = reload(engine, &case.case_id)?;
    Ok(turn(
        &case,
        TurnStatus::NeedsInput,
        Some(reason),
        &format!("{contact} provides {missing}, then advance"),
    ))
}

/// What the roster, the scope ceilings and the approval rules make of a dispatch.
enum Constrained {
    Go(Dispatch),
    Refused(String),
    /// A consequential move: it waits for `steward case approve`.
    NeedsApproval {
        member: String,
    },
}

fn constrain(case: &Case, member: &str, task: String, needed: Vec<String>) -> Constrained {
    let Some(m) = case.agency.roster.iter().find(|m| m.name == member) else {
        return Constrained::Refused(format!(
            "the planner proposed `{member}`, who is not on the roster"
        ));
    };
    if let Some(s) = needed.iter().find(|s| !m.scopes.contains(s)) {
        return Constrained::Refused(format!(
            "the planner asked for scope `{s}`, beyond {}'s ceiling {:?}",
            m.name, m.scopes
        ));
    }
    let rules = &case.agency.approval;
    let consequential =
        rules.members.contains(&m.name) || needed.iter().any(|s| rules.scopes.contains(s));
    if consequential && !case.approved {
        return Constrained::NeedsApproval {
            member: m.name.clone(),
        };
    }
    Constrained::Go(Dispatch {
        turn: case.turns + 1,
        member: m.name.clone(),
        skill: m.workflow.clone(),
        task,
        needed_scope: needed,
    })
}

/// Appends the consequential move as waiting for approval.
fn await_approval(
    engine: &Engine,
    case: &Case,
    member: &str,
    proposal: &Value,
    key: &str,
) -> Result<Turn, CaseError> {
    append(
        engine,
        case,
        key,
        EventKind::Turn,
        json!({ "decision": "awaiting_approval", "proposal": proposal }),
    )?;
    let case = reload(engine, &case.case_id)?;
    let mut t = turn(
        &case,
        TurnStatus::AwaitingApproval,
        Some(format!("dispatching {member} needs approval")),
        &format!("steward case approve {}", case.case_id),
    );
    t.approval_prompt = Some(prompt(&case, proposal));
    log(
        engine,
        &case.agency.id,
        &case.case_id,
        "awaiting_approval",
        t.approval_prompt.clone().unwrap_or_default(),
    );
    Ok(t)
}

fn refuse(engine: &Engine, case: &Case, why: String) -> Result<Turn, CaseError> {
    log(
        engine,
        &case.agency.id,
        &case.case_id,
        "refused",
        why.clone(),
    );
    let mut t = turn(
        case,
        TurnStatus::Refused,
        Some(why),
        "fix the planner or the roster; the case did not advance",
    );
    t.turn = case.turns;
    Ok(t)
}
