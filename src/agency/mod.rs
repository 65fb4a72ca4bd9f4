//! Agency cases: a standing team with a mandate, advanced one governed turn at a time.
//!
//! A case is an append-only event stream in the store, each event sealed with the hash
//! of the one before (a chain `steward case verify` replays). `advance` folds the stream
//! — never inferring what the events do not show — checks the measurable gate (turns,
//! acts, spend against the limits) *before* asking the planner, constrains the planner's
//! proposal to the roster and each member's scope ceiling, and appends one turn event at
//! the folded version before anything is dispatched: the append is the lease, so a racing
//! driver gets a version conflict and dispatches nothing. The dispatched member runs as
//! its own governed run, with budget caps no wider than what the case has left; its run
//! id is the receipt, and a case resolves only with receipts.

use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub use crate::config::agency::Agency;
use crate::config::Config;
use crate::governed::{Engine, Fire};
use crate::live::Ask;
use crate::redact::Redactor;
use crate::runlog::Entry;
use crate::runner::{Job, RunError, Runner};
use crate::store::RunState;

pub const SCHEMA: &str = "runx.agency.turn.v1";
/// Float sums of cents drift; this close to a cap is at it.
const EPS: f64 = 1e-9;

#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("version conflict on case {case}: another driver appended version {version} first; nothing was dispatched")]
    Conflict { case: String, version: u64 },
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Engine(#[from] crate::governed::EngineError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("the member's run was not carried out: {0}")]
    Run(#[from] RunError),
}

/// One sealed event of a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub version: u64,
    pub at: String,
    /// `case_id:turn:driver_id` for turn events.
    pub key: String,
    pub kind: String,
    pub data: Value,
    pub prev_hash: String,
    pub hash: String,
}

fn seal(version: u64, at: &str, key: &str, kind: &str, data: &Value, prev_hash: &str) -> String {
    let body = json!({ "version": version, "at": at, "key": key, "kind": kind, "data": data });
    let mut h = Sha256::new();
    h.update(prev_hash.as_bytes());
    h.update(b"\n");
    h.update(serde_json::to_string(&body).unwrap_or_default().as_bytes());
    hex::encode(h.finalize())
}

/// What a member's governed run left: the receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub turn: u64,
    pub member: String,
    pub run_id: String,
    pub state: String,
    pub output: Value,
    /// Counted against the case's limit (at most what the run was allowed).
    pub spend_usd: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dispatch {
    pub turn: u64,
    pub member: String,
    /// The workflow the member runs (the seed's `skill`).
    pub skill: String,
    pub task: String,
    pub needed_scope: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseStatus {
    Open,
    AwaitingApproval,
    Resolved,
    Failed,
}

/// The case as its events say it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Case {
    pub case_id: String,
    pub agency: Agency,
    pub signal: Value,
    pub version: u64,
    #[serde(skip)]
    pub last_hash: String,
    pub status: CaseStatus,
    pub turns: u64,
    pub acts: u64,
    pub spend_usd: f64,
    /// Dispatched, no result recorded yet.
    pub pending: Option<Dispatch>,
    /// A proposal waiting for (or granted) approval.
    pub awaiting: Option<Value>,
    pub approved: bool,
    pub receipts: Vec<Receipt>,
    /// Members with a successful receipt, for planners that only need that.
    pub done_members: Vec<String>,
    /// Member runs that ended without a result of their own (interrupted by a shutdown,
    /// skipped by overlap): their dispatch stays pending, so a later advance redoes it.
    #[serde(default)]
    pub unfinished: Vec<Receipt>,
    pub resolution: Option<Value>,
    pub reason: Option<String>,
}

/// The `agency_turn` object of the seed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Turn {
    pub schema: String,
    pub status: String,
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

fn predicates(case: &Case) -> (Value, Vec<String>) {
    let l = &case.agency.limits;
    let turns = case.turns >= l.max_turns;
    let acts = case.acts >= l.max_acts;
    let spend = case.spend_usd + EPS >= l.max_spend_usd;
    let mut breached = Vec::new();
    if turns {
        breached.push(format!("turns {}/{}", case.turns, l.max_turns));
    }
    if acts {
        breached.push(format!("acts {}/{}", case.acts, l.max_acts));
    }
    if spend {
        breached.push(format!(
            "spend {:.2}/{:.2} USD",
            case.spend_usd, l.max_spend_usd
        ));
    }
    (
        json!({ "turns_over": turns, "acts_over": acts, "spend_over": spend }),
        breached,
    )
}

