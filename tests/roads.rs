//! One road: every way a run can start in the daemon goes through the one runner, so the
//! safety rules hold on each of them. Per road, against a real daemon started with
//! `--max-concurrent 1 --grace 1`:
//!
//! 1. under SIGUSR1 the road's run is dry (or, for an approval or an explicit `--live`,
//!    refused) and the reason says forced dry-run;
//! 2. while the road's run is in flight, `steward status` lists it, a manual fire of the
//!    same workflow is recorded `skipped` (`overlap = "skip"`), and a run of another
//!    workflow waits for the global cap (its maker never starts);
//! 3. SIGTERM stops the daemon within the grace, no process of the run's group is left,
//!    and the runlog has the run's `end: interrupted` line;
//!
//! and before those, while `steward pause` holds the workflow, the road's fire is recorded
//! `skipped` and its maker never starts (not for an operator's approval, which a pause
//! does not hold back, nor a case turn, whose member run is the case's to settle).
//!
//! The road's run is held at a gate (a script that notes its pid and its child's, then
//! waits for a `release` file), so each check happens while the run is provably running.

mod util;

use std::path::PathBuf;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use util::{process_gone, read_pid, runs_of, wait_for, Env, Spec, PASS};

/// The gated workflow every road runs.
const W: &str = "w";
/// A workflow of its own, for the global cap.
const OTHER: &str = "other";
const BUDGET: &str =
    "max_tokens = 1000\nmax_tool_calls = 5\nmax_runtime_s = 120\nmax_cost_usd = 1.0\n";

/// A gate script: notes `$$` and a child's pid under `gate/`, then waits for `release`.
/// What it prints afterwards (`then`) is the step's or source's output.
fn gate(env: &Env, name: &str, then: &str) -> String {
    let marks = env.dir.path().display();
    env.script(
        name,
        &format!(
            "d={marks}/gate\nmkdir -p \"$d\"\nid=\"${{STEWARD_RUN_ID:-none}}-$$\"\nsleep 300 &\necho $! > \"$d/$id.child\"\necho $$ > \"$d/$id.pid\"\n\
             while [ ! -e {marks}/release ]; do sleep 0.05; done\nkill $! 2>/dev/null\n{then}"
        ),
    )
}

