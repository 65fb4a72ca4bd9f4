//! Steer by exception, against a real daemon and receivers steward did not write
//! (aiosmtpd for mail, Python's http.server for webhooks, `tests/fixtures/alert_sink.py`):
//! the breaker's alert goes out once per channel, a spend window pauses a workflow, a
//! daemon stopped across a slot reports `missed` and `overdue` when it starts, `steward
//! why` names what became of each slot, and a webhook that is down neither delays a run
//! nor loses its alert.

mod util;

use std::time::{Duration, Instant};

use serde_json::Value;
use util::sink::{first_hook, hooks, sink, Sink};
use util::{wait_for, Env, Spec};

/// steward.toml with the sink's SMTP server and the given `[[notify]]` tables.
fn settings(env: &Env, sink: &Sink, notify: &str) {
    std::fs::write(
        env.config.join("steward.toml"),
        format!("{}\n{notify}", util::smtp_settings(sink.smtp)),
    )
    .unwrap();
}

fn alert_lines(env: &Env, status: &str) -> Vec<Value> {
    env.runlog()
        .into_iter()
        .filter(|l| l["step"] == "alert" && l["status"] == status)
        .collect()
}

fn paused(env: &Env, wf: &str) -> Value {
    env.steward(&["list", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == wf)
        .map(|w| w["paused"].clone())
        .unwrap_or_default()
}

#[test]
fn three_failing_runs_open_the_breaker_and_alert_each_channel_once() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    settings(
        &env,
        &sink,
        &format!(
            "[[notify]]\nkind = \"email\"\nto = [\"ops@example.org\"]\nevents = [\"breaker_open\"]\n\n\
             [[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook/s3cret-token\"\nformat = \"json\"\nevents = [\"breaker_open\", \"dead_letter\"]\n",
            sink.http
        ),
    );
    env.workflow(
        &Spec::new(
            "w",
            "cat >/dev/null\nif [ -e \"$MARKS/fail\" ]; then exit 1; fi\necho '{}'\n",
        )
        .tables("[retry]\nattempts = 1\n[breaker]\nafter = 3\n"),
    );
    std::fs::write(env.path("fail"), "").unwrap();
    let mut d = env.daemon(&[]);
    for _ in 0..3 {
        assert_eq!(env.run("w", false).state(), "failed");
    }
    wait_for(
        "the breaker's alert by mail and by webhook",
        Duration::from_secs(20),
        || {
            !sink.of("smtp", "breaker_open").is_empty()
                && !sink.of("http", "breaker_open").is_empty()
        },
    );
    assert_eq!(paused(&env, "w")["cause"], "breaker");
    // Three dead letters, but the webhook's dead_letter alerts are held to one per 15 min.
    wait_for(
        "the first dead_letter alert",
        Duration::from_secs(20),
        || !sink.of("http", "dead_letter").is_empty(),
    );
    // A fire while paused is skipped: it opens nothing again and alerts nothing.
    assert_eq!(env.run("w", false).state(), "skipped");
    wait_for(
        "the runlog to record the three deliveries",
        Duration::from_secs(10),
        || alert_lines(&env, "sent").len() == 3,
    );
    assert_eq!(
        sink.of("smtp", "breaker_open").len(),
        1,
        "{:#?}",
        sink.received()
    );
    assert_eq!(
        sink.of("http", "breaker_open").len(),
        1,
        "{:#?}",
        sink.received()
    );
    assert_eq!(
        sink.of("http", "dead_letter").len(),
        1,
        "{:#?}",
        sink.received()
    );
    let mail = &sink.of("smtp", "breaker_open")[0];
    assert_eq!(mail["to"], serde_json::json!(["ops@example.org"]));
    assert!(
        mail["body"].as_str().unwrap().contains("steward resume w"),
        "{mail:#}"
    );
    let hook: Value =
        serde_json::from_str(sink.of("http", "breaker_open")[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        (hook["event"].as_str(), hook["workflow"].as_str()),
        (Some("breaker_open"), Some("w"))
    );
    assert_eq!(
        sink.of("http", "breaker_open")[0]["path"],
        "/hook/s3cret-token"
    );
    // The webhook's path holds its token: no log names it.
    assert!(
        !env.runlog_text().contains("s3cret"),
        "{}",
        env.runlog_text()
    );
    assert!(!d.log_text().contains("s3cret"), "{}", d.log_text());
    // Resume restores it: the next fire runs its maker again.
    std::fs::remove_file(env.path("fail")).unwrap();
    assert_eq!(env.steward(&["resume", "w"]).code, 0);
    assert!(paused(&env, "w").is_null());
    assert_eq!(env.run("w", false).state(), "success");
    d.stop(Duration::from_secs(10));
}

#[test]
fn a_spend_window_reached_by_the_third_run_pauses_the_workflow() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    settings(
        &env,
        &sink,
        &format!(
            "[[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/slack\"\nformat = \"slack\"\nevents = [\"budget_window\"]\n",
            sink.http
        ),
    );
    env.workflow(
        &Spec::new("spender", "cat >/dev/null\necho 'charge cost_usd 0.10' >&3\necho x >> \"$MARKS/started\"\necho '{}'\n")
            .tables("[budget.window]\nperiod = \"24h\"\ncost_usd = 0.30\n"),
    );
    let mut d = env.daemon(&[]);
    for n in 1..=2 {
        assert_eq!(env.run("spender", false).state(), "success");
        assert!(paused(&env, "spender").is_null(), "paused after {n} runs");
    }
    assert_eq!(env.run("spender", false).state(), "success");
    let pause = paused(&env, "spender");
    assert_eq!(pause["cause"], "budget", "{pause:#}");
    assert!(
        pause["reason"].as_str().unwrap().contains("0.30"),
        "{pause:#}"
    );
    let out = env.run("spender", false);
    assert_eq!(out.state(), "skipped", "{out}");
    assert!(out.reason().contains("budget"), "{out}");
    let started = std::fs::read_to_string(env.path("started")).unwrap();
    assert_eq!(
        started.lines().count(),
        3,
        "the fourth fire started its maker"
    );
    wait_for("the budget_window alert", Duration::from_secs(20), || {
        !sink.received().is_empty()
    });
    let body: Value = serde_json::from_str(sink.received()[0]["body"].as_str().unwrap()).unwrap();
    let text = body["text"].as_str().unwrap();
    assert!(text.contains("budget_window: spender"), "{text}");
    d.stop(Duration::from_secs(10));
}

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

