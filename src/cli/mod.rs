//! The command line: clap definitions and one function per command.
//!
//! Output is for a person by default; `--json` gives a script something stable to parse.
//! Errors go to stderr as `steward: what failed: why`, with a hint where there is one.

mod logs;
mod render;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::json;

use crate::config::{self, Config};
use crate::governed::{self, Engine, Fire};
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
pub struct NewArgs {
    /// Workflow id: a-z, 0-9, `-`, `_`
    pub workflow: String,
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    init_tracing();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("steward: {e:#}");
            1
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STEWARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn dispatch(cli: Cli) -> Result<i32> {
    let Cli {
        config,
        state,
        command,
    } = cli;
    match command {
        Command::Validate => validate(&config),
        Command::List { json } => list(&config, &state, json),
        Command::Run {
            workflow,
            live,
            payload,
            json,
        } => {
            let payload = payload
                .map(|p| {
                    serde_json::from_str(&p)
                        .map_err(|e| anyhow!("--payload is not valid JSON: {e}"))
                })
                .transpose()?;
            let cfg = load_config(&config)?;
            let wf = cfg.workflow(&workflow).map_err(|e| anyhow!(e))?;
            let engine = open_engine(&state)?;
            let rec = block_on(engine.execute(wf, Fire::manual(payload), live))?;
            print_run(&rec, json);
            Ok(rec.state.exit_code())
        }
        Command::Runs {
            workflow,
            status,
            limit,
            json,
        } => {
            let engine = open_engine(&state)?;
            let status = status.map(|s| parse_state(&s)).transpose()?;
            let runs = engine.store.runs(
                |r| {
                    workflow.as_ref().is_none_or(|w| &r.workflow == w)
                        && status.is_none_or(|s| r.state == s)
                },
                limit,
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&runs)?);
            } else {
                render::runs_table(&runs);
            }
            Ok(0)
        }
        Command::Show { run, json } => {
            let engine = open_engine(&state)?;
            let rec = engine.store.run(&run)?.ok_or_else(|| no_run(&run))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rec)?);
            } else {
                render::run_detail(&rec);
            }
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
        Command::DeadLetter(cmd) => dead_letter(&config, &state, cmd),
        Command::Review { json } => {
            let engine = open_engine(&state)?;
            let mut runs = Vec::new();
            for id in engine.store.review_queue()? {
                if let Some(r) = engine.store.run(&id)? {
                    runs.push(r);
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&runs)?);
            } else if runs.is_empty() {
                println!("review queue is empty");
            } else {
                render::runs_table(&runs);
            }
            Ok(0)
        }
        Command::Approve { run } => {
            let engine = open_engine(&state)?;
            let rec = engine.store.run(&run)?.ok_or_else(|| no_run(&run))?;
            let cfg = load_config(&config)?;
            let wf = cfg.workflow(&rec.workflow).map_err(|e| anyhow!(e))?;
            let rec = block_on(engine.approve(wf, &run))?;
            print_run(&rec, false);
            Ok(rec.state.exit_code())
        }
        Command::Reject { run, reason } => {
            let engine = open_engine(&state)?;
            let rec = engine.reject(&run, reason.as_deref())?;
            println!(
                "run {} rejected: its idempotency key is free to fire again",
                rec.run_id
            );
            Ok(0)
        }
        Command::GoLive { workflow } => {
            let cfg = load_config(&config)?;
            let wf = cfg.workflow(&workflow).map_err(|e| anyhow!(e))?;
            let engine = open_engine(&state)?;
            let a = engine.go_live(wf)?;
            println!(
                "{} is live: approved config sha256 {} ({}). Editing {} drops it back to dry-run.",
                wf.id,
                &a.config_hash[..12],
                a.approved_by,
                wf.file.display()
            );
            Ok(0)
        }
        Command::DryRun { workflow } => {
            let cfg = load_config(&config)?;
            let wf = cfg.workflow(&workflow).map_err(|e| anyhow!(e))?;
            let engine = open_engine(&state)?;
            let had = engine.dry_run(wf)?;
            if had {
                println!("{} is dry-run again: go-live approval withdrawn", wf.id);
            } else {
                println!("{} was not approved for go-live: it stays dry-run", wf.id);
            }
            Ok(0)
        }
        Command::InDoubt(cmd) => in_doubt(&state, cmd),
        Command::New(args) => {
            let written = crate::scaffold::create(&config, &args.workflow)?;
            for p in &written {
                println!("wrote {}", p.display());
            }
            println!(
                "next: edit the ten sections, then `steward validate` and `steward run {}` (dry-run)",
                args.workflow
            );
            Ok(0)
        }
    }
}

