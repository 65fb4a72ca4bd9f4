//! The control socket, `STATE/steward.sock`: how the CLI reaches a running daemon.
//!
//! sled admits one process per state folder, so while the daemon runs it answers the
//! CLI's requests itself. One JSON line each way: a [`crate::api::Request`] in, a [`Response`] out,
//! each with the protocol version ([`crate::api`]); every request goes to the same
//! [`Service`] the CLI uses when no daemon runs. The socket is mode 0600 and a client of
//! another uid (root aside) is refused.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::api::{self, RequestBody, Response, ResponseBody};
use crate::service::Service;

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
pub async fn serve(listener: UnixListener, service: Arc<Service>, cancel: CancellationToken) {
    let me = nix::unistd::geteuid().as_raw();
    // Clients still waiting for a reply (a run finishing during shutdown) get it before
    // the daemon exits.
    let clients = tokio_util::task::TaskTracker::new();
    let mut errors = crate::listener::AcceptErrors::new("control socket");
    // Refused clients and failed ones are per connection: logged once per 10 s, counted.
    let mut refused = crate::throttle::Throttle::new();
    let failed = Arc::new(crate::throttle::Shared::default());
    // Out of descriptors, say: the accept waits, and says so once in a while.
    while let Some((stream, _)) = errors.next(|| listener.accept(), &cancel).await {
        let uid = stream.peer_cred().map(|c| c.uid()).ok();
        if uid != Some(me) && uid != Some(0) {
            if let Some(n) = refused.due(std::time::Instant::now()) {
                tracing::warn!(peer_uid = ?uid, "control socket: refused a client of another user ({n} refused in the last 10s)");
            }
            let refusal =
                Response::error("refused: the daemon takes commands only from its own user");
            let _ = reply_to(stream, refusal).await;
            continue;
        }
        // Landlock does not cover connecting to a socket by its path: a confined maker
        // could otherwise approve, go live or start runs through this socket.
        let pid = stream.peer_cred().ok().and_then(|c| c.pid());
        if pid.is_some_and(crate::sandbox::is_confined_step) {
            if let Some(n) = refused.due(std::time::Instant::now()) {
                tracing::warn!(peer_pid = ?pid, "control socket: refused a sandboxed step ({n} refused in the last 10s)");
            }
            let refusal = Response::error(
                "refused: a sandboxed step may not command steward (its commit step may)",
            );
            let _ = reply_to(stream, refusal).await;
            continue;
        }
        let service = service.clone();
        let failed = failed.clone();
        clients.spawn(async move {
            if let Err(e) = handle(stream, service).await {
                if let Some(n) = failed.due() {
                    tracing::warn!("control socket client: {e} ({n} failed in the last 10s)");
                }
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

async fn handle(stream: UnixStream, service: Arc<Service>) -> Result<()> {
    let (read, write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read.take(api::MAX_REQUEST));
    let reading = reader.read_line(&mut line);
    // A client that connects and says nothing is let go.
    match tokio::time::timeout(crate::listener::REQUEST_LINE_TIMEOUT, reading).await {
        Ok(read) => {
            read?;
        }
        Err(_) => bail!(
            "no request within {}s: disconnected",
            crate::listener::REQUEST_LINE_TIMEOUT.as_secs()
        ),
    }
    let response = match api::decode::<RequestBody>(&line) {
        Ok(RequestBody { request }) => service.handle(request).await,
        Err(e) => Response::error(e),
    };
    let mut write = write;
    write
        .write_all(&api::encode(ResponseBody { response }))
        .await?;
    Ok(())
}

async fn reply_to(mut stream: UnixStream, response: Response) -> Result<()> {
    stream
        .write_all(&api::encode(ResponseBody { response }))
        .await?;
    Ok(())
}
