//! The step supervisor: runs one step command (run, verify or commit) as a child process
//! in its own process group and watches it until it ends.
//!
//! Guarantees: the context goes in on stdin; stdout, stderr and the fd-3 control channel
//! are drained concurrently (a chatty child cannot deadlock on a full pipe); charges are
//! applied to the [`BudgetGuard`] the moment they arrive; on a breach, a stall or a
//! timeout the whole group gets SIGTERM, then SIGKILL after the grace; and when the step
//! ends for any reason, whatever is left of its group is killed, so no grandchild outlives
//! its step.

mod launch;
mod pipes;
mod supervise;

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::budget::{Breach, BudgetGuard};
use crate::containment::StepCgroup;
use crate::control::{self, Message};
pub use crate::process::Exit;
use crate::process::StepProcess;
pub use launch::{reserve_control_fd, spawn_lock};
pub use supervise::run_step;

/// How much of stdout is kept (the rest is drained and dropped).
pub const STDOUT_CAP: usize = 1 << 20;
/// How much of the end of stderr is kept.
pub const STDERR_TAIL: usize = 16 << 10;
/// Notes kept per step; more are counted, not stored.
const MAX_NOTES: usize = 100;
/// SIGTERM → SIGKILL for a run the daemon cancels (it has had its grace already).
const CANCEL_GRACE: Duration = Duration::from_millis(500);
/// How long to wait for pipes to reach EOF once the group is gone.
const DRAIN_WAIT: Duration = Duration::from_millis(500);

/// Names passed through from steward's own environment to every step and helper.
const PASSTHROUGH: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR",
];

/// The environment every child starts from: the [`PASSTHROUGH`] names steward has, a
/// default `PATH` if it has none, and — for a helper started inside a step — the step's
/// own `STEWARD_*` variables and its model gateway's.
pub fn base_env() -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = PASSTHROUGH
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| (name.to_string(), v)))
        .collect();
    if !vars.iter().any(|(k, _)| k == "PATH") {
        vars.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
    }
    if std::env::var_os("STEWARD_RUN_ID").is_some() {
        vars.extend(std::env::vars().filter(|(k, _)| {
            k.starts_with("STEWARD_BUDGET_")
                || matches!(
                    k.as_str(),
                    "STEWARD_RUN_ID" | "STEWARD_WORKFLOW" | "STEWARD_DRY_RUN" | "STEWARD_ATTEMPT"
                    // The model gateway's, so a helper (a digest agent's claim command)
                    // calls models through it as its step does.
                    | "OPENAI_BASE_URL" | "OPENAI_API_KEY" | "ANTHROPIC_BASE_URL" | "ANTHROPIC_API_KEY"
                )
        }));
    }
    vars
}

/// `vars` with `extra` set over them (a name in both takes `extra`'s value).
pub fn with_vars(vars: &[(String, String)], extra: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vars
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .cloned()
        .collect();
    out.extend(extra);
    out
}

/// Which of the three steps a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    Run,
    Verify,
    Commit,
}

impl StepKind {
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Run => "run",
            StepKind::Verify => "verify",
            StepKind::Commit => "commit",
        }
    }
}

pub struct StepRequest<'a> {
    pub kind: StepKind,
    pub argv: &'a [String],
    pub cwd: &'a Path,
    /// The complete environment of the child: steward passes nothing else through.
    pub env: &'a [(String, String)],
    pub stdin: Vec<u8>,
    /// Wall-clock limit outside the budget (commit only).
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    pub stall_timeout: Option<Duration>,
    /// Cancelled when the daemon stops or a newer fire replaces this run (`cancel_other`).
    pub cancel: CancellationToken,
    /// The kernel confinement the step starts under (none for a commit or a trusted step).
    pub sandbox: Option<&'a crate::sandbox::Confinement>,
    /// Memory, process and CPU caps held by cgroups (none set for most steps).
    pub limits: crate::limits::Limits,
    /// Spend steward measures itself while the step runs (the model gateway's calls):
    /// charged as it arrives, like a report on fd 3, through [`BudgetGuard::meter`].
    pub metered: Option<Metered>,
}

/// What a meter steward runs itself tells the step.
#[derive(Debug, Clone, PartialEq)]
pub enum Metering {
    /// Spent: (resource, amount), as [`Message::Charge`] has them.
    Charge(control::Resource, f64),
    /// A spend the budget could not cover was refused before it happened: the run is
    /// exhausted all the same.
    Refused(crate::budget::Cap, f64),
}