/// The webhook bodies the sink received for `event`, parsed (format = "json").
fn webhook_settings(env: &Env, sink: &Sink, events: &str, extra: &str) {
    settings(
        env,
        sink,
        &format!(
            "[[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/\"\nevents = [{events}]\n{extra}",
            sink.http
        ),
    );
}

#[test]
fn a_first_start_on_a_fresh_state_raises_no_overdue_or_missed() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    // A short `every`: the rate window holds across a restart, and the control must be
    // told again after it.
    webhook_settings(&env, &sink, "\"overdue\", \"missed\"", "every = \"1s\"\n");
    // Its newest slot is up to an hour old and had no run: before this state folder
    // knew the workflow, so nothing was due then.
    env.workflow(
        &Spec::new("hourly", "cat >/dev/null\necho '{}'\n")
            .trigger("schedule = { cron = \"0 0 * * * *\" }")
            .tables("[expect]\nwithin = \"1h\"\n"),
    );
    // The control: overdue one second after it was first loaded, so its alert shows the
    // switch has looked at both, more than once.
    env.workflow(
        &Spec::new("inbox", "cat >/dev/null\necho '{}'\n")
            .trigger("queue = \"inbox\"")
            .tables("[expect]\nat_least = \"1/1s\"\n"),
    );
    for start in ["first start", "restart"] {
        let before = sink.received().len();
        let mut d = env.daemon(&[]);
        wait_for(
            &format!("the control's overdue alert after the {start}"),
            Duration::from_secs(30),
            || {
                sink.received()[before..].iter().any(|m| {
                    serde_json::from_str::<Value>(m["body"].as_str().unwrap_or("{}"))
                        .is_ok_and(|body| body["workflow"] == "inbox")
                })
            },
        );
        d.stop(Duration::from_secs(10));
        for event in ["overdue", "missed"] {
            let wrong: Vec<Value> = hooks(&sink, event)
                .into_iter()
                .filter(|h| h["workflow"] != "inbox")
                .collect();
            assert!(wrong.is_empty(), "{start}: {wrong:#?}");
        }
    }
    let runs = util::runs_of(&env, "hourly");
    assert!(runs.iter().all(|r| r["state"] != "missed"), "{runs:#?}");
}

