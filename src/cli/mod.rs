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

mod client;
mod logs;
mod render;
mod request;
mod show;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::api::{Request, Response};
use crate::config;
use crate::daemon;
use crate::governed::{self, Engine};
use crate::runner::Runner;
use crate::service::Service;
use crate::store::RunState;

const AFTER_HELP: &str = "\
Every run goes trigger → run (maker) → verify (checker) → commit, under hard budgets.
Workflows are dry-run until `dry_run = false` is set in the file AND an operator runs
`steward go-live WORKFLOW`; editing the file afterwards drops it back to dry-run.

Exit codes of `steward run`: 0 success or clean-no-op, 3 approval-required, 4 blocked,
5 failed, 6 exhausted, 7 stagnated, 1 steward itself failed, 2 bad usage.

Start here:  steward validate   ·   steward list   ·   steward run hello   ·   steward logs";

#[derive(Parser, Debug)]
#[command(name = "steward", version, about = "Governed, unattended automation: trigger → run → verify → commit, under hard budgets", after_help = AFTER_HELP)]
pub struct Cli {
    /// Config folder (holds workflows/ and the scripts they name)
    #[arg(
        long,
        global = true,
        env = "STEWARD_CONFIG",
        default_value = "config",
        value_name = "DIR"
    )]
    pub config: PathBuf,
    /// State folder (sled store, runlog.jsonl); created if missing
    #[arg(
        long,
        global = true,
        env = "STEWARD_STATE",
        default_value = "state",
        value_name = "DIR"
    )]
    pub state: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon: fire workflows from their triggers until SIGTERM
    Daemon(DaemonArgs),
    /// What a running daemon is doing: uptime, workflows, next fires, runs in flight
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Put an item on a queue (through the daemon when it runs)
    Enqueue {
        /// Queue name, as in a workflow's `[trigger] queue = "NAME"`
        queue: String,
        /// The item: any JSON value; it reaches the run as trigger.payload
        #[arg(long, value_name = "JSON")]
        payload: String,
    },
    /// Run a digest agent now: fetch, filter, write the digest, and email it if live
    Digest {
        /// The agent's `agent_name`
        agent: String,
        /// Write nothing and send nothing: show the digest it would write
        #[arg(long)]
        dry_run: bool,
        /// Print the run record as JSON instead of the summary line
        #[arg(long)]
        json: bool,
    },
    /// Agency cases: a standing team advanced one governed turn at a time
    #[command(subcommand)]
    Case(CaseCmd),
    /// Work off the queue markers of missed scheduled runs (vault/_inbox/scheduled-jobs/)
    Drain {
        /// Only say what would run and what would be deleted
        #[arg(long)]
        dry_run: bool,
    },
    /// (internal) one step of a digest agent's governed run
    #[command(name = "agent-step", hide = true)]
    AgentStep {
        /// run | check | email
        step: String,
        agent: String,
    },
    /// Check every workflow file in the config folder; report all errors, run nothing
    Validate,
    /// List workflows with their trigger and whether they run live or dry
    List {
        #[arg(long)]
        json: bool,
    },
    /// Fire a workflow by hand (dry-run unless --live and approved for go-live)
    Run {
        /// Workflow id (the `id` in its file)
        workflow: String,
        /// Run live: commit if verify passes. Needs `steward go-live WORKFLOW` first
        #[arg(long)]
        live: bool,
        /// JSON put into the context as trigger.payload
        #[arg(long, value_name = "JSON")]
        payload: Option<String>,
        /// Print the run record as JSON
        #[arg(long)]
        json: bool,
    },
    /// Recent runs, newest first
    Runs {
        /// Only this workflow
        #[arg(long, short)]
        workflow: Option<String>,
        /// Only runs in this state (success, failed, exhausted, …)
        #[arg(long = "status", value_name = "STATE")]
        status: Option<String>,
        /// How many to show
        #[arg(long, short = 'n', default_value_t = 20)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Everything recorded about one run
    Show {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Print the runlog readably (-f to follow, --json for raw lines)
    Logs {
        /// Keep printing new records as they are written
        #[arg(long, short)]
        follow: bool,
        /// Raw JSON lines
        #[arg(long)]
        json: bool,
        /// Only this run
        #[arg(long)]
        run: Option<String>,
        /// Only this workflow
        #[arg(long, short)]
        workflow: Option<String>,
        /// Start with the last N records
        #[arg(long, short = 'n', default_value_t = 50)]
        lines: usize,
    },
    /// The dead-letter queue: failed, exhausted and stagnated runs with full context
    #[command(subcommand, name = "dead-letter")]
    DeadLetter(DeadLetterCmd),
    /// Runs waiting for an operator (verify said escalate)
    Review {
        #[arg(long)]
        json: bool,
    },
    /// Accept an escalated run; a live run then commits (once)
    Approve { run: String },
    /// Refuse an escalated run; its idempotency key is freed
    Reject {
        run: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Approve the workflow's current config for live runs
    #[command(name = "go-live")]
    GoLive { workflow: String },
    /// Withdraw go-live: the workflow runs dry again
    #[command(name = "dry-run")]
    DryRun { workflow: String },
    /// Idempotency keys left in doubt by a crash, and settling them
    #[command(subcommand, name = "in-doubt")]
    InDoubt(InDoubtCmd),
    /// Scaffold a workflow: a TOML file and maker, checker and commit scripts
    New(NewArgs),
}

#[derive(Subcommand, Debug)]
pub enum DeadLetterCmd {
    /// List dead-lettered runs
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show one entry with its full context
    Show {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Fire the workflow again with the same trigger context (live only if still approved)
    Retry {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove entries
    Purge {
        /// Runs to remove
        runs: Vec<String>,
        /// Remove every entry
        #[arg(long, conflicts_with = "runs")]
        all: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum CaseCmd {
    /// Open a case for an agency: its mandate, roster and limits are snapshotted into it
    Open {
        /// The agency's id (config/agencies/*.toml)
        #[arg(long)]
        agency: String,
        /// The new case's id
        #[arg(long = "case")]
        case_id: String,
        /// JSON that started the case (kept in the case)
        #[arg(long, value_name = "JSON")]
        signal: Option<String>,
    },
    /// One turn: fold, check the limits, ask the planner, append the turn, dispatch.
    /// Exit codes: 0 advanced/resolved/awaiting/needs-input, 4 refused, 5 failed, 10 version conflict
    Advance {
        case_id: String,
        /// Who drives this turn (part of the turn's key)
        #[arg(long)]
        driver: String,
        /// The dispatched member's outcome, run by hand: JSON {run_id, state, output, spend_usd}
        #[arg(long, value_name = "FILE")]
        member_result: Option<PathBuf>,
        /// Run the dispatched member now, as its own governed run
        #[arg(long)]
        run: bool,
        /// Print the agency_turn as JSON
        #[arg(long)]
        json: bool,
    },
    /// Grant the move a case is waiting on
    Approve { case_id: String },
    /// The folded case
    Status {
        case_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Replay the case's hash chain; report the first broken link
    Verify { case_id: String },
    /// Every case with its agency, status, turns and spend
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum InDoubtCmd {
    /// Keys whose run was interrupted between reserve and commit
    List {
        #[arg(long)]
        json: bool,
    },
    /// Say what happened: --committed (re-fires become no-ops) or --not-committed (may run again)
    Resolve {
        workflow: String,
        key: String,
        #[arg(
            long,
            conflicts_with = "not_committed",
            required_unless_present = "not_committed"
        )]
        committed: bool,
        #[arg(long)]
        not_committed: bool,
    },
}

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// Seconds in-flight runs get to finish after SIGTERM before their process groups are killed
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub grace: f64,
    /// Most runs at once, over all workflows
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub max_concurrent: usize,
    /// Also write the daemon log to daily-rotated files in this folder
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct NewArgs {
    /// Workflow id: a-z, 0-9, `-`, `_`
    pub workflow: String,
}

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
            let _ = tracing_subscriber::registry().with(stderr).try_init();
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
            let _ = tracing_subscriber::registry()
                .with(stderr)
                .with(file)
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
    match command {
        Command::Daemon(args) => {
            // A daemon says what it does (start, reloads, fires skipped); a command stays quiet.
            let _guard = init_tracing(args.log_dir.as_deref(), "info");
            daemon::run_blocking(daemon::Options {
                config_dir: config,
                state_dir: state,
                grace: std::time::Duration::from_secs_f64(args.grace.clamp(0.0, 3600.0)),
                max_concurrent: args.max_concurrent.max(1),
            })?;
            Ok(0)
        }
        Command::Validate => validate(&config),
        Command::AgentStep { step, agent } => agent_step(&config, &state, &step, &agent),
        Command::New(args) => {
            let written = crate::scaffold::create(&config, &args.workflow)?;
            for p in &written {
                println!("wrote {}", p.display());
            }
            println!("next: edit the ten sections, then `steward validate` and `steward run {}` (dry-run)", args.workflow);
            Ok(0)
        }
        Command::Logs {
            follow,
            json,
            run,
            workflow,
            lines,
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
            print!("{}", shown.stdout);
            eprint!("{}", shown.stderr);
            Ok(shown.code)
        }
    }
}

/// `steward agent-step run|check|email AGENT`: one step of an agent's governed run,
/// started by the engine with the context on stdin.
fn agent_step(config: &Path, state: &Path, step: &str, agent: &str) -> Result<i32> {
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
    let cfg = crate::service::load_config(&config_dir)?;
    let spec = cfg
        .agents
        .get(agent)
        .ok_or_else(|| anyhow!("no agent named `{agent}` in {}", config_dir.display()))?;
    Ok(match step {
        "run" => block_on(crate::agent::run_step(&cfg, spec, &state_dir, &ctx)),
        "check" => crate::agent::check_step(&ctx),
        "email" => block_on(crate::agent::email_step(&cfg, spec, &ctx)),
        other => bail!("unknown agent step `{other}` (run, check or email)"),
    })
}

fn validate(config: &Path) -> Result<i32> {
    match config::load_dir(config) {
        Ok(cfg) => {
            let ids: Vec<&str> = cfg
                .workflows
                .values()
                .filter(|w| w.agent.is_none())
                .map(|w| w.id.as_str())
                .collect();
            let agents: Vec<&str> = cfg.agents.keys().map(String::as_str).collect();
            println!(
                "ok: {} workflow{} ({}), {} agent{} ({}), {} source{} in {}",
                ids.len(),
                if ids.len() == 1 { "" } else { "s" },
                ids.join(", "),
                agents.len(),
                if agents.len() == 1 { "" } else { "s" },
                agents.join(", "),
                cfg.sources.len(),
                if cfg.sources.len() == 1 { "" } else { "s" },
                config.display()
            );
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

/// No daemon runs: the CLI answers the request itself, with its own runner.
fn answer_here(config: &Path, state: &Path, request: Request) -> Result<Response> {
    match &request {
        Request::Status => bail!(
            "no steward daemon is running on state folder {} (start one with `steward daemon`)",
            state.display()
        ),
        // A queue item needs no store: the daemon takes it when it starts.
        Request::Enqueue { queue, payload } => {
            let item = crate::trigger::queue::write_item(state, queue, payload)?;
            return Ok(Response::Enqueued {
                queue: queue.clone(),
                item,
            });
        }
        _ => {}
    }
    let engine = open_engine(state)?;
    engine
        .store
        .set_retention(crate::config::Settings::load_lenient(config).retention());
    let service = Service {
        runner: Runner::new(engine.clone(), LOCAL_MAX_CONCURRENT),
        engine,
        config_dir: config.to_path_buf(),
        state_dir: state.to_path_buf(),
        daemon: None,
    };
    block_on(async {
        let watcher = stop_runs_on_signal(service.runner.clone())?;
        let response = service.handle(request).await;
        watcher.abort();
        Ok(response)
    })
}

/// Runs at once in the CLI's own process (no daemon), as the daemon's default.
const LOCAL_MAX_CONCURRENT: usize = 8;

fn open_engine(state: &Path) -> Result<Engine> {
    let (engine, recovery) = governed::open(state)
        .with_context(|| format!("cannot open state folder {}", state.display()))?;
    report_recovery(&recovery);
    Ok(engine)
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

fn parse_json(flag: &str, text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| anyhow!("{flag} is not valid JSON: {e}"))
}

fn parse_state(s: &str) -> Result<RunState> {
    serde_json::from_value(serde_json::json!(s)).map_err(|_| {
        anyhow!("unknown state `{s}`: use success, clean-no-op, blocked, approval-required, exhausted, stagnated, failed, interrupted, skipped or running")
    })
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
