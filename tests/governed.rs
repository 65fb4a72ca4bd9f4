//! The workflow standard's acceptance suite, against the real `steward` binary: every
//! guard breach ends exhausted, dead-lettered, logged, with nothing committed; the happy
//! path commits once; dry-run, idempotency, verify verdicts, noop, block, stall, retries,
//! approvals, go-live, crash recovery and secret redaction.

mod util;

use std::time::Duration;

use util::{process_gone, read_pid, wait_for, Env, Spec, BUDGET, COMMIT};

// ---- the four caps: each breach ends exhausted, dead-lettered, logged, never committed ----

/// A live workflow whose maker crosses `cap`, run once.
fn breach(cap: &str) -> (Env, util::Run) {
    let env = Env::new();
    let (run, budget) = match cap {
        "tokens" => (
            "cat >/dev/null\necho 'charge tokens 600' >&3\necho 'charge tokens 600' >&3\nsleep 30\n",
            BUDGET.to_string(),
        ),
        "tool_calls" => (
            "cat >/dev/null\nfor i in 1 2 3 4 5 6; do echo 'charge tool_calls 1' >&3; done\nsleep 30\n",
            BUDGET.to_string(),
        ),
        "runtime_s" => (
            "cat >/dev/null\nsleep 30\n",
            "max_tokens = 1000\nmax_tool_calls = 5\nmax_runtime_s = 0.5\nmax_cost_usd = 1.0\nkill_grace_s = 0.5\n".to_string(),
        ),
        "cost_usd" => (
            "cat >/dev/null\necho 'charge cost_usd 0.6' >&3\necho 'charge cost_usd 0.6' >&3\nsleep 30\n",
            BUDGET.to_string(),
        ),
        other => panic!("unknown cap {other}"),
    };
    env.live_workflow(&Spec::new("guarded", run).budget(&budget));
    let out = env.run("guarded", true);
    (env, out)
}

fn assert_exhausted(cap: &str) {
    let (_env, out) = breach(cap);
    assert_eq!(out.state(), "exhausted", "{out}");
    assert_eq!(out.code, 6, "{out}");
    let reason = out.reason().to_string();
    assert!(
        reason.contains(cap),
        "reason should name {cap}: {reason}\n{out}"
    );
}

fn assert_dead_lettered(cap: &str) {
    let (env, out) = breach(cap);
    assert_eq!(env.dead_letter_ids(), vec![out.run_id()], "{out}");
    let show = env.steward(&["dead-letter", "show", &out.run_id(), "--json"]);
    let entry = show.json();
    assert_eq!(entry["run"]["state"], "exhausted", "{show}");
    assert!(
        entry["run"]["breach"].as_str().unwrap().starts_with(cap),
        "{show}"
    );
    assert_eq!(
        entry["run"]["trigger"]["kind"], "manual",
        "full context kept: {show}"
    );
}

fn assert_logged(cap: &str) {
    let (env, out) = breach(cap);
    let log = env.runlog_for(&out.run_id());
    let breach = log
        .iter()
        .find(|e| e["status"] == "breach")
        .unwrap_or_else(|| panic!("no breach record\n{out}"));
    assert_eq!(breach["data"]["cap"], cap, "{out}");
    assert!(breach["detail"].as_str().unwrap().contains(cap), "{out}");
    let end = log.iter().find(|e| e["step"] == "end").expect("end record");
    assert_eq!(end["status"], "exhausted", "{out}");
    assert_eq!(end["data"]["dead_lettered"], true, "{out}");
}

fn assert_not_committed(cap: &str) {
    let (env, out) = breach(cap);
    assert!(
        out.json()["breach"].as_str().unwrap_or("").starts_with(cap),
        "not a {cap} breach\n{out}"
    );
    assert!(
        !env.ledger().exists(),
        "commit ran after a {cap} breach\n{out}"
    );
    assert_eq!(out.json()["committed"], false);
    let log = env.runlog_for(&out.run_id());
    assert!(
        !log.iter()
            .any(|e| e["step"] == "commit" || e["step"] == "verify"),
        "{out}"
    );
}

