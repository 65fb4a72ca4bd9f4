//! Reading a workflow file: the raw TOML shape, then every rule it must meet — each
//! error naming the file, line and column and what was expected.
//!
//! Strict on purpose: an unknown key is an error (a typo must not silently disable a
//! guard), a workflow without `[verify]` is rejected, every budget cap is a concrete
//! non-negative number, and the idempotency key template must compile.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use toml::Spanned;

use crate::budget::Caps;
pub use crate::schedule::ScheduleTrigger;
use crate::schedule::{Schedule, ScheduleError};
use crate::template;

use super::file::{line_col, parse_toml, read_bytes, valid_id, ConfigError};
use super::types::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrigger {
    #[serde(default)]
    manual: Option<bool>,
    #[serde(default)]
    schedule: Option<Spanned<RawSchedule>>,
    #[serde(default)]
    file: Option<Spanned<FileTrigger>>,
    #[serde(default)]
    queue: Option<Spanned<String>>,
    #[serde(default)]
    webhook: Option<Spanned<WebhookTrigger>>,
    #[serde(default)]
    after: Option<Spanned<RawAfter>>,
}

/// `after = { workflow = "…" | all = […], on = […] }`, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAfter {
    #[serde(default)]
    workflow: Option<String>,
    #[serde(default)]
    all: Option<Vec<String>>,
    #[serde(default)]
    on: Option<Vec<super::types::Outcome>>,
}

/// `schedule = { … }` with each value's place in the file, so an error points at it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule {
    cron: Spanned<String>,
    #[serde(default)]
    timezone: Option<Spanned<String>>,
    #[serde(default)]
    catchup: Option<Spanned<String>>,
    #[serde(default)]
    catchup_window_s: Option<u64>,
    #[serde(default)]
    jitter: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    max_tokens: Option<Spanned<i64>>,
    max_tool_calls: Option<Spanned<i64>>,
    max_runtime_s: Option<Spanned<f64>>,
    max_cost_usd: Option<Spanned<f64>>,
    #[serde(default)]
    stall_timeout_s: Option<Spanned<f64>>,
    #[serde(default)]
    kill_grace_s: Option<Spanned<f64>>,
    /// Memory the maker's (or checker's) processes may use together: bytes, or "512M".
    #[serde(default)]
    memory_max: Option<Spanned<toml::Value>>,
    #[serde(default)]
    pids_max: Option<Spanned<i64>>,
    #[serde(default)]
    cpu_weight: Option<Spanned<i64>>,
    /// `[budget.window]`: spend over a rolling period, across runs.
    #[serde(default)]
    window: Option<Spanned<RawWindow>>,
}

/// `[budget.window]`: the sums over every run of the workflow in the last `period`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    period: Spanned<String>,
    #[serde(default)]
    cost_usd: Option<Spanned<f64>>,
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    runs: Option<u64>,
}

/// `[expect]`: the dead-man's switch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    #[serde(default)]
    within: Option<Spanned<String>>,
    #[serde(default)]
    at_least: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    command: Spanned<Vec<String>>,
    #[serde(default)]
    timeout_s: Option<Spanned<f64>>,
    #[serde(default)]
    usage_from: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkflow {
    id: Spanned<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(default)]
    idempotency_key: Option<Spanned<String>>,
    #[serde(default)]
    overlap: Option<Overlap>,
    /// Working folder of every step, relative to the config folder (default: the config folder).
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    trigger: Option<Spanned<RawTrigger>>,
    #[serde(default)]
    budget: Option<Spanned<RawBudget>>,
    #[serde(default)]
    run: Option<RawStep>,
    #[serde(default)]
    verify: Option<RawStep>,
    #[serde(default)]
    commit: Option<RawStep>,
    #[serde(default)]
    retry: Option<Retry>,
    #[serde(default)]
    env: BTreeMap<String, EnvValue>,
    #[serde(default)]
    sandbox: Option<super::sandbox::SandboxSettings>,
    #[serde(default)]
    breaker: Option<Spanned<RawBreaker>>,
    #[serde(default)]
    expect: Option<Spanned<RawExpect>>,
    #[serde(default)]
    gateway: Option<Spanned<RawGateway>>,
}

