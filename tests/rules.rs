//! The engine's and the runner's rules, in-process: an in-memory store
//! ([`MemoryStore`]), steps that are scripted stand-ins rather than processes
//! ([`TestLauncher`]), and paused tokio time, so a 60-second runtime cap or a backoff of
//! seconds takes no time at all. The suites that run real processes against the real
//! binary (`governed.rs`, `roads.rs`, `daemon.rs`, …) remain the end-to-end check.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use steward::config::Workflow;
use steward::governed::{Engine, Fire};
use steward::live::Ask;
use steward::runner::{Job, Runner};
use steward::step::{Script, Started, TestLauncher};
use steward::store::{Approval, MemoryStore, RunRecord, RunState, Store};
use tokio_util::sync::CancellationToken;

/// A workflow `w` whose steps are `maker`, `checker` and `committer`, with `extra` TOML
/// at the top level (before its tables) and `budget` added to its `[budget]`.
fn workflow(dir: &Path, extra: &str, budget: &str) -> Arc<Workflow> {
    let text = format!(
        r#"id = "w"
{extra}

[trigger]
manual = true

[budget]
max_tokens = 100
max_tool_calls = 5
max_runtime_s = 60
max_cost_usd = 1.0
{budget}

[run]
command = ["maker"]

[verify]
command = ["checker"]

[commit]
command = ["committer"]

[sandbox]
enabled = false
"#
    );
    let file = dir.join("workflows/w.toml");
    let wf = steward::config::parse_workflow(dir, &file, text.into_bytes())
        .unwrap_or_else(|e| panic!("the test's workflow parses: {e:?}"));
    Arc::new(wf)
}

/// An engine on a fresh in-memory store whose steps `launcher` starts.
fn engine(dir: &Path, launcher: &Arc<TestLauncher>) -> Engine {
    let store = Store::from_backend(Arc::new(MemoryStore::new()));
    let mut engine = steward::governed::with_store(store, &dir.join("state")).unwrap();
    engine.launcher = launcher.clone();
    engine
}

/// Approves `wf` for live runs, as `steward go-live` does.
fn approve(engine: &Engine, wf: &Workflow) {
    engine
        .store
        .approve_go_live(&Approval {
            workflow: wf.id.clone(),
            config_hash: wf.config_hash.clone(),
            approved_at: chrono::Utc::now(),
            approved_by: "test".into(),
        })
        .unwrap();
}

/// The program each started step ran (`maker`, `checker`, `committer`).
fn programs(launcher: &TestLauncher) -> Vec<String> {
    launcher
        .started()
        .iter()
        .map(|s| s.argv[0].clone())
        .collect()
}

/// A maker that answers JSON and a checker that says `pass`.
fn passing(step: &Started) -> Script {
    match step.argv[0].as_str() {
        "maker" => Script::ok(r#"{"made": true}"#),
        "checker" => Script::ok("pass"),
        _ => Script::ok(r#"{"committed": true}"#),
    }
}

async fn run(runner: &Runner, wf: &Arc<Workflow>, ask: Ask) -> RunRecord {
    runner
        .run(Job::fire(wf.clone(), Fire::manual(None), ask))
        .await
        .expect("the run reaches a terminal record")
}

#[tokio::test(start_paused = true)]
async fn a_passing_run_not_approved_for_live_is_a_dry_success_and_never_commits() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(passing);
    let wf = workflow(dir.path(), "dry_run = false", "");
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::Success, "{rec:?}");
    assert!(rec.dry_run && !rec.committed, "{rec:?}");
    assert_eq!(programs(&launcher), ["maker", "checker"]);
    assert_eq!(launcher.started()[0].var("STEWARD_DRY_RUN"), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn an_approved_live_run_commits_once_its_checker_passes() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(passing);
    let wf = workflow(dir.path(), "dry_run = false", "");
    let engine = engine(dir.path(), &launcher);
    approve(&engine, &wf);
    let runner = Runner::new(engine, 4);
    let rec = run(&runner, &wf, Ask::Live).await;
    assert_eq!(rec.state, RunState::Success, "{rec:?}");
    assert!(!rec.dry_run && rec.committed, "{rec:?}");
    assert_eq!(programs(&launcher), ["maker", "checker", "committer"]);
}

#[tokio::test(start_paused = true)]
async fn forced_dry_run_keeps_an_approved_workflow_from_committing() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(passing);
    let wf = workflow(dir.path(), "dry_run = false", "");
    let engine = engine(dir.path(), &launcher);
    approve(&engine, &wf);
    let runner = Runner::new(engine, 4);
    runner.set_forced_dry_run(true);
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::Success, "{rec:?}");
    assert!(rec.dry_run && !rec.committed, "{rec:?}");
    let why = rec.dry_run_reason.unwrap_or_default();
    assert!(why.contains("SIGUSR1") || why.contains("forced"), "{why}");
    assert_eq!(programs(&launcher), ["maker", "checker"]);
}

