//! The control API: what the CLI may ask of steward and what it gets back.
//!
//! One [`Request`] and one [`Response`] enum, serialised as they are, one JSON object per
//! line each way over the daemon's socket (`STATE/steward.sock`, see
//! [`crate::control_socket`]), each wrapped with the protocol version. The CLI turns its
//! arguments into a `Request`; whoever answers — the daemon, or the CLI itself when no
//! daemon runs ([`crate::service`]) — never sees an argument list. A client and a daemon
//! of different protocol versions refuse each other with a clear error.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agency::{Case, Receipt, Turn};
use crate::runner::{InFlight, Waiting};
use crate::store::{DeadLetter, KeyRecord, Pause, RunRecord, RunState};

/// Bumped whenever a request or response changes shape.
pub const PROTOCOL: u32 = 2;

/// Largest request line a daemon reads (payloads are small JSON).
pub const MAX_REQUEST: u64 = 4 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    Enqueue {
        queue: String,
        payload: Value,
    },
    List,
    Run {
        workflow: String,
        live: bool,
        payload: Option<Value>,
    },
    Digest {
        agent: String,
        /// Write nothing, send nothing: show the digest.
        preview: bool,
    },
    Drain {
        dry_run: bool,
    },
    Runs {
        workflow: Option<String>,
        state: Option<RunState>,
        limit: usize,
    },
    Show {
        run: String,
    },
    DeadLetterList,
    DeadLetterShow {
        run: String,
    },
    DeadLetterRetry {
        run: String,
    },
    DeadLetterPurge {
        /// Empty with `all`: every entry.
        runs: Vec<String>,
        all: bool,
    },
    Review,
    Approve {
        run: String,
    },
    Reject {
        run: String,
        reason: Option<String>,
    },
    GoLive {
        workflow: String,
    },
    DryRun {
        workflow: String,
    },
    Pause {
        workflow: String,
        reason: Option<String>,
    },
    Resume {
        workflow: String,
    },
    /// What became of a slot (`at`, default: the last) or of each since a span ago.
    Why {
        workflow: String,
        at: Option<String>,
        since: Option<String>,
    },
    InDoubtList,
    InDoubtResolve {
        workflow: String,
        key: String,
        committed: bool,
    },
    CaseOpen {
        agency: String,
        case_id: String,
        signal: Value,
    },
    CaseAdvance {
        case_id: String,
        driver: String,
        member_result: Option<Receipt>,
        run: bool,
    },
    CaseApprove {
        case_id: String,
        by: String,
    },
    CaseStatus {
        case_id: String,
    },
    CaseVerify {
        case_id: String,
    },
    CaseList,
}

/// A workflow as `list` and `status` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowRow {
    pub id: String,
    /// A workflow file's, a digest agent's or an agency's.
    #[serde(default)]
    pub kind: WorkflowKind,
    pub trigger: String,
    pub live: bool,
    /// Live or dry-run, and why, for a person.
    pub mode: String,
    pub description: String,
    pub file: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_fire: Option<Value>,
    /// Set while the workflow is paused: its fires are recorded skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    /// An `after` trigger's upstream and outcomes: `fetch (success)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows: Option<String>,
    /// The workflows that follow this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub followers: Vec<String>,
}

/// What a row of `steward workflows` is (`workflow`, `agent` or `agency` on the wire).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowKind {
    /// A file under `workflows/`.
    #[default]
    Workflow,
    /// A digest agent's workflow.
    Agent,
    /// An agency's scheduled driver.
    Agency,
}

