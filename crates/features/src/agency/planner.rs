//! The case's planner: asked for one move with the folded case on its stdin, its JSON
//! read as a [`Proposal`] (dispatch, resolve, escalate — or an action steward does not
//! know, refused by name).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::case::Case;

/// The planner's proposal, read from its JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum Proposal {
    Dispatch {
        member: String,
        task: String,
        needed_scope: Vec<String>,
    },
    Resolve {
        resolution: Value,
        reason: Option<String>,
    },
    Escalate {
        missing: String,
    },
    /// An `action` steward does not know (refused, naming it).
    Unknown(String),
}

impl Proposal {
    pub fn read(v: &Value) -> Proposal {
        let text = |k: &str| v[k].as_str().map(String::from);
        match v["action"].as_str().unwrap_or("") {
            "dispatch" => Proposal::Dispatch {
                member: text("member").unwrap_or_default(),
                task: text("task").unwrap_or_default(),
                needed_scope: v["needed_scope"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            "resolve" => Proposal::Resolve {
                resolution: v["resolution"].clone(),
                reason: text("reason"),
            },
            "escalate" => Proposal::Escalate {
                missing: text("missing").unwrap_or_else(|| "(unspecified)".into()),
            },
            other => Proposal::Unknown(other.to_string()),
        }
    }
}

/// The question an operator is asked before a dispatch that needs approval.
pub(super) fn prompt(case: &Case, proposal: &Value) -> String {
    format!(
        "Case {}: dispatch {} to \"{}\" needing {}? Approve with `steward case approve {}`.",
        case.case_id,
        proposal["member"].as_str().unwrap_or("?"),
        proposal["task"].as_str().unwrap_or(""),
        proposal["needed_scope"],
        case.case_id
    )
}

/// Why the planner gave no usable proposal.
#[derive(Debug, thiserror::Error)]
pub enum PlannerError {
    #[error(transparent)]
    Helper(#[from] crate::helper::HelperError),
    #[error("exited with {code}: {stderr}")]
    Exited { code: i32, stderr: String },
    #[error("the proposal is not JSON ({0})")]
    NotJson(serde_json::Error),
    #[error("the proposal is not a JSON object")]
    NotAnObject,
}

/// Asks the planner for one move: the folded case on its stdin, a JSON object out.
pub(super) async fn ask_planner(case: &Case, cwd: &Path) -> Result<Value, PlannerError> {
    let input = serde_json::to_vec(case).unwrap_or_default();
    let timeout = Duration::from_secs(case.agency.planner_timeout_s.unwrap_or(60));
    let out = crate::helper::run(&case.agency.planner, cwd, Some(&input), timeout).await?;
    if out.code != 0 {
        return Err(PlannerError::Exited {
            code: out.code,
            stderr: out.stderr.trim().to_string(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim()).map_err(PlannerError::NotJson)?;
    if !v.is_object() {
        return Err(PlannerError::NotAnObject);
    }
    Ok(v)
}
