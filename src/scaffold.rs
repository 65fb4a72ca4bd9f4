//! `steward new WORKFLOW`: a workflow skeleton laid out as the ten-section authoring
//! template of the workflow standard, verification first. The files it writes pass
//! `steward validate` and run (dry) as they are.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config;

/// Writes `workflows/ID.toml` and `scripts/ID/{run,verify,commit}.sh` under `config_dir`;
/// refuses to overwrite anything.
pub fn create(config_dir: &Path, id: &str) -> Result<Vec<PathBuf>> {
    if !config::valid_id(id) {
        bail!("`{id}` is not a valid workflow id: use 1-64 of a-z, 0-9, `-`, `_`, starting with a letter or digit");
    }
    let toml_path = config_dir.join("workflows").join(format!("{id}.toml"));
    let script_dir = config_dir.join("scripts").join(id);
    let files = [
        (toml_path.clone(), workflow_toml(id), false),
        (script_dir.join("run.sh"), RUN_SH.replace("{id}", id), true),
        (script_dir.join("verify.sh"), VERIFY_SH.to_string(), true),
        (
            script_dir.join("commit.sh"),
            COMMIT_SH.replace("{id}", id),
            true,
        ),
    ];
    for (path, _, _) in &files {
        if path.exists() {
            bail!(
                "{} already exists: pick another id or remove it first",
                path.display()
            );
        }
    }
    let mut written = Vec::new();
    for (path, text, executable) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        if executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
        written.push(path);
    }
    Ok(written)
}

fn workflow_toml(id: &str) -> String {
    format!(
        r#"# Workflow `{id}`, written as the ten sections of the workflow standard.
# Verification comes first: decide what a wrong output is before writing the maker.

id = "{id}"
description = "Say in one line what this workflow does"
# Dry-run until you set this to false AND an operator approves this exact file with
# `steward go-live {id}` (editing the file afterwards drops it back to dry-run). See (9).
dry_run = true

# (1) What a wrong output is
#     Write it down before anything else; the checker in (5) must catch each case.
#     - the output is not JSON, or lacks a "message" field
#     - the message is empty
#     - (add what "wrong" means for your job: stale data, a total that does not add up, …)

# (2) Trigger and idempotency key
#     One trigger kind. The key decides what counts as "the same fire": a re-fire with a
#     key that already committed is a clean no-op that starts no process.
idempotency_key = "{{{{ workflow }}}}:{{{{ trigger.fired_at | date }}}}"
overlap = "skip"          # skip | buffer_one | buffer_all | cancel_other | allow_all

[trigger]
manual = true
# schedule = {{ cron = "0 7 * * Mon", timezone = "Europe/Berlin" }}
# file = {{ path = "inbox/{id}", pattern = "*.json" }}
# queue = "{id}"
# webhook = {{ path = "/hooks/{id}", secret_env = "{env}_HOOK_SECRET" }}

# (3) The agents: the maker (run) here, a separate checker in (5); the maker never
#     approves its own output. Commands are argv arrays, resolved against the config folder.
[run]
command = ["scripts/{id}/run.sh"]

# (4) Budget caps, concrete numbers. Counted across run and verify of one attempt; a
#     breach kills the process group and ends the run `exhausted` (never retried).
[budget]
max_tokens = 20000
max_tool_calls = 30
max_runtime_s = 120
max_cost_usd = 0.25
stall_timeout_s = 60      # no tick, charge or output this long → stagnated

# (5) Verification logic, with its thresholds. verify.sh prints `pass`, `fail` or
#     `escalate` as its first line (or exits 0, 1 or 2):
#     pass     - the output has a non-empty "message"
#     fail     - the output is missing or malformed (the run is dead-lettered)
#     escalate - the output is well-formed but needs a person (it waits in review)
[verify]
command = ["scripts/{id}/verify.sh"]

# (6) State and logging: every step is a line in state/runlog.jsonl (`steward logs`),
#     every run a record in the store (`steward runs`, `steward show RUN`).

# (7) Errors and recovery: failed and stagnated runs are retried with backoff; what
#     still fails lands in the dead-letter queue (`steward dead-letter list`).
[retry]
attempts = 2
backoff = "exponential"
base = 5
max = 60

# (8) The runnable commands:
#     steward validate                 check this file
#     steward run {id}             a dry run (commit skipped)
#     steward logs --run RUN           what each step did
#     steward go-live {id}         after setting dry_run = false above

# (9) Deployment: the trigger in (2); dry_run at the top; secrets by env name only,
#     never their values in this file.
[env]
LEDGER = "../state/{id}.ledger"
# API_TOKEN = {{ from_env = "{env}_API_TOKEN" }}   # secret: redacted from every log

# (10) What it must never do unattended:
#     - send, publish, pay or delete anything outside the commit step below
#     - run live before an operator approved this exact file
#     - widen its own budget or retry an exhausted run
[commit]
command = ["scripts/{id}/commit.sh"]
timeout_s = 60
"#,
        env = id.to_uppercase().replace('-', "_"),
    )
}

const RUN_SH: &str = r#"#!/bin/sh
# The maker. Reads the run context (JSON) on stdin, prints its output on stdout.
# Report usage on fd 3 so the budget guard can stop a runaway:
#   echo "charge tokens 1200" >&3 ; echo "charge tool_calls 1" >&3 ; echo "tick" >&3
# Print {"noop": true} when there is nothing to do; `echo "block <reason>" >&3` when stuck.
set -eu
context=$(cat)
echo "charge tool_calls 1" >&3
echo "tick" >&3
printf '{"message": "hello from {id}", "context_bytes": %s}\n' "${#context}"
"#;

const VERIFY_SH: &str = r#"#!/bin/sh
# The checker. Gets the context with the maker's "output" on stdin.
# First stdout line: pass | fail | escalate (or exit 0 | 1 | 2).
set -eu
context=$(cat)
case "$context" in
  *'"message":"'?*) echo pass ;;
  *) echo fail; echo "output has no non-empty message" ;;
esac
"#;

const COMMIT_SH: &str = r#"#!/bin/sh
# The only side effect. Runs only when the workflow is live and verify said pass.
# Exit 0 = committed; non-zero = not committed (the run fails and may be retried).
set -eu
mkdir -p "$(dirname "$LEDGER")"
printf '%s committed run %s\n' "{id}" "$STEWARD_RUN_ID" >> "$LEDGER"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaffold_validates_and_has_ten_sections_verification_first() {
        let dir = tempfile::tempdir().unwrap();
        create(dir.path(), "demo-flow").unwrap();
        let cfg = config::load_dir(dir.path()).expect("scaffold must validate");
        let wf = &cfg.workflows["demo-flow"];
        assert!(wf.dry_run);
        let text = std::fs::read_to_string(dir.path().join("workflows/demo-flow.toml")).unwrap();
        let mut last = 0;
        for n in 1..=10 {
            let at = text
                .find(&format!("# ({n})"))
                .unwrap_or_else(|| panic!("section {n} missing"));
            assert!(at > last, "section {n} out of order");
            last = at;
        }
        assert!(
            text.find("# (1)").unwrap() < text.find("[run]").unwrap(),
            "wrong-output section must come first"
        );
        assert!(
            create(dir.path(), "demo-flow").is_err(),
            "must not overwrite"
        );
    }
}
