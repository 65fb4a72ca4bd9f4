//! The control socket, `STATE/steward.sock`: how the CLI reaches a running daemon.
//!
//! sled admits one process per state folder, so while the daemon runs it executes the
//! CLI's store commands itself. The protocol is one JSON line each way: the request is
//! the CLI's argument list, the reply what the command printed and its exit code. The
//! socket is mode 0600 and a client of another uid (root aside) is refused.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::cli::{self, Cli, Command, Ctx, Reply};
use crate::daemon::Shared;

/// Largest request accepted (an argument list; payloads are small JSON).
const MAX_REQUEST: u64 = 4 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    argv: Vec<String>,
}

pub fn socket_path(state: &Path) -> PathBuf {
    state.join("steward.sock")
}

/// Binds the socket, refusing when another daemon answers on it.
pub fn bind(state: &Path) -> Result<UnixListener> {
    let path = socket_path(state);
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            bail!(
                "a steward daemon is already running on state folder {} (its socket {} answers)",
                state.display(),
                path.display()
            );
        }
        // Left behind by a daemon that crashed.
        std::fs::remove_file(&path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(&path)
        .with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make {} private", path.display()))?;
    Ok(listener)
}

pub fn remove(state: &Path) {
    let _ = std::fs::remove_file(socket_path(state));
}

/// Accepts clients until `cancel`; each request runs as its own task.
pub async fn serve(listener: UnixListener, shared: Arc<Shared>, cancel: CancellationToken) {
    let me = nix::unistd::geteuid().as_raw();
    // Clients still waiting for a reply (a run finishing during shutdown) get it before
    // the daemon exits.
    let clients = tokio_util::task::TaskTracker::new();
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("control socket accept: {e}");
                    continue;
                }
            },
            _ = cancel.cancelled() => break,
        };
        let uid = stream.peer_cred().map(|c| c.uid()).ok();
        if uid != Some(me) && uid != Some(0) {
            tracing::warn!(peer_uid = ?uid, "control socket: refused a client of another user");
            let _ = reply_to(
                stream,
                &Reply {
                    stdout: String::new(),
                    stderr: "steward: refused: the daemon takes commands only from its own user\n"
                        .into(),
                    code: 1,
                },
            )
            .await;
            continue;
        }
        let shared = shared.clone();
        clients.spawn(async move {
            if let Err(e) = handle(stream, shared).await {
                tracing::warn!("control socket client: {e}");
            }
        });
    }
    clients.close();
    if tokio::time::timeout(std::time::Duration::from_secs(5), clients.wait())
        .await
        .is_err()
    {
        tracing::warn!("control socket: clients still waiting at exit");
    }
}

async fn handle(stream: UnixStream, shared: Arc<Shared>) -> Result<()> {
    let (read, write) = stream.into_split();
    let mut line = String::new();
    tokio::io::BufReader::new(read.take(MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let reply = match serde_json::from_str::<Request>(&line) {
        Err(e) => Reply {
            stderr: format!("steward: bad request on the control socket: {e}\n"),
            code: 2,
            ..Default::default()
        },
        Ok(req) => {
            match Cli::try_parse_from(std::iter::once("steward".to_string()).chain(req.argv)) {
                Err(e) => Reply {
                    stderr: e.to_string(),
                    code: 2,
                    ..Default::default()
                },
                Ok(parsed)
                    if matches!(
                        parsed.command,
                        Command::Daemon(_)
                            | Command::Validate
                            | Command::New(_)
                            | Command::Logs { .. }
                            | Command::AgentStep { .. }
                    ) =>
                {
                    Reply {
                        stderr: "steward: this command runs in the CLI, not through the daemon\n"
                            .into(),
                        code: 2,
                        ..Default::default()
                    }
                }
                Ok(parsed) => {
                    let ctx = Ctx {
                        engine: shared.engine.clone(),
                        runner: shared.runner.clone(),
                        config_dir: shared.config_dir.clone(),
                        daemon: Some(shared.clone()),
                    };
                    cli::execute(&ctx, parsed.command).await
                }
            }
        }
    };
    let mut write = write;
    let mut bytes = serde_json::to_vec(&reply)?;
    bytes.push(b'\n');
    write.write_all(&bytes).await?;
    Ok(())
}

async fn reply_to(mut stream: UnixStream, reply: &Reply) -> Result<()> {
    let mut bytes = serde_json::to_vec(reply)?;
    bytes.push(b'\n');
    stream.write_all(&bytes).await?;
    Ok(())
}

/// Sends a command to the daemon on `state`, if one runs there; None means no daemon.
pub fn forward(state: &Path, argv: &[String]) -> Result<Option<Reply>> {
    let path = socket_path(state);
    let mut stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot reach the daemon at {}", path.display()))
        }
    };
    let mut req = serde_json::to_vec(&Request {
        argv: argv.to_vec(),
    })?;
    req.push(b'\n');
    // A refusal is written before the request is read: if sending fails, the answer
    // may still be waiting, so read it before reporting the failed send.
    let sent = stream.write_all(&req);
    let mut line = String::new();
    let read = BufReader::new(stream).read_line(&mut line);
    if line.trim().is_empty() {
        sent.with_context(|| format!("cannot talk to the daemon at {}", path.display()))?;
        read.context("the daemon closed the control socket without answering")?;
        bail!("the daemon closed the control socket without answering (is it stopping?)");
    }
    Ok(Some(
        serde_json::from_str(&line).context("unreadable reply from the daemon")?,
    ))
}