fn gate_files(env: &Env) -> Vec<PathBuf> {
    std::fs::read_dir(env.path("gate"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn gated_pids(env: &Env) -> usize {
    gate_files(env)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "pid"))
        .count()
}

fn status(env: &Env) -> Value {
    let out = env.steward(&["status", "--json"]);
    assert_eq!(out.code, 0, "{out}");
    out.json()
}

fn in_flight(env: &Env) -> Vec<Value> {
    status(env)["in_flight"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `OTHER`: a dry workflow whose maker notes that it started.
fn other_workflow(env: &Env) {
    env.workflow(
        &Spec::new(
            OTHER,
            "cat >/dev/null\ntouch \"$MARKS/other-started\"\necho '{}'\n",
        )
        .dry(),
    );
}

/// The gated workflow: live, `overlap = "skip"`, its maker (or with `commit_gate` its
/// commit) held at the gate.
fn gated_workflow(env: &Env, trigger: &str, run: &str, verify: &str, commit_gate: bool) {
    let mut spec = Spec::new(W, run)
        .trigger(trigger)
        .verify(verify)
        .top("overlap = \"skip\"\n")
        .budget(BUDGET);
    if commit_gate {
        let g = gate(env, "commit-gate.sh", "");
        spec = spec.commit(&format!(
            "cat >/dev/null\n\"$STEWARD_CONFIG_DIR/{g}\"\necho \"$STEWARD_RUN_ID\" >> \"$LEDGER\"\n"
        ));
    }
    env.workflow(&spec);
}

fn maker_gate(env: &Env) -> String {
    let g = gate(env, "maker-gate.sh", "");
    format!("cat >/dev/null\n\"$STEWARD_CONFIG_DIR/{g}\"\necho '{{}}'\n")
}

fn go_live(env: &Env, id: &str) {
    let out = env.steward(&["go-live", id]);
    assert_eq!(out.code, 0, "{out}");
}

/// What a road does, described for [`exercise`].
/// A check on what a road did: the env, the road's subject, its client's output.
type Check = dyn Fn(&Env, &str, Option<Output>);

struct Road<'a> {
    /// Before the phase (and, in phase 0, before SIGUSR1): makes what the road acts on
    /// (a review item, a dead letter, a marker, a case) and returns its id.
    prepare: &'a dyn Fn(&Env, usize) -> String,
    /// Starts the road on what `prepare` made; the CLI client, if the road has one.
    start: &'a dyn Fn(&Env, &str) -> Option<Child>,
    /// After phase 0 (forced dry-run, gate open): the run was dry and said why.
    check_dry: &'a dyn Fn(&Env, &str, Option<Output>),
    /// After the daemon stopped in phase 1.
    after_stop: &'a dyn Fn(&Env, &str),
    /// Run first, while `W` is paused: the road's run was recorded skipped, its maker never
    /// started. None where a pause does not hold the road back (an operator's approval).
    paused: Option<&'a Check>,
}

fn wait_client(child: Option<Child>) -> Option<Output> {
    child.map(|c| c.wait_with_output().expect("client"))
}

/// The newest run of `W` was dry because of the forced dry-run, in its record and in the
/// runlog's trigger line.
fn newest_run_forced_dry(env: &Env) {
    let runs = runs_of(env, W);
    let rec = runs.last().unwrap_or_else(|| panic!("no run of {W}"));
    assert_eq!(rec["dry_run"], true, "{rec:#}");
    let why = rec["dry_run_reason"].as_str().unwrap_or("");
    assert!(why.contains("forced dry-run"), "{rec:#}");
    let run_id = rec["run_id"].as_str().unwrap();
    let fired = env
        .runlog_for(run_id)
        .into_iter()
        .find(|e| e["step"] == "trigger")
        .unwrap_or_else(|| panic!("no trigger line for {run_id}:\n{}", env.runlog_text()));
    assert!(
        fired["detail"]
            .as_str()
            .unwrap_or("")
            .contains("forced dry-run"),
        "{fired:#}"
    );
}

fn exercise(env: &Env, road: &Road) {
    other_workflow(env);
    let mut d = env.daemon(&["--max-concurrent", "1", "--grace", "1"]);

    // The gate stays open until phase 1: a run the pause failed to hold back ends (and
    // fails the check) instead of waiting at the gate.
    std::fs::write(env.path("release"), "").unwrap();

    // Paused: the road's fire is recorded skipped; its maker never starts.
    if let Some(check) = road.paused {
        let subject = (road.prepare)(env, 2);
        let paused = env.steward(&["pause", W, "--reason", "road test"]);
        assert_eq!(paused.code, 0, "{paused}");
        let before = gated_pids(env);
        let out = wait_client((road.start)(env, &subject));
        check(env, &subject, out);
        assert_eq!(gated_pids(env), before, "a paused workflow's maker started");
        let resumed = env.steward(&["resume", W]);
        assert_eq!(resumed.code, 0, "{resumed}");
    }

    // Phase 0: the brake is on; the gate is open.
    let subject = (road.prepare)(env, 0);
    d.signal(Signal::SIGUSR1);
    wait_for("forced dry-run", Duration::from_secs(5), || {
        status(env)["forced_dry_run"] == true
    });
    let out = wait_client((road.start)(env, &subject));
    (road.check_dry)(env, &subject, out);
    assert!(
        env.ledger_lines().is_empty(),
        "committed under forced dry-run"
    );
    d.signal(Signal::SIGUSR2);
    wait_for("forced dry-run lifted", Duration::from_secs(5), || {
        status(env)["forced_dry_run"] == false
    });

    // Phase 1: the run is held at the gate.
    std::fs::remove_file(env.path("release")).unwrap();
    let subject = (road.prepare)(env, 1);
    let before = gated_pids(env);
    let client = (road.start)(env, &subject);
    wait_for(
        "the road's run at the gate",
        Duration::from_secs(20),
        || gated_pids(env) > before,
    );
    let flying = in_flight(env);
    let run = flying
        .iter()
        .find(|r| r["workflow"] == W)
        .unwrap_or_else(|| panic!("status lists no run of {W} in flight: {flying:#?}"));
    let run_id = run["run_id"].as_str().unwrap().to_string();

    let again = env.steward(&["run", W, "--json"]);
    assert_eq!(again.state(), "skipped", "{again}");
    assert!(again.reason().contains("overlap = skip"), "{again}");

    let waiting = env.spawn(&["run", OTHER, "--json"]);
    wait_for("the other run to be listed", Duration::from_secs(5), || {
        in_flight(env).iter().any(|r| r["workflow"] == OTHER)
    });

    let stopping = Instant::now();
    let exit = d.stop(Duration::from_secs(10));
    let took = stopping.elapsed();
    assert!(exit.success(), "{}", d.log_text());
    assert!(
        took < Duration::from_secs(3),
        "took {took:?} with a 1 s grace"
    );
    for f in gate_files(env) {
        let pid = read_pid(&f);
        wait_for(
            &format!("{} gone", f.display()),
            Duration::from_secs(2),
            || process_gone(pid),
        );
    }
    let ended = env
        .runlog_for(&run_id)
        .into_iter()
        .rfind(|e| e["step"] == "end")
        .unwrap_or_else(|| panic!("no end line for {run_id}:\n{}", env.runlog_text()));
    assert_eq!(ended["status"], "interrupted", "{ended:#}");
    assert!(
        !env.path("other-started").exists(),
        "the other workflow's maker ran past --max-concurrent 1"
    );
    wait_client(client);
    let _ = waiting.wait_with_output();
    (road.after_stop)(env, &subject);
}

/// The newest run of `W` was skipped because `W` is paused (waited for: some roads have
/// no client to wait on).
fn skipped_while_paused(env: &Env, _: &str, _: Option<Output>) {
    wait_for(
        "the paused fire's skipped record",
        Duration::from_secs(20),
        || {
            runs_of(env, W).last().is_some_and(|r| {
                r["state"] == "skipped" && r["reason"].as_str().unwrap_or("").contains("paused")
            })
        },
    );
}

fn nothing(_: &Env, _: usize) -> String {
    String::new()
}

fn no_check(_: &Env, _: &str) {}

fn forced_dry(env: &Env, _: &str, _: Option<Output>) {
    newest_run_forced_dry(env)
}

#[test]
fn manual_runs_over_the_socket_take_the_one_road() {
    let env = Env::new();
    gated_workflow(&env, "manual = true", &maker_gate(&env), PASS, false);
    go_live(&env, W);
    exercise(
        &env,
        &Road {
            prepare: &nothing,
            start: &|env, _| {
                let mut cmd = env.command(&["run", W, "--live", "--json"]);
                cmd.stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
                Some(cmd.spawn().expect("spawn steward"))
            },
            // An explicit --live under the brake is refused (exit 11), not quietly run dry:
            // nothing runs, so the only record is the fire the pause skipped.
            check_dry: &|env, _, out| {
                let out = out.unwrap();
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(11), "{stderr}");
                assert!(stderr.contains("forced dry-run"), "{stderr}");
                let runs = runs_of(env, W);
                assert!(runs.iter().all(|r| r["state"] == "skipped"), "{runs:#?}");
            },
            after_stop: &no_check,
            paused: Some(&skipped_while_paused),
        },
    );
}

#[test]
fn review_approvals_take_the_one_road() {
    let env = Env::new();
    // Verify escalates; the commit an approval starts is held at the gate.
    gated_workflow(
        &env,
        "manual = true",
        "cat >/dev/null\necho '{}'\n",
        "cat >/dev/null\nexit 2\n",
        true,
    );
    go_live(&env, W);
    exercise(
        &env,
        &Road {
            prepare: &|env, _| {
                let out = env.run(W, true);
                assert_eq!(out.state(), "approval-required", "{out}");
                out.run_id()
            },
            start: &|env, run| {
                let mut cmd = env.command(&["approve", run]);
                cmd.stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
                Some(cmd.spawn().expect("spawn steward"))
            },
            check_dry: &|env, run, out| {
                let out = out.unwrap();
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    !out.status.success(),
                    "approved under forced dry-run: {stderr}"
                );
                assert!(stderr.contains("forced dry-run"), "{stderr}");
                let review = env.steward(&["review", "--json"]).json();
                assert!(
                    review
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|r| r["run_id"] == run),
                    "the held approval must stay in review: {review:#}"
                );
            },
            after_stop: &|env, run| {
                let rec = env.steward(&["show", run, "--json"]).json();
                assert_eq!(rec["state"], "interrupted", "{rec:#}");
            },
            paused: None,
        },
    );
}