macro_rules! cap_tests {
    ($($cap:ident => $name:literal),*) => {$(
        mod $cap {
            #[test] fn breach_ends_exhausted() { super::assert_exhausted($name) }
            #[test] fn breach_is_dead_lettered() { super::assert_dead_lettered($name) }
            #[test] fn breach_writes_runlog_record_naming_the_cap() { super::assert_logged($name) }
            #[test] fn breach_never_commits() { super::assert_not_committed($name) }
        }
    )*};
}

cap_tests!(tokens => "tokens", tool_calls => "tool_calls", runtime => "runtime_s", cost => "cost_usd");

#[test]
fn breach_during_verify_also_ends_exhausted_without_commit() {
    let env = Env::new();
    env.live_workflow(
        &Spec::new(
            "w",
            "cat >/dev/null\necho 'charge tokens 900' >&3\necho '{\"x\":1}'\n",
        )
        .verify("cat >/dev/null\necho 'charge tokens 200' >&3\nsleep 30\necho pass\n"),
    );
    let out = env.run("w", true);
    assert_eq!(out.state(), "exhausted", "{out}");
    assert_eq!(
        out.json()["breach"],
        "tokens 1100/1000",
        "counted across run and verify: {out}"
    );
    assert!(!env.ledger().exists());
}

#[test]
fn charge_exactly_at_the_cap_is_within_budget() {
    let env = Env::new();
    env.live_workflow(&Spec::new(
        "w",
        "cat >/dev/null\necho 'charge tokens 1000' >&3\necho '{\"x\":1}'\n",
    ));
    let out = env.run("w", true);
    assert_eq!(out.state(), "success", "{out}");
}

#[test]
fn breach_kills_the_whole_process_tree() {
    let env = Env::new();
    let run = "cat >/dev/null\nsleep 300 &\necho $! > \"$MARKS/grandchild.pid\"\necho 'charge tokens 5000' >&3\nwait\n";
    env.live_workflow(&Spec::new("w", run));
    let out = env.run("w", true);
    assert_eq!(out.state(), "exhausted", "{out}");
    let pid = read_pid(&env.path("grandchild.pid"));
    wait_for("the grandchild to die", Duration::from_secs(5), || {
        process_gone(pid)
    });
}

#[test]
fn grandchild_that_ignores_sigterm_is_killed_too() {
    let env = Env::new();
    let run = "cat >/dev/null\nsh -c 'trap \"\" TERM; echo $$ > \"$MARKS/stubborn.pid\"; while :; do sleep 1; done' &\nwhile [ ! -s \"$MARKS/stubborn.pid\" ]; do sleep 0.05; done\necho 'charge tokens 5000' >&3\nwait\n";
    env.live_workflow(&Spec::new("w", run).budget(&format!("{BUDGET}kill_grace_s = 0.3\n")));
    let out = env.run("w", true);
    assert_eq!(out.state(), "exhausted", "{out}");
    let pid = read_pid(&env.path("stubborn.pid"));
    wait_for(
        "the stubborn grandchild to die",
        Duration::from_secs(5),
        || process_gone(pid),
    );
}

// ---- happy path, dry-run, idempotency ----

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

#[test]
fn verify_fail_ends_failed_and_dead_lettered() {
    let env = Env::new();
    env.live_workflow(
        &Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n")
            .verify("cat >/dev/null\necho fail\necho 'x must be 2'\n"),
    );
    let out = env.run("w", true);
    assert_eq!(out.state(), "failed", "{out}");
    assert!(out.reason().contains("x must be 2"), "{out}");
    assert_eq!(env.dead_letter_ids(), vec![out.run_id()]);
    assert!(!env.ledger().exists());
}

