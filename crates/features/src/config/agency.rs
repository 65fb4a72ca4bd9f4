//! Agency configs, `config/agencies/*.toml`: the mandate, the roster (each member, the
//! workflow it runs and its scope ceiling), the cumulative limits, the planner command,
//! which moves need approval, and the human to escalate to. All of it is operator
//! config: snapshotted into a case when it opens, never invented by the planner.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::workflow::file::{list_or_none, read_toml, toml_files, valid_id, ConfigError};
use crate::workflow::{ScheduleTrigger, Workflow};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    pub name: String,
    /// The workflow this member runs (its id).
    pub workflow: String,
    /// The scope ceiling: a dispatch may need these scopes and no others.
    #[serde(default)]
    pub scopes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_turns: u64,
    pub max_acts: u64,
    pub max_spend_usd: f64,
    /// `[limits.window]`: the agency's spend over all its cases in a rolling period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<LimitsWindow>,
}

/// `[limits.window]`: when the member runs of every case of the agency spent `spend_usd`
/// within the last `period`, no case takes a new turn (held, and `budget_window` alerted)
/// until the window has room again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsWindow {
    pub period: String,
    pub spend_usd: f64,
}

impl LimitsWindow {
    /// The period (validated when the config was loaded).
    pub fn period(&self) -> std::time::Duration {
        humantime::parse_duration(&self.period).unwrap_or(std::time::Duration::from_secs(86_400))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRules {
    /// Dispatches to these members wait for `steward case approve`.
    #[serde(default)]
    pub members: Vec<String>,
    /// Dispatches needing any of these scopes wait too.
    #[serde(default)]
    pub scopes: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgencyTrigger {
    #[serde(default)]
    pub schedule: Option<ScheduleTrigger>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agency {
    pub id: String,
    pub mandate: String,
    pub planner: Vec<String>,
    pub escalation_contact: String,
    pub limits: Limits,
    pub roster: Vec<Member>,
    #[serde(default)]
    pub approval: ApprovalRules,
    #[serde(default)]
    pub trigger: AgencyTrigger,
    /// Seconds the planner may take.
    #[serde(default)]
    pub planner_timeout_s: Option<u64>,
    #[serde(skip)]
    pub file: PathBuf,
}

/// Loads `agencies/*.toml`; a roster member must name a workflow of `workflows`. A
/// member whose workflow is in `broken` (its file failed to load, and says so itself) is
/// not reported again.
pub fn load(
    root: &Path,
    workflows: &BTreeMap<String, Workflow>,
    broken: &std::collections::BTreeSet<String>,
    errors: &mut Vec<ConfigError>,
) -> BTreeMap<String, Agency> {
    let mut out = BTreeMap::new();
    let files = match toml_files(&root.join("agencies")) {
        Ok(files) => files,
        Err(e) => {
            errors.push(ConfigError::whole_file(
                root.join("agencies").to_path_buf(),
                format!("cannot read: {e}"),
            ));
            Vec::new()
        }
    };
    for file in files {
        let (mut a, text): (Agency, String) = match read_toml(&file) {
            Ok((a, (text, _))) => (a, text),
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        a.file = file.clone();
        let at_key = |key: &str, message: String| ConfigError::at_key(&file, &text, key, message);
        let at_text =
            |needle: &str, message: String| ConfigError::at_text(&file, &text, needle, message);
        let mut problems = Vec::new();
        if !valid_id(&a.id) {
            problems.push(at_key(
                "id",
                format!(
                    "id `{}` is not allowed: use 1-64 of a-z, 0-9, `-`, `_`",
                    a.id
                ),
            ));
        }
        if a.planner.is_empty() {
            problems.push(at_key(
                "planner",
                "planner is empty: give the command that proposes the next move".into(),
            ));
        }
        if a.roster.is_empty() {
            problems.push(at_key(
                "roster",
                "roster is empty: an agency needs at least one [[roster]] member".into(),
            ));
        }
        if !(a.limits.max_spend_usd.is_finite() && a.limits.max_spend_usd >= 0.0) {
            problems.push(at_key(
                "limits.max_spend_usd",
                "limits.max_spend_usd must be zero or more".into(),
            ));
        }
        if let Some(w) = &a.limits.window {
            if !humantime::parse_duration(&w.period).is_ok_and(|p| !p.is_zero()) {
                problems.push(at_key(
                    "limits.window.period",
                    format!(
                        "limits.window.period: `{}` is not a duration (e.g. \"24h\", \"7days\")",
                        w.period
                    ),
                ));
            }
            if !(w.spend_usd.is_finite() && w.spend_usd >= 0.0) {
                problems.push(at_key(
                    "limits.window.spend_usd",
                    "limits.window.spend_usd must be zero or more".into(),
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for m in &a.roster {
            if !names.insert(m.name.clone()) {
                problems.push(at_text(
                    &format!("\"{}\"", m.name),
                    format!("roster member `{}` appears twice", m.name),
                ));
            }
            if !workflows.contains_key(&m.workflow) && !broken.contains(&m.workflow) {
                let mut known: Vec<&str> = workflows.keys().map(String::as_str).collect();
                known.truncate(20);
                problems.push(at_text(
                    &format!("\"{}\"", m.workflow),
                    format!(
                        "roster member `{}` runs workflow `{}`, which is not in the config (workflows: {})",
                        m.name,
                        m.workflow,
                        list_or_none(&known)
                    ),
                ));
            }
        }
        for m in &a.approval.members {
            if !names.contains(m) {
                problems.push(at_key(
                    "approval.members",
                    format!("approval.members names `{m}`, who is not on the roster"),
                ));
            }
        }
        if let Some(s) = &a.trigger.schedule {
            if let Err(e) = crate::schedule::Schedule::parse(s) {
                problems.push(at_key("trigger.schedule", e.to_string()));
            }
        }
        if problems.is_empty() {
            if out.contains_key(&a.id) {
                errors.push(ConfigError::whole_file(
                    file.clone(),
                    format!("agency `{}` is defined twice", a.id),
                ));
            } else {
                out.insert(a.id.clone(), a);
            }
        } else {
            errors.append(&mut problems);
        }
    }
    out
}
