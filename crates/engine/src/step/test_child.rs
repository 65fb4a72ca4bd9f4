//! Steps without processes: a [`TestLauncher`] starts a scripted [`TestChild`] in place of
//! each step, so the supervisor's, the engine's and the runner's rules (budgets, stalls,
//! retries and backoff, overlap, caps, dry-run) are tested in-process, in milliseconds,
//! under paused tokio time. The control lines still cross a real pipe, as fd 3 does.
//!
//! The real-process suites (`tests/`) stay the end-to-end check.

use std::io::Cursor;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::launch::{Launcher, Spawn, Spawned};
use crate::process::{Exit, StandIn, StepProcess};

/// What a scripted step does, from its start.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// fd-3 lines, each written this long after the one before.
    pub control: Vec<(Duration, String)>,
    pub stdout: String,
    pub stderr: String,
    /// How long it runs in all (from its start) before it exits by itself.
    pub runs_for: Duration,
    /// Its exit code when it exits by itself.
    pub exit_code: i32,
    /// When set, it also waits for this to be cancelled before it exits: a step a test
    /// holds running.
    pub hold: Option<CancellationToken>,
}

impl Script {
    /// A step that prints `stdout` and exits 0 at once.
    pub fn ok(stdout: &str) -> Script {
        Script {
            stdout: stdout.to_string(),
            ..Script::default()
        }
    }

    /// A step that exits `code` at once.
    pub fn exits(code: i32) -> Script {
        Script {
            exit_code: code,
            ..Script::default()
        }
    }

    /// This script, with `line` on fd 3 after `after`.
    pub fn line(mut self, after: Duration, line: &str) -> Script {
        self.control.push((after, line.to_string()));
        self
    }

    /// This script, running for `d` in all.
    pub fn running(mut self, d: Duration) -> Script {
        self.runs_for = d;
        self
    }

    /// This script, held running until `hold` is cancelled.
    pub fn held(mut self, hold: CancellationToken) -> Script {
        self.hold = Some(hold);
        self
    }
}

/// A step as the launcher was asked to start it.
#[derive(Debug, Clone)]
pub struct Started {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Started {
    /// The value of `name` in its environment.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

type Scripter = dyn Fn(&Started) -> Script + Send + Sync;

/// Starts a [`TestChild`] for each step, scripted by what it was asked to start (its
/// argv, and its environment: `STEWARD_ATTEMPT`, `STEWARD_DRY_RUN`, …), and keeps a list
/// of what it started.
pub struct TestLauncher {
    script: Box<Scripter>,
    started: Mutex<Vec<Started>>,
}

impl TestLauncher {
    pub fn new(script: impl Fn(&Started) -> Script + Send + Sync + 'static) -> Arc<TestLauncher> {
        Arc::new(TestLauncher {
            script: Box::new(script),
            started: Mutex::new(Vec::new()),
        })
    }

    /// Every step started so far, in order.
    pub fn started(&self) -> Vec<Started> {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Launcher for TestLauncher {
    fn spawn(&self, step: Spawn<'_>) -> std::io::Result<Spawned> {
        if step.argv.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "empty command",
            ));
        }
        let started = Started {
            argv: step.argv.to_vec(),
            env: step.env.to_vec(),
        };
        let script = (self.script)(&started);
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(started);
        let (control_read, control_write) = std::io::pipe()?;
        let control = tokio::net::unix::pipe::Sender::from_owned_fd(control_write.into())?;
        let killed = CancellationToken::new();
        let writer = tokio::spawn(write_control(control, script.control.clone()));
        let child = TestChild {
            ends_at: Instant::now() + script.runs_for,
            hold: script.hold.clone(),
            killed,
            exit_code: script.exit_code,
            writer,
        };
        let process = StepProcess::stand_in(
            Box::new(tokio::io::sink()),
            Box::new(Cursor::new(script.stdout.into_bytes())),
            Box::new(Cursor::new(script.stderr.into_bytes())),
            Box::new(child),
        );
        Ok((process, control_read.into(), None))
    }
}

/// Writes `lines` to the control pipe at their times, then closes it.
async fn write_control(mut pipe: tokio::net::unix::pipe::Sender, lines: Vec<(Duration, String)>) {
    for (after, line) in lines {
        tokio::time::sleep(after).await;
        if pipe
            .write_all(format!("{line}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// A scripted step: ends at its time (and once its hold is lifted) with its exit code, or
/// when killed, as by SIGKILL.
pub struct TestChild {
    ends_at: Instant,
    hold: Option<CancellationToken>,
    killed: CancellationToken,
    exit_code: i32,
    writer: tokio::task::JoinHandle<()>,
}

impl StandIn for TestChild {
    fn wait(&mut self) -> Pin<Box<dyn std::future::Future<Output = Exit> + Send + '_>> {
        Box::pin(async move {
            let ends = async {
                tokio::time::sleep_until(self.ends_at).await;
                if let Some(hold) = &self.hold {
                    hold.cancelled().await;
                }
            };
            // A kill is looked at first: it came while the step still ran.
            tokio::select! {
                biased;
                _ = self.killed.cancelled() => Exit::Signal(9),
                _ = ends => Exit::Code(self.exit_code),
            }
        })
    }

    fn kill(&mut self) {
        self.killed.cancel();
        self.writer.abort();
    }
}

impl Drop for TestChild {
    fn drop(&mut self) {
        self.writer.abort();
    }
}
