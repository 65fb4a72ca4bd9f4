//! Signals to a real daemon: reload, forced dry-run, stop with a run in flight; missed fires caught up once.

use super::*;

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
