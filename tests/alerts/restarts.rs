//! What alerting owes across a restart or a crash: deliveries, rate windows, slots already told, jitter, a resume.

use super::*;

/// A loopback port nobody listens on (just now): where a receiver that is down would be.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An alert still being retried when the daemon stops (SIGTERM) or dies (SIGKILL) is
/// delivered after the next start, once, with the event id it had before.
#[test]
fn an_alert_still_owed_at_a_stop_or_a_crash_is_delivered_after_the_restart_once() {
    for stop in ["SIGTERM", "SIGKILL"] {
        let env = Env::new();
        let port = free_port();
        std::fs::write(
            env.config.join("steward.toml"),
            format!(
                "[[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{port}/\"\nevents = [\"dead_letter\"]\n"
            ),
        )
        .unwrap();
        env.workflow(&Spec::new("w", "cat >/dev/null\nexit 1\n").tables("[retry]\nattempts = 1\n"));
        let mut d = env.daemon(&[]);
        assert_eq!(env.run("w", false).state(), "failed");
        // The receiver is down: the delivery is being retried.
        wait_for(
            &format!("{stop}: a retried delivery"),
            Duration::from_secs(20),
            || !alert_lines(&env, "retrying").is_empty(),
        );
        let id = alert_lines(&env, "retrying")[0]["data"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        match stop {
            "SIGTERM" => {
                d.stop(Duration::from_secs(20));
            }
            _ => {
                d.signal(nix::sys::signal::Signal::SIGKILL);
                drop(d);
            }
        }
        // The receiver comes back; the daemon starts again on the same state.
        let sink = sink(&env, "alerts.jsonl", Some(port));
        let _d = env.daemon(&[]);
        wait_for(
            &format!("{stop}: the owed alert delivered after the restart"),
            Duration::from_secs(30),
            || !alert_lines(&env, "sent").is_empty(),
        );
        let got = sink.of("http", "dead_letter");
        assert_eq!(got.len(), 1, "{stop}: {got:#?}");
        assert_eq!(got[0]["idempotency_key"], id.as_str(), "{stop}: {got:#?}");
        let body: Value = serde_json::from_str(got[0]["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["id"], id.as_str());
        assert_eq!(body["workflow"], "w");
        // Sent once: nothing is owed any more, and the next start owes nothing either.
        assert_eq!(alert_lines(&env, "sent").len(), 1, "{stop}");
    }
}

/// A channel's `every` holds across a restart: the second dead letter after it is held
/// back, not sent at once.
#[test]
fn every_holds_across_a_restart() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    webhook_settings(&env, &sink, "\"dead_letter\"", "every = \"1h\"\n");
    env.workflow(&Spec::new("w", "cat >/dev/null\nexit 1\n").tables("[retry]\nattempts = 1\n"));
    let mut d = env.daemon(&[]);
    assert_eq!(env.run("w", false).state(), "failed");
    wait_for(
        "the first dead_letter alert",
        Duration::from_secs(20),
        || hooks(&sink, "dead_letter").len() == 1,
    );
    d.stop(Duration::from_secs(20));
    let _d = env.daemon(&[]);
    assert_eq!(env.run("w", false).state(), "failed");
    wait_for(
        "the second dead_letter held back by its every",
        Duration::from_secs(20),
        || !alert_lines(&env, "held").is_empty(),
    );
    assert_eq!(
        hooks(&sink, "dead_letter").len(),
        1,
        "sent again after the restart"
    );
    assert_eq!(alert_lines(&env, "sent").len(), 1);
}

/// The overdue slot already alerted is kept across a restart: the daemon started again
/// inside the same slot does not tell it twice.
#[test]
fn an_overdue_slot_already_alerted_is_not_told_again_after_a_restart() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    // A short `every`, so only the switch's own memory can keep a second alert back.
    webhook_settings(&env, &sink, "\"overdue\"", "every = \"1s\"\n");
    env.workflow(
        &Spec::new("late", "cat >/dev/null\nexit 1\n")
            .trigger("schedule = { cron = \"*/20 * * * * *\", catchup = \"none\" }")
            .tables("[expect]\nwithin = \"1s\"\n[retry]\nattempts = 1\n"),
    );
    let mut d = env.daemon(&[]);
    wait_for("the first overdue alert", Duration::from_secs(45), || {
        hooks(&sink, "overdue").len() == 1
    });
    d.stop(Duration::from_secs(10));
    let d = env.daemon(&[]);
    // Ready means the start-up look of the switch has been made.
    wait_for(
        "the restarted daemon ready",
        Duration::from_secs(15),
        || d.log_text().contains("steward daemon ready"),
    );
    // A repeat would be delivered within moments of the start-up look: watch for one
    // for three seconds (a newer slot, 20 s on, may be told; the same one never).
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        let told = hooks(&sink, "overdue");
        let slots: Vec<&str> = told.iter().filter_map(|h| h["message"].as_str()).collect();
        let mut unique = slots.clone();
        unique.dedup();
        assert_eq!(slots.len(), unique.len(), "a slot told twice: {told:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A daemon started after a slot but before its jittered fire runs that slot at its fire
/// time, once, and `steward why` shows it fired (it was dropped before).
#[test]
fn a_slot_inside_its_jitter_delay_at_start_up_runs_once() {
    use steward::trigger::schedule::{Schedule, ScheduleTrigger};
    let env = Env::new();
    // A name whose delay is 10–14 s of the 15 s jitter: room to start inside it, even on
    // a busy machine where the daemon takes seconds to start.
    let spec = |name: &str| -> Schedule {
        Schedule::parse(&ScheduleTrigger {
            cron: "*/30 * * * * *".into(),
            timezone: None,
            catchup: None,
            catchup_window_s: None,
            jitter: Some("15s".into()),
        })
        .unwrap()
        .for_workflow(name)
    };
    let name = (0..500)
        .map(|i| format!("jit{i}"))
        .find(|n| (10..=14).contains(&spec(n).delay.as_secs()))
        .unwrap();
    let sched = spec(&name);
    env.workflow(
        &Spec::new(&name, "cat >/dev/null\necho '{}'\n")
            .trigger("schedule = { cron = \"*/30 * * * * *\", jitter = \"15s\" }"),
    );
    // Wait until just after a slot, so the daemon starts inside its delay.
    let slot = loop {
        let now = chrono::Utc::now();
        let s = sched.last_at_or_before(now).unwrap();
        let into = (now - s).num_milliseconds();
        if (100..1500).contains(&into) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _d = env.daemon(&[]);
    assert!(
        chrono::Utc::now() < sched.fire_at(slot),
        "started too late to test"
    );
    wait_for("the slot's jittered run", Duration::from_secs(30), || {
        !util::runs_of(&env, &name).is_empty()
    });
    let runs = util::runs_of(&env, &name);
    let first = &runs[0];
    let scheduled: chrono::DateTime<chrono::Utc> = first["trigger"]["scheduled_for"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(scheduled, slot, "{runs:#?}");
    assert_eq!(
        runs.iter()
            .filter(|r| r["trigger"]["scheduled_for"] == first["trigger"]["scheduled_for"])
            .count(),
        1,
        "{runs:#?}"
    );
    assert!(runs.iter().all(|r| r["state"] != "missed"), "{runs:#?}");
    let why = env.steward(&["why", &name]);
    assert!(why.stdout.contains("fired"), "{why}");
}

/// A `resume` taken while no daemon runs is honoured at the next start: the catch-up
/// policy runs the newest slot skipped while paused (it ran nothing before).
#[test]
fn a_resume_taken_offline_catches_up_at_the_next_start() {
    let env = Env::new();
    let mut d = paused_ticker(&env);
    d.stop(Duration::from_secs(10));
    // No daemon: the CLI lifts the pause itself.
    let resumed = env.steward(&["resume", "tick"]);
    assert_eq!(resumed.code, 0, "{resumed}");
    let _d = env.daemon(&[]);
    caught_up_once(&env, "the catch-up run after the offline resume");
}
