//! The command line: clap definitions and one handler per command.
//!
//! Output is for a person by default; `--json` gives a script something stable to parse.
//! Errors go to stderr as `steward: what failed: why`, with a hint where there is one.
//!
//! sled admits one process per state folder, so while a daemon runs, every command that
//! touches the store is sent to it over the control socket ([`crate::control_socket`]) and
//! executed there by the same [`execute`] handler; the reply is printed here. With no
//! daemon, the CLI opens the store itself.

mod logs;
mod render;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::config::{self, Config};
use crate::daemon;
use crate::governed::{self, Engine, Fire};
use crate::live::Ask;
use crate::runner::{Job, Runner};
use crate::store::RunState;

/// `writeln!` into a String cannot fail.
macro_rules! wln {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

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

/// What a command printed and how it exits: built the same way locally and in the daemon.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Reply {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

/// What a handler works against: the engine, the config, and the daemon when it is the
/// daemon executing the command.
pub struct Ctx {
    pub engine: Engine,
    /// The road every run takes: the daemon's runner, or one in this process.
    pub runner: Runner,
    pub config_dir: PathBuf,
    pub daemon: Option<Arc<daemon::Shared>>,
}

impl Ctx {
    fn config(&self) -> Result<Arc<Config>> {
        match &self.daemon {
            Some(d) => Ok(d.config()),
            None => Ok(Arc::new(load_config(&self.config_dir)?)),
        }
    }
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
            // Everything else touches the store: through the daemon if one runs.
            let argv = absolute_paths(std::env::args().skip(1).collect());
            if let Some(reply) = crate::control_socket::forward(&state, &argv)? {
                print!("{}", reply.stdout);
                eprint!("{}", reply.stderr);
                return Ok(reply.code);
            }
            if let Command::Status { .. } = command {
                bail!("no steward daemon is running on state folder {} (start one with `steward daemon`)", state.display());
            }
            if let Command::Enqueue { queue, payload } = &command {
                let payload = parse_json("--payload", payload)?;
                let item = crate::trigger::queue::write_item(&state, queue, &payload)?;
                println!("queued item {item} on {queue} (no daemon running: it runs when the daemon starts)");
                return Ok(0);
            }
            let engine = open_engine(&state)?;
            engine
                .store
                .set_retention(crate::config::Settings::load_lenient(&config).retention());
            let ctx = Ctx {
                runner: Runner::new(engine.clone(), LOCAL_MAX_CONCURRENT),
                engine,
                config_dir: config,
                daemon: None,
            };
            let reply = block_on(async {
                let watcher = stop_runs_on_signal(ctx.runner.clone())?;
                let reply = execute(&ctx, command).await;
                watcher.abort();
                Ok::<_, anyhow::Error>(reply)
            })?;
            print!("{}", reply.stdout);
            eprint!("{}", reply.stderr);
            Ok(reply.code)
        }
    }
}

/// File arguments the daemon reads must not depend on its working folder.
fn absolute_paths(mut argv: Vec<String>) -> Vec<String> {
    let cwd = std::env::current_dir().unwrap_or_default();
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "--member-result" && i + 1 < argv.len() {
            argv[i + 1] = cwd.join(&argv[i + 1]).to_string_lossy().into_owned();
            i += 1;
        } else if let Some(p) = argv[i].strip_prefix("--member-result=") {
            argv[i] = format!("--member-result={}", cwd.join(p).display());
        }
        i += 1;
    }
    argv
}

/// Runs one store command and collects what it prints.
pub async fn execute(ctx: &Ctx, command: Command) -> Reply {
    let mut reply = Reply::default();
    match handle(ctx, command, &mut reply.stdout).await {
        Ok(code) => reply.code = code,
        Err(e) => {
            wln!(reply.stderr, "steward: {e:#}");
            reply.code = 1;
        }
    }
    reply
}

