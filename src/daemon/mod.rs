//! `steward daemon`: loads the config, starts one task per trigger, and keeps running
//! until SIGTERM or SIGINT.
//!
//! Start-up order: load and validate the config (refuse to start on any error), open the
//! store (refuse if another steward holds it), bind the control socket, compute the fires
//! missed while down and drain the queue markers, then start the triggers. Signals are
//! turned into events in one place: HUP reloads (validate first; on any error the running
//! set stays), USR1/USR2 force and lift dry-run for every workflow, TERM/INT stop (a
//! second one cuts the grace short). An edit to the config folder reloads the same way
//! without a signal ([`live_config`]). Runs are never cut short by a reload.
//!
//! [`running::Daemon`] holds a handle to everything the daemon started, and its `stop`
//! is the one order they stop in; [`startup`] holds the start-up steps that stand alone.

mod chain;
mod live_config;
mod running;
mod shared;
mod startup;
mod task;
mod triggers;

pub use shared::Shared;
pub use startup::Options;

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;

/// Runs the daemon on a multi-threaded runtime until a stop signal.
pub fn run_blocking(opts: Options) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(run(opts, CancellationToken::new()))
}

/// The daemon; returns when stopped by a signal or by `shutdown`.
pub async fn run(opts: Options, shutdown: CancellationToken) -> Result<()> {
    let mut daemon = running::Daemon::start(opts).await?;
    daemon.serve(shutdown).await;
    daemon.stop().await
}