/// An agency whose planner always dispatches member `m`, who runs `W`.
fn agency(env: &Env, trigger: &str) {
    let planner = env.script(
        "planner.sh",
        "cat >/dev/null\necho '{\"action\":\"dispatch\",\"member\":\"m\",\"task\":\"t\",\"needed_scope\":[]}'\n",
    );
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    std::fs::write(
        env.config.join("agencies/ag.toml"),
        format!(
            "id = \"ag\"\nmandate = \"m\"\nplanner = [\"{planner}\"]\nescalation_contact = \"ops@example.org\"\n{trigger}\n\
             [limits]\nmax_turns = 10\nmax_acts = 1\nmax_spend_usd = 5.0\n\
             [[roster]]\nname = \"m\"\nworkflow = \"{W}\"\nscopes = []\n"
        ),
    )
    .unwrap();
}

fn open_case(env: &Env, phase: usize) -> String {
    let id = format!("c{phase}");
    let out = env.steward(&["case", "open", "--agency", "ag", "--case", &id]);
    assert_eq!(out.code, 0, "{out}");
    id
}

fn case_status(env: &Env, case: &str) -> Value {
    let out = env.steward(&["case", "status", case, "--json"]);
    assert_eq!(out.code, 0, "{out}");
    out.json()
}

/// The interrupted member run is recorded on the case, whose dispatch stays to be redone.
fn case_kept_the_turn(env: &Env, case: &str) {
    let c = case_status(env, case);
    let unfinished = c["unfinished"].as_array().cloned().unwrap_or_default();
    assert_eq!(unfinished.len(), 1, "{c:#}");
    assert_eq!(unfinished[0]["state"], "interrupted", "{c:#}");
    assert!(
        c["pending"].is_object(),
        "the dispatch stays pending: {c:#}"
    );
}

