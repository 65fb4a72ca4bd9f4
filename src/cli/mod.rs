//! The command line: clap definitions, and the one place arguments are read.
//!
//! Output is for a person by default; `--json` gives a script something stable to parse.
//! Errors go to stderr as `steward: what failed: why`, with a hint where there is one.
//!
//! Every command that touches the store becomes a typed [`Request`] (`request`). sled
//! admits one process per state folder, so while a daemon runs the request goes to it over
//! the control socket ([`client`]); with no daemon the CLI answers it itself with the same
//! [`Service`] and a runner of its own. Either way the [`Response`] is shown here
//! (`show`).

mod args;
mod calendar;
mod client;
mod logs;
mod output;
mod render;
mod request;
mod show;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;

pub use args::{
    AgentStepKind, CaseCmd, Cli, Command, DaemonArgs, DeadLetterCmd, InDoubtCmd, NewArgs,
};

use crate::api::{Request, Response};
use crate::config;
use crate::daemon;
use crate::governed::Engine;
use crate::runner::Runner;
use crate::service::Service;
use output::print_out;

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let daemon_mode = matches!(cli.command, Command::Daemon(_));
    if !daemon_mode {
        init_tracing(None, "warn");
    }
    match run_cli(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("steward: {e:#}");
            1
        }
    }
}

/// Logs go to stderr (journald reads them there), and to rolling files with `--log-dir`.
pub fn init_tracing(
    log_dir: Option<&Path>,
    default: &str,
) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("STEWARD_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
            .add_directive(
                "tokio_cron_scheduler=warn"
                    .parse()
                    .expect("static directive"),
            )
    };
    // Colour only for a person at a terminal; journald and log files get plain text.
    let stderr = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_filter(filter());
    match log_dir {
        None => {
            let _ = tracing_subscriber::registry()
                .with(stderr.with_filter(crate::throttle::LibraryLines))
                .try_init();
            None
        }
        Some(dir) => {
            let appender = tracing_appender::rolling::Builder::new()
                .rotation(tracing_appender::rolling::Rotation::DAILY)
                .filename_prefix("steward")
                .filename_suffix("log")
                .max_log_files(14)
                .build(dir)
                .ok()?;
            let (writer, guard) = tracing_appender::non_blocking(appender);
            let file = tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(writer)
                .with_filter(filter());
            // One throttle over both outputs, so a line is judged once.
            let _ = tracing_subscriber::registry()
                .with(
                    stderr
                        .and_then(file)
                        .with_filter(crate::throttle::LibraryLines),
                )
                .try_init();
            Some(guard)
        }
    }
}

fn run_cli(cli: Cli) -> Result<i32> {
    let Cli {
        config,
        state,
        command,
    } = cli;
    // What steward writes (the state folder, the store, the runlog, queue items, run
    // scratch) holds run records and outputs: private, whatever the umask it was started
    // with. `steward new` writes config meant to be shared, reviewed and committed.
    if !matches!(command, Command::New(_)) {
        crate::store::private_umask();
    }
    match command {
        Command::Daemon(args) => {
            // A daemon says what it does (start, reloads, fires skipped); a command stays quiet.
            let _guard = init_tracing(args.log_dir.as_deref(), "info");
            daemon::run_blocking(daemon::Options {
                config_dir: config,
                state_dir: state,
                grace: std::time::Duration::from_secs_f64(args.grace.clamp(0.0, 3600.0)),
                max_concurrent: args.max_concurrent.max(1),
                dashboard: args.dashboard,
            })?;
            Ok(0)
        }
        Command::Validate => validate(&config, &state),
        Command::Dashboard { json } => dashboard_url(&state, json),
        Command::Next { workflow, preview } => {
            calendar::workflow(&config, &workflow, &preview.into())
        }
        Command::Calendar {
            expression,
            tz,
            preview,
        } => calendar::expression(&expression, Some(&tz), &preview.into()),
        Command::AgentStep { step, agent } => agent_step(&config, &state, step, &agent),
        Command::New(args) => {
            let written = crate::scaffold::create(&config, &args.workflow)?;
            let mut text = String::new();
            for p in &written {
                text.push_str(&format!("wrote {}\n", p.display()));
            }
            text.push_str(&format!("next: edit the ten sections, then `steward validate` and `steward run {}` (dry-run)\n", args.workflow));
            print_out(&text);
            Ok(0)
        }
        Command::Logs {
            follow,
            json,
            run,
            workflow,
            lines,
            cluster: true,
        } => {
            let settings = crate::config::Settings::load_lenient(&config).cluster;
            let Some(settings) = settings else {
                anyhow::bail!(
                    "--cluster: {} has no [cluster] table",
                    config.join("steward.toml").display()
                );
            };
            logs::print_cluster(
                &settings,
                logs::Filter { run, workflow },
                lines,
                json,
                follow,
            )?;
            Ok(0)
        }
        Command::Logs {
            follow,
            json,
            run,
            workflow,
            lines,
            cluster: false,
        } => {
            logs::print(&state, logs::Filter { run, workflow }, lines, json, follow)?;
            Ok(0)
        }
        command => {
            // Everything else is a request: to the daemon if one runs, else answered here.
            let (request, view) = request::of(command)?;
            let (response, local) = match client::forward(&state, &request)? {
                Some(response) => (response, false),
                None => (answer_here(&config, &state, request)?, true),
            };
            let shown = show::response(&response, &view, local);
            print_out(&shown.stdout);
            eprint!("{}", shown.stderr);
            Ok(shown.code)
        }
    }
}