async fn handle(ctx: &Ctx, command: Command, out: &mut String) -> Result<i32> {
    let engine = &ctx.engine;
    match command {
        Command::Daemon(_)
        | Command::Validate
        | Command::New(_)
        | Command::Logs { .. }
        | Command::AgentStep { .. } => {
            bail!("this command runs in the CLI, not through the daemon")
        }
        Command::Digest {
            agent,
            dry_run,
            json,
        } => {
            let cfg = ctx.config()?;
            let wf = cfg.workflow(&agent).map_err(|e| anyhow!(e))?;
            if wf.agent.is_none() {
                bail!("`{agent}` is a workflow, not a digest agent: use `steward run {agent}`");
            }
            let fire = Fire::manual(dry_run.then(|| json!({ "preview": true })));
            let ask = if dry_run { Ask::Dry } else { Ask::Auto };
            let rec = ctx.run(wf, fire, ask).await?;
            if json {
                print_run(out, &rec, true);
            } else {
                if dry_run {
                    if let Some(text) = rec.output.as_ref().and_then(|o| o["preview"].as_str()) {
                        wln!(out, "{text}");
                    }
                }
                wln!(
                    out,
                    "{}",
                    rec.summary.clone().unwrap_or_else(|| format!(
                        "{}: {} ({})",
                        rec.workflow, rec.state, rec.reason
                    ))
                );
            }
            Ok(rec.state.exit_code())
        }
        Command::Drain { dry_run } => drain(ctx, dry_run, out).await,
        Command::Case(cmd) => case(ctx, cmd, out).await,
        Command::Status { json } => {
            let d = ctx.daemon.as_ref().ok_or_else(|| anyhow!("no daemon"))?;
            let status = d.status()?;
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&status)?);
            } else {
                render::status(out, &status);
            }
            Ok(0)
        }
        Command::Enqueue { queue, payload } => {
            let d = ctx.daemon.as_ref().ok_or_else(|| anyhow!("no daemon"))?;
            let payload = parse_json("--payload", &payload)?;
            let item = d.enqueue(&queue, &payload)?;
            wln!(out, "queued item {item} on {queue}");
            Ok(0)
        }
        Command::List { json } => {
            let cfg = ctx.config()?;
            let mut rows = Vec::new();
            for wf in cfg.workflows.values() {
                let status = engine.live_status(wf)?;
                let forced = ctx.daemon.as_ref().is_some_and(|d| d.forced_dry_run());
                let mut row = json!({
                    "id": wf.id,
                    "trigger": wf.trigger.kind(),
                    "live": status.is_live() && !forced,
                    "mode": if forced { "dry-run (forced for every workflow by SIGUSR1; SIGUSR2 lifts it)".to_string() } else { status.describe(&wf.id) },
                    "description": wf.description,
                    "file": wf.file,
                });
                if let Some(next) = crate::trigger::schedule::next_fire_json(wf) {
                    row["next_fire"] = next;
                }
                rows.push(row);
            }
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&rows)?);
            } else {
                render::workflows_table(out, &rows);
            }
            Ok(0)
        }
        Command::Run {
            workflow,
            live,
            payload,
            json,
        } => {
            let payload = payload.map(|p| parse_json("--payload", &p)).transpose()?;
            let cfg = ctx.config()?;
            let wf = cfg.workflow(&workflow).map_err(|e| anyhow!(e))?;
            let fire = Fire::manual(payload);
            let ask = if live { Ask::Live } else { Ask::Dry };
            let rec = ctx.run(wf, fire, ask).await?;
            print_run(out, &rec, json);
            Ok(rec.state.exit_code())
        }
        Command::Runs {
            workflow,
            status,
            limit,
            json,
        } => {
            let status = status.map(|s| parse_state(&s)).transpose()?;
            let runs = engine.store.runs(
                |r| {
                    workflow.as_ref().is_none_or(|w| &r.workflow == w)
                        && status.is_none_or(|s| r.state == s)
                },
                limit,
            )?;
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&runs)?);
            } else {
                render::runs_table(out, &runs);
            }
            Ok(0)
        }
        Command::Show { run, json } => {
            let rec = engine.store.run(&run)?.ok_or_else(|| no_run(&run))?;
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&rec)?);
            } else {
                render::run_detail(out, &rec);
            }
            Ok(0)
        }
        Command::DeadLetter(cmd) => dead_letter(ctx, cmd, out).await,
        Command::Review { json } => {
            let mut runs = Vec::new();
            for id in engine.store.review_queue()? {
                if let Some(r) = engine.store.run(&id)? {
                    runs.push(r);
                }
            }
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&runs)?);
            } else if runs.is_empty() {
                wln!(out, "review queue is empty");
            } else {
                render::runs_table(out, &runs);
            }
            Ok(0)
        }
        Command::Approve { run } => {
            let rec = engine.store.run(&run)?.ok_or_else(|| no_run(&run))?;
            let cfg = ctx.config()?;
            let wf = cfg.workflow(&rec.workflow).map_err(|e| anyhow!(e))?;
            let rec = ctx
                .runner
                .run(Job::approve(Arc::new(wf.clone()), &run))
                .await?;
            print_run(out, &rec, false);
            Ok(rec.state.exit_code())
        }
        Command::Reject { run, reason } => {
            let rec = engine.reject(&run, reason.as_deref())?;
            wln!(
                out,
                "run {} rejected: its idempotency key is free to fire again",
                rec.run_id
            );
            Ok(0)
        }
        Command::GoLive { workflow } => {
            let cfg = ctx.config()?;
            let wf = cfg.workflow(&workflow).map_err(|e| anyhow!(e))?;
            let a = engine.go_live(wf)?;
            wln!(
                out,
                "{} is live: approved config sha256 {} ({}). Editing {} drops it back to dry-run.",
                wf.id,
                &a.config_hash[..12],
                a.approved_by,
                wf.file.display()
            );
            Ok(0)
        }
        Command::DryRun { workflow } => {
            let cfg = ctx.config()?;
            let wf = cfg.workflow(&workflow).map_err(|e| anyhow!(e))?;
            if engine.dry_run(wf)? {
                wln!(
                    out,
                    "{} is dry-run again: go-live approval withdrawn",
                    wf.id
                );
            } else {
                wln!(
                    out,
                    "{} was not approved for go-live: it stays dry-run",
                    wf.id
                );
            }
            Ok(0)
        }
        Command::InDoubt(cmd) => in_doubt(engine, cmd, out),
    }
}