#[test]
fn case_turns_advanced_by_hand_take_the_one_road() {
    let env = Env::new();
    gated_workflow(&env, "manual = true", &maker_gate(&env), PASS, false);
    go_live(&env, W);
    agency(&env, "");
    exercise(
        &env,
        &Road {
            prepare: &open_case,
            start: &|env, case| {
                Some(env.spawn(&["case", "advance", case, "--driver", "op", "--run", "--json"]))
            },
            check_dry: &|env, _, out| {
                let out = out.unwrap();
                assert!(out.status.success(), "{out:?}");
                newest_run_forced_dry(env);
            },
            after_stop: &case_kept_the_turn,
            paused: None,
        },
    );
}

#[test]
fn the_daemons_scheduled_case_driver_takes_the_one_road() {
    let env = Env::new();
    gated_workflow(&env, "manual = true", &maker_gate(&env), PASS, false);
    go_live(&env, W);
    agency(&env, "[trigger]\nschedule = { cron = \"* * * * * *\" }\n");
    exercise(
        &env,
        &Road {
            prepare: &nothing,
            // The daemon drives every open case each second: opening one starts the road.
            start: &|env, _| {
                let phase = usize::from(env.path("phase-1").exists());
                std::fs::write(env.path("phase-1"), "").unwrap();
                open_case(env, phase);
                None
            },
            check_dry: &|env, _, _| {
                wait_for("the driver's member run", Duration::from_secs(20), || {
                    case_status(env, "c0")["receipts"]
                        .as_array()
                        .is_some_and(|r| !r.is_empty())
                });
                newest_run_forced_dry(env);
            },
            after_stop: &|env, _| case_kept_the_turn(env, "c1"),
            paused: None,
        },
    );
}