#[test]
fn alerts_held_back_are_counted_and_the_first_success_after_failures_is_recovered() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    webhook_settings(
        &env,
        &sink,
        "\"dead_letter\", \"recovered\"",
        "every = \"2s\"\n",
    );
    env.workflow(
        &Spec::new(
            "w",
            "cat >/dev/null\nif [ -e \"$MARKS/fail\" ]; then exit 1; fi\necho '{}'\n",
        )
        .tables("[retry]\nattempts = 1\n"),
    );
    std::fs::write(env.path("fail"), "").unwrap();
    let mut d = env.daemon(&[]);
    for _ in 0..3 {
        assert_eq!(env.run("w", false).state(), "failed");
    }
    wait_for(
        "the held-back dead letters reported",
        Duration::from_secs(20),
        || hooks(&sink, "dead_letter").len() == 2,
    );
    let got = hooks(&sink, "dead_letter");
    assert_eq!(got[0]["held_back"], 0, "{got:#?}");
    // The newest of the two held back is sent, naming the one before it.
    assert_eq!(got[1]["held_back"], 1, "{got:#?}");
    assert!(
        got[1]["text"]
            .as_str()
            .unwrap()
            .contains("1 more dead_letter alert(s)"),
        "{got:#?}"
    );
    let runs = util::runs_of(&env, "w");
    assert_eq!(got[1]["run_id"], runs[2]["run_id"], "{got:#?}");
    std::fs::remove_file(env.path("fail")).unwrap();
    assert_eq!(env.run("w", false).state(), "success");
    wait_for("the recovered alert", Duration::from_secs(20), || {
        !hooks(&sink, "recovered").is_empty()
    });
    // A second success is not a recovery.
    assert_eq!(env.run("w", false).state(), "success");
    wait_for(
        "the runlog to record three sent alerts",
        Duration::from_secs(10),
        || alert_lines(&env, "sent").len() == 3,
    );
    assert_eq!(hooks(&sink, "recovered").len(), 1);
    d.stop(Duration::from_secs(10));
}

#[test]
fn a_workflow_fired_far_more_often_than_its_schedule_allows_is_reported() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    webhook_settings(&env, &sink, "\"too_often\"", "");
    // Once a year on schedule; something keeps firing it by hand.
    env.workflow(
        &Spec::new("yearly", "cat >/dev/null\necho '{}'\n")
            .trigger("schedule = { cron = \"0 0 1 1 *\" }"),
    );
    let mut d = env.daemon(&[]);
    for _ in 0..5 {
        assert_eq!(env.run("yearly", false).state(), "success");
    }
    let got = &first_hook(&sink, "too_often", 30);
    assert!(
        got["message"]
            .as_str()
            .unwrap()
            .starts_with("more than 3 runs in the last hour"),
        "{got:#}"
    );
    d.stop(Duration::from_secs(10));
}

#[test]
fn a_queue_workflow_without_its_expected_runs_is_overdue() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    webhook_settings(&env, &sink, "\"overdue\"", "");
    env.workflow(
        &Spec::new("inbox", "cat >/dev/null\necho '{}'\n")
            .trigger("queue = \"inbox\"")
            .tables("[expect]\nat_least = \"1/2s\"\n"),
    );
    let mut d = env.daemon(&[]);
    let got = &first_hook(&sink, "overdue", 20);
    assert_eq!(got["workflow"], "inbox");
    assert!(
        got["message"]
            .as_str()
            .unwrap()
            .contains("0 successful run(s) in the last 2s, expected at least 1"),
        "{got:#}"
    );
    d.stop(Duration::from_secs(10));
}

#[test]
fn editing_an_approved_workflow_asks_for_go_live_again() {
    let env = Env::new();
    let sink = sink(&env, "alerts.jsonl", None);
    webhook_settings(&env, &sink, "\"go_live_needed\"", "");
    let path = env.live_workflow(&Spec::new("w", "cat >/dev/null\necho '{}'\n"));
    let mut d = env.daemon(&[]);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("max_tokens = 1000", "max_tokens = 999")).unwrap();
    let got = &first_hook(&sink, "go_live_needed", 20);
    assert!(
        got["message"]
            .as_str()
            .unwrap()
            .contains("steward go-live w"),
        "{got:#}"
    );
    d.stop(Duration::from_secs(10));
}

/// `tick`, fired every second with `catchup = "latest"`, paused under a daemon until two
/// of its slots were skipped; the daemon is returned running.
fn paused_ticker(env: &Env) -> util::Daemon {
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

fn skipped_ticks(env: &Env) -> Vec<Value> {
    util::runs_of(env, "tick")
        .into_iter()
        .filter(|r| r["state"] == "skipped")
        .collect()
}

/// Waits for `tick`'s catch-up run after its pause; checks it is one (`latest`) and for a
/// slot skipped while paused, and returns that slot.
fn caught_up_once(env: &Env, what: &str) -> Value {
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

/// A loopback port nobody listens on (just now): where a receiver that is down would be.
fn free_port() -> u16 {
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
