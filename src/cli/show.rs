//! Responses to text: what a command prints and the exit code it ends with.

use std::fmt::Write;

use serde::Serialize;

use super::render;
use super::request::{RunView, View};
use crate::agency;
use crate::api::{CaseResponse, Response};
use crate::store::RunRecord;

/// `writeln!` into a String cannot fail.
macro_rules! wln {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

/// What the command prints, and how it exits.
#[derive(Debug, Default)]
pub struct Shown {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

fn pretty(out: &mut String, value: &impl Serialize) {
    wln!(
        out,
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// The exit code of a live run or commit the go-live rules refused (not approved,
/// edited since go-live, forced dry-run): nothing ran.
pub const REFUSED: i32 = 11;

/// Shows `response` as `view` asks; `local` says no daemon answered.
pub fn response(response: &Response, view: &View, local: bool) -> Shown {
    let mut s = Shown::default();
    let out = &mut s.stdout;
    use Response as R;
    match response {
        R::Agency(case) => return case_response(case, view),
        R::Error { message } => {
            wln!(s.stderr, "steward: {message}");
            s.code = 1;
        }
        R::Refused { message } => {
            wln!(s.stderr, "steward: refused: {message}");
            s.code = REFUSED;
        }
        R::Status(status) if view.json => pretty(out, status),
        R::Status(status) => {
            render::status(out, &serde_json::to_value(status).unwrap_or_default())
        }
        R::Enqueued {
            queue,
            item,
            warning,
        } => {
            if local {
                wln!(
                    out,
                    "queued item {item} on {queue} (no daemon running: it runs when the daemon starts)"
                );
            } else {
                wln!(out, "queued item {item} on {queue}");
            }
            if let Some(w) = warning {
                wln!(s.stderr, "steward: warning: {w}");
            }
        }
        R::Workflows { workflows, cluster } => workflows_table(out, view, workflows, cluster),
        R::Run { run } => s.code = show_run(out, run, view),
        R::Runs { runs } if view.json => pretty(out, runs),
        R::Runs { runs } if runs.is_empty() && view.run == RunView::Review => {
            wln!(out, "review queue is empty")
        }
        R::Runs { runs } => render::runs_table(out, runs),
        R::Drained(report) => {
            for line in &report.lines {
                wln!(out, "{line}");
            }
            s.code = report.exit_code;
        }
        R::DeadLetters { entries } if view.json => pretty(out, entries),
        R::DeadLetters { entries } if entries.is_empty() => {
            wln!(out, "dead-letter queue is empty")
        }
        R::DeadLetters { entries } => {
            let runs: Vec<RunRecord> = entries.iter().map(|e| e.run.clone()).collect();
            render::runs_table(out, &runs);
        }
        R::DeadLetter { entry } if view.json => pretty(out, entry),
        R::DeadLetter { entry } => {
            wln!(out, "dead-lettered {}", entry.dead_lettered_at.to_rfc3339());
            render::run_detail(out, &entry.run);
        }
        R::Purged { removed, missing } => {
            for id in missing {
                wln!(out, "no dead-letter entry for run `{id}`");
            }
            let plural = if *removed == 1 { "y" } else { "ies" };
            wln!(out, "purged {removed} dead-letter entr{plural}");
        }
        R::Rejected { run_id } => wln!(
            out,
            "run {run_id} rejected: its idempotency key is free to fire again"
        ),
        R::WentLive {
            workflow,
            config_hash,
            approved_by,
            file,
        } => wln!(
            out,
            "{workflow} is live: approved config sha256 {} ({approved_by}). Editing {} drops it back to dry-run.",
            config_hash.get(..12).unwrap_or(config_hash),
            file.display()
        ),
        R::WentDry {
            workflow,
            was_live: true,
        } => wln!(out, "{workflow} is dry-run again: go-live approval withdrawn"),
        R::WentDry { workflow, .. } => wln!(
            out,
            "{workflow} was not approved for go-live: it stays dry-run"
        ),
        R::Paused { pause } => wln!(
            out,
            "{} is paused ({}): its fires are recorded skipped until `steward resume {}`",
            pause.workflow,
            pause.reason,
            pause.workflow
        ),
        R::Resumed { pause } => wln!(
            out,
            "{} resumed (it was paused by {}: {})",
            pause.workflow,
            pause.cause.name(),
            pause.reason
        ),
        R::Why {
            workflow,
            timezone,
            entries,
            upstream,
        } => s.code = why(out, view, workflow, timezone, entries, upstream),
        R::KeysInDoubt { keys } if view.json => pretty(out, keys),
        R::KeysInDoubt { keys } if keys.is_empty() => {
            wln!(out, "no idempotency key is in doubt")
        }
        R::KeysInDoubt { keys } => render::in_doubt_table(out, keys),
        R::KeySettled {
            workflow,
            key,
            committed: true,
        } => wln!(
            out,
            "key `{key}` of {workflow} marked committed: a re-fire is a clean no-op"
        ),
        R::KeySettled { workflow, key, .. } => wln!(
            out,
            "key `{key}` of {workflow} released: the next fire runs again"
        ),
    }
    s
}

/// `steward workflows`: a table, and the cluster's daemons under it.
fn workflows_table(
    out: &mut String,
    view: &View,
    workflows: &[crate::api::WorkflowRow],
    cluster: &Option<crate::api::ClusterStatus>,
) {
    if view.json {
        return pretty(out, &workflows);
    }
    let rows: Vec<serde_json::Value> = workflows
        .iter()
        .map(|w| serde_json::to_value(w).unwrap_or_default())
        .collect();
    render::workflows_table(out, &rows);
    if let Some(serde_json::Value::Object(c)) =
        cluster.as_ref().and_then(|c| serde_json::to_value(c).ok())
    {
        render::cluster(out, &c);
    }
}

/// `steward why`: the per-slot ledger, in the schedule's zone, and a follower's upstream
/// ends; exit 1 when nothing was recorded then.
fn why(
    out: &mut String,
    view: &View,
    workflow: &str,
    timezone: &str,
    entries: &[crate::ledger::Entry],
    upstream: &[crate::api::UpstreamEnd],
) -> i32 {
    if view.json && !upstream.is_empty() {
        pretty(
            out,
            &serde_json::json!({ "entries": entries, "upstream": upstream }),
        );
        return 0;
    }
    if view.json {
        pretty(out, &entries);
        return 0;
    }
    if entries.is_empty() && upstream.is_empty() {
        wln!(
            out,
            "{workflow}: nothing recorded then (no slot, no fire, or older than the oldest record kept)"
        );
        return 1;
    }
    let tz: chrono_tz::Tz = timezone.parse().unwrap_or(chrono_tz::Tz::UTC);
    let local = |t: chrono::DateTime<chrono::Utc>| {
        t.with_timezone(&tz)
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string()
    };
    for e in entries {
        wln!(out, "{}", crate::ledger::line(e, local));
    }
    if !upstream.is_empty() {
        wln!(out, "upstream runs, newest first:");
    }
    for u in upstream {
        wln!(
            out,
            "  {} {} {} ended {}: {}",
            u.ended_at.map(local).unwrap_or_default(),
            u.workflow,
            u.run_id,
            u.state.name(),
            u.why
        );
    }
    0
}

/// The agency cases' responses.
fn case_response(response: &CaseResponse, view: &View) -> Shown {
    let mut s = Shown::default();
    let out = &mut s.stdout;
    use CaseResponse as R;
    match response {
        R::CaseOpened { case, mandate } => {
            let l = &case.agency.limits;
            wln!(
                out,
                "case {} opened for {}: {mandate} ({} members, limits: {} turns, {} acts, {:.2} USD)",
                case.case_id,
                case.agency.id,
                case.agency.roster.len(),
                l.max_turns,
                l.max_acts,
                l.max_spend_usd
            );
        }
        R::Turn { turn } => {
            if view.json {
                pretty(out, &serde_json::json!({ "agency_turn": turn }));
            } else {
                wln!(out, "{}", agency::render(turn));
            }
            s.code = turn.status.exit_code();
        }
        R::TurnConflict { message } => {
            let body = serde_json::json!({ "error": "version_conflict", "message": message });
            wln!(out, "{body}");
            s.code = 10;
        }
        R::CaseApproved { case_id, turn } => wln!(
            out,
            "case {case_id} approved at turn {turn}: the next advance dispatches the waiting move"
        ),
        R::Case { case } if view.json => pretty(out, case),
        R::Case { case } => case_text(out, case),
        R::CaseChain {
            case_id,
            events,
            broken: None,
        } => wln!(out, "case {case_id}: {events} events, chain intact"),
        R::CaseChain {
            case_id,
            broken: Some(e),
            ..
        } => {
            wln!(out, "case {case_id}: broken link at {e}");
            s.code = 1;
        }
        R::Cases { cases } if view.json => pretty(out, cases),
        R::Cases { cases } if cases.is_empty() => wln!(out, "no cases"),
        R::Cases { cases } => {
            for c in cases {
                wln!(
                    out,
                    "{:<24} {:<20} {:<18} turns {} acts {} spend {}",
                    c.case_id,
                    c.agency.as_deref().unwrap_or(""),
                    c.status,
                    c.turns,
                    c.acts,
                    c.spend_usd
                );
            }
        }
    }
    s
}

/// A run record as the command's view asks; the exit code follows its state.
fn show_run(out: &mut String, rec: &RunRecord, view: &View) -> i32 {
    match view.run {
        RunView::Detail if view.json => pretty(out, rec),
        RunView::Detail => {
            render::run_detail(out, rec);
            return 0;
        }
        _ if view.json => pretty(out, rec),
        RunView::Digest { preview } => {
            if preview {
                if let Some(text) = rec.output.as_ref().and_then(|o| o["preview"].as_str()) {
                    wln!(out, "{text}");
                }
            }
            let line = rec
                .summary
                .clone()
                .unwrap_or_else(|| format!("{}: {} ({})", rec.workflow, rec.state, rec.reason));
            wln!(out, "{line}");
        }
        RunView::Summary | RunView::Review => render::run_summary(out, rec),
    }
    if view.run == RunView::Detail {
        0
    } else {
        rec.state.exit_code()
    }
}

fn case_text(out: &mut String, c: &agency::Case) {
    let status = serde_json::to_value(c.status).unwrap_or_default();
    wln!(
        out,
        "case {} ({}): {} · turn {} · acts {}/{} · spend {:.2}/{:.2} USD",
        c.case_id,
        c.agency.id,
        status.as_str().unwrap_or(""),
        c.turns,
        c.acts,
        c.agency.limits.max_acts,
        c.spend_usd,
        c.agency.limits.max_spend_usd
    );
    for r in &c.receipts {
        wln!(
            out,
            "  turn {} {}: run {} {} ({:.2} USD)",
            r.turn,
            r.member,
            r.run_id,
            r.state,
            r.spend_usd
        );
    }
}
