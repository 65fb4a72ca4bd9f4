//! The service's handlers in-process, one request at a time as the control socket hands
//! them over: a config folder on disk, an in-memory store, scripted steps
//! ([`TestLauncher`]) and paused time. The CLI and daemon suites send the same requests
//! through the real binary.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use steward::api::{Request, Response, WorkflowKind};
use steward::runner::Runner;
use steward::service::Service;
use steward::step::{Script, Started, TestLauncher};
use steward::store::{MemoryStore, RunRecord, RunState, Store};

/// A config folder with workflow `w` (steps `maker`, `checker`, `committer`; live once
/// approved) and a service on it whose steps `launcher` starts.
fn service(dir: &Path, launcher: &Arc<TestLauncher>) -> Service {
    let config = dir.join("config");
    std::fs::create_dir_all(config.join("workflows")).unwrap();
    std::fs::write(
        config.join("workflows/w.toml"),
        r#"id = "w"
dry_run = false
idempotency_key = "w-{{ trigger.payload.n | default('0') }}"

[trigger]
manual = true

[budget]
max_tokens = 100
max_tool_calls = 5
max_runtime_s = 60
max_cost_usd = 1.0

[run]
command = ["maker"]

[verify]
command = ["checker"]

[commit]
command = ["committer"]

[sandbox]
enabled = false
"#,
    )
    .unwrap();
    let state = dir.join("state");
    let store = Store::from_backend(Arc::new(MemoryStore::new()));
    let mut engine = steward::governed::with_store(store, &state).unwrap();
    engine.launcher = launcher.clone();
    Service {
        runner: Runner::new(engine.clone(), 4),
        engine,
        config_dir: config,
        state_dir: state,
        daemon: None,
    }
}

