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
mod outcome;
mod pipes;
mod request;
mod supervise;
mod test_child;

pub use crate::process::Exit;
pub use launch::{reserve_control_fd, spawn_lock, Launcher, Processes, Spawn, Spawned};
pub use outcome::{Ending, StepOutcome};
pub use request::{Metered, Metering, StepKind, StepRequest};
pub use supervise::{run_step, STDERR_TAIL, STDOUT_CAP};
pub use test_child::{Script, Started, TestChild, TestLauncher};

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

#[cfg(test)]
mod tests;
