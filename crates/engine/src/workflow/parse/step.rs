//! A workflow's `[run]`, `[verify]` and `[commit]` steps: a command that exists and can run.

use super::*;

impl Validator<'_> {
    pub(super) fn step(
        &mut self,
        name: &str,
        raw: Option<RawStep>,
        root: &Path,
        is_commit: bool,
    ) -> Option<StepCommand> {
        let Some(raw) = raw else {
            self.missing(format!(
                "missing [{name}]: set {name}.command to the program to run"
            ));
            return None;
        };
        let span = raw.command.span();
        let mut argv = raw.command.into_inner();
        if argv.is_empty() || argv[0].is_empty() {
            self.err(span, format!("{name}.command is empty: give the program and its arguments, e.g. [\"scripts/{name}.sh\"]"));
            return None;
        }
        if argv[0].contains('/') {
            let program = root.join(&argv[0]);
            match std::fs::metadata(&program) {
                Ok(m) if m.is_file() && is_executable(&m) => {}
                Ok(_) => {
                    self.err(
                        span.clone(),
                        format!(
                            "{name}.command: {} is not an executable file (chmod +x?)",
                            program.display()
                        ),
                    );
                }
                Err(e) => {
                    self.err(
                        span.clone(),
                        format!("{name}.command: {}: {e}", program.display()),
                    );
                }
            }
            argv[0] = program.to_string_lossy().into_owned();
        }
        let timeout = match raw.timeout_s {
            Some(t) if !is_commit => {
                self.err(t.span(), format!("{name}.timeout_s is not allowed: run and verify are bounded by [budget] max_runtime_s"));
                None
            }
            Some(t) => self.seconds(&span, "commit.timeout_s", Some(t), true),
            None if is_commit => Some(Duration::from_secs_f64(DEFAULT_COMMIT_TIMEOUT_S)),
            None => None,
        };
        let usage_from = raw.usage_from.and_then(|u| {
            use crate::metering::agent_cli::UsageFrom;
            match (UsageFrom::parse(u.get_ref()), is_commit) {
                (_, true) => {
                    self.err(u.span(), "commit.usage_from is not allowed: only run and verify spend the budget");
                    None
                }
                (Some(f), false) => Some(f),
                (None, false) => {
                    self.err(
                        u.span(),
                        format!("{name}.usage_from: `{}` is not a format steward reads (expected \"claude-json\" for `claude -p --output-format json` or \"codex-jsonl\" for `codex exec --json`)", u.get_ref()),
                    );
                    None
                }
            }
        });
        Some(StepCommand {
            argv,
            timeout,
            usage_from,
        })
    }
}

fn is_executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o111 != 0
}
