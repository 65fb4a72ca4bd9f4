//! Overlap policies and the global cap, and what a daemon keeps to itself (secrets, a private state folder).

use super::*;

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
pub(crate) fn open_to_others(dir: &std::path::Path) -> Vec<String> {
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
