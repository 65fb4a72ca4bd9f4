//! Commit: once, only live and approved, never twice for a key.

use super::*;

#[test]
fn happy_path_commits_exactly_once() {
    let env = Env::new();
    env.live_workflow(&Spec::new("w", "cat >/dev/null\necho '{\"answer\": 42}'\n"));
    let out = env.run("w", true);
    assert_eq!(out.state(), "success", "{out}");
    assert_eq!(out.code, 0);
    assert_eq!(out.json()["committed"], true);
    assert_eq!(out.json()["output"]["answer"], 42);
    assert_eq!(env.ledger_lines(), vec![out.run_id()], "{out}");
    let steps: Vec<String> = env
        .runlog_for(&out.run_id())
        .iter()
        .map(|e| e["step"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        steps,
        ["trigger", "run", "verify", "commit", "end"],
        "one record per step"
    );
}

#[test]
fn dry_run_skips_commit() {
    let env = Env::new();
    env.workflow(&Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n"));
    let out = env.run("w", false);
    assert_eq!(out.state(), "success", "{out}");
    assert_eq!(out.json()["dry_run"], true);
    assert_eq!(out.json()["committed"], false);
    assert!(!env.ledger().exists(), "dry-run must not commit\n{out}");
}

#[test]
fn live_run_needs_go_live_approval() {
    let env = Env::new();
    env.workflow(&Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n"));
    let out = env.run("w", true);
    assert_eq!(out.code, 11, "refused has its own exit code\n{out}");
    assert!(out.stderr.contains("go-live"), "{out}");
    assert!(!env.ledger().exists());
}

#[test]
fn workflow_marked_dry_run_in_its_file_cannot_go_live() {
    let env = Env::new();
    env.workflow(&Spec::new("w", "cat >/dev/null\n").dry());
    let out = env.steward(&["go-live", "w"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("dry_run = true"), "{out}");
}

#[test]
fn refire_with_same_key_is_a_clean_noop_that_starts_no_process() {
    let env = Env::new();
    let run = "cat >/dev/null\necho started >> \"$MARKS/starts\"\necho '{\"x\":1}'\n";
    env.live_workflow(&Spec::new("w", run).key("fixed-key"));
    let first = env.run("w", true);
    assert_eq!(first.state(), "success", "{first}");
    let second = env.run("w", true);
    assert_eq!(second.state(), "clean-no-op", "{second}");
    assert!(second.reason().contains(&first.run_id()), "{second}");
    let starts = std::fs::read_to_string(env.path("starts")).unwrap();
    assert_eq!(starts.lines().count(), 1, "the re-fire started the maker");
    assert_eq!(env.ledger_lines().len(), 1, "double commit");
    let steps: Vec<_> = env
        .runlog_for(&second.run_id())
        .iter()
        .map(|e| e["step"].clone())
        .collect();
    assert_eq!(steps, ["trigger", "end"], "{second}");
}

#[test]
fn key_template_renders_from_the_payload() {
    let env = Env::new();
    env.live_workflow(
        &Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n")
            .key("order-{{ trigger.payload.order }}"),
    );
    let a = env.steward(&[
        "run",
        "w",
        "--live",
        "--json",
        "--payload",
        r#"{"order": 7}"#,
    ]);
    let b = env.steward(&[
        "run",
        "w",
        "--live",
        "--json",
        "--payload",
        r#"{"order": 8}"#,
    ]);
    let c = env.steward(&[
        "run",
        "w",
        "--live",
        "--json",
        "--payload",
        r#"{"order": 7}"#,
    ]);
    assert_eq!(a.json()["idempotency_key"], "order-7");
    assert_eq!(
        (a.state(), b.state(), c.state()),
        ("success".into(), "success".into(), "clean-no-op".into())
    );
    assert_eq!(env.ledger_lines().len(), 2);
}

#[test]
fn dry_runs_never_consume_a_key() {
    let env = Env::new();
    env.workflow(&Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n").key("k"));
    assert_eq!(env.run("w", false).state(), "success");
    assert_eq!(
        env.run("w", false).state(),
        "success",
        "a second dry-run must run again"
    );
    let out = env.steward(&["in-doubt", "list", "--json"]);
    assert_eq!(out.json(), serde_json::json!([]));
}

#[test]
fn failed_key_may_fire_again() {
    let env = Env::new();
    let run = "cat >/dev/null\nif [ -e \"$MARKS/ok\" ]; then echo '{\"x\":1}'; else exit 3; fi\n";
    env.live_workflow(&Spec::new("w", run).key("k"));
    assert_eq!(env.run("w", true).state(), "failed");
    std::fs::write(env.path("ok"), "").unwrap();
    let again = env.run("w", true);
    assert_eq!(again.state(), "success", "{again}");
    assert_eq!(env.ledger_lines().len(), 1);
}

// ---- verify verdicts, review queue ----
