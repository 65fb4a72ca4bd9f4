//! A case as its events say it is: the sealed, hash-chained event stream, its fold, and
//! the appends that extend it (the append at the folded version is the lease).

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::config::agency::Agency;
use crate::governed::Engine;
use crate::redact::Redactor;
use crate::runlog::Entry;
use crate::runner::RunError;
use crate::store::RunState;

/// Float sums of cents drift; this close to a cap is at it.
pub(super) const EPS: f64 = 1e-9;

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

/// What is wrong with a case's stored events: the first broken link, or why they do not
/// make a case.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BrokenCase {
    #[error("event {version} is unreadable: {why}")]
    Unreadable { version: u64, why: String },
    #[error("event {want}: missing (found version {found} instead)")]
    Missing { want: u64, found: u64 },
    #[error("event {version}: its prev_hash does not match event {}'s hash", version - 1)]
    PrevHash { version: u64 },
    #[error("event {version} ({kind}): its content does not match its hash (altered after it was written)")]
    Altered { version: u64, kind: String },
    #[error("event {version}: unknown kind `{kind}`")]
    UnknownKind { version: u64, kind: String },
    #[error("no events")]
    Empty,
    #[error("the first event is not `opened`")]
    NotOpened,
    #[error("opened event: {0}")]
    BadOpened(String),
}

impl BrokenCase {
    /// An event's bytes that are not an event.
    pub fn unreadable(version: u64, e: &serde_json::Error) -> BrokenCase {
        BrokenCase::Unreadable {
            version,
            why: e.to_string(),
        }
    }
}

/// Whether a member run with this end state did its work. A receipt keeps the state as
/// its sealed event has it (a hand-run member's may name none steward knows: not done).
fn done(state: &str) -> bool {
    matches!(
        RunState::from_name(state),
        Some(RunState::Success | RunState::CleanNoOp)
    )
}

/// One sealed event of a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub version: u64,
    pub at: String,
    /// `case_id:turn:driver_id` for turn events.
    pub key: String,
    pub kind: StoredKind,
    pub data: Value,
    pub prev_hash: String,
    pub hash: String,
}

/// An event's kind as stored: one steward knows, or a name it does not (an event
/// written by hand or by a newer steward), which `verify` and a fold report by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StoredKind {
    Known(EventKind),
    Unknown(String),
}

impl StoredKind {
    pub fn name(&self) -> &str {
        match self {
            StoredKind::Known(kind) => kind.name(),
            StoredKind::Unknown(name) => name,
        }
    }
}

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The case opened: mandate, roster and limits snapshotted.
    Opened,
    /// One turn: its decision (dispatch, awaiting approval, resolve, escalate, fail).
    Turn,
    /// An operator granted the waiting move.
    Approved,
    /// A member's run ended: the receipt.
    MemberResult,
    /// A member's run ended without a result of its own (interrupted, skipped).
    MemberUnfinished,
    /// A member run that escalated was approved or rejected by an operator.
    ReviewSettled,
}

impl EventKind {
    /// The name stored in the event (and sealed into its hash).
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Opened => "opened",
            EventKind::Turn => "turn",
            EventKind::Approved => "approved",
            EventKind::MemberResult => "member_result",
            EventKind::MemberUnfinished => "member_unfinished",
            EventKind::ReviewSettled => "review_settled",
        }
    }
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
    /// Members with a receipt that did the work — `success`, or `clean-no-op` (it was
    /// already done: the key had committed) — for planners that only need that.
    pub done_members: Vec<String>,
    /// Member runs that ended without a result of their own (interrupted by a shutdown,
    /// skipped by overlap): their dispatch stays pending, so a later advance redoes it.
    #[serde(default)]
    pub unfinished: Vec<Receipt>,
    /// A member run whose checker escalated: the case waits until an operator approves
    /// or rejects that run (`steward approve|reject RUN`).
    #[serde(default)]
    pub awaiting_review: Option<String>,
    pub resolution: Option<Value>,
    pub reason: Option<String>,
}

