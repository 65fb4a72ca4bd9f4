//! The running daemon: a struct of the handles it started, a loop that turns signals
//! into events, and the one order everything stops in.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::StreamExt;
use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook_tokio::Signals;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use super::chain;
use super::live_config::LiveConfig;
use super::shared::Shared;
use super::startup::{self, notify_systemd, Membership, Options};
use super::task::Task;
use super::triggers::Triggers;
use crate::governed::Engine;
use crate::runner::Runner;
use crate::store::RunRecord;

/// A started daemon. Its fields are what [`Daemon::stop`] stops, in this order: the
/// config's follower, the triggers, the dead-man's switch and the library-line reports;
/// then the runs (with their grace); then the control socket, the dashboard and the
/// model gateway; then the store's last flush and the cluster.
pub(super) struct Daemon {
    shared: Arc<Shared>,
    signals: Signals,
    following: Task,
    triggers: Triggers,
    watch: Task,
    library_lines: Task,
    socket: Task,
    dashboard: Option<Task>,
    gateway: CancellationToken,
    membership: Option<Membership>,
    grace: Duration,
}

impl Daemon {
    /// Starts the daemon in its start-up order (see [`super`]); returns once it is ready.
    pub(super) async fn start(opts: Options) -> Result<Daemon> {
        // Before anything answers (the socket, a status): a SIGUSR1 sent as soon as the
        // daemon is up forces dry-run rather than killing it (the default action); what
        // arrives before `serve` is handled when it starts.
        let signals = Signals::new([SIGHUP, SIGUSR1, SIGUSR2, SIGTERM, SIGINT])
            .context("cannot install signal handlers")?;
        let config = crate::service::load_config(&opts.config_dir)?;
        if let Some((before, after)) = crate::listener::raise_open_files() {
            tracing::info!("open files: soft limit raised from {before} to the hard limit {after}");
        }
        let (mut engine, recovery, state_dir) = startup::open_engine(&opts)?;
        let membership =
            startup::join_cluster(&config, &mut engine, &state_dir, &recovery.interrupted_runs)
                .await?;
        engine.store.set_retention(config.settings.retention());
        // Followers known from the first moment: an upstream run that ends from now on
        // fires them, even should this daemon stop before it takes any work.
        crate::chain::note_followers(&engine.store, &config, chrono::Utc::now());
        startup::prune(&engine);
        let (alerts, alert_channels) = crate::alert::start(
            crate::alert::Channels::of(&config),
            engine.runlog.clone(),
            Some(engine.store.clone()),
        );
        engine.alerts = alerts;
        startup::report_recovery(&engine, &recovery);
        let gateway = CancellationToken::new();
        start_gateway(&config, &mut engine, gateway.clone()).await?;
        let listener = crate::control_socket::bind(&state_dir)?;
        // A previous daemon's webhook address is not this one's.
        let _ = std::fs::remove_file(state_dir.join("webhook.addr"));
        let live_config = Arc::new(LiveConfig::new(opts.config_dir.clone(), config));
        let ended = hand_ends_to_followers(&mut engine, &live_config);
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
            member: membership.as_ref().map(|(member, _)| member.clone()),
        });
        if let Some(membership) = &membership {
            start_member(&shared, membership);
        }
        let service = Arc::new(crate::service::Service {
            engine: shared.engine.clone(),
            runner: shared.runner.clone(),
            config_dir: shared.config_dir.clone(),
            state_dir: shared.state_dir.clone(),
            daemon: Some(shared.clone()),
        });
        let dashboard = start_dashboard(&shared, &opts, service.clone()).await?;
        let socket = Task::spawn(|stop| crate::control_socket::serve(listener, service, stop));
        let mut triggers = Triggers::start(shared.clone()).await?;
        // The dead-man's switch looks before the catch-up runs, so a slot the machine was
        // off for is reported even when its catch-up then succeeds.
        crate::expect::note_loaded(&shared.engine, &shared.config(), chrono::Utc::now());
        let watch = Task::spawn(|stop| startup::watch_expectations(shared.clone(), stop));
        let library_lines = Task::spawn(startup::report_library_lines);
        shared.expect_checked.notified().await;
        triggers.catch_up_and_drain().await;
        chain::start(shared.clone(), ended);
        triggers.reconcile().await;
        let following = Task::spawn(|stop| shared.config.clone().follow(stop));

        notify_systemd(&[sd_notify::NotifyState::Ready]);
        tracing::info!(
            config = %opts.config_dir.display(),
            state = %state_dir.display(),
            workflows = shared.config().workflows.len(),
            "steward daemon ready"
        );
        startup::report_support();
        Ok(Daemon {
            shared,
            signals,
            following,
            triggers,
            watch,
            library_lines,
            socket,
            dashboard,
            gateway,
            membership,
            grace: opts.grace,
        })
    }

    /// Turns signals (and config swaps, and systemd's watchdog) into events until a stop
    /// signal or `shutdown`.
    pub(super) async fn serve(&mut self, shutdown: CancellationToken) {
        let watchdog = startup::watchdog_interval();
        let mut watchdog_tick =
            tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
        loop {
            tokio::select! {
                sig = self.signals.next() => match sig {
                    Some(SIGHUP) => {
                        notify_systemd(&[sd_notify::NotifyState::Reloading]);
                        let live = self.shared.config.clone();
                        let _ = tokio::task::spawn_blocking(move || live.reload(true, "SIGHUP")).await;
                        notify_systemd(&[sd_notify::NotifyState::Ready]);
                    }
                    Some(SIGUSR1) => {
                        self.shared.runner.set_forced_dry_run(true);
                        tracing::warn!("SIGUSR1: forced dry-run for every workflow (commits are skipped) until SIGUSR2");
                    }
                    Some(SIGUSR2) => {
                        self.shared.runner.set_forced_dry_run(false);
                        tracing::warn!("SIGUSR2: forced dry-run lifted");
                    }
                    Some(sig) => {
                        tracing::info!("{}: stopping", if sig == SIGTERM { "SIGTERM" } else { "SIGINT" });
                        return;
                    }
                    None => return,
                },
                // A new config was swapped in (an edit, SIGHUP, or a command that read it).
                _ = self.shared.config.swapped.notified() => self.triggers.reconcile().await,
                _ = shutdown.cancelled() => return,
                _ = watchdog_tick.tick(), if watchdog.is_some() => notify_systemd(&[sd_notify::NotifyState::Watchdog]),
            }
        }
    }

    /// Stops everything in the order of [`Daemon`]'s fields; the runs in flight get the
    /// grace (a second TERM or INT cuts it short).
    pub(super) async fn stop(self) -> Result<()> {
        let Daemon {
            shared,
            signals,
            following,
            mut triggers,
            watch,
            library_lines,
            socket,
            dashboard,
            gateway,
            membership,
            grace,
        } = self;
        notify_systemd(&[sd_notify::NotifyState::Stopping]);
        following.stop().await;
        triggers.stop_all().await;
        watch.stop().await;
        library_lines.stop().await;
        let signals_handle = signals.handle();
        let (now, second) = cut_short_on_a_second_signal(signals);
        shared.runner.shutdown(grace, now).await;
        // Case turns whose member run just ended record it before the store's last flush.
        triggers.wait_for_drives().await;
        second.abort();
        signals_handle.close();
        socket.stop().await;
        if let Some(dashboard) = dashboard {
            dashboard.stop().await;
        }
        gateway.cancel();
        triggers.shutdown_scheduler().await;
        shared
            .engine
            .store
            .flush()
            .context("final flush of the store")?;
        if let Some((member, store)) = &membership {
            store.written(Duration::from_secs(5)).await;
            member.leave().await;
        }
        crate::control_socket::remove(&shared.state_dir);
        let _ = std::fs::remove_file(shared.state_dir.join("webhook.addr"));
        tracing::info!("steward daemon stopped");
        Ok(())
    }
}

