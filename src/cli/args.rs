//! The command line's grammar: every command and flag, with the help text `--help` shows.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::{Args, Parser, Subcommand};

use crate::store::RunState;

const AFTER_HELP: &str = "\
Every run goes trigger → run (maker) → verify (checker) → commit, under hard budgets.
Workflows are dry-run until `dry_run = false` is set in the file AND an operator runs
`steward go-live WORKFLOW`; editing the file afterwards drops it back to dry-run.

Exit codes of `steward run`: 0 success or clean-no-op, 3 approval-required, 4 blocked,
5 failed, 6 exhausted, 7 stagnated, 11 refused (`--live` or `approve` not allowed now:
not approved, edited since go-live, or forced dry-run; nothing ran), 1 steward itself
failed, 2 bad usage.

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
    /// Print the URL that opens the running daemon's web dashboard (it carries the
    /// token from state/dashboard.token; the first visit trades it for a cookie)
    Dashboard {
        /// Print {"url": ..., "listen": ...}
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
        #[arg(value_enum)]
        step: AgentStepKind,
        agent: String,
    },
    /// Check every workflow file in the config folder; report all errors, run nothing
    Validate,
    /// When a workflow's (or agent's, or agency's) schedule fires next, from the config on disk
    #[command(after_help = CALENDAR_HELP)]
    Next {
        /// Workflow, digest agent or agency id
        workflow: String,
        #[command(flatten)]
        preview: PreviewArgs,
    },
    /// When a cron expression fires, in a time zone (like `systemd-analyze calendar`)
    #[command(after_help = CALENDAR_HELP)]
    Calendar {
        /// 5 fields `m h dom mon dow`, 6 with seconds first, or @hourly/@daily/…
        expression: String,
        /// IANA time zone the expression is read in
        #[arg(long, default_value = "UTC", value_name = "ZONE")]
        tz: String,
        #[command(flatten)]
        preview: PreviewArgs,
    },
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
        /// Every daemon's runlog, from the cluster's log stream (needs `[cluster]`);
        /// each line names its daemon
        #[arg(long)]
        cluster: bool,
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
    /// Pause a workflow: its fires are recorded skipped until `steward resume`
    Pause {
        workflow: String,
        /// Why, for `list`, `status` and the runlog
        #[arg(long)]
        reason: Option<String>,
    },
    /// Lift a pause (the operator's or the breaker's); a schedule's catch-up policy then
    /// decides whether the slots it skipped run
    Resume { workflow: String },
    /// Why a slot did or did not run: fired (its run), skipped (overlap, paused, breaker,
    /// budget, forced dry-run), missed (steward was down), caught-up or coalesced
    Why {
        workflow: String,
        /// The slot at or before this time (default: the last): RFC 3339, `2026-12-04
        /// 09:00` or `09:00` (today), in the schedule's time zone
        time: Option<String>,
        /// Every slot and fire since this long ago instead (`24h`, `90m`, `7days`)
        #[arg(long, conflicts_with = "time")]
        since: Option<String>,
        #[arg(long)]
        json: bool,
    },
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
        /// Who drives this turn (part of the turn's key) [default: your login name, or
        /// the uid where the user database has none]
        #[arg(long)]
        driver: Option<String>,
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
    /// Where the web dashboard and /metrics listen, over `[dashboard] listen` of
    /// steward.toml (default 127.0.0.1:8484): an address, port 0 for any free port, or
    /// `off`. `steward dashboard` prints the URL to open
    #[arg(long, value_name = "ADDR|off", env = "STEWARD_DASHBOARD_LISTEN")]
    pub dashboard: Option<String>,
}

const CALENDAR_HELP: &str = "\
Daylight saving follows ISC cron: a wildcard job (minute or hour field starting with `*`,
and @hourly) runs in both passes of a repeated hour; a fixed-time job runs once, at the
first pass, and a slot a skipped hour removes runs once right after the jump. Fires a
change shaped are marked. --json prints {\"fires\": [\"2027-10-31T02:00:00+01:00\", …]}.";

#[derive(Args, Debug)]
pub struct PreviewArgs {
    /// How many fires to show
    #[arg(long, short = 'n', default_value_t = 5, value_name = "N")]
    pub count: usize,
    /// Start after this instant (RFC 3339, e.g. 2027-10-31T02:45:00+02:00) instead of now
    #[arg(long, value_name = "RFC3339")]
    pub from: Option<String>,
    /// Print {"fires": [...]}
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct NewArgs {
    /// Workflow id: a-z, 0-9, `-`, `_`
    pub workflow: String,
}

pub(super) fn parse_json(flag: &str, text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| anyhow!("{flag} is not valid JSON: {e}"))
}

pub(super) fn parse_state(s: &str) -> Result<RunState> {
    serde_json::from_value(serde_json::json!(s)).map_err(|_| {
        anyhow!("unknown state `{s}`: use success, clean-no-op, blocked, approval-required, exhausted, stagnated, failed, interrupted, skipped or running")
    })
}

/// A digest agent's own steps, as its workflow runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentStepKind {
    /// Steps 1–10: fetch, select, write the digest.
    Run,
    /// The checker of what `run` wrote.
    Check,
    /// The commit: the digest to its recipients.
    Email,
}