#[test]
fn verify_verdict_by_exit_code() {
    let env = Env::new();
    env.workflow(&Spec::new("a", "cat >/dev/null\necho 1\n").verify("cat >/dev/null\nexit 0\n"));
    env.workflow(&Spec::new("b", "cat >/dev/null\necho 1\n").verify("cat >/dev/null\nexit 1\n"));
    env.workflow(&Spec::new("c", "cat >/dev/null\necho 1\n").verify("cat >/dev/null\nexit 2\n"));
    env.workflow(&Spec::new("d", "cat >/dev/null\necho 1\n").verify("cat >/dev/null\nexit 9\n"));
    assert_eq!(env.run("a", false).state(), "success");
    assert_eq!(env.run("b", false).state(), "failed");
    assert_eq!(env.run("c", false).state(), "approval-required");
    let d = env.run("d", false);
    assert_eq!(d.state(), "failed", "{d}");
    assert!(d.reason().contains("exit code 9"), "{d}");
}

#[test]
fn verify_escalate_waits_in_review_then_approve_commits_once() {
    let env = Env::new();
    env.live_workflow(
        &Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n")
            .verify("cat >/dev/null\necho escalate\necho 'needs a human'\n")
            .key("k"),
    );
    let out = env.run("w", true);
    assert_eq!(out.state(), "approval-required", "{out}");
    assert_eq!(out.code, 3);
    assert!(
        !env.ledger().exists(),
        "escalated run committed before approval"
    );
    let review = env.steward(&["review", "--json"]);
    assert_eq!(
        review.json()[0]["run_id"],
        out.run_id().as_str(),
        "{review}"
    );
    // A re-fire while the review is open must not run.
    let refire = env.run("w", true);
    assert_eq!(refire.state(), "blocked", "{refire}");

    let approve = env.steward(&["approve", &out.run_id()]);
    assert_eq!(approve.code, 0, "{approve}");
    assert_eq!(
        env.ledger_lines(),
        vec![out.run_id()],
        "approve commits once"
    );
    let again = env.steward(&["approve", &out.run_id()]);
    assert_ne!(again.code, 0, "a second approve must be refused\n{again}");
    assert_eq!(
        env.ledger_lines().len(),
        1,
        "double commit on second approve"
    );
    let shown = env.steward(&["show", &out.run_id(), "--json"]);
    assert_eq!(shown.json()["state"], "success");
    assert_eq!(shown.json()["committed"], true);
}

#[test]
fn reject_frees_the_key_and_commits_nothing() {
    let env = Env::new();
    env.live_workflow(
        &Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n")
            .verify("cat >/dev/null\nexit 2\n")
            .key("k"),
    );
    let out = env.run("w", true);
    assert_eq!(out.state(), "approval-required");
    let reject = env.steward(&["reject", &out.run_id(), "--reason", "wrong numbers"]);
    assert_eq!(reject.code, 0, "{reject}");
    assert!(!env.ledger().exists());
    let shown = env.steward(&["show", &out.run_id(), "--json"]);
    assert!(shown.reason().contains("wrong numbers"));
    // The key is free: the next fire runs (and escalates again).
    assert_eq!(env.run("w", true).state(), "approval-required");
}

// ---- noop, block, stall ----

#[test]
fn noop_output_ends_clean_noop() {
    let env = Env::new();
    env.live_workflow(&Spec::new("w", "cat >/dev/null\necho '{\"noop\": true}'\n"));
    let out = env.run("w", true);
    assert_eq!(out.state(), "clean-no-op", "{out}");
    assert!(!env.ledger().exists());
    assert!(!env
        .runlog_for(&out.run_id())
        .iter()
        .any(|e| e["step"] == "verify"));
}

#[test]
fn noop_on_the_control_channel_ends_clean_noop() {
    let env = Env::new();
    env.live_workflow(&Spec::new("w", "cat >/dev/null\necho noop >&3\n"));
    assert_eq!(env.run("w", true).state(), "clean-no-op");
    assert!(!env.ledger().exists());
}

