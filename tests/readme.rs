//! The README's "Try it" section, followed literally: every command of its `sh` blocks,
//! in order, from the committed `config/` (as git has it: a workflow a user added to the
//! working tree does not change the walk-through) with a fresh state folder, the daemon
//! running, and no `$USER` or `$LOGNAME` (as in a root container). Each command's outcome
//! is checked against what the README's comment beside it says.

mod util;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use util::{copy_dir, dies_with_test, wait_for, Daemon};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The commands of the `sh` blocks of "## Try it", comments stripped.
fn try_it_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let section = readme
        .split("\n## Try it\n")
        .nth(1)
        .expect("README has a Try it section");
    let section = section.split("\n## ").next().unwrap();
    let mut commands = Vec::new();
    let mut in_sh = false;
    for line in section.lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            text if in_sh && !text.is_empty() => {
                let command = text.split("  #").next().unwrap().trim_end();
                commands.push(command.to_string());
            }
            _ => {}
        }
    }
    commands
}

/// What each command must do: (the command, its exit code, text its stdout shows).
const EXPECTED: &[(&str, i32, &str)] = &[
    ("export PATH=$PWD/target/release:$PATH", 0, ""),
    ("steward status", 0, "steward daemon pid"),
    ("steward logs -f", 0, ""),
    ("steward validate", 0, "ok: 6 workflows"),
    ("steward list", 0, "docs-team"),
    (
        "steward run hello --payload '{\"name\":\"Ada\"}'",
        0,
        "dry-run",
    ),
    ("steward run summarize", 0, "success"),
    ("steward run runaway", 6, "exhausted"),
    ("steward dead-letter list", 0, "runaway"),
    ("steward logs", 0, "runaway"),
    ("steward why hello-followup", 0, "fired hello-followup run"),
    (
        "sed -i 's/^dry_run = true/dry_run = false/' config/workflows/hello.toml",
        0,
        "",
    ),
    ("steward go-live hello", 0, "hello is live"),
    ("steward run hello --live", 0, "success"),
    ("steward run hello --live", 0, "clean-no-op"),
    ("echo '# edited' >> config/workflows/hello.toml", 0, ""),
    ("steward run hello --live", 11, ""),
    (
        "steward case open --agency docs-team --case rel-2",
        0,
        "rel-2",
    ),
    ("steward case advance rel-2 --run", 0, "researcher"),
    ("steward case advance rel-2 --run", 0, "writer"),
    ("steward case advance rel-2 --run", 0, "awaiting_approval"),
    ("steward case approve rel-2", 0, "approved"),
    ("steward case advance rel-2 --run", 0, "publisher"),
    ("steward case advance rel-2 --run", 0, "resolved"),
    ("steward case verify rel-2", 0, "chain intact"),
];

/// `sh -c COMMAND` in the walk-through's folder, `steward` on the PATH.
fn shell(dir: &Path, command: &str) -> Command {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_steward"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", path)
        // As in a root container: the case commands must not need either.
        .env_remove("USER")
        .env_remove("LOGNAME")
        .env_remove("SUDO_USER")
        // The README's own daemon may be running on this machine: its default dashboard
        // port is not taken from it.
        .env("STEWARD_DASHBOARD_LISTEN", "127.0.0.1:0")
        .env_remove("STEWARD_CONFIG")
        .env_remove("STEWARD_STATE")
        .env_remove("STEWARD_LOG");
    cmd
}