/// `steward dashboard`: the running daemon's dashboard URL, with the token.
fn dashboard_url(state: &Path, json: bool) -> Result<i32> {
    let status = match client::forward(state, &crate::api::Request::Status)? {
        Some(crate::api::Response::Status(status)) => status,
        Some(crate::api::Response::Error { message }) => bail!("{message}"),
        Some(other) => bail!("unexpected reply from the daemon: {other:?}"),
        None => bail!(
            "no steward daemon is running on state folder {}: the dashboard is served by the daemon (start one with `steward daemon`)",
            state.display()
        ),
    };
    let Some(listen) = status.dashboard_listen else {
        bail!("the running daemon serves no dashboard ([dashboard] listen = \"off\" in steward.toml, or --dashboard off)");
    };
    let token_file = crate::dashboard::token_path(&status.state_dir);
    let token = std::fs::read_to_string(&token_file)
        .with_context(|| format!("cannot read the dashboard token {}", token_file.display()))?;
    let addr = listen
        .parse()
        .with_context(|| format!("the daemon reports an odd dashboard address `{listen}`"))?;
    let url = crate::dashboard::url(addr, token.trim());
    if json {
        print_out(&format!(
            "{}\n",
            serde_json::json!({ "url": url, "listen": listen })
        ));
    } else {
        print_out(&format!(
            "{url}\n(open it in a browser on this machine; it holds the token, so keep it to yourself)\n"
        ));
    }
    Ok(0)
}

