//! What is told and what is not: a first start, held-back alerts and recovery, too many fires, a quiet queue, an edit after go-live.

use super::*;

/// The webhook bodies the sink received for `event`, parsed (format = "json").
pub(crate) fn webhook_settings(env: &Env, sink: &Sink, events: &str, extra: &str) {
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