/// Runs at once in the CLI's own process (no daemon), as the daemon's default.
const LOCAL_MAX_CONCURRENT: usize = 8;

impl Ctx {
    /// One governed run through the runner.
    async fn run(
        &self,
        wf: &config::Workflow,
        fire: Fire,
        ask: Ask,
    ) -> Result<crate::store::RunRecord> {
        Ok(self
            .runner
            .run(Job::fire(Arc::new(wf.clone()), fire, ask))
            .await?)
    }
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

async fn case(ctx: &Ctx, cmd: CaseCmd, out: &mut String) -> Result<i32> {
    use crate::agency::{self, CaseError};
    let engine = &ctx.engine;
    match cmd {
        CaseCmd::Open {
            agency: agency_id,
            case_id,
            signal,
        } => {
            let cfg = ctx.config()?;
            let a = cfg.agencies.get(&agency_id).ok_or_else(|| {
                anyhow!(
                    "no agency `{agency_id}` in {}",
                    cfg.root.join("agencies").display()
                )
            })?;
            let signal = signal
                .map(|s| parse_json("--signal", &s))
                .transpose()?
                .unwrap_or(serde_json::Value::Null);
            let c = agency::open(engine, a, &case_id, signal)?;
            wln!(
                out,
                "case {} opened for {}: {} ({} members, limits: {} turns, {} acts, {:.2} USD)",
                c.case_id,
                a.id,
                a.mandate,
                a.roster.len(),
                a.limits.max_turns,
                a.limits.max_acts,
                a.limits.max_spend_usd
            );
            Ok(0)
        }
        CaseCmd::Advance {
            case_id,
            driver,
            member_result,
            run,
            json,
        } => {
            let cfg = ctx.config()?;
            let receipt = match member_result {
                Some(file) => {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("cannot read {}", file.display()))?;
                    let v: serde_json::Value = serde_json::from_str(&text)
                        .with_context(|| format!("{} is not JSON", file.display()))?;
                    Some(agency::Receipt {
                        turn: 0,
                        member: String::new(),
                        run_id: v["run_id"]
                            .as_str()
                            .ok_or_else(|| {
                                anyhow!("{}: run_id is required (the receipt)", file.display())
                            })?
                            .to_string(),
                        state: v["state"].as_str().unwrap_or("success").to_string(),
                        output: v["output"].clone(),
                        spend_usd: v["spend_usd"].as_f64().unwrap_or(0.0).max(0.0),
                    })
                }
                None => None,
            };
            match agency::advance(&ctx.runner, &cfg, &case_id, &driver, receipt, run).await {
                Ok(t) => {
                    if json {
                        wln!(
                            out,
                            "{}",
                            serde_json::to_string_pretty(&json!({ "agency_turn": t }))?
                        );
                    } else {
                        wln!(out, "{}", agency::render(&t));
                    }
                    Ok(match t.status.as_str() {
                        "refused" => 4,
                        "failed" => 5,
                        _ => 0,
                    })
                }
                Err(e @ CaseError::Conflict { .. }) => {
                    wln!(
                        out,
                        "{}",
                        serde_json::to_string(
                            &json!({ "error": "version_conflict", "message": e.to_string() })
                        )?
                    );
                    Ok(10)
                }
                Err(e) => Err(e.into()),
            }
        }
        CaseCmd::Approve { case_id } => {
            let c = agency::approve(
                engine,
                &case_id,
                &std::env::var("USER").unwrap_or_else(|_| "operator".into()),
            )?;
            wln!(
                out,
                "case {} approved at turn {}: the next advance dispatches the waiting move",
                c.case_id,
                c.turns
            );
            Ok(0)
        }
        CaseCmd::Status { case_id, json } => {
            let (c, _) =
                agency::load(engine, &case_id)?.ok_or_else(|| anyhow!("no case {case_id}"))?;
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&c)?);
            } else {
                wln!(
                    out,
                    "case {} ({}): {:?} · turn {} · acts {}/{} · spend {:.2}/{:.2} USD",
                    c.case_id,
                    c.agency.id,
                    c.status,
                    c.turns,
                    c.acts,
                    c.agency.limits.max_acts,
                    c.spend_usd,
                    c.agency.limits.max_spend_usd
                );
                for r in &c.receipts {
                    wln!(
                        out,
                        "  turn {} {}: run {} {} ({:.2} USD)",
                        r.turn,
                        r.member,
                        r.run_id,
                        r.state,
                        r.spend_usd
                    );
                }
            }
            Ok(0)
        }
        CaseCmd::Verify { case_id } => {
            let raw = engine.store.case_events(&case_id)?;
            if raw.is_empty() {
                bail!("no case {case_id}");
            }
            let n = raw.len();
            let events: Result<Vec<agency::Event>, String> = raw
                .into_iter()
                .map(|(v, b)| {
                    serde_json::from_slice(&b).map_err(|e| format!("event {v}: unreadable ({e})"))
                })
                .collect();
            match events.and_then(|e| agency::verify_chain(&e)) {
                Ok(()) => {
                    wln!(out, "case {case_id}: {n} events, chain intact");
                    Ok(0)
                }
                Err(e) => {
                    wln!(out, "case {case_id}: broken link at {e}");
                    Ok(1)
                }
            }
        }
        CaseCmd::List { json } => {
            let mut rows = Vec::new();
            for id in engine.store.case_ids()? {
                match agency::load(engine, &id) {
                    Ok(Some((c, _))) => rows.push(json!({ "case_id": id, "agency": c.agency.id, "status": c.status, "turns": c.turns, "acts": c.acts, "spend_usd": c.spend_usd })),
                    Ok(None) => {}
                    Err(e) => rows.push(json!({ "case_id": id, "status": "unreadable", "error": e.to_string() })),
                }
            }
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&rows)?);
            } else if rows.is_empty() {
                wln!(out, "no cases");
            } else {
                for r in rows {
                    wln!(
                        out,
                        "{:<24} {:<20} {:<18} turns {} acts {} spend {}",
                        r["case_id"].as_str().unwrap_or(""),
                        r["agency"].as_str().unwrap_or(""),
                        r["status"].as_str().unwrap_or(""),
                        r["turns"],
                        r["acts"],
                        r["spend_usd"]
                    );
                }
            }
            Ok(0)
        }
    }
}

