//! What a step gets, retries and backoff, dead letters retried and purged, go-live bound to the exact file.

use super::*;

#[test]
fn context_arrives_on_stdin_and_env_carries_the_caps() {
    let env = Env::new();
    let run = "cat > \"$MARKS/context.json\"\nenv > \"$MARKS/env.txt\"\necho '{\"x\":1}'\n";
    env.live_workflow(&Spec::new("w", run));
    let out = env.steward(&[
        "run",
        "w",
        "--live",
        "--json",
        "--payload",
        r#"{"who":"ops"}"#,
    ]);
    assert_eq!(out.state(), "success", "{out}");
    let ctx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("context.json")).unwrap()).unwrap();
    assert_eq!(ctx["run_id"], out.run_id().as_str());
    assert_eq!(ctx["workflow"], "w");
    assert_eq!(ctx["dry_run"], false);
    assert_eq!(ctx["trigger"]["kind"], "manual");
    assert_eq!(ctx["trigger"]["payload"]["who"], "ops");
    let vars = std::fs::read_to_string(env.path("env.txt")).unwrap();
    for want in [
        "STEWARD_CONTROL_FD=3",
        "STEWARD_BUDGET_TOKENS=1000",
        "STEWARD_BUDGET_TOOL_CALLS=5",
        "STEWARD_DRY_RUN=0",
        "STEWARD_ATTEMPT=1",
    ] {
        assert!(vars.lines().any(|l| l == want), "missing {want} in\n{vars}");
    }
}

// ---- retries ----

#[test]
fn failed_runs_are_retried_with_backoff() {
    let env = Env::new();
    let run = "cat >/dev/null\nn=$(cat \"$MARKS/count\" 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > \"$MARKS/count\"\n[ $n -ge 3 ] || exit 1\necho '{\"x\":1}'\n";
    env.live_workflow(
        &Spec::new("w", run)
            .tables("[retry]\nattempts = 3\nbackoff = \"exponential\"\nbase = 0.1\nmax = 1\n"),
    );
    let out = env.run("w", true);
    assert_eq!(out.state(), "success", "{out}");
    assert_eq!(out.json()["attempt"], 3);
    assert_eq!(out.json()["attempts"].as_array().unwrap().len(), 3);
    let retries = env
        .runlog_for(&out.run_id())
        .into_iter()
        .filter(|e| e["step"] == "retry")
        .count();
    assert_eq!(retries, 2);
    assert_eq!(env.ledger_lines().len(), 1);
    assert!(env.dead_letter_ids().is_empty());
}

#[test]
fn exhausted_runs_are_never_retried() {
    let env = Env::new();
    let run =
        "cat >/dev/null\necho x >> \"$MARKS/starts\"\necho 'charge tokens 5000' >&3\nsleep 30\n";
    env.live_workflow(&Spec::new("w", run).tables("[retry]\nattempts = 3\nbase = 0\n"));
    let out = env.run("w", true);
    assert_eq!(out.state(), "exhausted", "{out}");
    assert_eq!(
        std::fs::read_to_string(env.path("starts"))
            .unwrap()
            .lines()
            .count(),
        1
    );
}

// ---- dead-letter operations ----

#[test]
fn dead_letter_retry_reruns_with_the_same_trigger_and_purge_removes() {
    let env = Env::new();
    let run = "cat > \"$MARKS/ctx\"\n[ -e \"$MARKS/ok\" ] || exit 1\necho '{\"x\":1}'\n";
    env.live_workflow(&Spec::new("w", run));
    let failed = env.steward(&["run", "w", "--live", "--json", "--payload", r#"{"n": 5}"#]);
    assert_eq!(failed.state(), "failed");
    std::fs::write(env.path("ok"), "").unwrap();
    let retry = env.steward(&["dead-letter", "retry", &failed.run_id(), "--json"]);
    assert_eq!(retry.state(), "success", "{retry}");
    assert_eq!(retry.json()["retry_of"], failed.run_id().as_str());
    assert!(std::fs::read_to_string(env.path("ctx"))
        .unwrap()
        .contains("\"n\":5"));
    assert!(
        env.dead_letter_ids().is_empty(),
        "retried entry leaves the queue"
    );

    std::fs::remove_file(env.path("ok")).unwrap();
    let again = env.run("w", true);
    assert_eq!(env.dead_letter_ids(), vec![again.run_id()]);
    let purge = env.steward(&["dead-letter", "purge", "--all"]);
    assert_eq!(purge.code, 0, "{purge}");
    assert!(env.dead_letter_ids().is_empty());
}

// ---- go-live is bound to the exact config ----

#[test]
fn go_live_applies_to_the_exact_config_and_an_edit_drops_to_dry_run() {
    let env = Env::new();
    let file = env.live_workflow(&Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n"));
    assert_eq!(env.run("w", true).state(), "success");
    assert_eq!(env.ledger_lines().len(), 1);

    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("\n# an edit\n");
    std::fs::write(&file, text).unwrap();
    let list = env.steward(&["list", "--json"]);
    assert_eq!(list.json()[0]["live"], false, "{list}");
    let refused = env.run("w", true);
    assert_eq!(refused.code, 11, "refused has its own exit code\n{refused}");
    assert!(refused.stderr.contains("changed"), "{refused}");
    assert_eq!(
        env.ledger_lines().len(),
        1,
        "an edited workflow committed without approval"
    );

    assert_eq!(env.steward(&["go-live", "w"]).code, 0);
    assert_eq!(env.run("w", true).state(), "success");
    assert_eq!(env.ledger_lines().len(), 2);

    assert_eq!(env.steward(&["dry-run", "w"]).code, 0);
    assert_eq!(env.run("w", true).code, 11, "dry-run withdrew the approval");
}

// ---- crash safety: a real SIGKILL of `steward run` ----
