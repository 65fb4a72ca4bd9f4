//! The operator's window: web pages and `/metrics`, served by the daemon.
//!
//! Server-rendered pages (minijinja templates and a stylesheet compiled into the binary;
//! no script but the live log's few lines) over the same [`Service`] the control socket
//! uses: every action on a page is a [`crate::api::Request`] like the CLI's, so forced
//! dry-run, the one road and its refusals hold as they do there. Who may use it is
//! checked in [`guard`] before any page runs. One module per kind of page:
//! [`pages`] (overview, runs, run detail, dead-letter, review, cases), [`live`] (the
//! runlog streamed), [`scrape`] (`/metrics`).
//!
//! Listens on `[dashboard] listen` (default `127.0.0.1:8484`; `"off"` turns it off).

mod context;
mod guard;
mod keys;
mod live;
mod pages;
mod render;
mod scrape;
mod spend;

use context::Dashboard;
pub use keys::{metrics_token_path, token_path};

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use crate::config::dashboard::DashboardSettings;
use crate::service::Service;

/// A bound dashboard, ready to serve.
pub struct Listening {
    listener: tokio::net::TcpListener,
    dashboard: Arc<Dashboard>,
    pub addr: SocketAddr,
}

/// Why the dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{0}")]
    Settings(String),
    #[error(transparent)]
    Token(#[from] keys::TokenError),
    #[error("cannot listen for the dashboard on {addr} ([dashboard] listen in steward.toml; \"off\" turns it off): {why}")]
    Listen {
        addr: SocketAddr,
        why: std::io::Error,
    },
}

/// Binds the dashboard's listener and creates its tokens; None when it is turned off.
pub async fn bind(
    settings: &DashboardSettings,
    service: Arc<Service>,
) -> Result<Option<Listening>, BindError> {
    let Some(addr) = settings.address() else {
        return Ok(None);
    };
    if let Some(problem) = settings.problem() {
        return Err(BindError::Settings(problem));
    }
    let keys = keys::Keys::load_or_create(&service.state_dir, settings.metrics)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|why| BindError::Listen { addr, why })?;
    let addr = listener
        .local_addr()
        .map_err(|why| BindError::Listen { addr, why })?;
    let dashboard = Arc::new(Dashboard {
        service,
        keys,
        hosts: guard::allowed_hosts(addr),
        templates: render::templates(),
        stop: CancellationToken::new(),
    });
    Ok(Some(Listening {
        listener,
        dashboard,
        addr,
    }))
}

/// The URL that opens a dashboard listening on `addr` with `token`.
pub fn url(addr: SocketAddr, token: &str) -> String {
    format!("http://{addr}/?token={token}")
}

/// Serves until `cancel`.
pub async fn serve(listening: Listening, cancel: CancellationToken) {
    let Listening {
        listener,
        dashboard,
        ..
    } = listening;
    let stop = dashboard.stop.clone();
    let app = axum::Router::new()
        .route("/", get(pages::overview))
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run_detail))
        .route("/dead-letter", get(pages::dead_letter))
        .route("/dead-letter/{id}/retry", post(pages::dead_letter_retry))
        .route(
            "/dead-letter/{id}/discard",
            post(pages::dead_letter_discard),
        )
        .route("/review", get(pages::review))
        .route("/review/{id}/approve", post(pages::approve))
        .route("/review/{id}/reject", post(pages::reject))
        .route("/cases", get(pages::cases))
        .route("/cases/{id}", get(pages::case_detail))
        .route("/cases/{id}/approve", post(pages::case_approve))
        .route("/live", get(live::page))
        .route("/live/stream", get(live::stream))
        .route("/style.css", get(pages::stylesheet))
        .route("/metrics", get(scrape::metrics))
        .layer(axum::middleware::from_fn_with_state(
            dashboard.clone(),
            guard::check,
        ))
        .with_state(dashboard);
    let app = app.layer(axum::middleware::from_fn(crate::listener::bounded_body));
    // The live log's streams end when the dashboard stops, so no connection outlasts it.
    let stop_streams = cancel.clone();
    tokio::spawn(async move {
        stop_streams.cancelled().await;
        stop.cancel();
    });
    crate::listener::serve_http(listener, app, "dashboard", cancel).await;
}
