//! The pages: overview, runs, run detail, dead-letter, review, cases, and the actions
//! their forms post. Reads come from the store and the service; every action is the
//! CLI's own request, answered by the same [`Service`](crate::service::Service).

use std::sync::Arc;

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use minijinja::{context, Value};
use serde::{Deserialize, Serialize};

use super::context::Dashboard;
use super::render::{error_page, render};
use crate::api::{CaseResponse as CaseReply, Request, Response as Reply};
use crate::store::{RunQuery, RunRecord, RunState};

/// Runs on one page of the runs list.
const PAGE: usize = 50;
/// Runs in each workflow's strip on the overview.
const STRIP: usize = 20;

fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn took(rec: &RunRecord) -> String {
    rec.ended_at
        .map(|end| {
            format!(
                "{:.1} s",
                (end - rec.started_at).num_milliseconds().max(0) as f64 / 1000.0
            )
        })
        .unwrap_or_else(|| "running".into())
}

/// A run as a row of a list.
#[derive(Serialize)]
struct RunRow {
    id: String,
    workflow: String,
    state: &'static str,
    started: String,
    took: String,
    mode: &'static str,
    reason: String,
    /// In a cluster, the daemon that ran it.
    daemon: Option<String>,
}

impl RunRow {
    fn of(rec: &RunRecord) -> RunRow {
        RunRow {
            id: rec.run_id.clone(),
            workflow: rec.workflow.clone(),
            state: rec.state.name(),
            started: time(&rec.started_at),
            took: took(rec),
            mode: if rec.dry_run { "dry" } else { "live" },
            reason: rec.reason.clone(),
            daemon: rec.daemon.clone(),
        }
    }
}

async fn ask(d: &Dashboard, request: Request) -> Reply {
    d.service.handle(request).await
}

pub async fn overview(State(d): State<Arc<Dashboard>>) -> Response {
    let status = match ask(&d, Request::Status).await {
        Reply::Status(s) => s,
        Reply::Error { message } => return error_page(StatusCode::SERVICE_UNAVAILABLE, &message),
        _ => return error_page(StatusCode::INTERNAL_SERVER_ERROR, "unexpected reply"),
    };
    let store = &d.service.engine.store;
    let config = d.config();
    let mut workflows = Vec::new();
    let mut queues = Vec::new();
    for row in &status.workflows {
        let strip: Vec<_> = store
            .recent_states(&row.id, STRIP)
            .unwrap_or_default()
            .into_iter()
            .map(|(id, state)| context! { id => id, state => state.name() })
            .collect();
        let queue = config
            .as_ref()
            .and_then(|c| match &c.workflows.get(&row.id)?.trigger {
                crate::config::Trigger::Queue { queue } => Some(queue.clone()),
                _ => None,
            });
        if let Some(q) = &queue {
            let depth = crate::trigger::queue::pending(&d.service.state_dir, q).len();
            queues.push(context! { name => q, depth => depth });
        }
        workflows.push(context! {
            id => row.id,
            kind => row.kind,
            trigger => row.trigger,
            follows => row.follows,
            queue => queue,
            live => row.live,
            mode => row.mode,
            paused => row.paused,
            next_fire => row.next_fire.as_ref().and_then(|n| n.get("local")).and_then(|v| v.as_str()),
            last => strip.first().cloned(),
            strip => strip,
            spend => super::spend::week(store, &row.id, Utc::now()),
        });
    }
    let counts = store.counts().unwrap_or_default();
    render(
        &d,
        "overview.html",
        context! {
            title => "Overview",
            uptime => status.uptime,
            forced_dry_run => status.forced_dry_run,
            in_flight => status.in_flight,
            waiting => status.waiting.len(),
            workflows => workflows,
            queues => queues,
            counts => counts,
            config_errors => status.config_errors,
            containment => status.process_containment,
            config_loaded_at => status.config_loaded_at,
            cluster => status.cluster,
        },
    )
}

#[derive(Debug, Default, Deserialize)]
pub struct RunsFilter {
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    state: String,
    /// `1h`, `24h`, `7d`, `30d` or empty.
    #[serde(default)]
    since: String,
    #[serde(default)]
    before: String,
}

fn since(text: &str) -> Option<DateTime<Utc>> {
    let hours = match text {
        "1h" => 1,
        "24h" => 24,
        "7d" => 24 * 7,
        "30d" => 24 * 30,
        _ => return None,
    };
    Some(Utc::now() - chrono::Duration::hours(hours))
}