/// `[gateway]`: the providers and models a workflow's steps may call.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGateway {
    providers: Vec<Spanned<String>>,
    models: Spanned<Vec<String>>,
}

/// `[breaker]`: pause the workflow after this many failing runs in a row.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    after: u32,
}

/// Loads and validates one workflow file. `root` is the config folder that relative
/// command paths and `cwd` resolve against.
pub fn load_file(root: &Path, file: &Path) -> Result<Workflow, Vec<ConfigError>> {
    parse_workflow(root, file, read_bytes(file).map_err(|e| vec![e])?)
}

/// Parses and validates a workflow file's bytes; `file` only names it in errors.
/// Never panics, whatever the bytes (a fuzz target holds it to that).
pub fn parse_workflow(
    root: &Path,
    file: &Path,
    bytes: Vec<u8>,
) -> Result<Workflow, Vec<ConfigError>> {
    let (raw, (text, bytes)) = parse_toml::<RawWorkflow>(file, bytes).map_err(|e| vec![e])?;
    let mut v = Validator {
        file,
        text: &text,
        errors: Vec::new(),
    };
    let wf = v.workflow(root, raw, hex::encode(Sha256::digest(&bytes)));
    match wf {
        Some(wf) if v.errors.is_empty() => Ok(wf),
        _ => Err(v.errors),
    }
}

struct Validator<'a> {
    file: &'a Path,
    text: &'a str,
    errors: Vec<ConfigError>,
}