#[tokio::test(start_paused = true)]
async fn a_charge_over_the_token_cap_ends_the_run_exhausted_before_its_checker() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|step: &Started| match step.argv[0].as_str() {
        "maker" => Script::ok("{}")
            .line(Duration::from_secs(1), "charge tokens 60")
            .line(Duration::from_secs(1), "charge tokens 60")
            .running(Duration::from_secs(600)),
        _ => Script::ok("pass"),
    });
    let wf = workflow(dir.path(), "", "");
    let engine = engine(dir.path(), &launcher);
    let store = engine.store.clone();
    let runner = Runner::new(engine, 4);
    let started = tokio::time::Instant::now();
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::Exhausted, "{rec:?}");
    assert!(
        rec.breach
            .as_deref()
            .unwrap_or("")
            .contains("tokens 120/100"),
        "{rec:?}"
    );
    assert_eq!(programs(&launcher), ["maker"], "the checker never runs");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "killed at the charge, not at its end: {:?}",
        started.elapsed()
    );
    let dead = store.dead_letter_entry(&rec.run_id).unwrap();
    assert!(dead.is_some(), "an exhausted run is dead-lettered");
}

#[tokio::test(start_paused = true)]
async fn a_maker_past_its_runtime_cap_is_killed_at_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|step: &Started| match step.argv[0].as_str() {
        "maker" => Script::ok("{}").running(Duration::from_secs(3600)),
        _ => Script::ok("pass"),
    });
    let wf = workflow(dir.path(), "", "");
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let started = tokio::time::Instant::now();
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::Exhausted, "{rec:?}");
    assert!(
        rec.breach.as_deref().unwrap_or("").contains("runtime"),
        "{rec:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(59) && took < Duration::from_secs(120),
        "ended at the 60 s cap (and its kill grace): {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_maker_is_stagnated_after_the_stall_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|step: &Started| match step.argv[0].as_str() {
        "maker" => Script::ok("{}").running(Duration::from_secs(50)),
        _ => Script::ok("pass"),
    });
    let wf = workflow(dir.path(), "", "stall_timeout_s = 5");
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::Stagnated, "{rec:?}");
}

#[tokio::test(start_paused = true)]
async fn ticks_keep_a_slow_maker_from_stalling() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|step: &Started| match step.argv[0].as_str() {
        "maker" => (0..10)
            .fold(Script::ok("{}"), |s, _| {
                s.line(Duration::from_secs(3), "tick")
            })
            .running(Duration::from_secs(31)),
        _ => Script::ok("pass"),
    });
    let wf = workflow(dir.path(), "", "stall_timeout_s = 5");
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::Success, "{rec:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failing_maker_is_retried_with_exponential_backoff_until_it_passes() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|step: &Started| {
        let attempt: u32 = step.var("STEWARD_ATTEMPT").unwrap().parse().unwrap();
        match step.argv[0].as_str() {
            "maker" if attempt < 3 => Script::exits(1),
            "maker" => Script::ok("{}"),
            _ => Script::ok("pass"),
        }
    });
    let wf = workflow(
        dir.path(),
        "[retry]\nattempts = 3\nbackoff = \"exponential\"\nbase = 2.0\nmax = 60.0",
        "",
    );
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let started = tokio::time::Instant::now();
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::Success, "{rec:?}");
    assert_eq!(rec.attempt, 3, "{rec:?}");
    assert_eq!(programs(&launcher), ["maker", "maker", "maker", "checker"]);
    let waited = started.elapsed();
    // 2 s before the second attempt, 4 s before the third.
    assert!(
        waited >= Duration::from_secs(6) && waited < Duration::from_secs(12),
        "waited {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_maker_failing_every_attempt_is_failed_and_dead_lettered_after_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|_: &Started| Script::exits(2));
    let wf = workflow(dir.path(), "[retry]\nattempts = 2\nbase = 1.0", "");
    let engine = engine(dir.path(), &launcher);
    let store = engine.store.clone();
    let runner = Runner::new(engine, 4);
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::Failed, "{rec:?}");
    assert_eq!(programs(&launcher), ["maker", "maker"]);
    assert!(store.dead_letter_entry(&rec.run_id).unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_checker_that_escalates_leaves_the_run_waiting_for_an_operator() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|step: &Started| match step.argv[0].as_str() {
        "maker" => Script::ok("{}"),
        _ => Script::ok("escalate\nnot sure about this one"),
    });
    let wf = workflow(dir.path(), "", "");
    let engine = engine(dir.path(), &launcher);
    let store = engine.store.clone();
    let runner = Runner::new(engine, 4);
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::ApprovalRequired, "{rec:?}");
    assert!(store.in_review(&rec.run_id).unwrap());
    assert_eq!(programs(&launcher), ["maker", "checker"]);
}

#[tokio::test(start_paused = true)]
async fn a_maker_that_says_noop_ends_clean_without_a_checker() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(|_: &Started| Script::ok("{}").line(Duration::ZERO, "noop"));
    let wf = workflow(dir.path(), "", "");
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let rec = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(rec.state, RunState::CleanNoOp, "{rec:?}");
    assert_eq!(programs(&launcher), ["maker"]);
}

