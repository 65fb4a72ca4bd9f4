//! Short helper processes that are not governed runs: a feed's `command` source, an
//! agent's claim commands, an agency's planner. Each runs with a timeout. Started by the
//! daemon (a planner), a helper gets a process group of its own, killed whole on
//! timeout; started inside a step (an agent's sources and claims), it stays in the
//! step's group, so the step's kill — a budget breach, a shutdown — reaches it too.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most stdout kept from a helper (a command source's feed is capped alike).
pub const MAX_STDOUT: usize = 5 << 20;

/// Why a helper gave no output.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("empty command")]
    Empty,
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Wait(std::io::Error),
    #[error("wrote more than {} MiB to stdout", MAX_STDOUT >> 20)]
    TooMuchOutput,
    #[error("timed out after {:.0}s", .0.as_secs_f64())]
    TimedOut(Duration),
}

/// What a helper left: exit code (-1 if killed by a signal), stdout, stderr.
pub struct Output {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

/// Runs `argv` in `cwd` (a program with a `/` is relative to `cwd`), writes `input` to its
/// stdin, and waits at most `timeout`.
pub async fn run(
    argv: &[String],
    cwd: &Path,
    input: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output, HelperError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(HelperError::Empty);
    };
    let program = if program.contains('/') {
        cwd.join(program)
    } else {
        program.into()
    };
    let mut cmd = tokio::process::Command::new(&program);
    // The steps' allowlist, not steward's whole environment (which may hold secrets).
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(crate::step::base_env())
        .stdin(if input.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let in_step = std::env::var_os("STEWARD_RUN_ID").is_some();
    if !in_step {
        cmd.process_group(0);
    }
    let spawned = {
        let _no_fd3_leak = crate::step::spawn_lock();
        cmd.spawn()
    };
    let mut child = spawned.map_err(|source| HelperError::Spawn {
        program: program.display().to_string(),
        source,
    })?;
    // Inside a step the group is the step's: on timeout only the helper itself is killed.
    let pgid = child
        .id()
        .filter(|_| !in_step)
        .map(|p| Pid::from_raw(p as i32));
    if let (Some(mut stdin), Some(bytes)) = (child.stdin.take(), input) {
        let bytes = bytes.to_vec();
        // Written concurrently, so a helper that answers before reading cannot deadlock us.
        tokio::spawn(async move {
            let _ = stdin.write_all(&bytes).await;
        });
    }
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let work = async {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let read_out = async {
            if let Some(o) = out.as_mut() {
                let _ = o.take(MAX_STDOUT as u64 + 1).read_to_end(&mut stdout).await;
            }
        };
        let read_err = async {
            if let Some(e) = err.as_mut() {
                let _ = e.take(64 << 10).read_to_end(&mut stderr).await;
            }
        };
        tokio::join!(read_out, read_err);
        if stdout.len() > MAX_STDOUT {
            return Err(HelperError::TooMuchOutput);
        }
        let status = child.wait().await.map_err(HelperError::Wait)?;
        Ok::<_, HelperError>(Output {
            code: status.code().unwrap_or(-1),
            stdout,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => {
            if let Some(pgid) = pgid {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            // The timed-out `work` future, and with it the child, is dropped here:
            // kill_on_drop ends the helper itself when it kept the step's group.
            Err(HelperError::TimedOut(timeout))
        }
    }
}
