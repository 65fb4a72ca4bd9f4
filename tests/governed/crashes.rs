//! Kills and secrets: a SIGKILL at each step never commits twice, a commit's timeout leaves its key in doubt, secrets reach only their step.

use super::*;

pub(crate) fn kill_steward_when(env: &Env, marker: &str) {
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