/// A launcher whose makers run until `hold` is lifted.
fn held_makers(hold: CancellationToken) -> Arc<TestLauncher> {
    TestLauncher::new(move |step: &Started| match step.argv[0].as_str() {
        "maker" => Script::ok("{}").held(hold.clone()),
        _ => Script::ok("pass"),
    })
}

/// Waits (in virtual time) until `runner` has `n` runs of `wf` in flight.
async fn in_flight(runner: &Runner, n: usize) {
    for _ in 0..10_000 {
        if runner.in_flight().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{n} runs never got in flight: {:?}", runner.in_flight());
}

#[tokio::test(start_paused = true)]
async fn overlap_skip_records_a_second_fire_skipped_while_the_first_runs() {
    let dir = tempfile::tempdir().unwrap();
    let hold = CancellationToken::new();
    let launcher = held_makers(hold.clone());
    let wf = workflow(dir.path(), "overlap = \"skip\"", "");
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let first = runner.submit(Job::fire(wf.clone(), Fire::manual(None), Ask::Auto));
    in_flight(&runner, 1).await;
    let second = run(&runner, &wf, Ask::Auto).await;
    assert_eq!(second.state, RunState::Skipped, "{second:?}");
    hold.cancel();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.state, RunState::Success, "{first:?}");
    assert_eq!(
        programs(&launcher),
        ["maker", "checker"],
        "the skipped fire ran nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn overlap_buffer_one_runs_the_second_fire_after_the_first_ends() {
    let dir = tempfile::tempdir().unwrap();
    let hold = CancellationToken::new();
    let launcher = held_makers(hold.clone());
    let wf = workflow(dir.path(), "overlap = \"buffer_one\"", "");
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let first = runner.submit(Job::fire(wf.clone(), Fire::manual(None), Ask::Auto));
    in_flight(&runner, 1).await;
    let second = runner.submit(Job::fire(wf.clone(), Fire::manual(None), Ask::Auto));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(runner.waiting().len(), 1, "the second fire waits its turn");
    assert_eq!(programs(&launcher), ["maker"], "only the first has started");
    hold.cancel();
    assert_eq!(first.await.unwrap().unwrap().state, RunState::Success);
    assert_eq!(second.await.unwrap().unwrap().state, RunState::Success);
    assert_eq!(
        programs(&launcher),
        ["maker", "checker", "maker", "checker"]
    );
}

#[tokio::test(start_paused = true)]
async fn overlap_cancel_other_interrupts_the_running_fire_for_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let hold = CancellationToken::new();
    let launcher = held_makers(hold.clone());
    let wf = workflow(dir.path(), "overlap = \"cancel_other\"", "");
    let runner = Runner::new(engine(dir.path(), &launcher), 4);
    let first = runner.submit(Job::fire(wf.clone(), Fire::manual(None), Ask::Auto));
    in_flight(&runner, 1).await;
    let second = runner.submit(Job::fire(wf.clone(), Fire::manual(None), Ask::Auto));
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.state, RunState::Interrupted, "{first:?}");
    hold.cancel();
    assert_eq!(second.await.unwrap().unwrap().state, RunState::Success);
}

#[tokio::test(start_paused = true)]
async fn the_global_cap_holds_a_third_run_until_one_of_two_ends() {
    let dir = tempfile::tempdir().unwrap();
    let hold = CancellationToken::new();
    let launcher = held_makers(hold.clone());
    let wf = workflow(dir.path(), "overlap = \"allow_all\"", "");
    let runner = Runner::new(engine(dir.path(), &launcher), 2);
    let runs: Vec<_> = (0..3)
        .map(|_| runner.submit(Job::fire(wf.clone(), Fire::manual(None), Ask::Auto)))
        .collect();
    in_flight(&runner, 2).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        programs(&launcher),
        ["maker", "maker"],
        "two makers run; the third waits for the cap"
    );
    hold.cancel();
    for run in runs {
        assert_eq!(run.await.unwrap().unwrap().state, RunState::Success);
    }
    assert_eq!(
        programs(&launcher).iter().filter(|p| *p == "maker").count(),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn a_committed_key_makes_a_refire_a_clean_no_op_without_a_step() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = TestLauncher::new(passing);
    let wf = workflow(
        dir.path(),
        "dry_run = false\nidempotency_key = \"k-{{ trigger.kind }}\"",
        "",
    );
    let engine = engine(dir.path(), &launcher);
    approve(&engine, &wf);
    let runner = Runner::new(engine, 4);
    let first = run(&runner, &wf, Ask::Live).await;
    assert!(first.committed, "{first:?}");
    let again = run(&runner, &wf, Ask::Live).await;
    assert_eq!(again.state, RunState::CleanNoOp, "{again:?}");
    assert_eq!(
        programs(&launcher),
        ["maker", "checker", "committer"],
        "the re-fire started nothing"
    );
}