/// Steps that pass, unless the payload's `verdict` says what the checker answers.
fn scripted() -> Arc<TestLauncher> {
    TestLauncher::new(|step: &Started| match step.argv[0].as_str() {
        "maker" => Script::ok(r#"{"made": true}"#),
        "checker" => Script::ok("pass"),
        _ => Script::ok("{}"),
    })
}

fn run_of(response: Response) -> RunRecord {
    match response {
        Response::Run { run } => *run,
        other => panic!("not a run: {other:?}"),
    }
}

fn run_request(live: bool, n: u32) -> Request {
    Request::Run {
        workflow: "w".into(),
        live,
        payload: Some(json!({ "n": n })),
    }
}

#[tokio::test(start_paused = true)]
async fn list_shows_the_config_folders_workflow_not_yet_live() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path(), &scripted());
    match service.handle(Request::List).await {
        Response::Workflows { workflows, .. } => {
            assert_eq!(workflows.len(), 1, "{workflows:?}");
            assert_eq!(workflows[0].id, "w");
            assert_eq!(workflows[0].kind, WorkflowKind::Workflow);
            assert!(!workflows[0].live, "not approved yet: {:?}", workflows[0]);
        }
        other => panic!("not a list: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_live_run_is_refused_until_go_live_then_commits_once_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = scripted();
    let service = service(dir.path(), &launcher);
    match service.handle(run_request(true, 1)).await {
        Response::Refused { message } => assert!(message.contains("go-live"), "{message}"),
        other => panic!("a live run before go-live: {other:?}"),
    }
    assert!(launcher.started().is_empty(), "nothing ran");
    match service
        .handle(Request::GoLive {
            workflow: "w".into(),
        })
        .await
    {
        Response::WentLive { workflow, .. } => assert_eq!(workflow, "w"),
        other => panic!("go-live: {other:?}"),
    }
    let rec = run_of(service.handle(run_request(true, 1)).await);
    assert_eq!(rec.state, RunState::Success, "{rec:?}");
    assert!(rec.committed && !rec.dry_run, "{rec:?}");
    let again = run_of(service.handle(run_request(true, 1)).await);
    assert_eq!(again.state, RunState::CleanNoOp, "{again:?}");
    let shown = run_of(
        service
            .handle(Request::Show {
                run: rec.run_id.clone(),
            })
            .await,
    );
    assert_eq!(shown.run_id, rec.run_id);
}

#[tokio::test(start_paused = true)]
async fn a_run_without_live_is_dry_and_the_runs_list_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = scripted();
    let service = service(dir.path(), &launcher);
    let rec = run_of(service.handle(run_request(false, 2)).await);
    assert_eq!(rec.state, RunState::Success, "{rec:?}");
    assert!(rec.dry_run && !rec.committed, "{rec:?}");
    match service
        .handle(Request::Runs {
            workflow: Some("w".into()),
            state: None,
            limit: 10,
        })
        .await
    {
        Response::Runs { runs } => {
            assert_eq!(runs.len(), 1);
            assert_eq!(runs[0].run_id, rec.run_id);
        }
        other => panic!("runs: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_is_dead_lettered_retried_and_purged() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|step: &Started| match step.argv[0].as_str() {
        "maker" => Script::ok("{}"),
        _ => Script::ok("fail\nthe output is wrong"),
    });
    let service = service(dir.path(), &launcher);
    let rec = run_of(service.handle(run_request(false, 3)).await);
    assert_eq!(rec.state, RunState::Failed, "{rec:?}");
    match service.handle(Request::DeadLetterList).await {
        Response::DeadLetters { entries } => {
            assert_eq!(entries.len(), 1);
            assert_eq!(entries[0].run.run_id, rec.run_id);
        }
        other => panic!("dead letters: {other:?}"),
    }
    let retried = run_of(
        service
            .handle(Request::DeadLetterRetry {
                run: rec.run_id.clone(),
            })
            .await,
    );
    assert_eq!(retried.retry_of.as_deref(), Some(rec.run_id.as_str()));
    match service
        .handle(Request::DeadLetterPurge {
            runs: Vec::new(),
            all: true,
        })
        .await
    {
        Response::Purged { removed, .. } => assert!(removed >= 1, "removed {removed}"),
        other => panic!("purge: {other:?}"),
    }
    match service.handle(Request::DeadLetterList).await {
        Response::DeadLetters { entries } => assert!(entries.is_empty(), "{entries:?}"),
        other => panic!("dead letters: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_escalated_run_waits_in_review_until_an_operator_rejects_it() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|step: &Started| match step.argv[0].as_str() {
        "maker" => Script::ok("{}"),
        _ => Script::ok("escalate"),
    });
    let service = service(dir.path(), &launcher);
    let rec = run_of(service.handle(run_request(false, 4)).await);
    assert_eq!(rec.state, RunState::ApprovalRequired, "{rec:?}");
    match service.handle(Request::Review).await {
        Response::Runs { runs } => assert_eq!(runs[0].run_id, rec.run_id),
        other => panic!("review: {other:?}"),
    }
    match service
        .handle(Request::Reject {
            run: rec.run_id.clone(),
            reason: Some("no".into()),
        })
        .await
    {
        Response::Rejected { run_id } => assert_eq!(run_id, rec.run_id),
        other => panic!("reject: {other:?}"),
    }
    match service.handle(Request::Review).await {
        Response::Runs { runs } => assert!(runs.is_empty(), "{runs:?}"),
        other => panic!("review: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_paused_workflow_records_its_fires_skipped_until_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = scripted();
    let service = service(dir.path(), &launcher);
    match service
        .handle(Request::Pause {
            workflow: "w".into(),
            reason: Some("maintenance".into()),
        })
        .await
    {
        Response::Paused { pause } => assert_eq!(pause.reason, "maintenance"),
        other => panic!("pause: {other:?}"),
    }
    let skipped = run_of(service.handle(run_request(false, 5)).await);
    assert_eq!(skipped.state, RunState::Skipped, "{skipped:?}");
    assert!(
        launcher.started().is_empty(),
        "a paused workflow runs nothing"
    );
    match service
        .handle(Request::Resume {
            workflow: "w".into(),
        })
        .await
    {
        Response::Resumed { pause } => assert_eq!(pause.workflow, "w"),
        other => panic!("resume: {other:?}"),
    }
    let rec = run_of(service.handle(run_request(false, 5)).await);
    assert_eq!(rec.state, RunState::Success, "{rec:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unknown_workflow_is_an_error_that_names_it_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = scripted();
    let service = service(dir.path(), &launcher);
    match service
        .handle(Request::Run {
            workflow: "nope".into(),
            live: false,
            payload: None,
        })
        .await
    {
        Response::Error { message } => assert!(message.contains("nope"), "{message}"),
        other => panic!("an unknown workflow: {other:?}"),
    }
    match service.handle(Request::InDoubtList).await {
        Response::KeysInDoubt { keys } => assert!(keys.is_empty()),
        other => panic!("in doubt: {other:?}"),
    }
    assert!(launcher.started().is_empty());
}