pub async fn runs(State(d): State<Arc<Dashboard>>, Query(f): Query<RunsFilter>) -> Response {
    let state = RunState::from_name(&f.state);
    let query = RunQuery {
        workflow: (!f.workflow.is_empty()).then(|| f.workflow.clone()),
        state,
        since: since(&f.since),
        until: None,
        before: (!f.before.is_empty()).then(|| f.before.clone()),
        limit: PAGE,
    };
    let page = match d.service.engine.store.run_page(&query) {
        Ok(p) => p,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let older = (page.len() == PAGE)
        .then(|| page.last().map(|r| r.run_id.clone()))
        .flatten();
    let rows: Vec<RunRow> = page.iter().map(RunRow::of).collect();
    let workflows: Vec<String> = d
        .config()
        .map(|c| c.workflows.keys().cloned().collect())
        .unwrap_or_default();
    let states: Vec<&str> = RunState::ALL.iter().map(|s| s.name()).collect();
    render(
        &d,
        "runs.html",
        context! {
            title => "Runs",
            runs => rows,
            older => older,
            workflows => workflows,
            states => states,
            filter => context! { workflow => f.workflow, state => f.state, since => f.since, before => f.before },
        },
    )
}

pub async fn run_detail(State(d): State<Arc<Dashboard>>, Path(id): Path<String>) -> Response {
    let store = &d.service.engine.store;
    let rec = match store.run(&id) {
        Ok(Some(r)) => r,
        Ok(None) => return error_page(StatusCode::NOT_FOUND, &format!("no run with id `{id}`")),
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let timeline: Vec<_> = crate::runlog::entries_of(&d.service.state_dir, &id)
        .into_iter()
        .map(|e| {
            context! {
                at => e.ts.format("%H:%M:%S%.3f").to_string(),
                attempt => e.attempt,
                step => e.step,
                status => e.status,
                ms => e.duration_ms,
                detail => e.detail,
            }
        })
        .collect();
    let caps = d
        .config()
        .and_then(|c| c.workflows.get(&rec.workflow).map(|w| w.caps.clone()));
    let f = &rec.figures;
    let spend = caps.map(|c| {
        vec![
            context! { kind => "tokens", spent => f.tokens.to_string(), cap => c.max_tokens.to_string(), pct => pct(f.tokens as f64, c.max_tokens as f64) },
            context! { kind => "tool calls", spent => f.tool_calls.to_string(), cap => c.max_tool_calls.to_string(), pct => pct(f.tool_calls as f64, c.max_tool_calls as f64) },
            context! { kind => "runtime", spent => format!("{:.1} s", f.runtime_ms as f64 / 1000.0), cap => format!("{} s", c.max_runtime.as_secs()), pct => pct(f.runtime_ms as f64, c.max_runtime.as_millis() as f64) },
            context! { kind => "cost", spent => format!("${:.4}", f.cost_usd), cap => format!("${:.2}", c.max_cost_usd), pct => pct(f.cost_usd, c.max_cost_usd) },
        ]
    });
    let key = rec.idempotency_key.as_ref().map(|k| {
        let phase = store
            .key(&rec.workflow, k)
            .ok()
            .flatten()
            .map(|r| format!("{:?} (by run {})", r.phase, r.run_id))
            .unwrap_or_else(|| "free".into());
        context! { key => k, phase => phase }
    });
    let in_review = store.in_review(&id).unwrap_or(false);
    let dead = store.dead_letter_entry(&id).ok().flatten().is_some();
    // Who fired it (an `after` trigger's upstream runs), and whom it fired.
    let upstream: Vec<_> = rec.trigger["upstreams"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|u| context! { run_id => u["run_id"].as_str(), workflow => u["workflow"].as_str(), state => u["state"].as_str() })
        .collect();
    let followers: Vec<_> = crate::chain::followers_of_run(store, &id)
        .into_iter()
        .map(|(workflow, run_id)| context! { workflow => workflow, run_id => run_id })
        .collect();
    render(
        &d,
        "run.html",
        context! {
            title => format!("Run {id}"),
            run => RunRow::of(&rec),
            rec => Value::from_serialize(&rec),
            timeline => timeline,
            spend => spend,
            key => key,
            in_review => in_review,
            dead => dead,
            upstream => upstream,
            followers => followers,
        },
    )
}

fn pct(spent: f64, cap: f64) -> u32 {
    if cap <= 0.0 || !spent.is_finite() {
        return 0;
    }
    (spent / cap * 100.0).clamp(0.0, 100.0) as u32
}

pub async fn dead_letter(State(d): State<Arc<Dashboard>>, Query(m): Query<Flash>) -> Response {
    let entries = match d.service.engine.store.dead_letters() {
        Ok(e) => e,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let rows: Vec<_> = entries
        .iter()
        .rev()
        .map(|e| context! { run => RunRow::of(&e.run), at => time(&e.dead_lettered_at), breach => e.run.breach })
        .collect();
    render(
        &d,
        "dead_letter.html",
        context! { title => "Dead-letter", entries => rows, flash => m.msg },
    )
}

pub async fn review(State(d): State<Arc<Dashboard>>, Query(m): Query<Flash>) -> Response {
    let runs = match ask(&d, Request::Review).await {
        Reply::Runs { runs } => runs,
        Reply::Error { message } => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &message),
        _ => Vec::new(),
    };
    let rows: Vec<_> = runs
        .iter()
        .map(|r| {
            context! {
                run => RunRow::of(r),
                verdict => r.verify.as_ref().map(|v| v.reason.clone()),
                output => r.output.as_ref().map(|o| serde_json::to_string_pretty(o).unwrap_or_default()),
            }
        })
        .collect();
    render(
        &d,
        "review.html",
        context! { title => "Review", runs => rows, flash => m.msg },
    )
}

pub async fn cases(State(d): State<Arc<Dashboard>>) -> Response {
    let cases = match ask(&d, Request::CaseList).await {
        Reply::Agency(CaseReply::Cases { cases }) => cases,
        Reply::Error { message } => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &message),
        _ => Vec::new(),
    };
    render(
        &d,
        "cases.html",
        context! { title => "Agency cases", cases => cases },
    )
}

pub async fn case_detail(
    State(d): State<Arc<Dashboard>>,
    Path(id): Path<String>,
    Query(m): Query<Flash>,
) -> Response {
    let case = match ask(
        &d,
        Request::CaseStatus {
            case_id: id.clone(),
        },
    )
    .await
    {
        Reply::Agency(CaseReply::Case { case }) => case,
        Reply::Error { message } => return error_page(StatusCode::NOT_FOUND, &message),
        _ => return error_page(StatusCode::INTERNAL_SERVER_ERROR, "unexpected reply"),
    };
    let chain = match ask(
        &d,
        Request::CaseVerify {
            case_id: id.clone(),
        },
    )
    .await
    {
        Reply::Agency(CaseReply::CaseChain { events, broken, .. }) => match broken {
            None => format!("intact: {events} events, each sealed to the one before"),
            Some(why) => format!("BROKEN: {why}"),
        },
        Reply::Error { message } => message,
        _ => String::new(),
    };
    let events: Vec<_> = d
        .service
        .engine
        .store
        .case_events(&id)
        .unwrap_or_default()
        .into_iter()
        .map(|(version, bytes)| {
            let event: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let kind = event
                .get("kind")
                .or_else(|| event.get("type"))
                .and_then(|k| k.as_str())
                .unwrap_or("event")
                .to_string();
            context! { version => version, kind => kind, body => serde_json::to_string(&event).unwrap_or_default() }
        })
        .collect();
    render(
        &d,
        "case.html",
        context! {
            title => format!("Case {id}"),
            case => Value::from_serialize(&*case),
            status => format!("{:?}", case.status),
            awaiting => case.awaiting.as_ref().map(|a| serde_json::to_string_pretty(a).unwrap_or_default()),
            chain => chain,
            events => events,
            flash => m.msg,
        },
    )
}

/// A message shown at the top of a page after an action (`?msg=`).
#[derive(Debug, Default, Deserialize)]
pub struct Flash {
    #[serde(default)]
    msg: Option<String>,
}

/// What an action's form posts besides the CSRF token (checked before the handler).
#[derive(Debug, Default, Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    reason: String,
}