fn validate(config: &Path) -> Result<i32> {
    match config::load_dir(config) {
        Ok(cfg) => {
            let ids: Vec<&str> = cfg.workflows.keys().map(String::as_str).collect();
            println!(
                "ok: {} workflow{} in {} ({})",
                ids.len(),
                if ids.len() == 1 { "" } else { "s" },
                config.display(),
                ids.join(", ")
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

fn list(config: &Path, state: &Path, json: bool) -> Result<i32> {
    let cfg = load_config(config)?;
    let engine = open_engine(state)?;
    let mut rows = Vec::new();
    for wf in cfg.workflows.values() {
        let status = engine.live_status(wf)?;
        rows.push(json!({
            "id": wf.id,
            "trigger": wf.trigger.kind(),
            "live": status.is_live(),
            "mode": status.describe(&wf.id),
            "description": wf.description,
            "file": wf.file,
        }));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        render::workflows_table(&rows);
    }
    Ok(0)
}

fn dead_letter(config: &Path, state: &Path, cmd: DeadLetterCmd) -> Result<i32> {
    let engine = open_engine(state)?;
    match cmd {
        DeadLetterCmd::List { json } => {
            let entries = engine.store.dead_letters()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else if entries.is_empty() {
                println!("dead-letter queue is empty");
            } else {
                let runs: Vec<_> = entries.into_iter().map(|e| e.run).collect();
                render::runs_table(&runs);
            }
        }
        DeadLetterCmd::Show { run, json } => {
            let entry = engine.store.dead_letter_entry(&run)?.ok_or_else(|| {
                anyhow!("no dead-letter entry for run `{run}` (see `steward dead-letter list`)")
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entry)?);
            } else {
                println!("dead-lettered {}", entry.dead_lettered_at.to_rfc3339());
                render::run_detail(&entry.run);
            }
        }
        DeadLetterCmd::Retry { run, json } => {
            let entry = engine.store.dead_letter_entry(&run)?.ok_or_else(|| {
                anyhow!("no dead-letter entry for run `{run}` (see `steward dead-letter list`)")
            })?;
            let cfg = load_config(config)?;
            let wf = cfg.workflow(&entry.run.workflow).map_err(|e| anyhow!(e))?;
            let fire = Fire {
                trigger: entry.run.trigger.clone(),
                retry_of: Some(run.clone()),
            };
            let rec = block_on(engine.execute(wf, fire, !entry.run.dry_run))?;
            engine.store.remove_dead_letter(&run)?;
            engine.store.flush()?;
            print_run(&rec, json);
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
                    eprintln!("steward: no dead-letter entry for run `{id}`");
                }
            }
            engine.store.flush()?;
            println!(
                "purged {removed} dead-letter entr{}",
                if removed == 1 { "y" } else { "ies" }
            );
        }
    }
    Ok(0)
}

fn in_doubt(state: &Path, cmd: InDoubtCmd) -> Result<i32> {
    let engine = open_engine(state)?;
    match cmd {
        InDoubtCmd::List { json } => {
            let keys = engine.store.keys_in_doubt()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&keys)?);
            } else if keys.is_empty() {
                println!("no idempotency key is in doubt");
            } else {
                render::in_doubt_table(&keys);
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
                println!("key `{key}` of {workflow} marked committed: a re-fire is a clean no-op");
            } else {
                println!("key `{key}` of {workflow} released: the next fire runs again");
            }
        }
    }
    Ok(0)
}

fn load_config(dir: &Path) -> Result<Config> {
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
    Ok(engine)
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    // A current-thread runtime is enough for one run; building it cannot fail short of
    // the OS refusing an epoll fd, which leaves nothing sensible to do.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot start the async runtime")
        .block_on(f)
}

fn print_run(rec: &crate::store::RunRecord, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(rec).unwrap_or_default());
    } else {
        render::run_summary(rec);
    }
}

fn parse_state(s: &str) -> Result<RunState> {
    serde_json::from_value(json!(s)).map_err(|_| {
        anyhow!("unknown state `{s}`: use success, clean-no-op, blocked, approval-required, exhausted, stagnated, failed, interrupted or running")
    })
}

fn no_run(id: &str) -> anyhow::Error {
    anyhow!("no run with id `{id}` (see `steward runs`)")
}
