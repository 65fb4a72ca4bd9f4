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

mod chain;
mod live_config;
mod shared;
mod triggers;

pub use shared::Shared;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use futures_util::StreamExt;
use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
use tokio_util::sync::CancellationToken;

use crate::governed;
use crate::runner::Runner;
use crate::store::StoreError;

pub struct Options {
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    /// How long in-flight runs may finish after SIGTERM.
    pub grace: Duration,
    pub max_concurrent: usize,
    /// `--dashboard`: where the dashboard listens, over steward.toml's `[dashboard] listen`.
    pub dashboard: Option<String>,
}

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
    // Before anything answers (the socket, a status): a SIGUSR1 sent as soon as the daemon
    // is up forces dry-run rather than killing it (the default action); what arrives
    // before the loop below is handled when it starts.
    let mut signals = signal_hook_tokio::Signals::new([SIGHUP, SIGUSR1, SIGUSR2, SIGTERM, SIGINT])
        .context("cannot install signal handlers")?;
    let signals_handle = signals.handle();
    let config = crate::service::load_config(&opts.config_dir)?;
    if let Some((before, after)) = crate::listener::raise_open_files() {
        tracing::info!("open files: soft limit raised from {before} to the hard limit {after}");
    }
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("cannot create state folder {}", opts.state_dir.display()))?;
    let state_dir = std::fs::canonicalize(&opts.state_dir).unwrap_or(opts.state_dir.clone());
    if let Some(warning) = crate::store::openness(&state_dir) {
        tracing::warn!("{warning}");
    }
    let (mut engine, recovery) = match governed::open(&state_dir) {
        Ok(v) => v,
        Err(governed::EngineError::Store(e @ StoreError::Locked { .. })) => {
            return Err(anyhow!(
                "{e}: it is already taken, and only one daemon may run per state folder"
            ))
        }
        Err(e) => return Err(e).context("cannot open the state folder"),
    };
    let (member, member_store) =
        join_cluster(&config, &mut engine, &state_dir, &recovery.interrupted_runs)
            .await?
            .unzip();
    engine.store.set_retention(config.settings.retention());
    // Followers known from the first moment: an upstream run that ends from now on fires
    // them, even should this daemon stop before it takes any work.
    crate::chain::note_followers(&engine.store, &config, chrono::Utc::now());
    match engine.store.prune_runs(chrono::Utc::now()) {
        Ok(0) => {}
        Ok(n) => tracing::info!("pruned {n} run record(s) past the retention"),
        Err(e) => tracing::warn!("could not prune old run records: {e}"),
    }
    let (alerts, alert_channels) = crate::alert::start(
        crate::alert::Channels::of(&config),
        engine.runlog.clone(),
        Some(engine.store.clone()),
    );
    engine.alerts = alerts;
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
    let stop_gateway = CancellationToken::new();
    let gateway_listen = config.settings.gateway.listen_addr();
    let gateway = crate::gateway::Gateway::start(&gateway_listen, stop_gateway.clone())
        .await
        .with_context(|| format!("cannot listen for the model gateway on {gateway_listen}"))?;
    tracing::info!(
        "model gateway: http://{} (for workflows with [gateway])",
        gateway.addr
    );
    engine.gateway = Some(gateway);
    let listener = crate::control_socket::bind(&state_dir)?;
    // A previous daemon's webhook address is not this one's.
    let _ = std::fs::remove_file(state_dir.join("webhook.addr"));
    let live_config = Arc::new(live_config::LiveConfig::new(
        opts.config_dir.clone(),
        config,
    ));
    // Each run's end is handed to the followers of its workflow (`after` triggers).
    let (ended_tx, ended_rx) = tokio::sync::mpsc::unbounded_channel();
    let followed = live_config.clone();
    engine.ended = Some(Arc::new(move |rec: &crate::store::RunRecord| {
        if crate::chain::is_followed(&followed.running(), &rec.workflow) {
            let _ = ended_tx.send(rec.clone());
        }
    }));
    let shared = Arc::new(Shared {
        runner: Runner::new(engine.clone(), opts.max_concurrent),
        engine,
        config_dir: opts.config_dir.clone(),
        state_dir: state_dir.clone(),
        config: live_config,
        started: Instant::now(),
        queue_wakes: Mutex::new(Default::default()),
        webhook_addr: Mutex::new(None),
        dashboard_addr: Mutex::new(None),
        alert_channels,
        expect_checked: Default::default(),
        member: member.clone(),
    });
    if let (Some(member), Some(store)) = (&member, &member_store) {
        let runner = shared.runner.clone();
        let here = tokio::runtime::Handle::current();
        let owner = shared.clone();
        let views = store.clone();
        member.start(
            move || runner.in_flight().len() as u64,
            move |taken| {
                here.spawn(triggers::run_taken_over(owner.clone(), taken));
            },
            move |alive| views.settle_gone_runs(&alive),
        );
        let runner = shared.runner.clone();
        store.set_in_flight(Arc::new(move |run_id| {
            runner.in_flight().iter().any(|r| r.run_id == run_id)
        }));
    }

    let stop_socket = CancellationToken::new();
    let service = Arc::new(crate::service::Service {
        engine: shared.engine.clone(),
        runner: shared.runner.clone(),
        config_dir: shared.config_dir.clone(),
        state_dir: shared.state_dir.clone(),
        daemon: Some(shared.clone()),
    });
    let mut dashboard_settings = shared.config().settings.dashboard.clone();
    if let Some(listen) = &opts.dashboard {
        dashboard_settings.listen = Some(
            serde::Deserialize::deserialize(serde::de::value::StrDeserializer::<
                serde::de::value::Error,
            >::new(listen))
            .map_err(|e| anyhow!("--dashboard: {e}"))?,
        );
    }
    let dashboard = crate::dashboard::bind(&dashboard_settings, service.clone()).await?;
    let stop_dashboard = CancellationToken::new();
    let dashboard_task = dashboard.map(|listening| {
        *shared
            .dashboard_addr
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(listening.addr);
        tracing::info!(
            "dashboard: http://{} (`steward dashboard` prints the URL with its token)",
            listening.addr
        );
        tokio::spawn(crate::dashboard::serve(listening, stop_dashboard.clone()))
    });
    let socket_task = tokio::spawn(crate::control_socket::serve(
        listener,
        service,
        stop_socket.clone(),
    ));
    let mut triggers = triggers::Triggers::start(shared.clone()).await?;
    // The dead-man's switch looks before the catch-up runs, so a slot the machine was
    // off for is reported even when its catch-up then succeeds.
    crate::expect::note_loaded(&shared.engine, &shared.config(), chrono::Utc::now());
    let stop_watch = CancellationToken::new();
    let watch_task = tokio::spawn(watch_expectations(shared.clone(), stop_watch.clone()));
    tokio::spawn(report_library_lines(stop_watch.clone()));
    shared.expect_checked.notified().await;
    triggers.catch_up_and_drain().await;
    chain::start(shared.clone(), ended_rx);
    triggers.reconcile().await;
    let stop_following = CancellationToken::new();
    let follow_task = tokio::spawn(shared.config.clone().follow(stop_following.clone()));

    notify_systemd(&[sd_notify::NotifyState::Ready]);
    let watchdog = watchdog_interval();
    tracing::info!(
        config = %opts.config_dir.display(),
        state = %state_dir.display(),
        workflows = shared.config().workflows.len(),
        "steward daemon ready"
    );
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

    let mut watchdog_tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    loop {
        tokio::select! {
            sig = signals.next() => match sig {
                Some(SIGHUP) => {
                    notify_systemd(&[sd_notify::NotifyState::Reloading]);
                    let live = shared.config.clone();
                    let _ = tokio::task::spawn_blocking(move || live.reload(true, "SIGHUP")).await;
                    notify_systemd(&[sd_notify::NotifyState::Ready]);
                }
                Some(SIGUSR1) => {
                    shared.runner.set_forced_dry_run(true);
                    tracing::warn!("SIGUSR1: forced dry-run for every workflow (commits are skipped) until SIGUSR2");
                }
                Some(SIGUSR2) => {
                    shared.runner.set_forced_dry_run(false);
                    tracing::warn!("SIGUSR2: forced dry-run lifted");
                }
                Some(sig) => {
                    tracing::info!("{}: stopping", if sig == SIGTERM { "SIGTERM" } else { "SIGINT" });
                    break;
                }
                None => break,
            },
            // A new config was swapped in (an edit, SIGHUP, or a command that read it).
            _ = shared.config.swapped.notified() => triggers.reconcile().await,
            _ = shutdown.cancelled() => break,
            _ = watchdog_tick.tick(), if watchdog.is_some() => notify_systemd(&[sd_notify::NotifyState::Watchdog]),
        }
    }

    notify_systemd(&[sd_notify::NotifyState::Stopping]);
    stop_following.cancel();
    let _ = follow_task.await;
    triggers.stop_all().await;
    stop_watch.cancel();
    let _ = watch_task.await;
    // A second TERM or INT during the grace period kills the runs at once.
    let now = CancellationToken::new();
    let second = {
        let now = now.clone();
        tokio::spawn(async move {
            while let Some(sig) = signals.next().await {
                if sig == SIGTERM || sig == SIGINT {
                    now.cancel();
                    break;
                }
            }
        })
    };
    shared.runner.shutdown(opts.grace, now).await;
    // Case turns whose member run just ended record it before the store's last flush.
    triggers.wait_for_drives().await;
    second.abort();
    signals_handle.close();
    stop_socket.cancel();
    let _ = socket_task.await;
    stop_dashboard.cancel();
    if let Some(task) = dashboard_task {
        let _ = task.await;
    }
    stop_gateway.cancel();
    triggers.shutdown_scheduler().await;
    shared
        .engine
        .store
        .flush()
        .context("final flush of the store")?;
    if let Some(store) = &member_store {
        store.written(std::time::Duration::from_secs(5)).await;
    }
    if let Some(member) = &member {
        member.leave().await;
    }
    crate::control_socket::remove(&state_dir);
    let _ = std::fs::remove_file(state_dir.join("webhook.addr"));
    tracing::info!("steward daemon stopped");
    Ok(())
}

/// With `[cluster]`: joins the cluster before any work is taken (a server that cannot be
/// reached stops the start, saying so) and keeps idempotency keys there.
async fn join_cluster(
    config: &crate::config::Config,
    engine: &mut governed::Engine,
    state_dir: &std::path::Path,
    recovered: &[String],
) -> Result<
    Option<(
        crate::cluster::Member,
        Arc<crate::cluster::store::MemberStore>,
    )>,
> {
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
async fn watch_expectations(shared: Arc<Shared>, stop: CancellationToken) {
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
async fn report_library_lines(stop: CancellationToken) {
    let mut tick = tokio::time::interval(crate::throttle::LOG_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => crate::throttle::report_held_back(),
            _ = stop.cancelled() => return,
        }
    }
}

fn notify_systemd(state: &[sd_notify::NotifyState]) {
    // Outside systemd there is no NOTIFY_SOCKET and this does nothing.
    let _ = sd_notify::notify(false, state);
}

/// Half the watchdog interval systemd asked for, if it asked.
fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0u64;
    if sd_notify::watchdog_enabled(false, &mut usec) && usec > 0 {
        Some(Duration::from_micros(usec / 2))
    } else {
        None
    }
}