fn back(to: &str, message: &str) -> Response {
    let msg: String = form_urlencoded::byte_serialize(message.as_bytes()).collect();
    Redirect::to(&format!("{to}?msg={msg}")).into_response()
}

/// What an action's reply says, for a person.
fn said(reply: &Reply) -> String {
    match reply {
        Reply::Error { message } | Reply::Refused { message } => format!("refused: {message}"),
        Reply::Run { run } => format!("run {} ended {}: {}", run.run_id, run.state, run.reason),
        Reply::Rejected { run_id } => format!("rejected {run_id}"),
        Reply::Purged { removed, .. } => format!("discarded {removed} entry"),
        Reply::Agency(CaseReply::CaseApproved { case_id, turn }) => {
            format!("approved case {case_id} at turn {turn}")
        }
        other => format!("{other:?}"),
    }
}

pub async fn approve(State(d): State<Arc<Dashboard>>, Path(id): Path<String>) -> Response {
    let reply = ask(&d, Request::Approve { run: id }).await;
    back("/review", &said(&reply))
}

pub async fn reject(
    State(d): State<Arc<Dashboard>>,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    let reason = (!form.reason.trim().is_empty()).then(|| form.reason.trim().to_string());
    let reply = ask(&d, Request::Reject { run: id, reason }).await;
    back("/review", &said(&reply))
}

pub async fn dead_letter_retry(
    State(d): State<Arc<Dashboard>>,
    Path(id): Path<String>,
) -> Response {
    let reply = ask(&d, Request::DeadLetterRetry { run: id }).await;
    back("/dead-letter", &said(&reply))
}

pub async fn dead_letter_discard(
    State(d): State<Arc<Dashboard>>,
    Path(id): Path<String>,
) -> Response {
    let reply = ask(
        &d,
        Request::DeadLetterPurge {
            runs: vec![id],
            all: false,
        },
    )
    .await;
    back("/dead-letter", &said(&reply))
}

pub async fn case_approve(State(d): State<Arc<Dashboard>>, Path(id): Path<String>) -> Response {
    let reply = ask(
        &d,
        Request::CaseApprove {
            case_id: id.clone(),
            by: "dashboard".into(),
        },
    )
    .await;
    back(&format!("/cases/{id}"), &said(&reply))
}

pub async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("templates/style.css"),
    )
        .into_response()
}
