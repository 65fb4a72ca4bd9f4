//! Pause, resume and the circuit breaker, against the real binary: `[breaker] after = 3`
//! opens after three failing runs in a row and pauses the workflow; its next fire is
//! recorded skipped without its maker starting; `steward list` shows the pause; only
//! `steward resume` lifts it; an operator's pause says its reason and refuses a second.

mod util;

use std::time::Duration;

use util::{Env, Spec};

/// A maker that fails while `fail` exists and notes each start in `started`.
fn flaky(env: &Env) {
    env.workflow(
        &Spec::new(
            "w",
            "cat >/dev/null\necho x >> \"$MARKS/started\"\nif [ -e \"$MARKS/fail\" ]; then exit 1; fi\necho '{}'\n",
        )
        .tables("[retry]\nattempts = 1\n[breaker]\nafter = 3\n"),
    );
}

fn starts(env: &Env) -> usize {
    std::fs::read_to_string(env.path("started"))
        .unwrap_or_default()
        .lines()
        .count()
}

fn pause_of(env: &Env) -> serde_json::Value {
    let list = env.steward(&["list", "--json"]).json();
    list.as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == "w")
        .map(|w| w["paused"].clone())
        .unwrap_or_default()
}

#[test]
fn three_failures_in_a_row_open_the_breaker_until_an_operator_resumes() {
    let env = Env::new();
    flaky(&env);
    std::fs::write(env.path("fail"), "").unwrap();
    for n in 1..=2 {
        assert_eq!(env.run("w", false).state(), "failed");
        assert!(pause_of(&env).is_null(), "paused after {n} failures");
    }
    // A success breaks the streak: two more failures do not open it.
    std::fs::remove_file(env.path("fail")).unwrap();
    assert_eq!(env.run("w", false).state(), "success");
    std::fs::write(env.path("fail"), "").unwrap();
    for _ in 0..2 {
        assert_eq!(env.run("w", false).state(), "failed");
    }
    assert!(
        pause_of(&env).is_null(),
        "the streak counted across a success"
    );
    assert_eq!(env.run("w", false).state(), "failed");
    let pause = pause_of(&env);
    assert_eq!(pause["cause"], "breaker", "{pause:#}");
    assert!(
        pause["reason"]
            .as_str()
            .unwrap()
            .contains("last 3 runs failed"),
        "{pause:#}"
    );
    let text = env.steward(&["list"]).stdout;
    assert!(text.contains("PAUSED by breaker"), "{text}");
    let line = env
        .runlog_text()
        .lines()
        .find(|l| l.contains("\"step\":\"pause\""))
        .map(String::from)
        .unwrap_or_default();
    assert!(
        line.contains("\"status\":\"breaker\""),
        "{}",
        env.runlog_text()
    );

    // Open: the next fire is recorded skipped, its maker never starts.
    std::fs::remove_file(env.path("fail")).unwrap();
    let before = starts(&env);
    let held = env.run("w", false);
    assert_eq!(held.state(), "skipped", "{held}");
    assert!(held.reason().contains("breaker"), "{held}");
    assert_eq!(
        starts(&env),
        before,
        "the maker ran while the breaker was open"
    );

    let resumed = env.steward(&["resume", "w"]);
    assert_eq!(resumed.code, 0, "{resumed}");
    assert!(resumed.stdout.contains("paused by breaker"), "{resumed}");
    assert!(pause_of(&env).is_null());
    assert_eq!(env.run("w", false).state(), "success");
}

#[test]
fn an_operators_pause_names_its_reason_and_is_refused_twice() {
    let env = Env::new();
    flaky(&env);
    let paused = env.steward(&["pause", "w", "--reason", "vendor outage"]);
    assert_eq!(paused.code, 0, "{paused}");
    let pause = pause_of(&env);
    assert_eq!(pause["cause"], "operator", "{pause:#}");
    assert_eq!(pause["reason"], "vendor outage", "{pause:#}");
    let again = env.steward(&["pause", "w"]);
    assert_ne!(again.code, 0, "{again}");
    assert!(again.stderr.contains("already paused"), "{again}");
    let held = env.run("w", false);
    assert_eq!(held.state(), "skipped", "{held}");
    assert!(held.reason().contains("vendor outage"), "{held}");
    assert_eq!(starts(&env), 0);
    assert_eq!(env.steward(&["resume", "w"]).code, 0);
    let twice = env.steward(&["resume", "w"]);
    assert_ne!(twice.code, 0, "{twice}");
    assert!(twice.stderr.contains("not paused"), "{twice}");
    let unknown = env.steward(&["pause", "nope"]);
    assert_ne!(unknown.code, 0, "{unknown}");
}

/// A queue item that arrives while its workflow is paused waits for the resume: one
/// skipped record, not one per retry, and it runs once resumed.
#[test]
fn a_queue_item_waits_out_a_pause_and_runs_once_resumed() {
    let env = Env::new();
    env.workflow(
        &Spec::new(
            "w",
            "cat >/dev/null\necho x >> \"$MARKS/started\"\necho '{}'\n",
        )
        .trigger("queue = \"q\""),
    );
    let _d = env.daemon(&[]);
    assert_eq!(env.steward(&["pause", "w"]).code, 0);
    let out = env.steward(&["enqueue", "q", "--payload", "{\"n\":1}"]);
    assert_eq!(out.code, 0, "{out}");
    let skipped = || {
        util::runs_of(&env, "w")
            .iter()
            .filter(|r| r["state"] == "skipped")
            .count()
    };
    util::wait_for(
        "the paused item's skipped record",
        Duration::from_secs(10),
        || skipped() >= 1,
    );
    // Several of the queue's 200 ms retries would have passed by now.
    let later = std::time::Instant::now() + Duration::from_millis(1500);
    util::wait_for("time to pass", Duration::from_secs(5), || {
        std::time::Instant::now() >= later
    });
    assert_eq!(skipped(), 1, "a skipped record per retry while paused");
    assert_eq!(starts(&env), 0);
    assert_eq!(env.steward(&["resume", "w"]).code, 0);
    util::wait_for(
        "the item's run after the resume",
        Duration::from_secs(10),
        || starts(&env) == 1,
    );
}
