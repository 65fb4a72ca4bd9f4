//! Test harness: each test gets a fresh temp folder with its own config and state, runs
//! the real `steward` binary, and on failure sees the command, its output and the runlog.

#![allow(dead_code)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod cluster;
mod daemon;
pub mod http;
pub mod nats;
mod servers;
pub mod sink;

pub use daemon::*;
pub use servers::*;

pub struct Env {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub state: PathBuf,
}

/// What one `steward` invocation did.
pub struct Run {
    pub args: Vec<String>,
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub runlog: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{self}"))
    }

    /// The run's terminal state, from `--json` output.
    pub fn state(&self) -> String {
        self.json()["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The run's `reason`, from `--json` output.
    pub fn reason(&self) -> String {
        self.json()["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub fn run_id(&self) -> String {
        self.json()["run_id"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "--- steward {}", self.args.join(" "))?;
        writeln!(f, "--- exit {}", self.code)?;
        writeln!(f, "--- stdout\n{}", self.stdout)?;
        writeln!(f, "--- stderr\n{}", self.stderr)?;
        writeln!(f, "--- runlog\n{}", self.runlog)
    }
}

/// A workflow for a test: scripts are shell bodies written to files.
pub struct Spec {
    pub id: String,
    pub run: String,
    pub verify: String,
    pub commit: Option<String>,
    pub dry_run: bool,
    pub key: Option<String>,
    pub budget: String,
    /// Extra TOML tables appended at the end (e.g. `[retry]`).
    pub tables: String,
    /// Extra `[env]` lines.
    pub env: String,
    /// The `[trigger]` body.
    pub trigger: String,
    /// Extra top-level lines (e.g. `overlap = "skip"`).
    pub top: String,
}

pub const PASS: &str = "cat >/dev/null\necho pass\n";
/// Appends the run id to $LEDGER: the side effect tests count.
pub const COMMIT: &str = "cat >/dev/null\necho \"$STEWARD_RUN_ID\" >> \"$LEDGER\"\n";
pub const BUDGET: &str =
    "max_tokens = 1000\nmax_tool_calls = 5\nmax_runtime_s = 20\nmax_cost_usd = 1.0\n";

impl Spec {
    pub fn new(id: &str, run: &str) -> Spec {
        Spec {
            id: id.to_string(),
            run: run.to_string(),
            verify: PASS.to_string(),
            commit: Some(COMMIT.to_string()),
            dry_run: false,
            key: None,
            budget: BUDGET.to_string(),
            tables: String::new(),
            env: String::new(),
            trigger: "manual = true".to_string(),
            top: String::new(),
        }
    }
    pub fn trigger(mut self, trigger: &str) -> Self {
        self.trigger = trigger.to_string();
        self
    }
    pub fn top(mut self, top: &str) -> Self {
        self.top = top.to_string();
        self
    }
    pub fn verify(mut self, body: &str) -> Self {
        self.verify = body.to_string();
        self
    }
    pub fn commit(mut self, body: &str) -> Self {
        self.commit = Some(body.to_string());
        self
    }
    pub fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_string());
        self
    }
    pub fn budget(mut self, budget: &str) -> Self {
        self.budget = budget.to_string();
        self
    }
    pub fn tables(mut self, tables: &str) -> Self {
        self.tables = tables.to_string();
        self
    }
    pub fn env(mut self, env: &str) -> Self {
        self.env = env.to_string();
        self
    }
    pub fn dry(mut self) -> Self {
        self.dry_run = true;
        self
    }
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("config");
        let state = dir.path().join("state");
        std::fs::create_dir_all(config.join("workflows")).unwrap();
        std::fs::create_dir_all(config.join("scripts")).unwrap();
        Env { dir, config, state }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The ledger the default commit appends to.
    pub fn ledger(&self) -> PathBuf {
        self.path("ledger")
    }

    pub fn ledger_lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.ledger())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    pub fn script(&self, name: &str, body: &str) -> String {
        let rel = format!("scripts/{name}");
        let path = self.config.join(&rel);
        // Written beside and renamed over: rewriting a script in place while a firing
        // schedule execs it fails with ETXTBSY ("Text file busy").
        let fresh = self.config.join(format!("scripts/.{name}.new"));
        std::fs::write(&fresh, format!("#!/bin/sh\n{body}")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&fresh, &path).unwrap();
        rel
    }

    /// Writes the workflow file and its scripts; returns the file's path.
    pub fn workflow(&self, s: &Spec) -> PathBuf {
        let run = self.script(&format!("{}-run.sh", s.id), &s.run);
        let verify = self.script(&format!("{}-verify.sh", s.id), &s.verify);
        let mut toml = format!("id = \"{}\"\ndry_run = {}\n", s.id, s.dry_run);
        if let Some(k) = &s.key {
            toml.push_str(&format!("idempotency_key = {}\n", toml_str(k)));
        }
        toml.push_str(&s.top);
        toml.push_str(&format!("\n[trigger]\n{}\n", s.trigger));
        toml.push_str(&format!("[budget]\n{}\n", s.budget));
        toml.push_str(&format!(
            "[run]\ncommand = [\"{run}\"]\n[verify]\ncommand = [\"{verify}\"]\n"
        ));
        if let Some(c) = &s.commit {
            let commit = self.script(&format!("{}-commit.sh", s.id), c);
            toml.push_str(&format!("[commit]\ncommand = [\"{commit}\"]\n"));
        }
        toml.push_str(&format!(
            "[env]\nLEDGER = {}\nMARKS = {}\n{}\n",
            toml_str(&self.ledger().to_string_lossy()),
            toml_str(&self.dir.path().to_string_lossy()),
            s.env
        ));
        toml.push_str(&s.tables);
        if !s.tables.contains("[sandbox]") {
            // Widened openly: the tests' makers leave their evidence (marks, the ledger)
            // in the test's folder, which holds config/ and state/ too. What the sandbox
            // denies by default is proven in tests/sandbox.rs.
            toml.push_str(&format!(
                "\n[sandbox]\nwrite = [{}]\n",
                toml_str(&self.dir.path().to_string_lossy())
            ));
        }
        let path = self.config.join("workflows").join(format!("{}.toml", s.id));
        std::fs::write(&path, toml).unwrap();
        path
    }

    /// A workflow that is live: `dry_run = false` and approved with `steward go-live`.
    pub fn live_workflow(&self, s: &Spec) -> PathBuf {
        let path = self.workflow(s);
        let out = self.steward(&["go-live", &s.id]);
        assert_eq!(out.code, 0, "go-live failed:\n{out}");
        path
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_steward"));
        cmd.args(args)
            .env("STEWARD_CONFIG", &self.config)
            .env("STEWARD_STATE", &self.state)
            .env_remove("STEWARD_LOG")
            // Each test daemon's dashboard on a port of its own (8484 is one per machine).
            .env("STEWARD_DASHBOARD_LISTEN", "127.0.0.1:0")
            .current_dir(self.dir.path());
        cmd
    }

    /// Starts `steward ARGS` in the background with stdout captured.
    pub fn spawn(&self, args: &[&str]) -> std::process::Child {
        self.command(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn steward")
    }

    pub fn steward(&self, args: &[&str]) -> Run {
        let out = self.command(args).output().expect("spawn steward");
        self.result(args, out)
    }

    pub fn steward_env(&self, args: &[&str], vars: &[(&str, &str)]) -> Run {
        let mut cmd = self.command(args);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("spawn steward");
        self.result(args, out)
    }

    pub fn result(&self, args: &[&str], out: Output) -> Run {
        Run {
            args: args.iter().map(|s| s.to_string()).collect(),
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            runlog: self.runlog_text(),
        }
    }

    /// `steward run ID --live --json` (or dry with `live = false`).
    pub fn run(&self, id: &str, live: bool) -> Run {
        let mut args = vec!["run", id, "--json"];
        if live {
            args.push("--live");
        }
        self.steward(&args)
    }

    pub fn runlog_text(&self) -> String {
        std::fs::read_to_string(self.state.join("runlog.jsonl")).unwrap_or_default()
    }

    pub fn runlog(&self) -> Vec<Value> {
        self.runlog_text()
            .lines()
            .map(|l| serde_json::from_str(l).expect("runlog line is JSON"))
            .collect()
    }

    pub fn runlog_for(&self, run_id: &str) -> Vec<Value> {
        self.runlog()
            .into_iter()
            .filter(|e| e["run_id"] == run_id)
            .collect()
    }

    pub fn dead_letter_ids(&self) -> Vec<String> {
        let out = self.steward(&["dead-letter", "list", "--json"]);
        assert_eq!(out.code, 0, "{out}");
        out.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["run"]["run_id"].as_str().unwrap().to_string())
            .collect()
    }
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Copies a folder tree (a config folder into a test's own place).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Waits until `cond` holds, or panics after `limit` with `what`.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process is gone (or a zombie nobody reaped, which is just as dead).
/// Peak resident memory of a process (VmHWM), in KiB; 0 if it cannot be read.
pub fn hwm_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
            .unwrap_or(false),
    }
}