/// `steward drain`: per job, run the newest unexpired marker, then delete it and the older
/// ones; delete expired markers unrun; report and keep unreadable ones.
async fn drain(ctx: &Ctx, dry_run: bool, out: &mut String) -> Result<i32> {
    use crate::drain;
    let cfg = ctx.config()?;
    let now = chrono::Utc::now();
    let dir = drain::marker_dir(&cfg.vault());
    let (markers, bad) = drain::scan(&dir);
    let windows = drain::windows(&cfg, now);
    let plan = drain::plan(markers, |job| windows.get(job).copied(), now);
    let verb = |real: &str, would: &str| {
        if dry_run {
            would.to_string()
        } else {
            real.to_string()
        }
    };
    for (path, why) in bad.iter().chain(plan.left.iter()) {
        wln!(out, "kept {}: {why}", path.display());
    }
    for path in &plan.expired {
        if !dry_run {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot delete {}", path.display()))?;
        }
        wln!(
            out,
            "{} {} (expired)",
            verb("deleted", "would delete"),
            path.display()
        );
    }
    let mut worst = 0;
    for (marker, older) in plan.run {
        let Some(wf) = cfg.workflows.get(&marker.job) else {
            continue;
        };
        if dry_run {
            wln!(
                out,
                "would run {} for {} (marker {}), then delete it and {} older",
                wf.id,
                marker.scheduled_for,
                marker.path.display(),
                older.len()
            );
            continue;
        }
        let fire = Fire::new(
            "schedule",
            Some(marker.scheduled_for),
            json!({ "catchup": true, "marker": marker.path }),
        );
        let rec = ctx.run(wf, fire, Ask::Auto).await?;
        wln!(
            out,
            "ran {} for {}: {} ({})",
            wf.id,
            marker.scheduled_for,
            rec.state,
            rec.run_id
        );
        if let Some(s) = &rec.summary {
            wln!(out, "{s}");
        }
        if rec.state == RunState::Interrupted {
            wln!(
                out,
                "kept the markers of {}: its run was interrupted",
                wf.id
            );
            worst = worst.max(rec.state.exit_code());
            continue;
        }
        for p in older.iter().chain(std::iter::once(&marker.path)) {
            let _ = std::fs::remove_file(p);
        }
        worst = worst.max(rec.state.exit_code());
    }
    if bad.is_empty()
        && plan.expired.is_empty()
        && plan.left.is_empty()
        && worst == 0
        && out.is_empty()
    {
        wln!(out, "no queue markers in {}", dir.display());
    }
    Ok(worst)
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
    let cfg = load_config(&config_dir)?;
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

async fn dead_letter(ctx: &Ctx, cmd: DeadLetterCmd, out: &mut String) -> Result<i32> {
    let engine = &ctx.engine;
    match cmd {
        DeadLetterCmd::List { json } => {
            let entries = engine.store.dead_letters()?;
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&entries)?);
            } else if entries.is_empty() {
                wln!(out, "dead-letter queue is empty");
            } else {
                let runs: Vec<_> = entries.into_iter().map(|e| e.run).collect();
                render::runs_table(out, &runs);
            }
        }
        DeadLetterCmd::Show { run, json } => {
            let entry = engine.store.dead_letter_entry(&run)?.ok_or_else(|| {
                anyhow!("no dead-letter entry for run `{run}` (see `steward dead-letter list`)")
            })?;
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&entry)?);
            } else {
                wln!(out, "dead-lettered {}", entry.dead_lettered_at.to_rfc3339());
                render::run_detail(out, &entry.run);
            }
        }
        DeadLetterCmd::Retry { run, json } => {
            let entry = engine.store.dead_letter_entry(&run)?.ok_or_else(|| {
                anyhow!("no dead-letter entry for run `{run}` (see `steward dead-letter list`)")
            })?;
            let cfg = ctx.config()?;
            let wf = cfg.workflow(&entry.run.workflow).map_err(|e| anyhow!(e))?;
            let mut fire = Fire::manual(None);
            fire.trigger = entry.run.trigger.clone();
            fire.retry_of = Some(run.clone());
            // A dry run is retried dry; a live one live if the workflow still may be.
            let ask = if entry.run.dry_run {
                Ask::Dry
            } else {
                Ask::Auto
            };
            let rec = ctx.run(wf, fire, ask).await?;
            engine.store.remove_dead_letter(&run)?;
            engine.store.flush()?;
            print_run(out, &rec, json);
            return Ok(rec.state.exit_code());
        }
        DeadLetterCmd::Purge { runs, all } => {
            let ids: Vec<String> = if all {
                engine
                    .store
                    .dead_letters()?
                    .into_iter()
                    .map(|e| e.run.run_id)
                    .collect()
            } else if runs.is_empty() {
                bail!("name the runs to purge, or pass --all");
            } else {
                runs
            };
            let mut removed = 0;
            for id in &ids {
                if engine.store.remove_dead_letter(id)? {
                    removed += 1;
                } else {
                    wln!(out, "no dead-letter entry for run `{id}`");
                }
            }
            engine.store.flush()?;
            wln!(
                out,
                "purged {removed} dead-letter entr{}",
                if removed == 1 { "y" } else { "ies" }
            );
        }
    }
    Ok(0)
}

