//! The supervisor on real processes, started whichever way this machine allows
//! (straight into a cgroup where steward may create them, `posix_spawn` elsewhere).

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::budget::BudgetGuard;

use super::*;

async fn run(argv: &[&str], cwd: &Path, stdin: &str) -> StepOutcome {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let env = vec![
        ("PATH".to_string(), "/usr/bin:/bin".to_string()),
        ("GREETING".to_string(), "hello from env".to_string()),
    ];
    run_step(
        StepRequest {
            launcher: &Processes,
            kind: StepKind::Run,
            argv: &argv,
            cwd,
            env: &env,
            stdin: stdin.as_bytes().to_vec(),
            timeout: Some(Duration::from_secs(30)),
            kill_grace: Duration::from_secs(1),
            stall_timeout: None,
            cancel: CancellationToken::new(),
            sandbox: None,
            limits: Default::default(),
            metered: None,
        },
        None,
    )
    .await
}

#[tokio::test]
async fn a_step_gets_its_stdin_environment_folder_and_fd_3_and_its_exit_code_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let script = "cat; echo \"$GREETING\"; pwd; echo 'note from fd 3' >&3; \
                  echo \"pgid=$(cut -d' ' -f5 /proc/$$/stat) pid=$$\"; exit 7";
    let out = run(&["sh", "-c", script], dir.path(), "context on stdin\n").await;
    assert_eq!(out.ending, Ending::Exited, "{out:?}");
    assert_eq!(out.exit, Some(Exit::Code(7)), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "context on stdin");
    assert_eq!(lines[1], "hello from env");
    assert_eq!(Path::new(lines[2]), dir.path().canonicalize().unwrap());
    assert_eq!(out.notes, vec!["from fd 3".to_string()]);
    // A process group of its own: the group id is its pid.
    let ids = lines[3].strip_prefix("pgid=").unwrap();
    let (pgid, pid) = ids.split_once(" pid=").unwrap();
    assert_eq!(pgid, pid, "{}", lines[3]);
}

#[tokio::test]
async fn a_step_killed_by_a_signal_reports_the_signal() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["sh", "-c", "kill -TERM $$"], dir.path(), "").await;
    assert_eq!(out.exit, Some(Exit::Signal(libc::SIGTERM)), "{out:?}");
}

#[tokio::test]
async fn a_program_that_cannot_be_executed_is_a_spawn_failure_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let not_exec = dir.path().join("plain.txt");
    std::fs::write(&not_exec, "#!/bin/sh\necho hi\n").unwrap();
    let out = run(&[not_exec.to_str().unwrap()], dir.path(), "").await;
    match &out.ending {
        Ending::SpawnFailed(e) => assert!(e.contains("Permission denied"), "{e}"),
        other => panic!("expected a spawn failure, got {other:?}"),
    }
    let out = run(&["/bin/true"], &dir.path().join("no-such-folder"), "").await;
    match &out.ending {
        Ending::SpawnFailed(e) => assert!(e.contains("No such file"), "{e}"),
        other => panic!("expected a spawn failure, got {other:?}"),
    }
}

#[tokio::test]
async fn metered_spend_over_the_cap_kills_a_step_that_reports_nothing() {
    use crate::control::Resource;
    let dir = tempfile::tempdir().unwrap();
    let argv: Vec<String> = ["sh", "-c", "sleep 30"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
    let (feed, metered) = mpsc::unbounded_channel();
    let mut guard = BudgetGuard::new(crate::budget::Caps {
        max_tokens: 1000,
        max_tool_calls: 5,
        max_runtime: Duration::from_secs(60),
        max_cost_usd: 1.0,
        stall_timeout: None,
        kill_grace: Duration::from_secs(1),
    });
    // Two model calls, as the gateway meters them: the second takes it over 1000.
    feed.send(Metering::Charge(Resource::Tokens, 600.0))
        .unwrap();
    feed.send(Metering::Charge(Resource::ToolCalls, 1.0))
        .unwrap();
    feed.send(Metering::Charge(Resource::Tokens, 600.0))
        .unwrap();
    let headroom = crate::budget::Headroom::new(guard.left());
    let started = Instant::now();
    let out = run_step(
        StepRequest {
            launcher: &Processes,
            kind: StepKind::Run,
            argv: &argv,
            cwd: dir.path(),
            env: &env,
            stdin: Vec::new(),
            timeout: None,
            kill_grace: Duration::from_secs(1),
            stall_timeout: None,
            cancel: CancellationToken::new(),
            sandbox: None,
            limits: Default::default(),
            metered: Some(Metered {
                charges: metered,
                headroom: headroom.clone(),
                lease: Some(Box::new(feed)),
            }),
        },
        Some(&mut guard),
    )
    .await;
    match &out.ending {
        Ending::Breach(b) => assert_eq!(
            (b.cap, b.used.as_str()),
            (crate::budget::Cap::Tokens, "1200")
        ),
        other => panic!("not a breach: {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(guard.figures().tool_calls, 1);
    assert_eq!(
        guard.misreported().as_deref(),
        Some("reported tokens 0 of 1200 metered, tool_calls 0 of 1 metered")
    );
    // What the step published back: 400 left after the first call.
    let (free, _) = headroom.reserve(|free| Ok::<_, ()>((free, free))).unwrap();
    assert_eq!(free.tokens, 400);
}

#[tokio::test]
async fn a_spend_refused_before_it_happened_ends_the_step_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let argv: Vec<String> = ["sleep", "30"].iter().map(|a| a.to_string()).collect();
    let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
    let (feed, charges) = mpsc::unbounded_channel();
    let mut guard = BudgetGuard::new(crate::budget::Caps {
        max_tokens: 1000,
        max_tool_calls: 5,
        max_runtime: Duration::from_secs(60),
        max_cost_usd: 1.0,
        stall_timeout: None,
        kill_grace: Duration::from_secs(1),
    });
    feed.send(Metering::Charge(crate::control::Resource::CostUsd, 0.25))
        .unwrap();
    feed.send(Metering::Refused(crate::budget::Cap::CostUsd, 0.9))
        .unwrap();
    let out = run_step(
        StepRequest {
            launcher: &Processes,
            kind: StepKind::Run,
            argv: &argv,
            cwd: dir.path(),
            env: &env,
            stdin: Vec::new(),
            timeout: None,
            kill_grace: Duration::from_secs(1),
            stall_timeout: None,
            cancel: CancellationToken::new(),
            sandbox: None,
            limits: Default::default(),
            metered: Some(Metered {
                charges,
                headroom: crate::budget::Headroom::new(guard.left()),
                lease: Some(Box::new(feed)),
            }),
        },
        Some(&mut guard),
    )
    .await;
    match &out.ending {
        Ending::Breach(b) => assert_eq!(b.to_string(), "cost_usd 1.15/1"),
        other => panic!("not a breach: {other:?}"),
    }
}