impl Validator<'_> {
    fn err(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = line_col(self.text, span.start);
        self.errors.push(ConfigError {
            file: self.file.to_path_buf(),
            line,
            column,
            message: message.into(),
        });
    }

    /// An error about something absent: points at the end of the file.
    fn missing(&mut self, message: impl Into<String>) {
        let end = self.text.len();
        self.err(end..end, message);
    }

    fn workflow(&mut self, root: &Path, raw: RawWorkflow, config_hash: String) -> Option<Workflow> {
        let id = raw.id.get_ref().clone();
        if !valid_id(&id) {
            self.err(
                raw.id.span(),
                format!("id `{id}` is not allowed: use 1-64 of a-z, 0-9, `-`, `_`, starting with a letter or digit"),
            );
        }
        if let Some(key) = &raw.idempotency_key {
            if let Err(e) = template::check(key.get_ref()) {
                self.err(
                    key.span(),
                    format!("idempotency_key is not a valid template: {e}"),
                );
            }
        }
        let trigger = self.trigger(raw.trigger);
        let limits = raw
            .budget
            .as_ref()
            .map(|b| self.limits(b))
            .unwrap_or_default();
        let spend_window = raw
            .budget
            .as_ref()
            .and_then(|b| b.get_ref().window.as_ref())
            .and_then(|w| self.window(w));
        let caps = self.budget(raw.budget);
        let cwd = match &raw.cwd {
            Some(c) => root.join(c),
            None => root.to_path_buf(),
        };
        let run = self.step("run", raw.run, root, false);
        let verify = match raw.verify {
            Some(step) => self.step("verify", Some(step), root, false),
            None => {
                self.missing("missing [verify]: every workflow needs a separate checker (verify.command) before it can run");
                None
            }
        };
        let commit = raw
            .commit
            .and_then(|s| self.step("commit", Some(s), root, true));
        let retry = raw.retry.unwrap_or_default();
        if retry.attempts == 0 {
            self.missing("retry.attempts must be at least 1 (it counts the first attempt)");
        }
        if !(retry.base.is_finite()
            && retry.base >= 0.0
            && retry.max.is_finite()
            && retry.max >= 0.0)
        {
            self.missing("retry.base and retry.max must be non-negative numbers of seconds");
        }
        for (name, value) in &raw.env {
            if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                || name.starts_with("STEWARD_")
            {
                self.missing(format!(
                    "env.{name}: names are letters, digits and `_`, and STEWARD_* is reserved"
                ));
            }
            if let EnvValue::Literal {
                secret: true,
                value,
            } = value
            {
                if let Some(why) = crate::redact::too_short(&format!("env.{name}"), value) {
                    self.missing(why);
                }
                // Allowed, but a secret belongs in the environment, not in a file in git.
                tracing::warn!(file = %self.file.display(), "env.{name} holds a secret literal: prefer {{ from_env = \"VAR\" }}");
            }
        }
        // Queue items and dropped files can be replayed after a crash, webhooks
        // redelivered; their natural key keeps a replay from committing twice.
        let idempotency_key =
            raw.idempotency_key
                .map(|k| k.into_inner())
                .or_else(|| match &trigger {
                    Some(Trigger::Queue { .. }) => Some("{{ trigger.item_id }}".to_string()),
                    Some(Trigger::File(_)) => Some("{{ trigger.sha256 }}".to_string()),
                    // A provider redelivers until it hears back: its delivery id (or the
                    // hash of what was signed) keeps a redelivery from committing twice.
                    Some(Trigger::Webhook(_)) => Some("{{ trigger.delivery_id }}".to_string()),
                    // A follower fires once per upstream run (or set of them, fan-in).
                    Some(Trigger::After(_)) => Some("{{ trigger.upstream_ids }}".to_string()),
                    _ => None,
                });
        let sandbox_own = raw.sandbox.unwrap_or_default();
        let breaker_after = raw.breaker.map(|b| {
            if b.get_ref().after == 0 {
                self.err(
                    b.span(),
                    "breaker.after must be at least 1 (runs failing in a row before the workflow is paused)",
                );
            }
            b.into_inner().after
        });
        let expect = raw.expect.and_then(|e| self.expect(e, trigger.as_ref()));
        let gateway = raw.gateway.and_then(|g| self.gateway(g));
        Some(Workflow {
            id,
            description: raw.description.unwrap_or_default(),
            dry_run: raw.dry_run.unwrap_or(true),
            idempotency_key,
            overlap: raw.overlap.unwrap_or_default(),
            trigger: trigger?,
            caps: caps?,
            limits,
            run: run?,
            verify: verify?,
            commit,
            retry,
            env: raw.env,
            cwd,
            file: self.file.to_path_buf(),
            config_hash,
            breaker_after,
            spend_window,
            expect,
            agent: None,
            sandbox: super::sandbox::Sandbox::layered(&Default::default(), &sandbox_own, root),
            sandbox_own,
            gateway,
        })
    }

    fn gateway(&mut self, raw: Spanned<RawGateway>) -> Option<super::gateway::GatewayUse> {
        use crate::metering::meter::Provider;
        let span = raw.span();
        let raw = raw.into_inner();
        let mut providers = Vec::new();
        for p in &raw.providers {
            match p.get_ref().as_str() {
                "openai" => providers.push(Provider::Openai),
                "anthropic" => providers.push(Provider::Anthropic),
                other => self.err(
                    p.span(),
                    format!("gateway.providers: `{other}` is not a provider the gateway speaks (expected \"openai\" or \"anthropic\")"),
                ),
            }
        }
        providers.dedup();
        if raw.providers.is_empty() {
            self.err(
                span.clone(),
                "gateway.providers: name at least one (\"openai\", \"anthropic\")",
            );
        }
        let models_span = raw.models.span();
        let models = raw.models.into_inner();
        if models.is_empty() || models.iter().any(|m| m.trim().is_empty()) {
            self.err(
                models_span,
                "gateway.models: list the model names its steps may call, e.g. [\"gpt-4o-mini\"]",
            );
            return None;
        }
        Some(super::gateway::GatewayUse::new(providers, models))
    }

    fn trigger(&mut self, raw: Option<Spanned<RawTrigger>>) -> Option<Trigger> {
        let Some(raw) = raw else {
            return Some(Trigger::Manual);
        };
        let span = raw.span();
        let t = raw.into_inner();
        let mut kinds = Vec::new();
        if t.manual == Some(true) {
            kinds.push(Trigger::Manual);
        }
        if let Some(s) = t.schedule {
            kinds.push(Trigger::Schedule(self.schedule(s)));
        }
        if let Some(f) = t.file {
            let span = f.span();
            let f = f.into_inner();
            if let Err(e) = globset::Glob::new(&f.pattern) {
                self.err(
                    span,
                    format!("trigger.file.pattern `{}` is not a glob: {e}", f.pattern),
                );
            }
            kinds.push(Trigger::File(f));
        }
        if let Some(q) = t.queue {
            if !valid_id(q.get_ref()) {
                self.err(
                    q.span(),
                    format!(
                        "trigger.queue `{}` is not a valid queue name (a-z, 0-9, `-`, `_`)",
                        q.get_ref()
                    ),
                );
            }
            kinds.push(Trigger::Queue {
                queue: q.into_inner(),
            });
        }
        if let Some(w) = t.webhook {
            let span = w.span();
            let w = w.into_inner();
            if !w.path.starts_with('/') {
                self.err(span, "trigger.webhook.path must start with `/`");
            }
            kinds.push(Trigger::Webhook(w));
        }
        if let Some(a) = t.after {
            kinds.extend(self.after(a).map(Trigger::After));
        }
        match kinds.len() {
            1 => kinds.pop(),
            0 => {
                self.err(
                    span,
                    "[trigger] needs exactly one of: schedule, file, queue, webhook, after, manual = true",
                );
                None
            }
            _ => {
                self.err(span, "[trigger] has more than one kind: a workflow has exactly one trigger (schedule, file, queue, webhook, after or manual)");
                None
            }
        }
    }

    /// `after`: one upstream workflow, or `all` of several; `on` some outcomes.
    fn after(&mut self, raw: Spanned<RawAfter>) -> Option<super::types::AfterTrigger> {
        use super::types::{AfterTrigger, Outcome};
        let span = raw.span();
        let raw = raw.into_inner();
        let (upstream, all) = match (raw.workflow, raw.all) {
            (Some(w), None) => (vec![w], false),
            (None, Some(list)) if list.len() >= 2 => (list, true),
            (None, Some(_)) => {
                self.err(
                    span,
                    "trigger.after.all: list two workflows or more (one is `workflow = \"…\"`)",
                );
                return None;
            }
            _ => {
                self.err(span, "trigger.after: name the workflow it follows, `workflow = \"fetch\"`, or several with `all = [\"a\", \"b\"]` (not both)");
                return None;
            }
        };
        if let Some(bad) = upstream.iter().find(|u| !valid_id(u)) {
            self.err(
                span,
                format!("trigger.after: `{bad}` is not a workflow id (a-z, 0-9, `-`, `_`)"),
            );
            return None;
        }
        let on = raw.on.unwrap_or_else(|| vec![Outcome::Success]);
        if on.is_empty() {
            self.err(span, "trigger.after.on: name at least one of \"success\", \"failure\", \"any\" (default [\"success\"])");
            return None;
        }
        Some(AfterTrigger { upstream, all, on })
    }

    /// The schedule, each error at the value it is about.
    fn schedule(&mut self, raw: Spanned<RawSchedule>) -> ScheduleTrigger {
        let span = raw.span();
        let raw = raw.into_inner();
        let spec = ScheduleTrigger {
            cron: raw.cron.get_ref().clone(),
            timezone: raw.timezone.as_ref().map(|t| t.get_ref().clone()),
            catchup: raw.catchup.as_ref().map(|c| c.get_ref().clone()),
            catchup_window_s: raw.catchup_window_s,
            jitter: raw.jitter.as_ref().map(|j| j.get_ref().clone()),
        };
        if let Err(e) = Schedule::parse(&spec) {
            let at = match &e {
                ScheduleError::Cron(_) | ScheduleError::NeverFires(_) => raw.cron.span(),
                ScheduleError::Timezone(_) => raw.timezone.map_or(span, |t| t.span()),
                ScheduleError::Catchup(_) => raw.catchup.map_or(span, |c| c.span()),
                ScheduleError::Jitter(_) => raw.jitter.map_or(span, |j| j.span()),
            };
            self.err(at, e.to_string());
        }
        spec
    }
}

mod budget;
mod step;
