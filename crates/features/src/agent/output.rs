//! What the run step hands to check and email, and how every lifecycle step reports
//! itself on the control channel.

use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::digest::Failure;

/// What the run step hands to check and email (its stdout).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunOutput {
    pub agent: String,
    pub date: String,
    /// Shown in the summary: relative to the folder holding `config/`.
    pub written: Option<String>,
    pub digest_file: Option<PathBuf>,
    pub polled: usize,
    pub new_items: usize,
    pub updated_items: usize,
    pub verified: usize,
    pub failures: Vec<Failure>,
    pub recipients: Vec<String>,
    pub recipients_error: Option<String>,
    /// `steward digest --dry-run`: nothing was written; the digest is here instead.
    pub preview: Option<String>,
}

/// Reports one lifecycle step on the control channel.
pub(super) fn report(step: &str, status: &str, detail: &str) {
    let line = format!("step {step} {status} {}\n", detail.replace('\n', " "));
    // fd 3 is the control channel when steward runs us; a hand run has none.
    let channel = std::env::var("STEWARD_CONTROL_FD")
        .ok()
        .filter(|fd| fd == "3")
        .and_then(|_| {
            std::fs::OpenOptions::new()
                .append(true)
                .open("/dev/fd/3")
                .ok()
        });
    match channel {
        Some(mut f) => {
            let _ = f.write_all(line.as_bytes());
        }
        None => eprint!("{line}"),
    }
}