/// `steward status`: the running daemon's view of itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub pid: u32,
    pub uptime: String,
    pub uptime_s: u64,
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    pub forced_dry_run: bool,
    pub in_flight: Vec<InFlight>,
    pub waiting: Vec<Waiting>,
    pub workflows: Vec<WorkflowRow>,
    pub webhook_listen: Option<String>,
    /// Where the dashboard listens (`steward dashboard` prints its URL).
    #[serde(default)]
    pub dashboard_listen: Option<String>,
    /// Where the model gateway listens (steps of workflows with `[gateway]` are told).
    #[serde(default)]
    pub gateway_listen: Option<String>,
    pub process_containment: String,
    /// When the running config was loaded (RFC 3339, UTC).
    #[serde(default)]
    pub config_loaded_at: String,
    /// Errors of an edit the daemon could not load; it runs the older config meanwhile.
    #[serde(default)]
    pub config_errors: Vec<String>,
    /// With `[cluster]`: this daemon's name and the daemons alive, by their heartbeats.
    #[serde(default)]
    pub cluster: Option<ClusterStatus>,
}

/// An upstream run's end, as its follower's `steward why` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamEnd {
    pub run_id: String,
    pub workflow: String,
    pub state: crate::store::RunState,
    pub ended_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The follower's run it fired (none: it did not fire it).
    pub fired: Option<String>,
    /// Why, in words.
    pub why: String,
}

/// The cluster as one daemon sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// This daemon's name in the cluster.
    pub daemon: String,
    pub servers: Vec<String>,
    /// The daemons whose heartbeat is current, with their runs in flight (empty, with
    /// `error` set, when the server cannot be reached).
    pub alive: Vec<crate::cluster::heartbeat::Beat>,
    #[serde(default)]
    pub error: Option<String>,
}

/// What `steward drain` did, line by line, and the worst run's exit code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainReport {
    pub lines: Vec<String>,
    pub exit_code: i32,
}

/// One case in `case list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseRow {
    pub case_id: String,
    pub agency: Option<String>,
    pub status: String,
    pub turns: u64,
    pub acts: u64,
    pub spend_usd: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// The request failed; `message` says what and what to do.
    Error {
        message: String,
    },
    /// A live run or commit the go-live rules do not allow now (not approved, edited
    /// since go-live, forced dry-run): nothing ran; `message` says why.
    Refused {
        message: String,
    },
    Status(Box<Status>),
    Enqueued {
        queue: String,
        item: String,
        /// Set when no workflow of the config reads the queue: the item just waits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warning: Option<String>,
    },
    Workflows {
        workflows: Vec<WorkflowRow>,
        /// With `[cluster]`: the daemons alive, as in `status`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cluster: Option<ClusterStatus>,
    },
    Run {
        run: Box<RunRecord>,
    },
    Runs {
        runs: Vec<RunRecord>,
    },
    Drained(DrainReport),
    DeadLetters {
        entries: Vec<DeadLetter>,
    },
    DeadLetter {
        entry: Box<DeadLetter>,
    },
    Purged {
        removed: usize,
        missing: Vec<String>,
    },
    Rejected {
        run_id: String,
    },
    WentLive {
        workflow: String,
        config_hash: String,
        approved_by: String,
        file: PathBuf,
    },
    WentDry {
        workflow: String,
        was_live: bool,
    },
    Paused {
        pause: Pause,
    },
    Resumed {
        /// The pause that was lifted.
        pause: Pause,
    },
    Why {
        workflow: String,
        /// The zone slots are shown in (the schedule's).
        timezone: String,
        entries: Vec<crate::ledger::Entry>,
        /// A follower's (`after`): its upstream's recent ends, and which fired it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        upstream: Vec<UpstreamEnd>,
    },
    KeysInDoubt {
        keys: Vec<KeyRecord>,
    },
    KeySettled {
        workflow: String,
        key: String,
        committed: bool,
    },
    /// An agency case's answers: their own `kind`s, on the same line as the others.
    #[serde(untagged)]
    Agency(CaseResponse),
}

/// What the agency case commands answer (`case open | advance | approve | status | verify
/// | list`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CaseResponse {
    CaseOpened {
        case: Box<Case>,
        mandate: String,
    },
    Turn {
        turn: Box<Turn>,
    },
    /// Another driver appended first: nothing was dispatched.
    TurnConflict {
        message: String,
    },
    CaseApproved {
        case_id: String,
        turn: u64,
    },
    Case {
        case: Box<Case>,
    },
    CaseChain {
        case_id: String,
        events: usize,
        broken: Option<String>,
    },
    Cases {
        cases: Vec<CaseRow>,
    },
}