fn decode(events: Vec<(u64, Vec<u8>)>) -> Result<Vec<Event>, String> {
    events
        .into_iter()
        .map(|(v, bytes)| {
            serde_json::from_slice::<Event>(&bytes)
                .map_err(|e| format!("event {v} is unreadable: {e}"))
        })
        .collect()
}

/// Replays the chain: Err names the first broken link.
pub fn verify_chain(events: &[Event]) -> Result<(), String> {
    let mut prev = String::new();
    for (i, e) in events.iter().enumerate() {
        let want = i as u64 + 1;
        if e.version != want {
            return Err(format!(
                "event {want}: missing (found version {} instead)",
                e.version
            ));
        }
        if e.prev_hash != prev {
            return Err(format!(
                "event {}: its prev_hash does not match event {}'s hash",
                e.version,
                e.version - 1
            ));
        }
        if seal(e.version, &e.at, &e.key, &e.kind, &e.data, &e.prev_hash) != e.hash {
            return Err(format!(
                "event {} ({}): its content does not match its hash (altered after it was written)",
                e.version, e.kind
            ));
        }
        prev = e.hash.clone();
    }
    Ok(())
}

/// Folds a verified stream into the case.
pub fn fold(case_id: &str, events: &[Event]) -> Result<Case, String> {
    let first = events.first().ok_or("no events")?;
    if first.kind != "opened" {
        return Err("the first event is not `opened`".into());
    }
    let agency: Agency = serde_json::from_value(first.data["agency"].clone())
        .map_err(|e| format!("opened event: {e}"))?;
    let mut c = Case {
        case_id: case_id.to_string(),
        agency,
        signal: first.data["signal"].clone(),
        version: 0,
        last_hash: String::new(),
        status: CaseStatus::Open,
        turns: 0,
        acts: 0,
        spend_usd: 0.0,
        pending: None,
        awaiting: None,
        approved: false,
        receipts: Vec::new(),
        done_members: Vec::new(),
        unfinished: Vec::new(),
        resolution: None,
        reason: None,
    };
    for e in events {
        c.version = e.version;
        c.last_hash = e.hash.clone();
        match e.kind.as_str() {
            "opened" => {}
            "turn" => {
                c.turns += 1;
                match e.data["decision"].as_str() {
                    Some("dispatch") => {
                        c.acts += 1;
                        c.pending = serde_json::from_value(e.data["dispatch"].clone()).ok();
                        c.awaiting = None;
                        c.approved = false;
                    }
                    Some("awaiting_approval") => {
                        c.status = CaseStatus::AwaitingApproval;
                        c.awaiting = Some(e.data["proposal"].clone());
                        c.approved = false;
                    }
                    Some("resolve") => {
                        c.status = CaseStatus::Resolved;
                        c.resolution = Some(e.data["resolution"].clone());
                    }
                    Some("fail") => {
                        c.status = CaseStatus::Failed;
                        c.reason = e.data["reason"].as_str().map(String::from);
                    }
                    _ => {}
                }
            }
            "approved" => {
                c.status = CaseStatus::Open;
                c.approved = true;
            }
            "member_result" => {
                if let Ok(r) = serde_json::from_value::<Receipt>(e.data.clone()) {
                    c.spend_usd += r.spend_usd;
                    if r.state == "success" && !c.done_members.contains(&r.member) {
                        c.done_members.push(r.member.clone());
                    }
                    c.receipts.push(r);
                }
                c.pending = None;
            }
            "member_unfinished" => {
                if let Ok(r) = serde_json::from_value::<Receipt>(e.data.clone()) {
                    c.unfinished.push(r);
                }
            }
            other => return Err(format!("event {}: unknown kind `{other}`", e.version)),
        }
    }
    Ok(c)
}

/// Loads, verifies and folds a case; None if it has no events.
pub fn load(engine: &Engine, case_id: &str) -> Result<Option<(Case, Vec<Event>)>, CaseError> {
    let raw = engine.store.case_events(case_id)?;
    if raw.is_empty() {
        return Ok(None);
    }
    let events = decode(raw).map_err(CaseError::Refused)?;
    verify_chain(&events).map_err(|e| {
        CaseError::Refused(format!(
            "case {case_id} cannot be trusted: {e} (see `steward case verify {case_id}`)"
        ))
    })?;
    let case = fold(case_id, &events).map_err(CaseError::Refused)?;
    Ok(Some((case, events)))
}