#[test]
fn the_readme_walk_through_works_in_order_with_the_daemon_running() {
    let commands = try_it_commands();
    let listed: Vec<&str> = EXPECTED.iter().map(|(c, _, _)| *c).collect();
    assert_eq!(
        commands, listed,
        "the README's Try it commands changed: update EXPECTED with what each must do"
    );

    let dir = tempfile::tempdir().unwrap();
    committed_config(&dir.path().join("config"));
    let log = dir.path().join("daemon.log");
    let daemon = Daemon {
        child: Some(
            dies_with_test(&mut shell(dir.path(), "exec steward daemon"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        ),
        log,
    };
    let daemon_log = || daemon.log_text();
    wait_for("the daemon to listen", Duration::from_secs(15), || {
        dir.path().join("state/steward.sock").exists()
    });

    let ledger = dir.path().join("state/hello.ledger");
    let ledger_lines = || {
        std::fs::read_to_string(&ledger)
            .unwrap_or_default()
            .lines()
            .count()
    };
    for (n, (command, code, shows)) in EXPECTED.iter().enumerate() {
        if command.starts_with("export PATH=") {
            continue; // the test puts the binary it built on the PATH itself
        }
        if command.ends_with(" -f") {
            // `logs -f` follows until stopped: it must print the runlog, then keep going.
            let mut follow = shell(dir.path(), &format!("exec {command}"))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut out = std::io::BufReader::new(follow.stdout.take().unwrap());
            let mut first = String::new();
            std::io::BufRead::read_line(&mut out, &mut first).unwrap();
            assert!(!first.is_empty(), "`{command}` printed nothing");
            assert!(
                follow.try_wait().unwrap().is_none(),
                "`{command}` did not keep following"
            );
            let _ = follow.kill();
            let _ = follow.wait();
            continue;
        }
        let before = ledger_lines();
        let out = shell(dir.path(), command).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let context = format!(
            "step {n}: `{command}`\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- daemon\n{}",
            daemon_log()
        );
        assert_eq!(out.status.code(), Some(*code), "{context}");
        assert!(stdout.contains(shows), "expected `{shows}`: {context}");
        // Through the daemon, not beside it: no command opened the store itself.
        assert!(!stderr.contains("no daemon"), "{context}");
        match (n, *command) {
            (_, "steward run hello --live") if *code == 0 && shows == &"success" => {
                assert_eq!(
                    ledger_lines(),
                    before + 1,
                    "the commit wrote no line: {context}"
                )
            }
            (_, "steward run hello --live") => {
                assert_eq!(ledger_lines(), before, "a line was committed: {context}")
            }
            _ => {}
        }
    }
    let status = shell(dir.path(), "steward case status rel-2 --json")
        .output()
        .unwrap();
    let case: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(case["status"], "resolved", "{case:#}");
    let receipts = case["receipts"].as_array().unwrap();
    assert_eq!(receipts.len(), 3, "{case:#}");
    // Each member really ran: its maker started (a `run` step in the runlog) and its run
    // succeeded, rather than ending clean-no-op on a key the walk-through committed.
    let runlog = std::fs::read_to_string(dir.path().join("state/runlog.jsonl")).unwrap();
    for receipt in receipts {
        assert_eq!(receipt["state"], "success", "{receipt:#}");
        let run_id = receipt["run_id"].as_str().unwrap();
        assert!(
            runlog.lines().any(|l| {
                let e: serde_json::Value = serde_json::from_str(l).unwrap();
                e["run_id"] == run_id && e["step"] == "run"
            }),
            "no maker ran for {receipt:#}"
        );
    }
    // The runaway's maker reads its documents: it ends exhausted for its tokens, not
    // with a denied read in its stderr.
    let dead = shell(dir.path(), "steward dead-letter list --json")
        .output()
        .unwrap();
    let dead: serde_json::Value = serde_json::from_slice(&dead.stdout).unwrap();
    let runaway = dead
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["run"]["workflow"] == "runaway")
        .unwrap_or_else(|| panic!("no runaway dead letter: {dead:#}"));
    let id = runaway["run"]["run_id"].as_str().unwrap();
    let shown = shell(dir.path(), &format!("steward dead-letter show {id}"))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("exhausted"), "{shown}");
    assert!(!shown.contains("No such file"), "{shown}");
    assert!(!shown.contains("Permission denied"), "{shown}");
}

/// The example config as committed (`git archive HEAD config`), or, outside a git
/// checkout, the working tree's.
fn committed_config(to: &Path) {
    let archive = Command::new("git")
        .args(["-C", ROOT, "archive", "--format=tar", "HEAD", "config"])
        .output();
    match archive {
        Ok(out) if out.status.success() => {
            let parent = to.parent().unwrap();
            let mut tar = Command::new("tar")
                .args(["-x", "-C"])
                .arg(parent)
                .stdin(Stdio::piped())
                .spawn()
                .unwrap();
            std::io::Write::write_all(tar.stdin.as_mut().unwrap(), &out.stdout).unwrap();
            drop(tar.stdin.take());
            assert!(
                tar.wait().unwrap().success(),
                "tar -x of the committed config"
            );
        }
        _ => {
            eprintln!("not a git checkout: the walk-through uses the working tree's config/");
            copy_dir(&Path::new(ROOT).join("config"), to);
        }
    }
}