/// A token cancelled by a second TERM or INT during the grace, and the task listening.
fn cut_short_on_a_second_signal(
    mut signals: Signals,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let now = CancellationToken::new();
    let listening = {
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
    (now, listening)
}

/// The model gateway's listener, its handle given to the engine.
async fn start_gateway(
    config: &crate::config::Config,
    engine: &mut Engine,
    stop: CancellationToken,
) -> Result<()> {
    let listen = config.settings.gateway.listen_addr();
    let gateway = crate::gateway::Gateway::start(&listen, stop)
        .await
        .with_context(|| format!("cannot listen for the model gateway on {listen}"))?;
    tracing::info!(
        "model gateway: http://{} (for workflows with [gateway])",
        gateway.addr
    );
    engine.gateway = Some(Arc::new(gateway));
    Ok(())
}

/// The engine's run-ended hook: each end of a followed workflow (`after` triggers) is
/// sent to the receiver returned, which [`chain::start`] reads.
fn hand_ends_to_followers(
    engine: &mut Engine,
    config: &Arc<LiveConfig>,
) -> UnboundedReceiver<RunRecord> {
    let (ended_tx, ended_rx) = tokio::sync::mpsc::unbounded_channel();
    let followed = config.clone();
    engine.ended = Some(Arc::new(move |rec: &RunRecord| {
        if crate::chain::is_followed(&followed.running(), &rec.workflow) {
            let _ = ended_tx.send(rec.clone());
        }
    }));
    ended_rx
}

/// A cluster member's duties: its heartbeat tells how busy it is, runs of a daemon gone
/// are taken over here, and the runs view settles those no daemon runs any longer.
fn start_member(shared: &Arc<Shared>, (member, store): &Membership) {
    let runner = shared.runner.clone();
    let here = tokio::runtime::Handle::current();
    let owner = shared.clone();
    let views = store.clone();
    member.start(
        move || runner.in_flight().len() as u64,
        move |taken| {
            here.spawn(super::triggers::run_taken_over(owner.clone(), taken));
        },
        move |alive| views.settle_gone_runs(&alive),
    );
    let runner = shared.runner.clone();
    store.set_in_flight(Arc::new(move |run_id| {
        runner.in_flight().iter().any(|r| r.run_id == run_id)
    }));
}

/// The dashboard, when configured: bound now (a bad address stops the start), served
/// until stopped.
async fn start_dashboard(
    shared: &Arc<Shared>,
    opts: &Options,
    service: Arc<crate::service::Service>,
) -> Result<Option<Task>> {
    let settings = startup::dashboard_settings(shared, opts)?;
    let Some(listening) = crate::dashboard::bind(&settings, service).await? else {
        return Ok(None);
    };
    *shared
        .dashboard_addr
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(listening.addr);
    tracing::info!(
        "dashboard: http://{} (`steward dashboard` prints the URL with its token)",
        listening.addr
    );
    Ok(Some(Task::spawn(|stop| {
        crate::dashboard::serve(listening, stop)
    })))
}