fn in_doubt(engine: &Engine, cmd: InDoubtCmd, out: &mut String) -> Result<i32> {
    match cmd {
        InDoubtCmd::List { json } => {
            let keys = engine.store.keys_in_doubt()?;
            if json {
                wln!(out, "{}", serde_json::to_string_pretty(&keys)?);
            } else if keys.is_empty() {
                wln!(out, "no idempotency key is in doubt");
            } else {
                render::in_doubt_table(out, &keys);
            }
        }
        InDoubtCmd::Resolve {
            workflow,
            key,
            committed,
            ..
        } => {
            engine.settle_key(&workflow, &key, committed)?;
            if committed {
                wln!(
                    out,
                    "key `{key}` of {workflow} marked committed: a re-fire is a clean no-op"
                );
            } else {
                wln!(
                    out,
                    "key `{key}` of {workflow} released: the next fire runs again"
                );
            }
        }
    }
    Ok(0)
}

pub fn load_config(dir: &Path) -> Result<Config> {
    config::load_dir(dir).map_err(|errors| {
        let list: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        anyhow!(
            "the config in {} has {} error(s); fix them (see `steward validate`):\n{}",
            dir.display(),
            errors.len(),
            list.join("\n")
        )
    })
}

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

fn print_run(out: &mut String, rec: &crate::store::RunRecord, json: bool) {
    if json {
        wln!(
            out,
            "{}",
            serde_json::to_string_pretty(rec).unwrap_or_default()
        );
    } else {
        render::run_summary(out, rec);
    }
}

fn parse_json(flag: &str, text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| anyhow!("{flag} is not valid JSON: {e}"))
}

fn parse_state(s: &str) -> Result<RunState> {
    serde_json::from_value(json!(s)).map_err(|_| {
        anyhow!("unknown state `{s}`: use success, clean-no-op, blocked, approval-required, exhausted, stagnated, failed, interrupted, skipped or running")
    })
}

fn no_run(id: &str) -> anyhow::Error {
    anyhow!("no run with id `{id}` (see `steward runs`)")
}