#[test]
fn block_ends_blocked() {
    let env = Env::new();
    env.live_workflow(&Spec::new(
        "w",
        "cat >/dev/null\necho 'block upstream API is down' >&3\necho '{\"x\":1}'\n",
    ));
    let out = env.run("w", true);
    assert_eq!(out.state(), "blocked", "{out}");
    assert_eq!(out.code, 4);
    assert!(out.reason().contains("upstream API is down"));
    assert!(!env.ledger().exists());
    assert!(
        env.dead_letter_ids().is_empty(),
        "blocked is not dead-lettered"
    );
}

#[test]
fn no_progress_ends_stagnated() {
    let env = Env::new();
    let budget = format!("{BUDGET}stall_timeout_s = 0.5\nkill_grace_s = 0.2\n");
    env.live_workflow(&Spec::new("w", "cat >/dev/null\necho tick >&3\nsleep 30\n").budget(&budget));
    let out = env.run("w", true);
    assert_eq!(out.state(), "stagnated", "{out}");
    assert_eq!(out.code, 7);
    assert_eq!(env.dead_letter_ids(), vec![out.run_id()]);
    assert!(!env.ledger().exists());
}

#[test]
fn ticks_keep_a_slow_run_alive() {
    let env = Env::new();
    let budget = format!("{BUDGET}stall_timeout_s = 0.5\n");
    let run = "cat >/dev/null\nfor i in 1 2 3 4 5 6; do echo tick >&3; sleep 0.2; done\necho '{\"x\":1}'\n";
    env.live_workflow(&Spec::new("w", run).budget(&budget));
    assert_eq!(env.run("w", true).state(), "success");
}

#[test]
fn maker_crash_ends_failed_with_stderr_reason() {
    let env = Env::new();
    env.live_workflow(&Spec::new(
        "w",
        "cat >/dev/null\necho 'database unreachable' >&2\nexit 3\n",
    ));
    let out = env.run("w", true);
    assert_eq!(out.state(), "failed", "{out}");
    let reason = out.reason().to_string();
    assert!(
        reason.contains("exit code 3") && reason.contains("database unreachable"),
        "{reason}"
    );
    assert!(env.dead_letter_ids().contains(&out.run_id()));
}

#[test]
fn malformed_control_lines_are_logged_and_ignored() {
    let env = Env::new();
    let run = "cat >/dev/null\necho 'charge tokens lots' >&3\necho 'launch missiles' >&3\necho 'charge tokens 10' >&3\necho '{\"x\":1}'\n";
    env.live_workflow(&Spec::new("w", run));
    let out = env.run("w", true);
    assert_eq!(out.state(), "success", "{out}");
    assert_eq!(out.json()["figures"]["tokens"], 10);
    let ignored = env
        .runlog_for(&out.run_id())
        .into_iter()
        .filter(|e| e["status"] == "control-ignored")
        .count();
    assert_eq!(ignored, 2, "{out}");
}

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

