//! Other users: a socket client refused; a live run as an unprivileged user; looping key templates.

use super::*;

#[test]
fn a_control_socket_client_of_another_user_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to start a client as another user");
        return;
    }
    let env = Env::new();
    env.workflow(&Spec::new("w", QUICK).dry());
    let _d = env.daemon(&[]);
    let sock = env.state.join("steward.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is the owner's alone");
    let nobody = |env: &Env| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
            .args(["status", "--state"])
            .arg(&env.state)
            .env_remove("STEWARD_STATE")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Layer one: the file mode (and the 0700 folders) keep other users out.
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&env.state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let (code, stderr) = nobody(&env);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    // Layer two: even with the socket opened up, the daemon checks the peer's uid.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, stderr) = nobody(&env);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    // The daemon's own user still gets in.
    assert_eq!(env.steward(&["status"]).code, 0);
}

/// steward never needs root: a live run, end to end, as an unprivileged user that owns
/// only its own folders (where it may not create cgroups, status says so and process
/// groups still contain each step).
#[test]
fn a_live_run_works_as_an_unprivileged_user() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to become another user");
        return;
    }
    let env = Env::new();
    env.workflow(&Spec::new("w", QUICK));
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(env.dir.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let as_nobody = |args: &[&str]| {
        let out = env
            .command(args)
            .env("HOME", env.dir.path())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        env.result(args, out)
    };
    let out = as_nobody(&["go-live", "w"]);
    assert_eq!(out.code, 0, "{out}");
    let out = as_nobody(&["run", "w", "--live", "--json"]);
    assert_eq!(out.state(), "success", "{out}");
    assert_eq!(env.ledger_lines().len(), 1, "{out}");
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(env.state.join("runlog.jsonl")).unwrap(),
    );
    assert_eq!(owner, 65534);
}

/// A key template that would loop 10^10 times: it must run out of its budget instead.
pub(crate) const LOOPING_KEY: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";

#[test]
fn looping_key_templates_fail_their_runs_and_the_daemon_keeps_answering() {
    let env = Env::new();
    for id in ["loop-a", "loop-b"] {
        env.workflow(&Spec::new(id, QUICK).key(LOOPING_KEY));
    }
    let validate = env.steward(&["validate"]);
    assert_eq!(validate.code, 1, "{validate}");
    for id in ["loop-a", "loop-b"] {
        assert!(
            validate
                .stderr
                .contains(&format!("{id}.toml: idempotency_key")),
            "{validate}"
        );
    }

    let mut d = env.daemon(&[]);
    let started = std::time::Instant::now();
    let runs: Vec<_> = ["loop-a", "loop-b"]
        .iter()
        .map(|id| env.spawn(&["run", id, "--json"]))
        .collect();
    let status = env.steward(&["status"]);
    assert_eq!(status.code, 0, "{status}");
    for (child, id) in runs.into_iter().zip(["loop-a", "loop-b"]) {
        let out = child.wait_with_output().unwrap();
        let rec: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{id}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        assert_eq!(rec["state"], "failed", "{rec:#}");
        let reason = rec["reason"].as_str().unwrap();
        assert!(
            reason.contains(&format!("idempotency_key of workflow `{id}`")),
            "{reason}"
        );
        assert!(reason.contains("{% for i in range(100000) %}"), "{reason}");
        assert!(reason.contains("budget"), "{reason}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the runs took {:?}",
        started.elapsed()
    );
    assert_eq!(env.steward(&["status"]).code, 0);
    let stopped = d.stop(Duration::from_secs(10));
    assert!(stopped.success(), "{}", d.log_text());
}
