//! What a workflow's steps get besides the context: the environment (steward's
//! allowlist, the workflow's `[env]`, the `STEWARD_*` variables) and the redactor that
//! masks its secrets in everything steward writes.

use std::path::Path;

use crate::redact::Redactor;
use crate::step::StepOutcome;
use crate::store::RunRecord;
use crate::workflow::{EnvValue, Workflow};

/// What a workflow's steps get besides the context: env and the redactor for its secrets.
pub(super) struct StepEnv {
    pub(super) vars: Vec<(String, String)>,
    pub(super) redactor: Redactor,
}

impl StepEnv {
    /// No variables and nothing to mask: for records of fires that ran nothing.
    pub(super) fn none() -> StepEnv {
        StepEnv {
            vars: Vec::new(),
            redactor: Redactor::default(),
        }
    }
}

/// Resolves the workflow's `[env]`; on failure returns why, with whatever redactor it has.
pub(super) fn step_env(wf: &Workflow) -> std::result::Result<StepEnv, (String, Redactor)> {
    let mut vars = crate::step::base_env();
    let mut secrets = Vec::new();
    let mut missing = Vec::new();
    for (name, value) in &wf.env {
        let v = match value {
            EnvValue::Literal { value, .. } => value.clone(),
            EnvValue::FromEnv { var, .. } => {
                match crate::secret::require(var, &format!("env.{name} needs ${var}, which")) {
                    Ok(v) => v,
                    Err(why) => {
                        missing.push(why.to_string());
                        continue;
                    }
                }
            }
        };
        if value.is_secret() {
            if let Some(why) = crate::redact::too_short(&format!("env.{name}"), &v) {
                missing.push(why);
                continue;
            }
            secrets.push((name.clone(), v.clone()));
        }
        vars.retain(|(k, _)| k != name);
        vars.push((name.clone(), v));
    }
    let redactor = Redactor::new(secrets);
    if !missing.is_empty() {
        return Err((missing.join("; "), redactor));
    }
    Ok(StepEnv { vars, redactor })
}

/// The full child environment for one attempt.
pub(super) fn step_vars(
    wf: &Workflow,
    rec: &RunRecord,
    env: &StepEnv,
    state_dir: &Path,
) -> Vec<(String, String)> {
    let mut vars = env.vars.clone();
    vars.extend([
        ("STEWARD_RUN_ID".to_string(), rec.run_id.clone()),
        ("STEWARD_WORKFLOW".to_string(), wf.id.clone()),
        (
            "STEWARD_DRY_RUN".to_string(),
            if rec.dry_run { "1" } else { "0" }.to_string(),
        ),
        ("STEWARD_ATTEMPT".to_string(), rec.attempt.to_string()),
        ("STEWARD_CONTROL_FD".to_string(), "3".to_string()),
        // The file sits in CONFIG/workflows/ or CONFIG/agents/.
        (
            "STEWARD_CONFIG_DIR".to_string(),
            wf.file
                .parent()
                .and_then(Path::parent)
                .unwrap_or(&wf.cwd)
                .to_string_lossy()
                .into_owned(),
        ),
        (
            "STEWARD_STATE_DIR".to_string(),
            std::path::absolute(state_dir)
                .unwrap_or_else(|_| state_dir.to_path_buf())
                .to_string_lossy()
                .into_owned(),
        ),
    ]);
    vars.extend(wf.caps.env());
    // Every step of the run shares one scratch folder (the only one a sandboxed step may
    // write), and its temporary files go there too.
    let scratch = scratch_dir(state_dir, &rec.run_id);
    vars.retain(|(k, _)| k != "TMPDIR");
    vars.push((
        "TMPDIR".to_string(),
        scratch.join("tmp").to_string_lossy().into_owned(),
    ));
    vars.push((
        "STEWARD_SCRATCH".to_string(),
        scratch.to_string_lossy().into_owned(),
    ));
    vars
}

/// A run's scratch folder: `STATE/scratch/RUN_ID`, removed when the run ends.
pub(super) fn scratch_dir(state_dir: &Path, run_id: &str) -> std::path::PathBuf {
    // Absolute: steps start in their own working folder, and a sandbox rule needs a path.
    std::path::absolute(state_dir)
        .unwrap_or_else(|_| state_dir.to_path_buf())
        .join("scratch")
        .join(run_id)
}

pub(super) fn scrub(out: &mut StepOutcome, r: &Redactor) {
    if r.is_empty() {
        return;
    }
    out.stdout = r.redact(&out.stdout).into_owned();
    out.stderr_tail = r.redact(&out.stderr_tail).into_owned();
    out.block = out.block.as_deref().map(|b| r.redact(b).into_owned());
    for s in out.notes.iter_mut().chain(out.malformed.iter_mut()) {
        *s = r.redact(s).into_owned();
    }
}
