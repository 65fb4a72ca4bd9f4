//! How a step ended, and what it reported on the way: its exit, its output, and the
//! control lines of fd 3 applied as they arrived.

use std::time::Duration;

use crate::budget::{Breach, BudgetGuard};
use crate::control::{self, Message};
use crate::process::Exit;

/// Notes kept per step; more are counted, not stored.
const MAX_NOTES: usize = 100;

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

    pub(super) fn apply(
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
