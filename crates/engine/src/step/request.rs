//! What the supervisor is asked to run: which step, its command, environment and
//! context, its limits, and the spend steward meters itself while it runs.

use std::path::Path;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::control;

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
    /// What starts its process.
    pub launcher: &'a dyn super::launch::Launcher,
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