fn kill_steward_when(env: &Env, marker: &str) {
    let mut child = env
        .command(&["run", "w", "--live", "--json"])
        .spawn()
        .unwrap();
    let path = env.path(marker);
    wait_for(marker, Duration::from_secs(10), || path.exists());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The orphaned step keeps running in its own group; end it as a crash would not.
    let pgid = read_pid(&env.path("step.pid"));
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[test]
fn sigkill_during_the_maker_then_rerun_never_commits_twice() {
    let env = Env::new();
    let run = "cat >/dev/null\necho $$ > \"$MARKS/step.pid\"\nif [ ! -e \"$MARKS/second\" ]; then touch \"$MARKS/in-maker\"; sleep 30; fi\necho '{\"x\":1}'\n";
    env.live_workflow(&Spec::new("w", run).key("k"));
    kill_steward_when(&env, "in-maker");
    std::fs::write(env.path("second"), "").unwrap();

    let rerun = env.run("w", true);
    assert_eq!(
        rerun.state(),
        "blocked",
        "an in-doubt key must not run again on its own\n{rerun}"
    );
    assert!(rerun.stderr.contains("in doubt"), "{rerun}");
    assert!(!env.ledger().exists());
    let doubt = env.steward(&["in-doubt", "list", "--json"]);
    assert_eq!(doubt.json()[0]["key"], "k", "{doubt}");
    assert_eq!(doubt.json()[0]["found_in"], "reserved", "{doubt}");
    let runs = env.steward(&["runs", "--json", "--status", "interrupted"]);
    assert_eq!(runs.json().as_array().unwrap().len(), 1, "{runs}");

    let settle = env.steward(&["in-doubt", "resolve", "w", "k", "--not-committed"]);
    assert_eq!(settle.code, 0, "{settle}");
    assert_eq!(env.run("w", true).state(), "success");
    assert_eq!(env.run("w", true).state(), "clean-no-op");
    assert_eq!(env.ledger_lines().len(), 1, "committed twice");
}

#[test]
fn sigkill_during_commit_then_rerun_never_commits_twice() {
    let env = Env::new();
    let commit =
        format!("echo $$ > \"$MARKS/step.pid\"\n{COMMIT}touch \"$MARKS/in-commit\"\nsleep 30\n");
    env.live_workflow(
        &Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n")
            .commit(&commit)
            .key("k"),
    );
    kill_steward_when(&env, "in-commit");
    assert_eq!(env.ledger_lines().len(), 1, "the commit had happened");

    for _ in 0..2 {
        let rerun = env.run("w", true);
        assert_eq!(rerun.state(), "blocked", "{rerun}");
    }
    assert_eq!(env.ledger_lines().len(), 1, "committed twice");
    let doubt = env.steward(&["in-doubt", "list", "--json"]);
    assert_eq!(doubt.json()[0]["found_in"], "committing", "{doubt}");
    assert_eq!(
        env.steward(&["in-doubt", "resolve", "w", "k", "--committed"])
            .code,
        0
    );
    assert_eq!(env.run("w", true).state(), "clean-no-op");
    assert_eq!(env.ledger_lines().len(), 1, "committed twice");
}

#[test]
fn commit_killed_by_its_timeout_leaves_the_key_in_doubt() {
    let env = Env::new();
    env.live_workflow(&Spec::new("w", "cat >/dev/null\necho '{\"x\":1}'\n").key("k"));
    // Rewrite the commit step with a short timeout and a hang.
    let file = env.config.join("workflows/w.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let hang = env.script("w-hang.sh", "cat >/dev/null\nsleep 30\n");
    let text = text
        .replace("[commit]\n", "[commit]\ntimeout_s = 0.5\n")
        .replace("scripts/w-commit.sh", &hang);
    std::fs::write(&file, text).unwrap();
    env.steward(&["go-live", "w"]);
    let out = env.run("w", true);
    assert_eq!(out.state(), "failed", "{out}");
    assert!(out.reason().contains("in doubt"), "{out}");
    assert_eq!(env.run("w", true).state(), "blocked");
}

// ---- secrets ----

#[test]
fn secret_values_never_reach_the_runlog_the_store_or_stderr() {
    let env = Env::new();
    let secret = "sk-live-9f8e7d6c5b4a";
    let run = "cat >/dev/null\necho \"note token is $API_TOKEN\" >&3\necho \"using $API_TOKEN\" >&2\nprintf '{\"echo\": \"%s\"}\\n' \"$API_TOKEN\"\n";
    let verify = "cat >/dev/null\necho fail\necho \"bad token $API_TOKEN\"\n";
    env.live_workflow(
        &Spec::new("w", run)
            .verify(verify)
            .env("API_TOKEN = { from_env = \"TEST_API_TOKEN\" }"),
    );
    let out = env.steward_env(
        &["run", "w", "--live", "--json"],
        &[("TEST_API_TOKEN", secret), ("STEWARD_LOG", "debug")],
    );
    assert_eq!(out.state(), "failed", "{out}");
    assert!(
        out.runlog.contains("[REDACTED:API_TOKEN]"),
        "the secret was used and masked\n{out}"
    );
    assert!(!out.runlog.contains(secret), "secret in runlog\n{out}");
    assert!(!out.stdout.contains(secret), "secret in run output\n{out}");
    assert!(!out.stderr.contains(secret), "secret in log output\n{out}");
    let dl = env.steward(&["dead-letter", "show", &out.run_id(), "--json"]);
    assert!(
        !dl.stdout.contains(secret),
        "secret in dead-letter entry\n{dl}"
    );
    let logs = env.steward(&["logs"]);
    assert!(!logs.stdout.contains(secret));
}

#[test]
fn a_secret_from_a_systemd_credential_file_reaches_the_step_and_is_redacted() {
    let env = Env::new();
    let secret = "cred-7a6b5c4d3e2f";
    let creds = env.path("credentials");
    std::fs::create_dir_all(&creds).unwrap();
    std::fs::write(creds.join("TEST_CRED_TOKEN"), format!("{secret}\n")).unwrap();
    let run = "cat >/dev/null\nprintf '%s' \"$API_TOKEN\" > \"$MARKS/seen\"\necho \"note token $API_TOKEN\" >&3\necho 1\n";
    env.live_workflow(&Spec::new("w", run).env("API_TOKEN = { from_env = \"TEST_CRED_TOKEN\" }"));
    let out = env.steward_env(
        &["run", "w", "--live", "--json"],
        &[("CREDENTIALS_DIRECTORY", creds.to_str().unwrap())],
    );
    assert_eq!(out.state(), "success", "{out}");
    assert_eq!(std::fs::read_to_string(env.path("seen")).unwrap(), secret);
    assert!(out.runlog.contains("[REDACTED:API_TOKEN]"), "{out}");
    assert!(
        !out.runlog.contains(secret) && !out.stdout.contains(secret),
        "{out}"
    );
}

#[test]
fn missing_secret_env_fails_the_run_with_a_clear_reason() {
    let env = Env::new();
    env.live_workflow(
        &Spec::new("w", "cat >/dev/null\n")
            .env("API_TOKEN = { from_env = \"STEWARD_TEST_UNSET_VAR\" }"),
    );
    let out = env.run("w", true);
    assert_eq!(out.state(), "failed", "{out}");
    assert!(out.reason().contains("STEWARD_TEST_UNSET_VAR"), "{out}");
}

#[test]
fn steps_do_not_inherit_stewards_environment() {
    let env = Env::new();
    env.live_workflow(&Spec::new(
        "w",
        "cat >/dev/null\nenv > \"$MARKS/env.txt\"\necho 1\n",
    ));
    let out = env.steward_env(
        &["run", "w", "--live", "--json"],
        &[("SMTP_PASSWORD", "do-not-pass")],
    );
    assert_eq!(out.state(), "success", "{out}");
    assert!(!std::fs::read_to_string(env.path("env.txt"))
        .unwrap()
        .contains("do-not-pass"));
}

#[test]
fn sigterm_to_steward_run_kills_the_steps_and_records_interrupted() {
    let env = Env::new();
    let run = "cat >/dev/null\necho $$ > \"$MARKS/step.pid\"\nsleep 30\n";
    env.live_workflow(&Spec::new("w", run).key("k"));
    let child = env.spawn(&["run", "w", "--live", "--json"]);
    wait_for("the maker", Duration::from_secs(10), || {
        env.path("step.pid").exists()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let rec: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a run record");
    assert_eq!(rec["state"], "interrupted");
    let pid = read_pid(&env.path("step.pid"));
    wait_for("the maker to die", Duration::from_secs(3), || {
        process_gone(pid)
    });
    // Stopped before its commit: nothing committed, and the key is free, not in doubt.
    assert!(!env.ledger().exists());
    let doubt = env.steward(&["in-doubt", "list", "--json"]);
    assert_eq!(doubt.json(), serde_json::json!([]), "{doubt}");
}
