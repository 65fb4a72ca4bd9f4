//! Alerts as the engine raises them: one [`Alert`] (what happened to which workflow, as a
//! mail subject and a line of text), its [`Event`], and [`Alerts`], the handle the engine
//! raises them through. Where they go — the `[[notify]]` channels, their rate windows,
//! delivery and retries — is the alert dispatcher's, above the engine, behind [`Raise`].

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What an alert is about. The names are the ones a channel's `events` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A run ended failed, exhausted or stagnated (it is in the dead-letter queue).
    DeadLetter,
    /// A run's checker escalated: it waits in the review queue.
    ReviewWaiting,
    /// The circuit breaker paused a workflow.
    BreakerOpen,
    /// A workflow's `[budget.window]` was reached: it is paused.
    BudgetWindow,
    /// Scheduled slots passed while steward was not running.
    Missed,
    /// No run ended successfully within `[expect] within` of a slot (or `at_least`).
    Overdue,
    /// A commit may or may not have happened: its key waits for `steward in-doubt`.
    InDoubt,
    /// A workflow approved for go-live was edited: it runs dry until approved again.
    GoLiveNeeded,
    /// The first success after a run of failures.
    Recovered,
    /// A workflow fired far more often than its schedule or `[expect]` allows.
    TooOften,
}

impl Event {
    pub const ALL: [Event; 10] = [
        Event::DeadLetter,
        Event::ReviewWaiting,
        Event::BreakerOpen,
        Event::BudgetWindow,
        Event::Missed,
        Event::Overdue,
        Event::InDoubt,
        Event::GoLiveNeeded,
        Event::Recovered,
        Event::TooOften,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Event::DeadLetter => "dead_letter",
            Event::ReviewWaiting => "review_waiting",
            Event::BreakerOpen => "breaker_open",
            Event::BudgetWindow => "budget_window",
            Event::Missed => "missed",
            Event::Overdue => "overdue",
            Event::InDoubt => "in_doubt",
            Event::GoLiveNeeded => "go_live_needed",
            Event::Recovered => "recovered",
            Event::TooOften => "too_often",
        }
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What takes the alerts raised: the daemon's dispatcher.
pub trait Raise: Send + Sync {
    /// Whether any channel wants `event` (so a caller can skip the work of finding out).
    fn wants(&self, event: Event) -> bool;
    /// Sends `alert` to the channels that want it, now or later; never waits.
    fn raise(&self, alert: Alert);
}

/// Where alerts are raised; clones share one dispatcher. `Alerts::default()` sends
/// nothing (the CLI's own process, tests of the engine alone).
#[derive(Clone, Default)]
pub struct Alerts {
    to: Option<Arc<dyn Raise>>,
}

impl Alerts {
    /// Alerts that go to `to`.
    pub fn to(to: Arc<dyn Raise>) -> Alerts {
        Alerts { to: Some(to) }
    }

    /// Whether any channel wants `event`.
    pub fn wants(&self, event: Event) -> bool {
        self.to.as_ref().is_some_and(|to| to.wants(event))
    }

    /// Sends `alert` where it goes; never waits.
    pub fn raise(&self, alert: Alert) {
        if let Some(to) = &self.to {
            to.raise(alert);
        }
    }
}

/// One thing a person should know about.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Alert {
    /// Stable across retries and restarts: a receiver drops a repeat by it.
    #[serde(default)]
    pub id: String,
    pub event: Event,
    pub workflow: String,
    /// One or two sentences: what happened and what to do.
    pub message: String,
    pub run_id: Option<String>,
    pub at: DateTime<Utc>,
    /// Alerts of the same workflow and event this channel held back before this one.
    pub held_back: u32,
}

impl Alert {
    pub fn new(event: Event, workflow: &str, message: impl Into<String>) -> Alert {
        let at = Utc::now();
        let mut random = [0u8; 4];
        let _ = getrandom::fill(&mut random);
        Alert {
            id: format!("{}-{}", at.format("%Y%m%dT%H%M%S%3f"), hex::encode(random)),
            event,
            workflow: workflow.to_string(),
            message: message.into(),
            run_id: None,
            at,
            held_back: 0,
        }
    }

    pub fn run(mut self, run_id: &str) -> Alert {
        self.run_id = Some(run_id.to_string());
        self
    }

    /// `[steward] breaker_open: nightly`.
    pub fn subject(&self) -> String {
        format!("[steward] {}: {}", self.event, self.workflow)
    }

    /// The message with the run and what was held back, as a person reads it.
    pub fn text(&self) -> String {
        let mut t = format!("{}: {}", self.subject(), self.message);
        if let Some(run) = &self.run_id {
            t.push_str(&format!(" (run {run})"));
        }
        if self.held_back > 0 {
            t.push_str(&format!(
                " — {} more {} alert(s) of {} were held back",
                self.held_back, self.event, self.workflow
            ));
        }
        t
    }
}
