//! The daemon's start-up steps that stand on their own: opening the state folder, what
//! the last run left (interrupted runs, keys in doubt), joining a cluster, the dashboard's
//! address, what this machine supports — and the small tasks and systemd notices the
//! running daemon keeps.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio_util::sync::CancellationToken;

use super::shared::Shared;
use crate::governed;
use crate::store::{Recovery, StoreError};

/// What `steward daemon` was started with.
pub struct Options {
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    /// How long in-flight runs may finish after SIGTERM.
    pub grace: Duration,
    pub max_concurrent: usize,
    /// `--dashboard`: where the dashboard listens, over steward.toml's `[dashboard] listen`.
    pub dashboard: Option<String>,
}

/// Creates and opens the state folder: the engine on its store, and what the last run
/// of steward left in it.
pub(super) fn open_engine(opts: &Options) -> Result<(governed::Engine, Recovery, PathBuf)> {
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("cannot create state folder {}", opts.state_dir.display()))?;
    let state_dir = std::fs::canonicalize(&opts.state_dir).unwrap_or(opts.state_dir.clone());
    if let Some(warning) = crate::store::openness(&state_dir) {
        tracing::warn!("{warning}");
    }
    match crate::hooks::open(&state_dir) {
        Ok((engine, recovery)) => Ok((engine, recovery, state_dir)),
        Err(governed::EngineError::Store(e @ StoreError::Locked { .. })) => Err(anyhow!(
            "{e}: it is already taken, and only one daemon may run per state folder"
        )),
        Err(e) => Err(e).context("cannot open the state folder"),
    }
}

/// Logs the runs a crash interrupted and alerts each key it left in doubt.
pub(super) fn report_recovery(engine: &governed::Engine, recovery: &Recovery) {
    for id in &recovery.interrupted_runs {
        tracing::warn!(run = %id, "run was in flight when steward last stopped: recorded interrupted");
    }
    for k in &recovery.keys_in_doubt {
        tracing::warn!(workflow = %k.workflow, key = %k.key, "idempotency key in doubt after a crash: see `steward in-doubt list`");
        engine.alerts.raise(
            crate::alert::Alert::new(
                crate::alert::Event::InDoubt,
                &k.workflow,
                format!("steward stopped during the commit of key `{}`: it may or may not have happened — settle it with `steward in-doubt resolve`", k.key),
            )
            .run(&k.run_id),
        );
    }
}

/// Prunes the run records past the retention (a failure is logged, not fatal).
pub(super) fn prune(engine: &governed::Engine) {
    match engine.store.prune_runs(chrono::Utc::now()) {
        Ok(0) => {}
        Ok(n) => tracing::info!("pruned {n} run record(s) past the retention"),
        Err(e) => tracing::warn!("could not prune old run records: {e}"),
    }
}

/// The dashboard's settings: steward.toml's `[dashboard]`, its address replaced by
/// `--dashboard` when given.
pub(super) fn dashboard_settings(
    shared: &Shared,
    opts: &Options,
) -> Result<crate::config::dashboard::DashboardSettings> {
    let mut settings = shared.config().settings.dashboard.clone();
    if let Some(listen) = &opts.dashboard {
        settings.listen = Some(
            serde::Deserialize::deserialize(serde::de::value::StrDeserializer::<
                serde::de::value::Error,
            >::new(listen))
            .map_err(|e| anyhow!("--dashboard: {e}"))?,
        );
    }
    Ok(settings)
}

/// Logs what this machine gives a step: cgroups or process groups, Landlock's reach, a
/// mount namespace of its own.
pub(super) fn report_support() {
    match crate::containment::current() {
        crate::containment::Containment::Cgroup(_) => {
            tracing::info!("containment: {}", crate::containment::describe())
        }
        crate::containment::Containment::ProcessGroups(_) => {
            tracing::warn!("containment: {}", crate::containment::describe())
        }
    }
    let sandbox = crate::sandbox::Support::current();
    if sandbox.missing(&crate::sandbox::Net::None).is_empty() {
        tracing::info!("{}", sandbox.describe());
    } else {
        tracing::warn!("{}", sandbox.describe());
    }
    match crate::sandbox::tmp::supported() {
        Ok(()) => tracing::info!("sandbox: each step gets a mount namespace (a private /tmp, the system's secrets masked)"),
        Err(why) => tracing::warn!("sandbox: steps get no /tmp and the system's secrets are fenced by Landlock only: {why}"),
    }
}

/// The cluster's member and its store, once joined.
pub(super) type Membership = (
    crate::cluster::Member,
    Arc<crate::cluster::store::MemberStore>,
);

/// With `[cluster]`: joins the cluster before any work is taken (a server that cannot be
/// reached stops the start, saying so) and keeps idempotency keys there.
pub(super) async fn join_cluster(
    config: &crate::config::Config,
    engine: &mut governed::Engine,
    state_dir: &Path,
    recovered: &[String],
) -> Result<Option<Membership>> {
    let Some(settings) = &config.settings.cluster else {
        return Ok(None);
    };
    let settings = settings.checked()?;
    let member = crate::cluster::Member::join(&settings)
        .await
        .context("cannot join the cluster ([cluster] in steward.toml)")?;
    tracing::info!(
        daemon = %member.cluster.daemon,
        servers = %settings.servers.join(", "),
        "cluster: joined; slots, idempotency keys and queue items are shared through NATS JetStream"
    );
    // The runlog's lines go to the cluster's log stream too, sent without waiting.
    let cluster = member.cluster.clone();
    let bridge = member.bridge.clone();
    let _ = bridge
        .run({
            let cluster = cluster.clone();
            async move { cluster.log_stream().await }
        })
        .await;
    engine.runlog.set_tee(Box::new(move |line: &str| {
        let (cluster, line) = (cluster.clone(), line.to_string());
        bridge.spawn(async move { cluster.send_log_line(line).await });
    }));
    let store = crate::cluster::store::MemberStore::join(
        &member,
        engine.store.clone(),
        state_dir,
        recovered,
    )
    .await?;
    engine.store = crate::store::Store::from_backend(store.clone());
    Ok(Some((member, store)))
}

/// The dead-man's switch: one look at start-up (then `expect_checked` is notified), one
/// every [`crate::expect::EVERY`] after.
pub(super) async fn watch_expectations(shared: Arc<Shared>, stop: CancellationToken) {
    let mut watch = crate::expect::Watch::load(&shared.engine);
    let mut tick = tokio::time::interval(crate::expect::EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let config = shared.config();
        watch.check(&shared.engine, &config, chrono::Utc::now());
        shared.expect_checked.notify_one();
    }
}

/// What a library logged too often, told as a count every [`crate::throttle::LOG_EVERY`].
pub(super) async fn report_library_lines(stop: CancellationToken) {
    let mut tick = tokio::time::interval(crate::throttle::LOG_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => crate::throttle::report_held_back(),
            _ = stop.cancelled() => return,
        }
    }
}

pub(super) fn notify_systemd(state: &[sd_notify::NotifyState]) {
    // Outside systemd there is no NOTIFY_SOCKET and this does nothing.
    let _ = sd_notify::notify(false, state);
}

/// Half the watchdog interval systemd asked for, if it asked.
pub(super) fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0u64;
    if sd_notify::watchdog_enabled(false, &mut usec) && usec > 0 {
        Some(Duration::from_micros(usec / 2))
    } else {
        None
    }
}
