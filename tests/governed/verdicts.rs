//! The checker's verdicts and the maker's own ends: fail, escalate, reject, noop, block, stall, crash.

use super::*;

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
