//! The breaker and the spend window: a workflow paused, each channel told once.

use super::*;

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
