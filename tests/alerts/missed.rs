//! Missed and overdue slots, overlap's skips, and a channel that cannot be reached.

use super::*;

#[test]
fn a_daemon_stopped_across_a_slot_reports_missed_and_overdue_and_why_names_each_slot() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    settings(
        &env,
        &sink,
        &format!(
            "[[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/\"\nevents = [\"missed\", \"overdue\"]\n",
            sink.http
        ),
    );
    env.workflow(
        &Spec::new("tick", "cat >/dev/null\necho '{}'\n")
            .trigger("schedule = { cron = \"*/2 * * * * *\", catchup = \"none\" }")
            .tables("[expect]\nwithin = \"1s\"\n"),
    );
    let mut d = env.daemon(&[]);
    wait_for("a fired slot", Duration::from_secs(15), || {
        util::runs_of(&env, "tick")
            .iter()
            .any(|r| r["state"] == "success")
    });
    d.stop(Duration::from_secs(10));
    let stopped = Instant::now();
    // Let two slots pass with nothing running.
    wait_for("two slots to pass", Duration::from_secs(10), || {
        stopped.elapsed() > Duration::from_secs(5)
    });
    let before = sink.received().len();
    let mut d = env.daemon(&[]);
    wait_for(
        "missed and overdue alerts after the start",
        Duration::from_secs(20),
        || {
            let new: Vec<Value> = sink.received().into_iter().skip(before).collect();
            let has = |e: &str| {
                new.iter().any(|m| {
                    m["body"]
                        .as_str()
                        .unwrap_or("")
                        .contains(&format!("\"event\":\"{e}\""))
                })
            };
            has("missed") && has("overdue")
        },
    );
    let runs = util::runs_of(&env, "tick");
    assert!(runs.iter().any(|r| r["state"] == "missed"), "{runs:#?}");
    // Pause it, and let a slot be skipped as paused.
    assert_eq!(
        env.steward(&["pause", "tick", "--reason", "maintenance"])
            .code,
        0
    );
    wait_for(
        "a slot skipped while paused",
        Duration::from_secs(15),
        || {
            util::runs_of(&env, "tick")
                .iter()
                .any(|r| r["state"] == "skipped")
        },
    );
    let why = env.steward(&["why", "tick", "--since", "1h", "--json"]);
    assert_eq!(why.code, 0, "{why}");
    let entries = why.json().as_array().cloned().unwrap();
    let with = |outcome: &str, cause: &str| {
        entries
            .iter()
            .find(|e| e["outcome"] == outcome && e["reason"].as_str().unwrap().starts_with(cause))
            .cloned()
    };
    let fired = with("fired", "success").unwrap_or_else(|| panic!("no fired slot: {entries:#?}"));
    assert!(fired["run_id"].is_string(), "{fired:#}");
    let missed =
        with("missed", "daemon-down").unwrap_or_else(|| panic!("no missed slot: {entries:#?}"));
    let skipped =
        with("skipped", "paused").unwrap_or_else(|| panic!("no paused slot: {entries:#?}"));
    assert!(
        skipped["reason"].as_str().unwrap().contains("maintenance"),
        "{skipped:#}"
    );
    // One slot asked by its time, as a person would: the same answer in a line.
    for (entry, word) in [
        (&fired, "fired"),
        (&missed, "missed"),
        (&skipped, "skipped"),
    ] {
        let slot = entry["slot"].as_str().unwrap();
        let out = env.steward(&["why", "tick", slot]);
        assert_eq!(out.code, 0, "{out}");
        assert_eq!(out.stdout.lines().count(), 1, "{out}");
        assert!(out.stdout.contains(word), "{slot}: {out}");
    }
    d.stop(Duration::from_secs(10));
}

#[test]
fn a_slot_skipped_by_overlap_says_so() {
    let env = Env::new();
    env.workflow(
        &Spec::new("slow", "cat >/dev/null\nsleep 1.5\necho '{}'\n")
            .trigger("schedule = { cron = \"* * * * * *\" }")
            .top("overlap = \"skip\"\n"),
    );
    let mut d = env.daemon(&[]);
    wait_for("a slot skipped by overlap", Duration::from_secs(15), || {
        util::runs_of(&env, "slow")
            .iter()
            .any(|r| r["state"] == "skipped")
    });
    d.stop(Duration::from_secs(10));
    let why = env.steward(&["why", "slow", "--since", "1h", "--json"]);
    let entries = why.json().as_array().cloned().unwrap();
    let skipped = entries
        .iter()
        .find(|e| e["outcome"] == "skipped")
        .cloned()
        .unwrap();
    assert!(
        skipped["reason"].as_str().unwrap().starts_with("overlap:"),
        "{skipped:#}"
    );
    assert!(skipped["run_id"].is_string());
}

#[test]
fn an_unreachable_webhook_does_not_delay_a_run_and_is_retried() {
    let env = Env::new();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }; // nothing listens there now
    std::fs::write(
        env.config.join("steward.toml"),
        format!("[[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{port}/down\"\nformat = \"ntfy\"\nevents = [\"dead_letter\"]\n"),
    )
    .unwrap();
    env.workflow(&Spec::new("bad", "cat >/dev/null\nexit 1\n").tables("[retry]\nattempts = 1\n"));
    let mut d = env.daemon(&[]);
    let out = env.run("bad", false);
    assert_eq!(out.state(), "failed");
    wait_for(
        "a failed delivery, to be retried",
        Duration::from_secs(10),
        || !alert_lines(&env, "retrying").is_empty(),
    );
    // The run had ended before its alert's first attempt failed: it did not wait for it.
    let end = env
        .runlog()
        .into_iter()
        .find(|l| l["step"] == "end" && l["workflow"] == "bad")
        .unwrap();
    let retry = &alert_lines(&env, "retrying")[0];
    assert!(end["ts"].as_str() < retry["ts"].as_str(), "{end} / {retry}");
    assert!(
        retry["detail"].as_str().unwrap().contains("retrying in"),
        "{retry}"
    );
    // The receiver comes up: a later attempt reaches it.
    let sink = sink(&env, "alerts.jsonl", Some(port));
    wait_for("the retried alert", Duration::from_secs(40), || {
        !sink.received().is_empty()
    });
    let got = &sink.received()[0];
    assert_eq!(got["title"], "[steward] dead_letter: bad", "{got:#}");
    assert!(
        got["body"].as_str().unwrap().contains("run ended failed"),
        "{got:#}"
    );
    wait_for(
        "the runlog to say it was sent",
        Duration::from_secs(10),
        || !alert_lines(&env, "sent").is_empty(),
    );
    d.stop(Duration::from_secs(10));
}
