//! Test harness: each test gets a fresh temp folder with its own config and state, runs
//! the real `steward` binary, and on failure sees the command, its output and the runlog.

#![allow(dead_code)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod cluster;
pub mod http;
pub mod nats;
pub mod sink;

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

/// A real `steward daemon` child process; killed (SIGKILL) on drop if still running, so
/// a test that fails or panics leaves none behind (and [`dies_with_test`] covers a test
/// process that is killed outright).
pub struct Daemon {
    pub child: Option<std::process::Child>,
    pub log: PathBuf,
}

/// Makes the process `cmd` starts die with the test that started it: the kernel sends it
/// SIGKILL when the spawning thread ends (each test runs on a thread of its own, which
/// ends when the test does: passed, failed or panicked) or the test process is killed.
/// For daemons, which would otherwise outlive a killed test holding its state and ports.
pub fn dies_with_test(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the hook runs between fork and exec and makes only two system calls
    // (prctl, getppid), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            // The test may have died before the line above took hold.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    }
}

impl Env {
    /// Starts the daemon and waits until it answers `status`.
    pub fn daemon(&self, extra: &[&str]) -> Daemon {
        self.daemon_env(extra, &[])
    }

    pub fn daemon_env(&self, extra: &[&str], vars: &[(&str, &str)]) -> Daemon {
        self.daemon_with(extra, vars, |_| {})
    }

    /// [`Env::daemon_env`], with `configure` applied to the command before it starts.
    pub fn daemon_with(
        &self,
        extra: &[&str],
        vars: &[(&str, &str)],
        configure: impl FnOnce(&mut Command),
    ) -> Daemon {
        let log = self.path(&format!(
            "daemon-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let file = std::fs::File::create(&log).unwrap();
        let mut args = vec!["daemon"];
        args.extend_from_slice(extra);
        let mut cmd = self.command(&args);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        configure(&mut cmd);
        let child = dies_with_test(&mut cmd)
            .env("STEWARD_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn daemon");
        let mut d = Daemon {
            child: Some(child),
            log,
        };
        let sock = self.state.join("steward.sock");
        wait_for(
            "the daemon to answer status",
            Duration::from_secs(15),
            || {
                if let Some(status) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    panic!("daemon exited early ({status}):\n{}", d.log_text());
                }
                sock.exists() && self.steward(&["status"]).code == 0
            },
        );
        d
    }
}

impl Daemon {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(-1)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).expect("signal daemon");
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait for exit (panics after `limit`); returns the exit status.
    pub fn stop(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let mut child = self.child.take().expect("daemon running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("daemon did not stop within {limit:?}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs with this trigger, in the order they started.
pub fn runs_of(env: &Env, workflow: &str) -> Vec<Value> {
    let out = env.steward(&["runs", "--workflow", workflow, "-n", "100000", "--json"]);
    assert_eq!(out.code, 0, "{out}");
    let mut runs: Vec<Value> = out.json().as_array().cloned().unwrap_or_default();
    runs.reverse();
    runs
}

/// A small SMTP server on loopback speaking the real protocol over TCP; `reject` lists
/// recipients answered with 550. Each accepted message is (recipients, data).
/// Messages received: (recipients, data).
pub type Mailbox = std::sync::Arc<std::sync::Mutex<Vec<(Vec<String>, String)>>>;

pub struct SmtpServer {
    pub port: u16,
    pub messages: Mailbox,
}

pub fn smtp_server(reject: &[&str]) -> SmtpServer {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let messages = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reject: Vec<String> = reject.iter().map(|s| s.to_string()).collect();
    let store = messages.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let store = store.clone();
            let reject = reject.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let _ = conn.write_all(b"220 test ESMTP\r\n");
                let mut rcpts = Vec::new();
                let mut line = String::new();
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let cmd = line.trim_end().to_string();
                    let upper = cmd.to_uppercase();
                    let reply: &[u8] = if upper.starts_with("EHLO") {
                        b"250-test\r\n250 8BITMIME\r\n"
                    } else if upper.starts_with("HELO") || upper.starts_with("NOOP") {
                        b"250 OK\r\n"
                    } else if upper.starts_with("MAIL FROM") || upper.starts_with("RSET") {
                        rcpts.clear();
                        b"250 OK\r\n"
                    } else if upper.starts_with("RCPT TO") {
                        let addr = cmd.split(['<', '>']).nth(1).unwrap_or("").to_string();
                        if reject.contains(&addr) {
                            b"550 5.1.1 no such user\r\n"
                        } else {
                            rcpts.push(addr);
                            b"250 OK\r\n"
                        }
                    } else if upper == "DATA" {
                        let _ = conn.write_all(b"354 go on\r\n");
                        let mut data = String::new();
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == ".\r\n" || line == ".\n" {
                                break;
                            }
                            data.push_str(&line);
                        }
                        store
                            .lock()
                            .unwrap()
                            .push((std::mem::take(&mut rcpts), data));
                        b"250 OK queued\r\n"
                    } else if upper.starts_with("QUIT") {
                        let _ = conn.write_all(b"221 bye\r\n");
                        return;
                    } else {
                        b"502 not implemented\r\n"
                    };
                    if conn.write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    SmtpServer { port, messages }
}

/// A small HTTP server on loopback: `routes` maps a path to (status, body); a status of 0
/// accepts the request and never answers (a feed that hangs).
pub fn http_server(routes: Vec<(&'static str, u16, String)>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let routes = std::sync::Arc::new(routes);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let routes = routes.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut request = String::new();
                let _ = reader.read_line(&mut request);
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                }
                match routes.iter().find(|(p, _, _)| *p == path) {
                    Some((_, 0, _)) => std::thread::sleep(Duration::from_secs(60)),
                    Some((_, status, body)) => {
                        let _ = write!(conn, "HTTP/1.1 {status} X\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                    }
                    None => {
                        let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    }
                }
            });
        }
    });
    addr
}