/// The metered side of one step: the charges as they come, and the headroom the step
/// publishes back after each charge (so the meter can refuse what will not fit).
pub struct Metered {
    pub charges: mpsc::UnboundedReceiver<Metering>,
    pub headroom: crate::budget::Headroom,
    /// Held while the step's process runs and dropped as it ends (the gateway's key,
    /// revoked then); the step then waits, briefly, for the charges of calls still
    /// settling, until the feed closes.
    pub lease: Option<Box<dyn std::any::Any + Send>>,
}

/// Why the supervisor stopped watching.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// The process exited by itself.
    Exited,
    /// A budget cap was crossed; the group was killed.
    Breach(Breach),
    /// No tick, charge or output for the stall timeout; the group was killed.
    Stalled(Duration),
    /// The step's own timeout (commit) passed; the group was killed.
    TimedOut(Duration),
    /// The command could not be started.
    SpawnFailed(String),
    /// steward was told to stop the run (shutdown, `cancel_other`); the group was killed.
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct StepOutcome {
    pub ending: Ending,
    pub exit: Option<Exit>,
    pub stdout: String,
    pub stderr_tail: String,
    pub noop: bool,
    pub block: Option<String>,
    pub notes: Vec<String>,
    pub confidence: Option<String>,
    /// Control lines that did not parse, with the reason.
    pub malformed: Vec<String>,
    /// Sub-steps the process reported (`step NAME STATUS DETAIL`), in order.
    pub steps: Vec<(String, String, String)>,
    pub duration: Duration,
}

impl StepOutcome {
    pub fn new(ending: Ending) -> Self {
        StepOutcome {
            ending,
            exit: None,
            stdout: String::new(),
            stderr_tail: String::new(),
            noop: false,
            block: None,
            notes: Vec::new(),
            confidence: None,
            malformed: Vec::new(),
            steps: Vec::new(),
            duration: Duration::ZERO,
        }
    }

    /// True when the process exited by itself with status 0.
    pub fn succeeded(&self) -> bool {
        self.ending == Ending::Exited && self.exit == Some(Exit::Code(0))
    }

    fn apply(
        &mut self,
        msg: Result<Message, control::ParseError>,
        guard: &mut Option<&mut BudgetGuard>,
    ) -> Option<Breach> {
        match msg {
            Ok(Message::Charge(resource, amount)) => match guard {
                Some(g) => return g.charge(resource, amount),
                None => self.malformed.push(format!(
                    "charge {} ignored: the {} step is not budgeted",
                    resource.name(),
                    "commit"
                )),
            },
            Ok(Message::Tick) => {}
            Ok(Message::Noop) => self.noop = true,
            Ok(Message::Block(reason)) => self.block = Some(reason),
            Ok(Message::Note(text)) => {
                if self.notes.len() < MAX_NOTES {
                    self.notes.push(text);
                }
            }
            Ok(Message::Confidence(c)) => self.confidence = Some(c),
            Ok(Message::Step {
                name,
                status,
                detail,
            }) => {
                if self.steps.len() < MAX_NOTES {
                    self.steps.push((name, status, detail));
                }
            }
            Err(e) => {
                if self.malformed.len() < MAX_NOTES {
                    self.malformed.push(e.0);
                }
            }
        }
        None
    }
}

/// What must die with a step: its process group and its cgroup. Normally the step's end
/// sweeps both and empties this; a drop with anything left kills it.
struct Contained {
    pgid: Option<Pid>,
    cgroup: Option<StepCgroup>,
}

impl Drop for Contained {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.kill();
        }
    }
}

/// The longest a step's end waits for its killed cgroup to empty.
const CGROUP_DRAIN: Duration = Duration::from_secs(1);

/// SIGTERM the group, wait out the grace, then SIGKILL; returns how the child ended.
async fn stop_group(child: &mut StepProcess, pgid: Option<Pid>, grace: Duration) -> Option<Exit> {
    if let Some(pgid) = pgid {
        let _ = killpg(pgid, Signal::SIGTERM);
    }
    if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
        return status.ok();
    }
    if let Some(pgid) = pgid {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    child.start_kill();
    child.wait().await.ok()
}

/// The next metered charge; pending forever when there is no feed (its arm is off then).
async fn recv_metered(metered: &mut Option<Metered>) -> Option<Metering> {
    match metered {
        Some(m) => m.charges.recv().await,
        None => std::future::pending().await,
    }
}

/// Counts one metering in the guard; a breach if it took the budget over a cap (a
/// refused spend always does).
fn metering(guard: &mut BudgetGuard, m: Metering) -> Option<Breach> {
    match m {
        Metering::Charge(resource, amount) => guard.meter(resource, amount),
        Metering::Refused(cap, asked) => Some(guard.refused(cap, asked)),
    }
}

#[cfg(test)]
mod tests;