#[test]
fn digest_agent_runs_take_the_one_road() {
    let env = Env::new();
    // The agent's one source is a command held at the gate; it runs inside the agent's
    // maker step, so it is in the step's process group.
    let feed = r#"echo '{"version":"https://jsonfeed.org/version/1.1","title":"t","items":[{"id":"1","title":"x","content_text":"y"}]}'"#;
    let source = gate(&env, "feed-gate.sh", &format!("{feed}\n"));
    std::fs::write(
        env.config.join("sources.toml"),
        format!("[[source]]\nname = \"gated\"\nkind = \"command\"\ncommand = [\"{source}\"]\ntopic_tags = [\"t\"]\ntimeout_s = 120\n"),
    )
    .unwrap();
    std::fs::create_dir_all(env.config.join("agents")).unwrap();
    std::fs::write(
        env.config.join(format!("agents/{W}.toml")),
        format!("agent_name = \"{W}\"\ncadence = \"daily\"\nverify_loadbearing = false\ncurate_findings = false\ndry_run = false\n[source_filter]\ntopic_tags = [\"t\"]\n"),
    )
    .unwrap();
    go_live(&env, W);
    exercise(
        &env,
        &Road {
            prepare: &nothing,
            start: &|env, _| Some(env.spawn(&["digest", W, "--json"])),
            check_dry: &forced_dry,
            after_stop: &no_check,
            paused: Some(&skipped_while_paused),
        },
    );
}

#[test]
fn queue_marker_drains_take_the_one_road() {
    let env = Env::new();
    // A yearly schedule: it never fires during the test, but its markers are known jobs.
    gated_workflow(
        &env,
        "schedule = { cron = \"0 0 1 1 *\" }",
        &maker_gate(&env),
        PASS,
        false,
    );
    go_live(&env, W);
    exercise(
        &env,
        &Road {
            prepare: &|env, _| {
                let slot = chrono::Utc::now() - chrono::Duration::minutes(1);
                let dir = steward::drain::marker_dir(&env.path("vault"));
                steward::drain::write_marker(&dir, W, slot.date_naive(), slot).unwrap();
                String::new()
            },
            start: &|env, _| Some(env.spawn(&["drain"])),
            check_dry: &forced_dry,
            after_stop: &no_check,
            paused: Some(&skipped_while_paused),
        },
    );
}

#[test]
fn dead_letter_retries_take_the_one_road() {
    let env = Env::new();
    // The maker fails while `fail` exists (a live run lands in the dead-letter queue);
    // its retry is held at the gate.
    let g = gate(&env, "maker-gate.sh", "");
    let run = format!(
        "cat >/dev/null\nif [ -e \"$MARKS/fail\" ]; then exit 1; fi\n\"$STEWARD_CONFIG_DIR/{g}\"\necho '{{}}'\n"
    );
    gated_workflow(&env, "manual = true", &run, PASS, false);
    go_live(&env, W);
    exercise(
        &env,
        &Road {
            prepare: &|env, _| {
                std::fs::write(env.path("fail"), "").unwrap();
                let out = env.run(W, true);
                assert_eq!(out.state(), "failed", "{out}");
                std::fs::remove_file(env.path("fail")).unwrap();
                out.run_id()
            },
            start: &|env, run| Some(env.spawn(&["dead-letter", "retry", run, "--json"])),
            check_dry: &forced_dry,
            after_stop: &no_check,
            paused: Some(&skipped_while_paused),
        },
    );
}