pub(super) fn predicates(case: &Case) -> (Value, Vec<String>) {
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

pub fn decode(events: Vec<(u64, Vec<u8>)>) -> Result<Vec<Event>, BrokenCase> {
    events
        .into_iter()
        .map(|(v, bytes)| {
            serde_json::from_slice::<Event>(&bytes).map_err(|e| BrokenCase::unreadable(v, &e))
        })
        .collect()
}

/// Replays the chain: Err names the first broken link.
pub fn verify_chain(events: &[Event]) -> Result<(), BrokenCase> {
    let mut prev = String::new();
    for (i, e) in events.iter().enumerate() {
        let want = i as u64 + 1;
        if e.version != want {
            return Err(BrokenCase::Missing {
                want,
                found: e.version,
            });
        }
        if e.prev_hash != prev {
            return Err(BrokenCase::PrevHash { version: e.version });
        }
        if seal(
            e.version,
            &e.at,
            &e.key,
            e.kind.name(),
            &e.data,
            &e.prev_hash,
        ) != e.hash
        {
            return Err(BrokenCase::Altered {
                version: e.version,
                kind: e.kind.name().to_string(),
            });
        }
        prev = e.hash.clone();
    }
    Ok(())
}

/// Folds a verified stream into the case.
pub fn fold(case_id: &str, events: &[Event]) -> Result<Case, BrokenCase> {
    let first = events.first().ok_or(BrokenCase::Empty)?;
    if first.kind != StoredKind::Known(EventKind::Opened) {
        return Err(BrokenCase::NotOpened);
    }
    let agency: Agency = serde_json::from_value(first.data["agency"].clone())
        .map_err(|e| BrokenCase::BadOpened(e.to_string()))?;
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
        awaiting_review: None,
        resolution: None,
        reason: None,
    };
    for e in events {
        c.version = e.version;
        c.last_hash = e.hash.clone();
        let kind = match &e.kind {
            StoredKind::Known(kind) => *kind,
            StoredKind::Unknown(name) => {
                return Err(BrokenCase::UnknownKind {
                    version: e.version,
                    kind: name.clone(),
                })
            }
        };
        match kind {
            EventKind::Opened => {}
            EventKind::Turn => {
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
            EventKind::Approved => {
                c.status = CaseStatus::Open;
                c.approved = true;
            }
            EventKind::MemberResult => {
                if let Ok(r) = serde_json::from_value::<Receipt>(e.data.clone()) {
                    c.spend_usd += r.spend_usd;
                    if done(&r.state) && !c.done_members.contains(&r.member) {
                        c.done_members.push(r.member.clone());
                    }
                    if RunState::from_name(&r.state) == Some(RunState::ApprovalRequired) {
                        c.status = CaseStatus::AwaitingApproval;
                        c.awaiting_review = Some(r.run_id.clone());
                    }
                    c.receipts.push(r);
                }
                c.pending = None;
            }
            EventKind::ReviewSettled => {
                let run_id = e.data["run_id"].as_str().unwrap_or("");
                let state = e.data["state"].as_str().unwrap_or("");
                if let Some(r) = c.receipts.iter_mut().find(|r| r.run_id == run_id) {
                    r.state = state.to_string();
                    if done(state) && !c.done_members.contains(&r.member) {
                        c.done_members.push(r.member.clone());
                    }
                }
                c.status = CaseStatus::Open;
                c.awaiting_review = None;
            }
            EventKind::MemberUnfinished => {
                if let Ok(r) = serde_json::from_value::<Receipt>(e.data.clone()) {
                    c.unfinished.push(r);
                }
            }
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
    let events = decode(raw).map_err(|e| CaseError::Refused(e.to_string()))?;
    verify_chain(&events).map_err(|e| {
        CaseError::Refused(format!(
            "case {case_id} cannot be trusted: {e} (see `steward case verify {case_id}`)"
        ))
    })?;
    let case = fold(case_id, &events).map_err(|e| CaseError::Refused(e.to_string()))?;
    Ok(Some((case, events)))
}

/// The case again, after an append of ours.
pub(super) fn reload(engine: &Engine, case_id: &str) -> Result<Case, CaseError> {
    load(engine, case_id)?
        .map(|(c, _)| c)
        .ok_or_else(|| CaseError::Refused(format!("case {case_id} vanished")))
}

pub(super) fn append(
    engine: &Engine,
    case: &Case,
    key: &str,
    kind: EventKind,
    data: Value,
) -> Result<(), CaseError> {
    let version = case.version + 1;
    let at = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let hash = seal(version, &at, key, kind.name(), &data, &case.last_hash);
    let e = Event {
        version,
        at,
        key: key.to_string(),
        kind: StoredKind::Known(kind),
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

pub(super) fn log(engine: &Engine, agency: &str, case_id: &str, status: &str, detail: String) {
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
    let hash = seal(1, &at, &key, EventKind::Opened.name(), &data, "");
    let e = Event {
        version: 1,
        at,
        key,
        kind: StoredKind::Known(EventKind::Opened),
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
    if let Some(run) = &case.awaiting_review {
        return Err(CaseError::Refused(format!(
            "case {case_id} waits for the review of member run {run}, not for a case approval: `steward approve {run}` or `steward reject {run}`, then advance"
        )));
    }
    append(
        engine,
        &case,
        &format!("{case_id}:approve:{}", case.turns),
        EventKind::Approved,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_kind_is_stored_by_its_name_and_an_unknown_name_is_kept() {
        let known: StoredKind = serde_json::from_str("\"member_result\"").unwrap();
        assert_eq!(known, StoredKind::Known(EventKind::MemberResult));
        assert_eq!(serde_json::to_string(&known).unwrap(), "\"member_result\"");
        let unknown: StoredKind = serde_json::from_str("\"bribe\"").unwrap();
        assert_eq!(unknown, StoredKind::Unknown("bribe".into()));
        assert_eq!(serde_json::to_string(&unknown).unwrap(), "\"bribe\"");
        let event = Event {
            version: 1,
            at: "2026-01-01T00:00:00.000Z".into(),
            key: "c:open".into(),
            kind: unknown,
            data: json!({}),
            prev_hash: String::new(),
            hash: String::new(),
        };
        assert_eq!(fold("c", &[event]).unwrap_err(), BrokenCase::NotOpened);
    }
}