impl From<CaseResponse> for Response {
    fn from(r: CaseResponse) -> Response {
        Response::Agency(r)
    }
}

impl Response {
    pub fn error(e: impl std::fmt::Display) -> Response {
        Response::Error {
            message: e.to_string(),
        }
    }
}

/// One line on the wire: the message and the sender's protocol version.
#[derive(Debug, Serialize, Deserialize)]
pub struct Wire<T> {
    pub protocol: u32,
    #[serde(flatten)]
    pub body: T,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RequestBody {
    pub request: Request,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ResponseBody {
    pub response: Response,
}

/// A message as one JSON line.
pub fn encode<T: Serialize>(body: T) -> Vec<u8> {
    let mut line = serde_json::to_vec(&Wire {
        protocol: PROTOCOL,
        body,
    })
    .unwrap_or_default();
    line.push(b'\n');
    line
}

/// Why a line from the other side could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the other side speaks control protocol {0}, this steward speaks {PROTOCOL}: use a steward client and daemon of the same version")]
    Version(u32),
    #[error("the other side speaks another control protocol than this steward ({PROTOCOL}): use a steward client and daemon of the same version ({0})")]
    Unknown(String),
    #[error("unreadable control message: {0}")]
    Malformed(String),
}

/// Reads one line: its protocol version first, so a mismatch is named as such.
pub fn decode<T: for<'de> Deserialize<'de>>(line: &str) -> Result<T, WireError> {
    let value: Value =
        serde_json::from_str(line).map_err(|e| WireError::Malformed(e.to_string()))?;
    match value.get("protocol").and_then(Value::as_u64) {
        Some(v) if v == u64::from(PROTOCOL) => {}
        Some(v) => return Err(WireError::Version(v as u32)),
        None => {
            return Err(WireError::Unknown(
                "no protocol version in the message".into(),
            ))
        }
    }
    let wire: Wire<T> =
        serde_json::from_value(value).map_err(|e| WireError::Malformed(e.to_string()))?;
    Ok(wire.body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_another_version_is_named() {
        let req = Request::Run {
            workflow: "w".into(),
            live: true,
            payload: Some(serde_json::json!({"a": 1})),
        };
        let line = encode(RequestBody {
            request: req.clone(),
        });
        let back: RequestBody = decode(std::str::from_utf8(&line).unwrap()).unwrap();
        assert_eq!(back.request, req);
        let other = r#"{"protocol": 9, "request": {"op": "status"}}"#;
        let err = decode::<RequestBody>(other).unwrap_err().to_string();
        assert!(err.contains("protocol 9"), "{err}");
        let old = r#"{"argv": ["status"]}"#;
        let err = decode::<RequestBody>(old).unwrap_err().to_string();
        assert!(err.contains("another control protocol"), "{err}");
    }

    #[test]
    fn an_agency_answer_keeps_its_own_kind_on_the_wire_and_reads_back_as_one() {
        let answer = Response::from(CaseResponse::CaseApproved {
            case_id: "c1".into(),
            turn: 3,
        });
        let line = encode(&answer);
        let text = std::str::from_utf8(&line).unwrap();
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["kind"], "case_approved", "{text}");
        assert_eq!(v["case_id"], "c1", "{text}");
        match decode::<Response>(text).unwrap() {
            Response::Agency(CaseResponse::CaseApproved { case_id, turn }) => {
                assert_eq!((case_id.as_str(), turn), ("c1", 3))
            }
            other => panic!("read back as {other:?}"),
        }
        // The others still read as themselves.
        let line = encode(Response::error("no"));
        match decode::<Response>(std::str::from_utf8(&line).unwrap()).unwrap() {
            Response::Error { message } => assert_eq!(message, "no"),
            other => panic!("read back as {other:?}"),
        }
    }
}
