//! Accepting connections with limits, for every listener the daemon has (the webhook
//! listener, the dashboard, the control socket): a cap on the connections served at
//! once (a connection over it is closed at once), a deadline for a request's headers,
//! and an accept loop that backs off when the process is out of file descriptors and
//! says so once per interval, with a count — never in a loop.
//!
//! The open-file limit itself is raised to its hard limit at start-up
//! ([`raise_open_files`]), and the connection cap follows from what that limit allows,
//! so a flood of idle clients cannot take the descriptors the daemon needs for its store,
//! its runs and `steward status`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::throttle::{Throttle, LOG_EVERY};

/// How long a client may take to send a request's headers (each request of a
/// keep-alive connection too): a client that sends nothing, or trickles, is cut off.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's body, once its headers are in.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a control-socket client may take to send its request line.
pub const REQUEST_LINE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most connections one HTTP listener serves at once, when the open-file limit
/// allows it (see [`connection_cap`]).
pub const MAX_CONNECTIONS: usize = 512;

/// Raises the soft open-file limit to the hard one (a daemon with many clients and runs
/// needs more than the usual 1,024). Returns (before, after) when it changed.
pub fn raise_open_files() -> Option<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return None;
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).ok()?;
    Some((soft, hard))
}

/// The connections one HTTP listener may hold: [`MAX_CONNECTIONS`], or a quarter of the
/// open-file limit when that is lower, so two listeners at their caps leave half the
/// descriptors to everything else.
pub fn connection_cap() -> usize {
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    MAX_CONNECTIONS.min((limit / 4).max(8) as usize)
}

/// What an accept loop does when `accept` fails (EMFILE, ENFILE, ENOMEM, …): wait a
/// little longer each time in a row (10 ms up to 1 s), and log once per interval.
#[derive(Debug)]
pub struct AcceptErrors {
    what: &'static str,
    delay: Duration,
    log: Throttle,
}

impl AcceptErrors {
    pub fn new(what: &'static str) -> AcceptErrors {
        AcceptErrors {
            what,
            delay: Duration::from_millis(10),
            log: Throttle::new(),
        }
    }

    /// Notes a failed accept; returns how long to wait before the next.
    pub fn failed(&mut self, e: &std::io::Error) -> Duration {
        if let Some(n) = self.log.due(Instant::now()) {
            let hint = if e.raw_os_error() == Some(libc::EMFILE) {
                " (out of file descriptors: raise LimitNOFILE)"
            } else {
                ""
            };
            tracing::error!(
                "{}: accept failed {n} time(s) in the last {}s: {e}{hint}; backing off",
                self.what,
                LOG_EVERY.as_secs()
            );
        }
        let delay = self.delay;
        self.delay = (self.delay * 2).min(Duration::from_secs(1));
        delay
    }

    pub fn accepted(&mut self) {
        self.delay = Duration::from_millis(10);
    }

    /// The next connection `accept` gives, waiting out failures as [`Self::failed`]
    /// says; None once `cancel` fires.
    pub async fn next<T, F, Fut>(&mut self, mut accept: F, cancel: &CancellationToken) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::io::Result<T>>,
    {
        loop {
            let failed = tokio::select! {
                r = accept() => match r {
                    Ok(connection) => {
                        self.accepted();
                        return Some(connection);
                    }
                    Err(e) => e,
                },
                _ = cancel.cancelled() => return None,
            };
            let wait = self.failed(&failed);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => return None,
            }
        }
    }
}

/// Serves `app` over HTTP/1.1 on `listener` until `cancel`, within the limits above:
/// at most [`connection_cap`] connections, [`HEADER_TIMEOUT`] for each request's headers.
/// Each connection's peer address reaches the app as `ConnectInfo<SocketAddr>`. At
/// `cancel`, connections finish the request they are on (for at most 5 s).
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    what: &'static str,
    cancel: CancellationToken,
) {
    let cap = connection_cap();
    let permits = Arc::new(Semaphore::new(cap));
    let mut errors = AcceptErrors::new(what);
    let mut over_cap = Throttle::new();
    let connections = tokio_util::task::TaskTracker::new();
    while let Some((stream, peer)) = errors.next(|| listener.accept(), &cancel).await {
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if let Some(n) = over_cap.due(Instant::now()) {
                tracing::warn!(
                    "{what}: {n} connection(s) closed at once in the last {}s: {cap} already open (the cap)",
                    LOG_EVERY.as_secs()
                );
            }
            drop(stream);
            continue;
        };
        let app = app.clone();
        let cancel = cancel.clone();
        connections.spawn(async move {
            let _permit = permit;
            serve_connection(stream, peer, app, cancel).await;
        });
    }
    connections.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), connections.wait()).await;
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    app: axum::Router,
    cancel: CancellationToken,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let app = app.layer(axum::Extension(axum::extract::ConnectInfo(peer)));
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = cancel.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
        }
    }
}

/// Reads a request body of at most `limit` bytes within [`BODY_TIMEOUT`]: Err(413) over
/// the limit, Err(408) too slow.
pub async fn read_body(
    body: axum::body::Body,
    limit: usize,
) -> Result<axum::body::Bytes, axum::http::StatusCode> {
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(axum::http::StatusCode::PAYLOAD_TOO_LARGE),
        Err(_) => Err(axum::http::StatusCode::REQUEST_TIMEOUT),
    }
}

/// Middleware for an app whose requests are small (the dashboard's forms): the body is
/// read in full within [`BODY_TIMEOUT`] (at most `LIMIT` bytes) before the handler sees it.
pub async fn bounded_body(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    const LIMIT: usize = 1 << 20;
    let (parts, body) = request.into_parts();
    match read_body(body, LIMIT).await {
        Ok(bytes) => {
            next.run(axum::extract::Request::from_parts(parts, bytes.into()))
                .await
        }
        Err(status) => (status, "request body too large or too slow\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_back_off_up_to_a_second() {
        let mut e = AcceptErrors::new("test");
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        let waits: Vec<Duration> = (0..10).map(|_| e.failed(&emfile)).collect();
        assert_eq!(waits[0], Duration::from_millis(10));
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*waits.last().unwrap(), Duration::from_secs(1));
        e.accepted();
        assert_eq!(e.failed(&emfile), Duration::from_millis(10));
    }
}
