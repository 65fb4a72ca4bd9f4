//! Arguments to requests: the only place a command line is turned into what steward is
//! asked to do, and how its answer should be shown.

use anyhow::{anyhow, Context, Result};
use serde_json::Value;

use super::args::{parse_json, parse_state, CaseCmd, Command, DeadLetterCmd, InDoubtCmd};
use crate::agency::Receipt;
use crate::api::Request;

/// How a response is shown: `--json`, and which view of a run record.
#[derive(Debug, Clone, Copy, Default)]
pub struct View {
    pub json: bool,
    pub run: RunView,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RunView {
    /// What happened, in a few lines (`run`, `approve`, `dead-letter retry`).
    #[default]
    Summary,
    /// Every recorded field (`show`).
    Detail,
    /// A digest agent's summary line, after the digest with `preview`.
    Digest { preview: bool },
    /// The review queue (says so when it is empty).
    Review,
}

fn view(json: bool) -> View {
    View {
        json,
        ..View::default()
    }
}

/// The request for a command, and how to show its answer.
pub fn of(command: Command) -> Result<(Request, View)> {
    use Command as C;
    Ok(match command {
        C::Status { json } => (Request::Status, view(json)),
        C::Enqueue { queue, payload } => (
            Request::Enqueue {
                queue,
                payload: parse_json("--payload", &payload)?,
            },
            View::default(),
        ),
        C::Digest {
            agent,
            dry_run,
            json,
        } => (
            Request::Digest {
                agent,
                preview: dry_run,
            },
            View {
                json,
                run: RunView::Digest { preview: dry_run },
            },
        ),
        C::Case(cmd) => case(cmd)?,
        C::Drain { dry_run } => (Request::Drain { dry_run }, View::default()),
        C::List { json } => (Request::List, view(json)),
        C::Run {
            workflow,
            live,
            payload,
            json,
        } => (
            Request::Run {
                workflow,
                live,
                payload: payload.map(|p| parse_json("--payload", &p)).transpose()?,
            },
            view(json),
        ),
        C::Runs {
            workflow,
            status,
            limit,
            json,
        } => (
            Request::Runs {
                workflow,
                state: status.map(|s| parse_state(&s)).transpose()?,
                limit,
            },
            view(json),
        ),
        C::Show { run, json } => (
            Request::Show { run },
            View {
                json,
                run: RunView::Detail,
            },
        ),
        C::DeadLetter(cmd) => dead_letter(cmd),
        C::Review { json } => (
            Request::Review,
            View {
                json,
                run: RunView::Review,
            },
        ),
        C::Approve { run } => (Request::Approve { run }, View::default()),
        C::Reject { run, reason } => (Request::Reject { run, reason }, View::default()),
        C::GoLive { workflow } => (Request::GoLive { workflow }, View::default()),
        C::DryRun { workflow } => (Request::DryRun { workflow }, View::default()),
        C::Pause { workflow, reason } => (Request::Pause { workflow, reason }, View::default()),
        C::Resume { workflow } => (Request::Resume { workflow }, View::default()),
        C::Why {
            workflow,
            time,
            since,
            json,
        } => (
            Request::Why {
                workflow,
                at: time,
                since,
            },
            view(json),
        ),
        C::InDoubt(InDoubtCmd::List { json }) => (Request::InDoubtList, view(json)),
        C::InDoubt(InDoubtCmd::Resolve {
            workflow,
            key,
            committed,
            ..
        }) => (
            Request::InDoubtResolve {
                workflow,
                key,
                committed,
            },
            View::default(),
        ),
        C::Daemon(_)
        | C::Dashboard { .. }
        | C::Validate
        | C::Next { .. }
        | C::Calendar { .. }
        | C::New(_)
        | C::Logs { .. }
        | C::AgentStep { .. } => {
            return Err(anyhow!(
                "this command runs in the CLI itself and has no request to the daemon"
            ))
        }
    })
}

fn dead_letter(cmd: DeadLetterCmd) -> (Request, View) {
    match cmd {
        DeadLetterCmd::List { json } => (Request::DeadLetterList, view(json)),
        DeadLetterCmd::Show { run, json } => (
            Request::DeadLetterShow { run },
            View {
                json,
                run: RunView::Detail,
            },
        ),
        DeadLetterCmd::Retry { run, json } => (Request::DeadLetterRetry { run }, view(json)),
        DeadLetterCmd::Purge { runs, all } => {
            (Request::DeadLetterPurge { runs, all }, View::default())
        }
    }
}

fn case(cmd: CaseCmd) -> Result<(Request, View)> {
    Ok(match cmd {
        CaseCmd::Open {
            agency,
            case_id,
            signal,
        } => (
            Request::CaseOpen {
                agency,
                case_id,
                signal: signal
                    .map(|s| parse_json("--signal", &s))
                    .transpose()?
                    .unwrap_or(Value::Null),
            },
            View::default(),
        ),
        CaseCmd::Advance {
            case_id,
            driver,
            member_result,
            run,
            json,
        } => (
            Request::CaseAdvance {
                case_id,
                driver: driver.unwrap_or_else(crate::governed::operator::login_name),
                // Read here, where the path means what the operator meant by it.
                member_result: member_result.map(|f| receipt(&f)).transpose()?,
                run,
            },
            view(json),
        ),
        CaseCmd::Approve { case_id } => (
            Request::CaseApprove {
                case_id,
                by: crate::governed::operator::login_name(),
            },
            View::default(),
        ),
        CaseCmd::Status { case_id, json } => (Request::CaseStatus { case_id }, view(json)),
        CaseCmd::Verify { case_id } => (Request::CaseVerify { case_id }, View::default()),
        CaseCmd::List { json } => (Request::CaseList, view(json)),
    })
}

/// `--member-result FILE`: a hand-run member's outcome, `{run_id, state, output, spend_usd}`.
fn receipt(file: &std::path::Path) -> Result<Receipt> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    Ok(Receipt {
        turn: 0,
        member: String::new(),
        run_id: v["run_id"]
            .as_str()
            .ok_or_else(|| anyhow!("{}: run_id is required (the receipt)", file.display()))?
            .to_string(),
        state: v["state"].as_str().unwrap_or("success").to_string(),
        output: v["output"].clone(),
        spend_usd: v["spend_usd"].as_f64().unwrap_or(0.0).max(0.0),
    })
}
