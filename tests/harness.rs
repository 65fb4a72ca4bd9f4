//! The test harness itself: a daemon a test starts is gone when the test ends, however
//! it ends. Each case runs a real test of this binary in a child process (the `child_*`
//! tests, which do nothing unless the parent asks for them), so the test that fails or
//! is killed is a real one.

mod util;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use util::{process_gone, read_pid, wait_for, Env};

/// Set by the parent: where the child test writes its daemon's pid.
const PID_FILE: &str = "STEWARD_HARNESS_PID_FILE";

/// Runs one `child_*` test of this binary in a process of its own, its temp folders
/// inside `env` so that a killed child leaves nothing behind either.
fn child_test(env: &Env, name: &str, pid_file: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PID_FILE, pid_file)
        .env("TMPDIR", env.dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run the child test")
}

/// In a child: starts a daemon and records its pid; `None` when not asked for.
fn start_daemon_for_parent() -> Option<(Env, util::Daemon)> {
    let pid_file = PathBuf::from(std::env::var_os(PID_FILE)?);
    let env = Env::new();
    let daemon = env.daemon(&[]);
    std::fs::write(pid_file, daemon.pid().to_string()).unwrap();
    Some((env, daemon))
}

#[test]
#[ignore = "run by a_daemon_started_by_the_harness_is_gone_after_its_test_panics"]
fn child_panics_with_a_daemon_running() {
    if let Some((_env, _daemon)) = start_daemon_for_parent() {
        panic!("this test fails on purpose, with its daemon running");
    }
}

#[test]
#[ignore = "run by a_daemon_started_by_the_harness_is_gone_when_its_test_process_is_killed"]
fn child_waits_with_a_daemon_running() {
    if let Some((env, _daemon)) = start_daemon_for_parent() {
        // Held until the parent kills this process (a hung test, a CI timeout).
        wait_for(
            "the parent to kill this test",
            Duration::from_secs(120),
            || env.path("never").exists(),
        );
    }
}

#[test]
fn a_daemon_started_by_the_harness_is_gone_after_its_test_panics() {
    let env = Env::new();
    let pid_file = env.path("daemon.pid");
    let status = child_test(&env, "child_panics_with_a_daemon_running", &pid_file)
        .wait()
        .unwrap();
    assert!(!status.success(), "the child test was meant to fail");
    let pid = read_pid(&pid_file);
    wait_for(
        &format!("daemon {pid} to be gone"),
        Duration::from_secs(20),
        || process_gone(pid),
    );
}

#[test]
fn a_daemon_started_by_the_harness_is_gone_when_its_test_process_is_killed() {
    let env = Env::new();
    let pid_file = env.path("daemon.pid");
    let mut child = child_test(&env, "child_waits_with_a_daemon_running", &pid_file);
    wait_for(
        "the child test's daemon to start",
        Duration::from_secs(60),
        || std::fs::read_to_string(&pid_file).is_ok_and(|s| !s.trim().is_empty()),
    );
    let pid = read_pid(&pid_file);
    assert!(!process_gone(pid), "the daemon should be running now");
    child.kill().unwrap(); // SIGKILL: no unwinding, no Drop
    child.wait().unwrap();
    wait_for(
        &format!("daemon {pid} to be gone"),
        Duration::from_secs(20),
        || process_gone(pid),
    );
}