/// The case again, after an append of ours.
fn reload(engine: &Engine, case_id: &str) -> Result<Case, CaseError> {
    load(engine, case_id)?
        .map(|(c, _)| c)
        .ok_or_else(|| CaseError::Refused(format!("case {case_id} vanished")))
}

fn append(
    engine: &Engine,
    case: &Case,
    key: &str,
    kind: &str,
    data: Value,
) -> Result<(), CaseError> {
    let version = case.version + 1;
    let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let hash = seal(version, &at, key, kind, &data, &case.last_hash);
    let e = Event {
        version,
        at,
        key: key.to_string(),
        kind: kind.to_string(),
        data,
        prev_hash: case.last_hash.clone(),
        hash,
    };
    let bytes = serde_json::to_vec(&e).map_err(|e| CaseError::Refused(e.to_string()))?;
    if engine
        .store
        .append_case_event(&case.case_id, version, &bytes)?
    {
        Ok(())
    } else {
        Err(CaseError::Conflict {
            case: case.case_id.clone(),
            version,
        })
    }
}

fn log(engine: &Engine, agency: &str, case_id: &str, status: &str, detail: String) {
    let e = Entry {
        ts: Utc::now(),
        run_id: case_id.to_string(),
        workflow: agency.to_string(),
        attempt: 0,
        step: "case".into(),
        status: status.into(),
        figures: None,
        duration_ms: None,
        detail,
        data: None,
    };
    if let Err(err) = engine.runlog.record(&e, &Redactor::default()) {
        tracing::error!("cannot write the runlog: {err}");
    }
}

/// `steward case open`
pub fn open(
    engine: &Engine,
    agency: &Agency,
    case_id: &str,
    signal: Value,
) -> Result<Case, CaseError> {
    if !crate::config::valid_id(case_id) {
        return Err(CaseError::Refused(format!(
            "case id `{case_id}` is not allowed: use 1-64 of a-z, 0-9, `-`, `_`"
        )));
    }
    if load(engine, case_id)?.is_some() {
        return Err(CaseError::Refused(format!("case {case_id} already exists")));
    }
    let data = json!({ "agency": agency, "signal": signal });
    let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let key = format!("{case_id}:open");
    let hash = seal(1, &at, &key, "opened", &data, "");
    let e = Event {
        version: 1,
        at,
        key,
        kind: "opened".into(),
        data,
        prev_hash: String::new(),
        hash,
    };
    let bytes = serde_json::to_vec(&e).map_err(|e| CaseError::Refused(e.to_string()))?;
    if !engine.store.append_case_event(case_id, 1, &bytes)? {
        return Err(CaseError::Conflict {
            case: case_id.to_string(),
            version: 1,
        });
    }
    log(
        engine,
        &agency.id,
        case_id,
        "opened",
        format!("mandate: {}", agency.mandate),
    );
    reload(engine, case_id)
}

/// `steward case approve`: grants the waiting proposal.
pub fn approve(engine: &Engine, case_id: &str, by: &str) -> Result<Case, CaseError> {
    let (case, _) =
        load(engine, case_id)?.ok_or_else(|| CaseError::Refused(format!("no case {case_id}")))?;
    if case.status != CaseStatus::AwaitingApproval {
        return Err(CaseError::Refused(format!(
            "case {case_id} is not awaiting approval"
        )));
    }
    append(
        engine,
        &case,
        &format!("{case_id}:approve:{}", case.turns),
        "approved",
        json!({ "turn": case.turns, "by": by }),
    )?;
    log(
        engine,
        &case.agency.id,
        case_id,
        "approved",
        format!("turn {} approved by {by}", case.turns),
    );
    reload(engine, case_id)
}