/// The reference clients the tests run, from PyPI: cron implementations (cronsim,
/// croniter), Selenium for driving Chromium, and aiosmtpd (the SMTP server alerts reach).
/// `tests/run` installs the same file.
pub const PYTHON_REQUIREMENTS: &str = include_str!("../python-requirements.txt");

/// A Python with [`PYTHON_REQUIREMENTS`]: `STEWARD_TEST_PYTHON` (`tests/run` makes one), or a
/// venv made here once per build.
pub fn python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("STEWARD_TEST_PYTHON") {
                return PathBuf::from(p);
            }
            let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-venv");
            let python = venv.join("bin/python");
            let ready = venv.join("ready");
            // The marker holds the pins it was made with: a changed pin list remakes it.
            if std::fs::read_to_string(&ready).ok().as_deref() != Some(PYTHON_REQUIREMENTS) {
                let _ = std::fs::remove_dir_all(&venv);
                let ok = Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&venv)
                    .status()
                    .is_ok_and(|s| s.success())
                    && Command::new(&python)
                        .args(["-m", "pip", "install", "-q"])
                        .args(PYTHON_REQUIREMENTS.split_whitespace())
                        .status()
                        .is_ok_and(|s| s.success());
                assert!(
                    ok,
                    "cannot make a venv with {PYTHON_REQUIREMENTS:?} in {}",
                    venv.display()
                );
                std::fs::write(&ready, PYTHON_REQUIREMENTS).unwrap();
            }
            python
        })
        .clone()
}

/// A real Prometheus scraping `target` every second, killed on drop.
pub struct Prometheus {
    child: std::process::Child,
    pub addr: String,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus (its files in `dir`) and waits until it has seen `target` up.
    pub fn scraping(dir: &Path, target: &str) -> Prometheus {
        assert!(
            Path::new("/usr/bin/prometheus").exists(),
            "/usr/bin/prometheus is missing: apt-get install prometheus (tests/run does)"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: steward\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let log = dir.join("prometheus.log");
        let child = dies_with_test(&mut Command::new("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, addr, log };
        wait_for(
            "Prometheus to see the target up",
            Duration::from_secs(60),
            || p.value("up{job=\"steward\"}").as_deref() == Some("1"),
        );
        p
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The result of an instant query, as Prometheus's JSON.
    pub fn query(&self, query: &str) -> Value {
        let q: String = query
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let Ok(mut conn) = std::net::TcpStream::connect(&self.addr) else {
            return Value::Null;
        };
        use std::io::{Read, Write};
        let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
        let head = format!(
            // HTTP/1.0: the answer comes whole, never chunked.
            "GET /api/v1/query?query={q} HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.addr
        );
        if conn.write_all(head.as_bytes()).is_err() {
            return Value::Null;
        }
        let mut raw = String::new();
        let _ = conn.read_to_string(&mut raw);
        let Some((head, body)) = raw.split_once("\r\n\r\n") else {
            return Value::Null;
        };
        if head.split_whitespace().nth(1) != Some("200") {
            return Value::Null;
        }
        serde_json::from_str(body).unwrap_or(Value::Null)
    }

    /// The value of the query's one series, if Prometheus has it.
    pub fn value(&self, query: &str) -> Option<String> {
        self.query(query)["data"]["result"][0]["value"][1]
            .as_str()
            .map(String::from)
    }
}

/// `promtool check metrics` on `text`: Err with what it said.
pub fn promtool_check(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool: {e}"))?;
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
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
