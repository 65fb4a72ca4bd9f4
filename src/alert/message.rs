//! One alert: what happened to which workflow, as a mail subject and a line of text.

use chrono::{DateTime, Utc};

use crate::config::notify::Event;

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
