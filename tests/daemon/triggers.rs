//! The daemon's triggers: a six-field cron, file drops, queue items across a restart, signed webhooks.

use super::*;

#[test]
fn six_field_cron_every_second_fires_with_its_exact_slot() {
    let env = Env::new();
    env.workflow(
        &Spec::new("tick", QUICK)
            .trigger("schedule = { cron = \"* * * * * *\" }")
            .dry(),
    );
    let _d = env.daemon(&[]);
    // The window under test: at least 3 runs in 4 seconds.
    std::thread::sleep(Duration::from_secs(4));
    let runs = runs_of(&env, "tick");
    let done: Vec<&Value> = runs.iter().filter(|r| r["state"] == "success").collect();
    assert!(
        done.len() >= 3,
        "only {} runs in 4 s: {runs:#?}",
        done.len()
    );
    let mut slots = std::collections::HashSet::new();
    for r in &done {
        let slot = r["trigger"]["scheduled_for"]
            .as_str()
            .expect("scheduled_for");
        let slot_t = chrono::DateTime::parse_from_rfc3339(slot).unwrap();
        let fired =
            chrono::DateTime::parse_from_rfc3339(r["trigger"]["fired_at"].as_str().unwrap())
                .unwrap();
        assert!(fired >= slot_t, "fired before its slot: {r}");
        assert!(
            (fired - slot_t).num_milliseconds() < 1500,
            "fired far after its slot: {r}"
        );
        assert!(slots.insert(slot.to_string()), "slot fired twice: {slot}");
    }
    // The runlog's trigger record carries the slot and the start time.
    let log = env.runlog();
    let rid = done[0]["run_id"].as_str().unwrap();
    let trig = log
        .iter()
        .find(|e| e["run_id"] == rid && e["step"] == "trigger")
        .expect("trigger record");
    assert!(
        trig["data"]["scheduled_for"].is_string() && trig["ts"].is_string(),
        "{trig}"
    );
}

