//! Schedules around pauses and jitter, and the alerts of escalations and keys in doubt.

use super::*;

/// `tick`, fired every second with `catchup = "latest"`, paused under a daemon until two
/// of its slots were skipped; the daemon is returned running.
pub(crate) fn paused_ticker(env: &Env) -> util::Daemon {
    env.workflow(&Spec::new("tick", "cat >/dev/null\necho '{}'\n").trigger(
        "schedule = { cron = \"* * * * * *\", catchup = \"latest\", catchup_window_s = 3600 }",
    ));
    let d = env.daemon(&[]);
    assert_eq!(env.steward(&["pause", "tick"]).code, 0);
    wait_for(
        "two slots skipped while paused",
        Duration::from_secs(15),
        || skipped_ticks(env).len() >= 2,
    );
    d
}

pub(crate) fn skipped_ticks(env: &Env) -> Vec<Value> {
    util::runs_of(env, "tick")
        .into_iter()
        .filter(|r| r["state"] == "skipped")
        .collect()
}

/// Waits for `tick`'s catch-up run after its pause; checks it is one (`latest`) and for a
/// slot skipped while paused, and returns that slot.
pub(crate) fn caught_up_once(env: &Env, what: &str) -> Value {
    wait_for(what, Duration::from_secs(20), || {
        util::runs_of(env, "tick")
            .iter()
            .any(|r| r["trigger"]["after_pause"] == true && r["state"] == "success")
    });
    let caught: Vec<Value> = util::runs_of(env, "tick")
        .into_iter()
        .filter(|r| r["trigger"]["after_pause"] == true)
        .collect();
    assert_eq!(caught.len(), 1, "{caught:#?}");
    let slot = caught[0]["trigger"]["scheduled_for"].clone();
    assert!(
        skipped_ticks(env)
            .iter()
            .any(|r| r["trigger"]["scheduled_for"] == slot),
        "{slot}"
    );
    slot
}

#[test]
fn a_resumed_schedule_catches_up_the_newest_slot_it_skipped_while_paused() {
    let env = Env::new();
    let mut d = paused_ticker(&env);
    assert_eq!(env.steward(&["resume", "tick"]).code, 0);
    let slot = caught_up_once(&env, "the catch-up run after the pause");
    d.stop(Duration::from_secs(10));
    let why = env.steward(&["why", "tick", slot.as_str().unwrap()]);
    assert!(why.stdout.contains("caught-up"), "{why}");
}

#[test]
fn jitter_delays_each_fire_by_the_same_amount_and_next_shows_it() {
    let env = Env::new();
    // The delay is a hash of the name within the jitter: this name's is 1.84 s of 2 s.
    env.workflow(
        &Spec::new("spread", "cat >/dev/null\necho '{}'\n")
            .trigger("schedule = { cron = \"*/3 * * * * *\", jitter = \"2s\" }"),
    );
    let fires = |args: &[&str]| -> Vec<chrono::DateTime<chrono::FixedOffset>> {
        let out = env.steward(args);
        assert_eq!(out.code, 0, "{out}");
        out.json()["fires"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| chrono::DateTime::parse_from_rfc3339(f.as_str().unwrap()).unwrap())
            .collect()
    };
    let from = "2027-01-01T00:00:00Z";
    let jittered = fires(&["next", "spread", "--from", from, "--count", "3", "--json"]);
    let slots = fires(&[
        "calendar",
        "*/3 * * * * *",
        "--from",
        from,
        "--count",
        "3",
        "--json",
    ]);
    let delays: Vec<i64> = jittered
        .iter()
        .zip(&slots)
        .map(|(j, s)| (*j - *s).num_milliseconds())
        .collect();
    assert!(delays.iter().all(|d| *d == delays[0]), "{delays:?}");
    assert!((500..=2000).contains(&delays[0]), "{delays:?}");
    let text = env.steward(&["next", "spread"]).stdout;
    assert!(
        text.contains(&format!(
            "each fire starts {:.1}s after its slot",
            delays[0] as f64 / 1000.0
        )),
        "{text}"
    );
    // The daemon starts each run that long after its slot, which the run still records.
    let mut d = env.daemon(&[]);
    wait_for("a fired slot", Duration::from_secs(15), || {
        !util::runs_of(&env, "spread").is_empty()
    });
    d.stop(Duration::from_secs(10));
    let run = &util::runs_of(&env, "spread")[0];
    let slot =
        chrono::DateTime::parse_from_rfc3339(run["trigger"]["scheduled_for"].as_str().unwrap())
            .unwrap();
    let started =
        chrono::DateTime::parse_from_rfc3339(run["started_at"].as_str().unwrap()).unwrap();
    let late = (started - slot).num_milliseconds();
    assert!(
        late >= delays[0] && late < delays[0] + 1000,
        "started {late} ms after its slot, delay {} ms",
        delays[0]
    );
}

#[test]
fn an_escalated_run_and_a_commit_left_in_doubt_are_alerted() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    webhook_settings(&env, &sink, "\"review_waiting\", \"in_doubt\"", "");
    env.workflow(
        &Spec::new("asks", "cat >/dev/null\necho '{}'\n")
            .verify("cat >/dev/null\necho escalate\necho 'needs a human'\n"),
    );
    // A live commit killed by its timeout: it may or may not have happened.
    let path = env.live_workflow(
        &Spec::new("slowcommit", "cat >/dev/null\necho '{}'\n")
            .key("fixed")
            .commit("cat >/dev/null\nsleep 30\n")
            .tables("[retry]\nattempts = 1\n"),
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let at = text.find("[commit]\ncommand = ").unwrap();
    let end = at + text[at..].find('\n').unwrap() + 1;
    let end = end + text[end..].find('\n').unwrap() + 1;
    std::fs::write(
        &path,
        format!("{}timeout_s = 1\n{}", &text[..end], &text[end..]),
    )
    .unwrap();
    assert_eq!(env.steward(&["go-live", "slowcommit"]).code, 0);
    let mut d = env.daemon(&[]);
    let asked = env.run("asks", false);
    assert_eq!(asked.state(), "approval-required", "{asked}");
    let doubt = env.run("slowcommit", true);
    assert_eq!(doubt.state(), "failed", "{doubt}");
    wait_for(
        "the review_waiting and in_doubt alerts",
        Duration::from_secs(20),
        || !hooks(&sink, "review_waiting").is_empty() && !hooks(&sink, "in_doubt").is_empty(),
    );
    let review = &hooks(&sink, "review_waiting")[0];
    assert_eq!(
        review["run_id"].as_str(),
        Some(asked.run_id().as_str()),
        "{review:#}"
    );
    assert!(
        review["message"]
            .as_str()
            .unwrap()
            .contains("needs a human"),
        "{review:#}"
    );
    let doubt_alert = &hooks(&sink, "in_doubt")[0];
    assert_eq!(
        doubt_alert["run_id"].as_str(),
        Some(doubt.run_id().as_str()),
        "{doubt_alert:#}"
    );
    assert!(doubt_alert["message"]
        .as_str()
        .unwrap()
        .contains("steward in-doubt resolve"));
    d.stop(Duration::from_secs(10));
}