fn turn(case: &Case, status: &str, reason: Option<String>, next: &str) -> Turn {
    Turn {
        schema: SCHEMA.into(),
        status: status.into(),
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
    let engine = runner.engine();
    let Some((mut case, _)) = load(engine, case_id)? else {
        return Ok(Turn {
            schema: SCHEMA.into(),
            status: "needs_input".into(),
            case_id: case_id.into(),
            turn: 0,
            dispatch: None,
            approval_prompt: None,
            resolution: None,
            predicates: json!({}),
            reason: Some(format!("no case {case_id}")),
            next: format!("open it: steward case open --agency AGENCY --case {case_id}"),
            receipt: None,
        });
    };
    match case.status {
        CaseStatus::Resolved => {
            return Ok(turn(
                &case,
                "resolved",
                Some("the case is resolved".into()),
                "nothing: the case is closed",
            ))
        }
        CaseStatus::Failed => {
            return Ok(turn(
                &case,
                "failed",
                case.reason.clone(),
                "nothing: the case is closed",
            ))
        }
        _ => {}
    }
    if let Some(mut r) = member_result {
        // No dispatch waits for a result: another driver recorded it first (or the case
        // moved on). Either way this driver's view is stale: a conflict, nothing runs.
        let Some(p) = case.pending.clone() else {
            return Err(CaseError::Conflict {
                case: case_id.to_string(),
                version: case.version,
            });
        };
        r.turn = p.turn;
        r.member = p.member.clone();
        append(
            engine,
            &case,
            &format!("{case_id}:{}:result", p.turn),
            "member_result",
            serde_json::to_value(&r).unwrap_or_default(),
        )?;
        case = reload(engine, case_id)?;
    }
    if let Some(p) = &case.pending {
        if !run {
            let mut t = turn(
                &case,
                "needs_input",
                Some(format!(
                    "turn {} dispatched {} and its result is not recorded",
                    p.turn, p.member
                )),
                "record it: --member-result FILE, or advance with --run",
            );
            t.dispatch = Some(p.clone());
            return Ok(t);
        }
        // Run the dispatched member now (the turn event, the lease, is already there).
        let p = p.clone();
        return run_member(runner, config, case, p).await;
    }
    // The measurable gate comes before any judgment.
    let (preds, breached) = predicates(&case);
    if !breached.is_empty() {
        let reason = format!("limit reached: {}", breached.join(", "));
        append(
            engine,
            &case,
            &format!("{case_id}:{}:{driver}", case.turns + 1),
            "turn",
            json!({ "decision": "fail", "reason": reason, "predicates": preds }),
        )?;
        log(engine, &case.agency.id, case_id, "failed", reason.clone());
        let case = reload(engine, case_id)?;
        return Ok(turn(
            &case,
            "failed",
            Some(reason),
            "nothing: the case is closed",
        ));
    }
    if case.status == CaseStatus::AwaitingApproval {
        let mut t = turn(
            &case,
            "awaiting_approval",
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
    match proposal["action"].as_str().unwrap_or("") {
        "resolve" => {
            if case.receipts.is_empty() {
                return refuse(
                    engine,
                    &case,
                    "the planner wants to resolve, but no work has a receipt yet".into(),
                );
            }
            let receipts: Vec<&str> = case.receipts.iter().map(|r| r.run_id.as_str()).collect();
            let resolution =
                json!({ "summary": proposal["resolution"].clone(), "receipts": receipts });
            append(
                engine,
                &case,
                &key,
                "turn",
                json!({ "decision": "resolve", "resolution": resolution }),
            )?;
            log(
                engine,
                &case.agency.id,
                case_id,
                "resolved",
                format!("receipts: {}", receipts.join(", ")),
            );
            let case = reload(engine, case_id)?;
            Ok(turn(
                &case,
                "resolved",
                proposal["reason"].as_str().map(String::from),
                "nothing: the case is closed",
            ))
        }
        "escalate" => {
            let missing = proposal["missing"]
                .as_str()
                .unwrap_or("(unspecified)")
                .to_string();
            append(
                engine,
                &case,
                &key,
                "turn",
                json!({ "decision": "escalate", "missing": missing }),
            )?;
            let reason = format!(
                "no member can act: missing {missing}; escalated to {}",
                case.agency.escalation_contact
            );
            log(
                engine,
                &case.agency.id,
                case_id,
                "needs_input",
                reason.clone(),
            );
            let case = reload(engine, case_id)?;
            Ok(turn(
                &case,
                "needs_input",
                Some(reason),
                &format!(
                    "{} provides {missing}, then advance",
                    case.agency.escalation_contact
                ),
            ))
        }
        "dispatch" => {
            let member_name = proposal["member"].as_str().unwrap_or("").to_string();
            let Some(member) = case
                .agency
                .roster
                .iter()
                .find(|m| m.name == member_name)
                .cloned()
            else {
                return refuse(
                    engine,
                    &case,
                    format!("the planner proposed `{member_name}`, who is not on the roster"),
                );
            };
            let needed: Vec<String> = proposal["needed_scope"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            if let Some(s) = needed.iter().find(|s| !member.scopes.contains(s)) {
                return refuse(
                    engine,
                    &case,
                    format!(
                        "the planner asked for scope `{s}`, beyond {}'s ceiling {:?}",
                        member.name, member.scopes
                    ),
                );
            }
            let rules = &case.agency.approval;
            let consequential = rules.members.contains(&member.name)
                || needed.iter().any(|s| rules.scopes.contains(s));
            if consequential && !case.approved {
                append(
                    engine,
                    &case,
                    &key,
                    "turn",
                    json!({ "decision": "awaiting_approval", "proposal": proposal }),
                )?;
                let case = reload(engine, case_id)?;
                let mut t = turn(
                    &case,
                    "awaiting_approval",
                    Some(format!("dispatching {} needs approval", member.name)),
                    &format!("steward case approve {case_id}"),
                );
                t.approval_prompt = Some(prompt(&case, &proposal));
                log(
                    engine,
                    &case.agency.id,
                    case_id,
                    "awaiting_approval",
                    t.approval_prompt.clone().unwrap_or_default(),
                );
                return Ok(t);
            }
            let dispatch = Dispatch {
                turn: case.turns + 1,
                member: member.name.clone(),
                skill: member.workflow.clone(),
                task: proposal["task"].as_str().unwrap_or("").to_string(),
                needed_scope: needed,
            };
            // The lease: this append lands before the member runs, or nothing runs.
            append(
                engine,
                &case,
                &key,
                "turn",
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
                return run_member(runner, config, case, dispatch).await;
            }
            let mut t = turn(
                &case,
                "advanced",
                None,
                &format!(
                    "run {} ({}), then advance with its result",
                    dispatch.member, dispatch.skill
                ),
            );
            t.dispatch = Some(dispatch);
            Ok(t)
        }
        other => refuse(
            engine,
            &case,
            format!("the planner proposed `{other}`: expected dispatch, resolve or escalate"),
        ),
    }
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
        "refused",
        Some(why),
        "fix the planner or the roster; the case did not advance",
    );
    t.turn = case.turns;
    Ok(t)
}

fn prompt(case: &Case, proposal: &Value) -> String {
    format!(
        "Case {}: dispatch {} to \"{}\" needing {}? Approve with `steward case approve {}`.",
        case.case_id,
        proposal["member"].as_str().unwrap_or("?"),
        proposal["task"].as_str().unwrap_or(""),
        proposal["needed_scope"],
        case.case_id
    )
}

/// Runs the dispatched member as its own governed run through the runner (caps,
/// overlap, forced dry-run and shutdown grace apply as to any run), capped by what the
/// case has left, and records the receipt. A run that ended without a result of its own
/// (interrupted, skipped) is recorded as unfinished and its dispatch stays pending.
async fn run_member(
    runner: &Runner,
    config: &Config,
    case: Case,
    d: Dispatch,
) -> Result<Turn, CaseError> {
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
    let rec = runner
        .run(Job::fire(std::sync::Arc::new(wf), fire, Ask::Auto))
        .await?;
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
            "member_unfinished",
            format!("{}:{}:unfinished:{}", case.case_id, d.turn, rec.run_id),
        )
    } else {
        (
            "member_result",
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
    let case = reload(engine, &case.case_id)?;
    let mut t = if unfinished {
        turn(
            &case,
            "needs_input",
            Some(format!(
                "{}'s run {} ended {} ({}): the turn is not done",
                d.member, rec.run_id, rec.state, rec.reason
            )),
            "advance with --run to redo it",
        )
    } else {
        turn(
            &case,
            "advanced",
            Some(format!("{} ran: {} ({})", d.member, rec.state, rec.reason)),
            "advance again",
        )
    };
    t.dispatch = Some(d);
    t.receipt = Some(rec.run_id);
    Ok(t)
}

async fn ask_planner(case: &Case, cwd: &Path) -> Result<Value, String> {
    let input = serde_json::to_vec(case).unwrap_or_default();
    let timeout = Duration::from_secs(case.agency.planner_timeout_s.unwrap_or(60));
    let out = crate::helper::run(&case.agency.planner, cwd, Some(&input), timeout).await?;
    if out.code != 0 {
        return Err(format!("exited with {}: {}", out.code, out.stderr.trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value =
        serde_json::from_str(text.trim()).map_err(|e| format!("the proposal is not JSON ({e})"))?;
    if !v.is_object() {
        return Err("the proposal is not a JSON object".into());
    }
    Ok(v)
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
