//! The daemon, end to end: a real `steward daemon` child process per test, fed by real
//! cron slots, files, queue items, HTTP requests and signals.

mod util;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use sha2::{Digest, Sha256};
use util::{process_gone, read_pid, runs_of, wait_for, Env, Spec};

const QUICK: &str = "cat >/dev/null\necho '{\"ok\": true}'\n";

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

fn http_post(addr: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> u16 {
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

#[test]
fn sighup_keeps_the_running_set_on_a_broken_file_and_loads_a_fixed_one() {
    let env = Env::new();
    env.workflow(&Spec::new("a", QUICK).dry());
    let d = env.daemon(&[]);
    let b = env.workflow(&Spec::new("b", QUICK).dry());
    let good = std::fs::read_to_string(&b).unwrap();
    std::fs::write(&b, good.replace("max_tokens", "max_tokns")).unwrap();
    let line = good.lines().position(|l| l.contains("max_tokens")).unwrap() + 1;
    d.signal(Signal::SIGHUP);
    let want = format!("b.toml:{line}:");
    wait_for(
        "the reload error in the log",
        Duration::from_secs(10),
        || d.log_text().contains(&format!("SIGHUP: {}", b.display())),
    );
    assert!(d.log_text().contains(&want), "{}", d.log_text());
    assert!(
        d.log_text().contains("keeping the running config"),
        "{}",
        d.log_text()
    );
    // The running set (what status shows) is the old one.
    let ids = |env: &Env| -> Vec<String> {
        env.steward(&["status", "--json"]).json()["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&env), ["a"]);
    std::fs::write(&b, good).unwrap();
    d.signal(Signal::SIGHUP);
    wait_for("b to load", Duration::from_secs(10), || {
        ids(&env) == ["a", "b"]
    });
}

#[test]
fn sigusr1_makes_a_live_workflow_skip_its_commit_and_sigusr2_lifts_it() {
    let env = Env::new();
    env.live_workflow(&Spec::new("w", QUICK).trigger("queue = \"q\""));
    let d = env.daemon(&[]);
    env.steward(&["enqueue", "q", "--payload", "1"]);
    wait_for("a live commit", Duration::from_secs(10), || {
        env.ledger_lines().len() == 1
    });
    d.signal(Signal::SIGUSR1);
    wait_for("forced dry-run in status", Duration::from_secs(5), || {
        env.steward(&["status", "--json"]).json()["forced_dry_run"] == true
    });
    env.steward(&["enqueue", "q", "--payload", "2"]);
    wait_for("the second run", Duration::from_secs(10), || {
        runs_of(&env, "w").len() == 2
    });
    let runs = runs_of(&env, "w");
    assert_eq!(runs[1]["dry_run"], true, "{runs:#?}");
    assert_eq!(
        env.ledger_lines().len(),
        1,
        "committed under forced dry-run"
    );
    assert!(d.log_text().contains("SIGUSR1"));
    d.signal(Signal::SIGUSR2);
    wait_for("forced dry-run lifted", Duration::from_secs(5), || {
        env.steward(&["status", "--json"]).json()["forced_dry_run"] == false
    });
    env.steward(&["enqueue", "q", "--payload", "3"]);
    wait_for("live again", Duration::from_secs(10), || {
        env.ledger_lines().len() == 2
    });
}

#[test]
fn sigterm_with_a_run_in_flight_exits_within_the_grace_and_leaves_no_child() {
    let env = Env::new();
    let run = "cat >/dev/null\necho $$ > \"$MARKS/maker.pid\"\nsleep 300 &\necho $! > \"$MARKS/grandchild.pid\"\nwait\n";
    env.workflow(
        &Spec::new("slow", run)
            .dry()
            .budget("max_tokens = 1\nmax_tool_calls = 1\nmax_runtime_s = 600\nmax_cost_usd = 1\n"),
    );
    let mut d = env.daemon(&["--grace", "1"]);
    let client = env.spawn(&["run", "slow", "--json"]);
    wait_for("the maker to start", Duration::from_secs(10), || {
        env.path("grandchild.pid").exists()
    });
    let started = Instant::now();
    let status = d.stop(Duration::from_secs(10));
    let took = started.elapsed();
    assert!(status.success(), "{}", d.log_text());
    assert!(
        took < Duration::from_secs(2),
        "took {took:?} with a 1 s grace"
    );
    for f in ["maker.pid", "grandchild.pid"] {
        let pid = read_pid(&env.path(f));
        wait_for(f, Duration::from_secs(2), || process_gone(pid));
    }
    let out = client.wait_with_output().unwrap();
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        rec["state"],
        "interrupted",
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn missed_fires_catch_up_once_the_older_marker_goes_and_an_expired_one_is_deleted_unrun() {
    let env = Env::new();
    env.workflow(
        &Spec::new("every2", QUICK)
            .trigger("schedule = { cron = \"*/2 * * * * *\" }")
            .dry(),
    );
    env.workflow(
        &Spec::new("yearly", QUICK)
            .trigger("schedule = { cron = \"0 0 1 1 *\", catchup_window_s = 60 }")
            .dry(),
    );
    let mut d = env.daemon(&[]);
    wait_for("a first scheduled run", Duration::from_secs(10), || {
        !runs_of(&env, "every2").is_empty()
    });
    d.stop(Duration::from_secs(10));
    let before = runs_of(&env, "every2").len();

    let markers = env.path("vault/_inbox/scheduled-jobs");
    std::fs::create_dir_all(&markers).unwrap();
    let yesterday = chrono::Utc::now() - chrono::Duration::days(1);
    let older = markers.join(format!("{}-every2.md", yesterday.format("%Y-%m-%d")));
    std::fs::write(
        &older,
        format!(
            "---\nstatus: queued\nscheduled_for: {}\n---\n",
            yesterday.to_rfc3339()
        ),
    )
    .unwrap();
    let old = chrono::Utc::now() - chrono::Duration::days(10);
    let expired = markers.join(format!("{}-yearly.md", old.format("%Y-%m-%d")));
    std::fs::write(
        &expired,
        format!(
            "---\nstatus: queued\nscheduled_for: {}\n---\n",
            old.to_rfc3339()
        ),
    )
    .unwrap();
    let broken = markers.join("2026-01-01-every2-notes.md");
    std::fs::write(&broken, "no frontmatter").unwrap();

    // Let two slots pass while the daemon is down.
    std::thread::sleep(Duration::from_millis(5200));
    let d2 = env.daemon(&[]);
    let catchups = |env: &Env| {
        runs_of(env, "every2")
            .into_iter()
            .filter(|r| r["trigger"]["catchup"] == true)
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !catchups(&env).iter().any(|r| r["state"] == "success") {
        assert!(
            Instant::now() < deadline,
            "no catch-up run\n{}\n{:#?}",
            d2.log_text(),
            runs_of(&env, "every2")
                .iter()
                .map(|r| (
                    r["state"].clone(),
                    r["trigger"].clone(),
                    r["reason"].clone()
                ))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(catchups(&env).len(), 1, "exactly one catch-up run");
    let missed = runs_of(&env, "every2")
        .into_iter()
        .filter(|r| r["state"] == "missed")
        .count();
    assert!(
        missed >= 2,
        "missed fires are recorded ({missed}): {:#?}",
        runs_of(&env, "every2")
            .iter()
            .map(|r| (
                r["state"].clone(),
                r["trigger"]["scheduled_for"].clone(),
                r["reason"].clone()
            ))
            .collect::<Vec<_>>()
    );
    assert!(runs_of(&env, "every2").len() > before);
    wait_for("the markers to go", Duration::from_secs(5), || {
        !older.exists()
    });
    assert!(!expired.exists(), "expired marker kept");
    assert!(
        runs_of(&env, "yearly")
            .iter()
            .all(|r| r["trigger"]["catchup"] != true),
        "expired marker ran"
    );
    assert!(
        broken.exists(),
        "a marker with bad frontmatter must be left in place"
    );
    let leftover: Vec<_> = std::fs::read_dir(&markers)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p != &broken)
        .collect();
    assert!(leftover.is_empty(), "{leftover:?}");
}

/// User plus system CPU time of a process, in clock ticks (USER_HZ, 100 a second).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn an_idle_daemon_watching_a_queue_and_a_folder_does_not_spin() {
    let env = Env::new();
    env.workflow(&Spec::new("q", QUICK).trigger("queue = \"jobs\"").dry());
    env.workflow(
        &Spec::new("drop", QUICK)
            .trigger("file = { path = \"drop\", pattern = \"*.txt\", debounce_ms = 50 }")
            .dry(),
    );
    std::fs::create_dir_all(env.path("drop")).unwrap();
    let d = env.daemon(&[]);
    // One item through each first: the bug this guards against (the trigger's own listing
    // of its folder seen as an event, waking it again) starts with the first wake.
    assert_eq!(env.steward(&["enqueue", "jobs", "--payload", "1"]).code, 0);
    std::fs::write(env.path("drop/a.txt"), "a").unwrap();
    wait_for("both runs", Duration::from_secs(30), || {
        runs_of(&env, "q").len() == 1 && runs_of(&env, "drop").len() == 1
    });
    let before = cpu_ticks(d.pid());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(d.pid()) - before;
    // Idle means timers only: a tick or two in 3 s. Spinning on its own folder listing
    // used about a third of a core (~90 ticks).
    assert!(used <= 15, "idle daemon used {used} ticks of CPU in 3 s");
}

#[test]
fn a_second_daemon_on_the_same_state_folder_refuses_to_start() {
    let env = Env::new();
    env.workflow(&Spec::new("a", QUICK).dry());
    let _d = env.daemon(&[]);
    let out = env.steward(&["daemon"]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("already"), "{out}");
}

#[test]
fn control_socket_is_private_and_status_reports_the_daemon() {
    let env = Env::new();
    env.workflow(
        &Spec::new("tick", QUICK)
            .trigger("schedule = { cron = \"0 9 * * *\", timezone = \"Europe/Berlin\" }")
            .dry(),
    );
    let _d = env.daemon(&[]);
    let mode = std::fs::metadata(env.state.join("steward.sock"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let s = env.steward(&["status", "--json"]).json();
    assert!(s["uptime"].is_string() && s["in_flight"].is_array(), "{s}");
    assert_eq!(s["forced_dry_run"], false);
    let w = &s["workflows"][0];
    assert_eq!(w["id"], "tick");
    assert!(
        w["next_fire"]["local"]
            .as_str()
            .unwrap()
            .contains("09:00:00"),
        "{w}"
    );
    assert!(
        w["next_fire"]["utc"].as_str().unwrap().ends_with('Z'),
        "{w}"
    );
    let text = env.steward(&["status"]);
    assert!(
        text.stdout.contains("tick") && text.stdout.contains("up "),
        "{text}"
    );
}

#[test]
fn overlap_skip_records_the_skipped_fire() {
    let env = Env::new();
    env.workflow(
        &Spec::new(
            "w",
            "cat >/dev/null\ntouch \"$MARKS/started\"\nsleep 1\necho '{}'\n",
        )
        .dry()
        .top("overlap = \"skip\"\n"),
    );
    let _d = env.daemon(&[]);
    let first = env.spawn(&["run", "w", "--json"]);
    wait_for("the first run", Duration::from_secs(10), || {
        env.path("started").exists()
    });
    let second = env.run("w", false);
    assert_eq!(second.state(), "skipped", "{second}");
    assert!(second.reason().contains("overlap = skip"));
    let out = first.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"success\""));
}

#[test]
fn overlap_buffer_one_runs_one_waiting_fire_and_skips_the_rest() {
    let env = Env::new();
    let run = "cat >/dev/null\necho x >> \"$MARKS/starts\"\nsleep 0.7\necho '{}'\n";
    env.workflow(&Spec::new("w", run).dry().top("overlap = \"buffer_one\"\n"));
    let _d = env.daemon(&[]);
    let first = env.spawn(&["run", "w", "--json"]);
    wait_for("the first run", Duration::from_secs(10), || {
        env.path("starts").exists()
    });
    let second = env.spawn(&["run", "w", "--json"]);
    wait_for(
        "the second fire to be buffered",
        Duration::from_secs(5),
        || {
            env.steward(&["status", "--json"]).json()["waiting"]
                .as_array()
                .map_or(0, |a| a.len())
                == 1
        },
    );
    std::thread::sleep(Duration::from_millis(100));
    let third = env.run("w", false);
    assert_eq!(third.state(), "skipped", "{third}");
    for c in [first, second] {
        let out = c.wait_with_output().unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("\"success\""),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    assert_eq!(
        std::fs::read_to_string(env.path("starts"))
            .unwrap()
            .lines()
            .count(),
        2,
        "runs overlapped or a fire was lost"
    );
}

#[test]
fn overlap_cancel_other_interrupts_the_running_one() {
    let env = Env::new();
    let run = "cat >/dev/null\necho $$ >> \"$MARKS/pids\"\nsleep 30\necho '{}'\n";
    env.workflow(
        &Spec::new("w", run)
            .dry()
            .top("overlap = \"cancel_other\"\n"),
    );
    let mut d = env.daemon(&["--grace", "0"]);
    let first = env.spawn(&["run", "w", "--json"]);
    wait_for("the first run", Duration::from_secs(10), || {
        env.path("pids").exists()
    });
    let second = env.spawn(&["run", "w", "--json"]);
    let out = first.wait_with_output().unwrap();
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rec["state"], "interrupted", "{rec}");
    let pid: i32 = std::fs::read_to_string(env.path("pids"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    wait_for("the cancelled maker to die", Duration::from_secs(3), || {
        process_gone(pid)
    });
    wait_for("the newer run to start", Duration::from_secs(5), || {
        std::fs::read_to_string(env.path("pids"))
            .unwrap()
            .lines()
            .count()
            == 2
    });
    // Stop the daemon: the newer run is killed, and the client sees it end.
    d.stop(Duration::from_secs(5));
    let out = second.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("interrupted"));
}

#[test]
fn the_global_cap_keeps_runs_from_overlapping() {
    let env = Env::new();
    // Each run notes when it starts and ends; with a cap of 1 no two may interleave.
    let run = "cat >/dev/null\necho \"start $STEWARD_RUN_ID\" >> \"$MARKS/events\"\nsleep 0.3\necho \"end $STEWARD_RUN_ID\" >> \"$MARKS/events\"\necho '{}'\n";
    env.workflow(&Spec::new("a", run).dry().top("overlap = \"allow_all\"\n"));
    env.workflow(&Spec::new("b", run).dry().top("overlap = \"allow_all\"\n"));
    let _d = env.daemon(&["--max-concurrent", "1"]);
    let kids: Vec<_> = ["a", "b", "a", "b"]
        .iter()
        .map(|w| {
            env.command(&["run", w, "--json"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut k in kids {
        k.wait().unwrap();
    }
    let events = std::fs::read_to_string(env.path("events")).unwrap();
    let lines: Vec<&str> = events.lines().collect();
    assert_eq!(lines.len(), 8, "{events}");
    for pair in lines.chunks(2) {
        assert!(
            pair[0].starts_with("start") && pair[1].starts_with("end"),
            "runs overlapped:\n{events}"
        );
        assert_eq!(pair[0][6..], pair[1][4..], "runs overlapped:\n{events}");
    }
}

#[test]
fn secrets_never_reach_the_daemon_log() {
    let env = Env::new();
    let secret = "daemon-secret-7f3a9c";
    let run =
        "cat >/dev/null\necho \"leaking $TOKEN\" >&2\necho \"note token=$TOKEN\" >&3\nexit 1\n";
    env.workflow(
        &Spec::new("w", run)
            .dry()
            .env("TOKEN = { from_env = \"TEST_DAEMON_TOKEN\" }"),
    );
    let d = env.daemon_env(
        &[],
        &[("TEST_DAEMON_TOKEN", secret), ("STEWARD_LOG", "debug")],
    );
    let out = env.run("w", false);
    assert_eq!(out.state(), "failed", "{out}");
    assert!(out.runlog.contains("[REDACTED:TOKEN]"), "{out}");
    assert!(!out.runlog.contains(secret));
    assert!(!out.stdout.contains(secret));
    assert!(
        !d.log_text().contains(secret),
        "secret in the daemon log:\n{}",
        d.log_text()
    );
}

/// Every entry under `dir` (recursively, links not followed) with group or other bits.
fn open_to_others(dir: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let meta = e.path().symlink_metadata().unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 && !meta.file_type().is_symlink() {
            found.push(format!("{} {mode:04o}", e.path().display()));
        }
        if meta.is_dir() {
            found.extend(open_to_others(&e.path()));
        }
    }
    found
}

#[test]
fn a_state_folder_created_under_umask_022_is_private_and_an_open_one_is_warned_about() {
    // The umask a shell usually gives: steward must not rely on it.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let env = Env::new();
    std::fs::write(
        env.config.join("steward.toml"),
        "webhook_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    env.workflow(&Spec::new("q", QUICK).trigger("queue = \"jobs\"").dry());
    env.workflow(&Spec::new("m", QUICK).dry());
    env.workflow(
        &Spec::new("hook", QUICK)
            .trigger("webhook = { path = \"/h\", secret_env = \"TEST_HOOK_SECRET\" }")
            .dry(),
    );
    let mut d = env.daemon_env(&[], &[("TEST_HOOK_SECRET", "hook-secret-123")]);
    assert_eq!(env.steward(&["enqueue", "jobs", "--payload", "{}"]).code, 0);
    wait_for("the queue item's run", Duration::from_secs(20), || {
        runs_of(&env, "q").len() == 1
    });
    assert!(env.webhook_addr().contains("127.0.0.1"));
    let addr_file = env.state.join("webhook.addr");
    wait_for("webhook.addr", Duration::from_secs(10), || {
        addr_file.exists()
    });
    let mode = std::fs::metadata(&addr_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o077, 0, "webhook.addr is {mode:04o}");
    assert!(env.state.join("dashboard.token").exists());
    let run = env.run("m", false);
    assert_eq!(run.state(), "success", "{run}");
    d.stop(Duration::from_secs(10));
    let open = open_to_others(&env.state);
    assert!(
        open.is_empty(),
        "open to group or others:\n{}",
        open.join("\n")
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&env.state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);

    // An operator opened it: steward says so at start-up (and leaves the choice alone).
    std::fs::set_permissions(&env.state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut d = env.daemon(&[]);
    wait_for("the warning", Duration::from_secs(10), || {
        d.log_text().contains("is open to other users (mode 0755)")
    });
    d.stop(Duration::from_secs(10));
}