#[test]
fn a_file_written_slowly_fires_once_after_it_is_complete_with_its_sha256() {
    let env = Env::new();
    env.workflow(
        &Spec::new(
            "ingest",
            "cat > \"$MARKS/ctx-$STEWARD_RUN_ID.json\"\necho '{\"ok\":1}'\n",
        )
        .trigger("file = { path = \"inbox\", pattern = \"*.csv\", debounce_ms = 400 }")
        .dry(),
    );
    let _d = env.daemon(&[]);
    let inbox = env.path("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let mut content = Vec::new();
    {
        let mut f = std::fs::File::create(inbox.join("data.csv")).unwrap();
        for i in 0..6 {
            let chunk = format!("row {i},{}\n", "x".repeat(1000));
            f.write_all(chunk.as_bytes()).unwrap();
            f.flush().unwrap();
            content.extend_from_slice(chunk.as_bytes());
            std::thread::sleep(Duration::from_millis(150));
        }
    }
    let written_at = Instant::now();
    wait_for("one run", Duration::from_secs(10), || {
        runs_of(&env, "ingest")
            .iter()
            .any(|r| r["state"] == "success")
    });
    let runs = runs_of(&env, "ingest");
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let t = &runs[0]["trigger"];
    assert_eq!(t["sha256"], hex::encode(Sha256::digest(&content)));
    assert_eq!(t["size"], content.len());
    assert!(
        !inbox.join("data.csv").exists(),
        "claimed out of the watched folder"
    );
    // Nothing more arrives later.
    std::thread::sleep(Duration::from_millis(800).saturating_sub(written_at.elapsed()));
    assert_eq!(runs_of(&env, "ingest").len(), 1);
    wait_for("the file filed under done/", Duration::from_secs(5), || {
        env.state.join("claimed/ingest/done/data.csv").exists()
    });
}

#[test]
fn fifty_files_dropped_at_once_fire_fifty_runs_none_twice() {
    let env = Env::new();
    env.workflow(
        &Spec::new("drop", QUICK)
            .trigger("file = { path = \"drop\", pattern = \"*.txt\", debounce_ms = 200 }")
            .dry(),
    );
    let dir = env.path("drop");
    std::fs::create_dir_all(&dir).unwrap();
    // A few already there at start-up are picked up too.
    for i in 0..5 {
        std::fs::write(dir.join(format!("f{i:02}.txt")), format!("file {i}")).unwrap();
    }
    let _d = env.daemon(&[]);
    for i in 5..50 {
        let tmp = env.path(&format!("tmp{i}"));
        std::fs::write(&tmp, format!("file {i}")).unwrap();
        std::fs::rename(&tmp, dir.join(format!("f{i:02}.txt"))).unwrap();
    }
    wait_for("50 runs", Duration::from_secs(60), || {
        runs_of(&env, "drop").len() >= 50
    });
    std::thread::sleep(Duration::from_millis(500));
    let runs = runs_of(&env, "drop");
    assert_eq!(
        runs.len(),
        50,
        "{:#?}",
        runs.iter()
            .map(|r| (
                r["state"].clone(),
                r["trigger"]["name"].clone(),
                r["reason"].clone()
            ))
            .collect::<Vec<_>>()
    );
    let shas: std::collections::HashSet<String> = runs
        .iter()
        .map(|r| r["trigger"]["sha256"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(shas.len(), 50, "a file fired twice");
}

#[test]
fn a_hundred_queue_items_run_in_order_exactly_once_across_a_restart() {
    let env = Env::new();
    let commit = "n=$(sed -n 's/.*\"payload\":\\([0-9]*\\).*/\\1/p')\necho \"$n\" >> \"$LEDGER\"\n";
    env.live_workflow(
        &Spec::new("worker", "cat >/dev/null\nsleep 0.02\necho '{\"ok\":1}'\n")
            .trigger("queue = \"jobs\"")
            .commit(commit),
    );
    for n in 1..=50 {
        assert_eq!(
            env.steward(&["enqueue", "jobs", "--payload", &n.to_string()])
                .code,
            0
        );
    }
    let mut d = env.daemon(&["--grace", "10"]);
    for n in 51..=100 {
        let out = env.steward(&["enqueue", "jobs", "--payload", &n.to_string()]);
        assert_eq!(out.code, 0, "{out}");
    }
    wait_for("a third of the items", Duration::from_secs(30), || {
        env.ledger_lines().len() >= 30
    });
    let status = d.stop(Duration::from_secs(15));
    assert!(status.success(), "{}", d.log_text());
    let mid = env.ledger_lines().len();
    assert!(mid < 100, "the restart must happen mid-queue");
    let _d2 = env.daemon(&[]);
    wait_for("all 100 items", Duration::from_secs(60), || {
        env.ledger_lines().len() >= 100
    });
    std::thread::sleep(Duration::from_millis(300));
    let got: Vec<u32> = env
        .ledger_lines()
        .iter()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(
        got,
        (1..=100).collect::<Vec<u32>>(),
        "out of order, lost or twice"
    );
    // Regression: a queue task firing its next item as soon as it heard the last outcome
    // used to find that run still "active" and be skipped by the overlap policy.
    let skipped = runs_of(&env, "worker")
        .into_iter()
        .filter(|r| r["state"] == "skipped")
        .count();
    assert_eq!(
        skipped, 0,
        "sequential fires of one task were skipped as overlapping"
    );
    assert!(std::fs::read_dir(env.state.join("queues/jobs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .all(|e| e.path().extension().is_none_or(|x| x != "json")));
}

#[test]
fn a_queue_item_that_is_not_json_is_rejected_with_a_reason() {
    let env = Env::new();
    env.workflow(&Spec::new("worker", QUICK).trigger("queue = \"jobs\"").dry());
    let spool = env.state.join("queues/jobs");
    std::fs::create_dir_all(&spool).unwrap();
    std::fs::write(spool.join("00000-bad.json"), "{not json").unwrap();
    let _d = env.daemon(&[]);
    assert_eq!(
        env.steward(&["enqueue", "jobs", "--payload", "{\"n\":1}"])
            .code,
        0
    );
    wait_for("the good item to run", Duration::from_secs(10), || {
        runs_of(&env, "worker").len() == 1
    });
    let reason = std::fs::read_to_string(spool.join("rejected/00000-bad.json.reason")).unwrap();
    assert!(reason.contains("not JSON"), "{reason}");
}

pub(crate) fn http_post(addr: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> u16 {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn webhook_with_a_good_signature_runs_a_bad_one_gets_401_and_runs_nothing() {
    let env = Env::new();
    std::fs::write(
        env.config.join("steward.toml"),
        "webhook_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    env.workflow(
        &Spec::new("hook", "cat > \"$MARKS/hook-$STEWARD_RUN_ID.json\"\necho '{\"ok\":1}'\n")
            .trigger("webhook = { path = \"/hooks/t\", secret_env = \"TEST_HOOK_SECRET\", max_body_bytes = 1024 }")
            .dry(),
    );
    let _d = env.daemon_env(&[], &[("TEST_HOOK_SECRET", "hook-secret-123")]);
    let addr = env.webhook_addr();
    let body = br#"{"event":"paid"}"#;
    let now = chrono::Utc::now().timestamp();
    let good = |body: &[u8]| {
        vec![
            ("X-Steward-Timestamp", now.to_string()),
            (
                "X-Steward-Signature",
                steward::trigger::webhook::sign(b"hook-secret-123", now, body),
            ),
        ]
    };

    assert_eq!(http_post(&addr, "/hooks/t", &good(body), body), 202);
    wait_for("the run", Duration::from_secs(10), || {
        runs_of(&env, "hook").len() == 1
    });
    let bad = vec![
        ("X-Steward-Timestamp", now.to_string()),
        (
            "X-Steward-Signature",
            steward::trigger::webhook::sign(b"wrong", now, body),
        ),
    ];
    assert_eq!(http_post(&addr, "/hooks/t", &bad, body), 401);
    assert_eq!(
        http_post(&addr, "/hooks/t", &[], body),
        401,
        "missing signature"
    );
    let stale = now - 3600;
    let replay = vec![
        ("X-Steward-Timestamp", stale.to_string()),
        (
            "X-Steward-Signature",
            steward::trigger::webhook::sign(b"hook-secret-123", stale, body),
        ),
    ];
    assert_eq!(
        http_post(&addr, "/hooks/t", &replay, body),
        401,
        "stale timestamp"
    );
    let big = vec![b'x'; 4096];
    assert_eq!(http_post(&addr, "/hooks/t", &good(&big), &big), 413);
    // The same good request again is a replay: answered, and it runs nothing.
    assert_eq!(http_post(&addr, "/hooks/t", &good(body), body), 200);
    // One more new request: exactly two runs in all, so the refused ones ran nothing.
    let body2 = br#"{"event":"paid","n":2}"#;
    assert_eq!(http_post(&addr, "/hooks/t", &good(body2), body2), 202);
    wait_for("the second run", Duration::from_secs(10), || {
        runs_of(&env, "hook").len() >= 2
    });
    std::thread::sleep(Duration::from_millis(300));
    let runs = runs_of(&env, "hook");
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert_eq!(runs[0]["trigger"]["body"]["event"], "paid");
}