pub fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no pid in {}", path.display()))
}

/// `[smtp]` settings for a plain-text SMTP server on loopback at `port`.
pub fn smtp_settings(port: u16) -> String {
    format!("[smtp]\nhost = \"127.0.0.1\"\nport = {port}\nsecurity = \"plain\"\nfrom = \"steward@example.org\"\n")
}

impl Env {
    /// Writes the vault's email distribution list.
    pub fn distribution(&self, list: &str) {
        std::fs::create_dir_all(self.path("vault/_config")).unwrap();
        std::fs::write(self.path("vault/_config/email-distribution.md"), list).unwrap();
    }

    /// Where the running daemon's webhook server listens, as its `status` says (waited
    /// for: the listener starts once the daemon has loaded its triggers, after the socket
    /// answers).
    pub fn webhook_addr(&self) -> String {
        let mut addr = String::new();
        wait_for(
            "the daemon's webhook listener",
            Duration::from_secs(20),
            || {
                let out = self.steward(&["status", "--json"]);
                match out.code == 0 {
                    true => out.json()["webhook_listen"]
                        .as_str()
                        .map(|a| addr = a.to_string())
                        .is_some(),
                    false => false,
                }
            },
        );
        addr
    }
}

/// A hostile maker's attempts, from the `NAME=ok` / `NAME=denied` lines it wrote on stderr.
pub fn attempts(stderr: &str) -> std::collections::BTreeMap<String, String> {
    stderr
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(_, v)| *v == "ok" || *v == "denied")
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