/// `steward agent-step run|check|email AGENT`: one step of an agent's governed run,
/// started by the engine with the context on stdin.
fn agent_step(config: &Path, state: &Path, step: AgentStepKind, agent: &str) -> Result<i32> {
    let config_dir = std::env::var_os("STEWARD_CONFIG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| config.to_path_buf());
    let state_dir = std::env::var_os("STEWARD_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| state.to_path_buf());
    let mut input = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)?;
    let ctx: serde_json::Value =
        serde_json::from_str(&input).context("the run context on stdin is not JSON")?;
    // The config the run was fired with; a hand run without one reads the folder.
    let cfg = match std::env::var(config::AGENT_SNAPSHOT_ENV) {
        Ok(text) => serde_json::from_str::<config::AgentSnapshot>(&text)
            .context("the agent's config snapshot is unreadable")?
            .into_config(),
        Err(_) => crate::service::load_config(&config_dir)?,
    };
    let spec = cfg
        .agents
        .get(agent)
        .ok_or_else(|| anyhow!("no agent named `{agent}` in {}", config_dir.display()))?;
    Ok(match step {
        AgentStepKind::Run => block_on(crate::agent::run_step(&cfg, spec, &state_dir, &ctx)),
        AgentStepKind::Check => crate::agent::check_step(&ctx),
        AgentStepKind::Email => block_on(crate::agent::email_step(&cfg, spec, &state_dir, &ctx)),
    })
}

/// Renders each workflow's idempotency key once over a sample fire of its trigger, so a
/// template that runs past its bounds (a loop, a huge key) is found before a run fails
/// on it. Prints each one found; false when there was one.
fn key_templates_within_bounds(cfg: &config::Config) -> bool {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut ok = true;
    for wf in cfg.workflows.values() {
        let Some(source) = &wf.idempotency_key else {
            continue;
        };
        let sample = serde_json::json!({
            "run_id": "sample",
            "workflow": wf.id,
            "attempt": 1,
            "dry_run": true,
            "trigger": {
                "kind": wf.trigger.kind(),
                "fired_at": now,
                "scheduled_for": now,
                "payload": {},
            },
        });
        if let Err(e) = crate::template::try_sample(source, &sample) {
            eprintln!(
                "{}: idempotency_key: {e}; every run of {} would fail on it",
                wf.file.display(),
                wf.id
            );
            ok = false;
        }
    }
    ok
}

fn validate(config: &Path, state: &Path) -> Result<i32> {
    match config::load_dir(config) {
        Ok(cfg) if !key_templates_within_bounds(&cfg) => Ok(1),
        Ok(cfg) => {
            let ids: Vec<&str> = cfg
                .workflows
                .values()
                .filter(|w| w.agent.is_none())
                .map(|w| w.id.as_str())
                .collect();
            let agents: Vec<&str> = cfg.agents.keys().map(String::as_str).collect();
            let agencies: Vec<&str> = cfg.agencies.keys().map(String::as_str).collect();
            let mut text = format!(
                "ok: {}, {}, {}, {} in {}\n",
                counted(&ids, "workflow", "workflows"),
                counted(&agents, "agent", "agents"),
                counted(&agencies, "agency", "agencies"),
                match cfg.sources.len() {
                    1 => "1 source".to_string(),
                    n => format!("{n} sources"),
                },
                config.display()
            );
            for (id, spec) in calendar::schedules(&cfg) {
                text.push_str(&format!("  {}\n", calendar::next_line(id, spec)));
            }
            for wf in cfg.workflows.values() {
                if let Some(after) = wf.trigger.after() {
                    text.push_str(&format!("  {}: follows {}\n", wf.id, after.describe()));
                }
            }
            // What each workflow's maker and checker may touch, one line each.
            for wf in cfg.workflows.values().filter(|w| w.agent.is_none()) {
                let caps = match wf.limits.describe() {
                    c if c.is_empty() => c,
                    c => format!("; caps {c}"),
                };
                text.push_str(&format!(
                    "  {}: {}{caps}\n",
                    wf.id,
                    wf.sandbox.summary(&cfg.root)
                ));
                if wf.sandbox.enabled {
                    let programs: Vec<&Path> = [Some(&wf.run), Some(&wf.verify)]
                        .into_iter()
                        .flatten()
                        .map(|c| Path::new(&c.argv[0]))
                        .filter(|p| p.is_absolute())
                        .collect();
                    for warning in wf.sandbox.warnings(state, &programs) {
                        text.push_str(&format!("  {}: sandbox: {warning}\n", wf.id));
                    }
                }
            }
            match crate::sandbox::tmp::supported() {
                Ok(()) => text.push_str(
                    "  steps get a private /tmp (their scratch folder's tmp/, mounted over /tmp)\n",
                ),
                Err(why) => text.push_str(&format!("  steps get no /tmp: {why}\n")),
            }
            // Which models each workflow may call through the gateway, and whether the
            // daemon here could reach them (a real key missing fails its calls).
            for wf in cfg.workflows.values() {
                if let Some(g) = &wf.gateway {
                    text.push_str(&format!("  {}: {}\n", wf.id, g.summary()));
                }
            }
            // Where alerts go, one line per channel.
            for channel in &cfg.settings.notify {
                let events: Vec<&str> = channel.events.iter().map(|e| e.name()).collect();
                let unset = channel
                    .url_env
                    .as_deref()
                    .filter(|v| channel.url.is_none() && crate::secret::lookup(v).is_none())
                    .map(|v| format!(" — {v} is not set: its alerts are dropped"))
                    .unwrap_or_default();
                text.push_str(&format!(
                    "  alerts: {} ({}){unset}\n",
                    channel.label(),
                    events.join(", ")
                ));
            }
            print_out(&text);
            Ok(0)
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            eprintln!(
                "{} error{} in {}",
                errors.len(),
                if errors.len() == 1 { "" } else { "s" },
                config.display()
            );
            Ok(1)
        }
    }
}

/// `2 workflows (a, b)`, `1 agent (x)`, `0 agencies`.
fn counted(names: &[&str], one: &str, many: &str) -> String {
    match names.len() {
        0 => format!("0 {many}"),
        1 => format!("1 {one} ({})", names[0]),
        n => format!("{n} {many} ({})", names.join(", ")),
    }
}

/// No daemon runs: the CLI answers the request itself, with its own runner.
fn answer_here(config: &Path, state: &Path, request: Request) -> Result<Response> {
    match &request {
        Request::Status => bail!(
            "no steward daemon is running on state folder {} (start one with `steward daemon`)",
            state.display()
        ),
        // A queue item needs no store: the daemon takes it when it starts (in a cluster,
        // the cluster's queue takes it now).
        Request::Enqueue { queue, payload } => {
            let item = match crate::config::Settings::load_lenient(config).cluster {
                Some(cluster) => crate::cluster::member::enqueue_once(&cluster, queue, payload)?,
                None => crate::trigger::queue::write_item(state, queue, payload)?,
            };
            let warning = crate::service::load_config(config)
                .ok()
                .and_then(|c| crate::service::unread_queue_warning(&c, queue));
            return Ok(Response::Enqueued {
                queue: queue.clone(),
                item,
                warning,
            });
        }
        _ => {}
    }
    let (mut engine, recovery) = open_engine_recovered(state)?;
    let settings = crate::config::Settings::load_lenient(config);
    engine.store.set_retention(settings.retention());
    // A run made here fires its followers at the next daemon's start: they follow from
    // now, even if no daemon has seen them yet.
    if let Ok(cfg) = crate::service::load_config(config) {
        crate::chain::note_followers(&engine.store, &cfg, chrono::Utc::now());
    }
    block_on(async {
        // In a cluster, this process is a member for as long as the command runs: the
        // keys, approvals and cases it touches are the cluster's.
        let member = match &settings.cluster {
            Some(cluster) => Some(join_here(cluster, &mut engine, state, &recovery).await?),
            None => None,
        };
        // Runs made here call models through a gateway of this process's own.
        let stop_gateway = tokio_util::sync::CancellationToken::new();
        engine.gateway = match crate::gateway::Gateway::start(
            &settings.gateway.listen_addr(),
            stop_gateway.clone(),
        )
        .await
        {
            Ok(g) => Some(std::sync::Arc::new(g)),
            Err(e) => {
                eprintln!("steward: no model gateway in this process (workflows with [gateway] cannot run): {e}");
                None
            }
        };
        let service = Service {
            runner: Runner::new(engine.clone(), LOCAL_MAX_CONCURRENT),
            engine,
            config_dir: config.to_path_buf(),
            state_dir: state.to_path_buf(),
            daemon: None,
        };
        let watcher = stop_runs_on_signal(service.runner.clone())?;
        let response = service.handle(request).await;
        watcher.abort();
        stop_gateway.cancel();
        if let Some((member, store)) = member {
            store.written(std::time::Duration::from_secs(5)).await;
            member.leave().await;
        }
        Ok(response)
    })
}

/// Joins the cluster for one command and keeps the engine's shared state there.
async fn join_here(
    cluster: &crate::config::cluster::ClusterSettings,
    engine: &mut Engine,
    state: &Path,
    recovery: &crate::store::Recovery,
) -> Result<(
    crate::cluster::Member,
    std::sync::Arc<crate::cluster::store::MemberStore>,
)> {
    let settings = cluster.checked()?;
    let member = crate::cluster::Member::join(&settings)
        .await
        .context("cannot join the cluster ([cluster] in steward.toml)")?;
    member.beat_only();
    let store = crate::cluster::store::MemberStore::join(
        &member,
        engine.store.clone(),
        state,
        &recovery.interrupted_runs,
    )
    .await?;
    engine.store = crate::store::Store::from_backend(store.clone());
    Ok((member, store))
}

/// Runs at once in the CLI's own process (no daemon), as the daemon's default.
const LOCAL_MAX_CONCURRENT: usize = 8;

/// Opens the state folder's engine, telling what its recovery found, and returning it.
fn open_engine_recovered(state: &Path) -> Result<(Engine, crate::store::Recovery)> {
    let (engine, recovery) = crate::hooks::open(state)
        .with_context(|| format!("cannot open state folder {}", state.display()))?;
    report_recovery(&recovery);
    Ok((engine, recovery))
}

/// Tells the operator what a crash left behind.
pub fn report_recovery(recovery: &crate::store::Recovery) {
    if !recovery.interrupted_runs.is_empty() {
        eprintln!(
            "steward: recovered after a crash: {} run(s) interrupted ({})",
            recovery.interrupted_runs.len(),
            recovery.interrupted_runs.join(", ")
        );
    }
    if !recovery.keys_in_doubt.is_empty() {
        eprintln!(
            "steward: {} idempotency key(s) now in doubt; they never commit again on their own: see `steward in-doubt list`",
            recovery.keys_in_doubt.len()
        );
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    // A current-thread runtime is enough for one command; building it fails only when
    // the OS refuses an epoll fd, which leaves nothing sensible to do.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot start the async runtime")
        .block_on(f)
}

/// In the CLI's own process, Ctrl-C or SIGTERM stops the runs in flight the way the
/// daemon would (their process groups and cgroups killed, each recorded `interrupted`)
/// instead of orphaning their steps; with no run in flight the command just exits.
fn stop_runs_on_signal(runner: Runner) -> Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        if runner.in_flight().is_empty() {
            std::process::exit(130);
        }
        eprintln!("steward: stopping the run (its process group is killed)");
        runner.cancel_all();
    }))
}
