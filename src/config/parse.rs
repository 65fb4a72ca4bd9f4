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
use crate::template;
pub use crate::trigger::schedule::ScheduleTrigger;
use crate::trigger::schedule::{Schedule, ScheduleError};

use super::file::{line_col, parse_toml, read_bytes, valid_id, ConfigError};
use super::workflow::*;

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
    on: Option<Vec<super::workflow::Outcome>>,
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
        use crate::gateway::meter::Provider;
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
    fn after(&mut self, raw: Spanned<RawAfter>) -> Option<super::workflow::AfterTrigger> {
        use super::workflow::{AfterTrigger, Outcome};
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

    fn budget(&mut self, raw: Option<Spanned<RawBudget>>) -> Option<Caps> {
        let Some(raw) = raw else {
            self.missing("missing [budget]: every workflow states max_tokens, max_tool_calls, max_runtime_s and max_cost_usd (use 0 for a resource it never uses)");
            return None;
        };
        let span = raw.span();
        let b = raw.into_inner();
        let before = self.errors.len();
        let tokens = self.count(&span, "max_tokens", b.max_tokens);
        let tool_calls = self.count(&span, "max_tool_calls", b.max_tool_calls);
        let runtime = self.seconds(&span, "max_runtime_s", b.max_runtime_s, true);
        let cost = self.amount(&span, "max_cost_usd", b.max_cost_usd);
        let stall = b
            .stall_timeout_s
            .map(|s| self.seconds(&span, "stall_timeout_s", Some(s), true));
        let grace = b
            .kill_grace_s
            .map(|s| self.seconds(&span, "kill_grace_s", Some(s), false));
        if self.errors.len() != before {
            return None;
        }
        Some(Caps {
            max_tokens: tokens?,
            max_tool_calls: tool_calls?,
            max_runtime: runtime?,
            max_cost_usd: cost?,
            stall_timeout: stall.flatten(),
            kill_grace: grace
                .flatten()
                .unwrap_or(Duration::from_secs_f64(DEFAULT_KILL_GRACE_S)),
        })
    }

    /// `[budget.window]`: a period and at least one sum to hold it to.
    fn window(&mut self, raw: &Spanned<RawWindow>) -> Option<SpendWindow> {
        let w = raw.get_ref();
        let period = match humantime::parse_duration(w.period.get_ref()) {
            Ok(p) if !p.is_zero() => Some(p),
            _ => {
                self.err(
                    w.period.span(),
                    format!(
                        "budget.window.period: `{}` is not a duration (e.g. \"24h\", \"7days\")",
                        w.period.get_ref()
                    ),
                );
                None
            }
        };
        let cost_usd = w.cost_usd.as_ref().map(|c| *c.get_ref());
        if let Some(c) = &w.cost_usd {
            if !(c.get_ref().is_finite() && *c.get_ref() >= 0.0) {
                self.err(
                    c.span(),
                    "budget.window.cost_usd must be a number zero or more",
                );
            }
        }
        if cost_usd.is_none() && w.tokens.is_none() && w.runs.is_none() {
            self.err(
                raw.span(),
                "[budget.window] needs at least one of cost_usd, tokens, runs (the sums it holds the workflow to)",
            );
            return None;
        }
        Some(SpendWindow {
            period: period?,
            cost_usd,
            tokens: w.tokens,
            runs: w.runs,
        })
    }

    /// `[expect] within` (a schedule's) and `at_least` (a file's or queue's).
    fn expect(&mut self, raw: Spanned<RawExpect>, trigger: Option<&Trigger>) -> Option<Expect> {
        let span = raw.span();
        let e = raw.into_inner();
        let within_at = e.within.as_ref().map_or(span.clone(), |w| w.span());
        let within = e
            .within
            .and_then(|w| match humantime::parse_duration(w.get_ref()) {
                Ok(d) if !d.is_zero() => Some(d),
                _ => {
                    self.err(
                        w.span(),
                        format!(
                            "expect.within: `{}` is not a duration (e.g. \"15m\", \"2h\")",
                            w.get_ref()
                        ),
                    );
                    None
                }
            });
        let at_least = e.at_least.and_then(|a| match parse_rate(a.get_ref()) {
            Some(r) => Some(r),
            None => {
                self.err(
                    a.span(),
                    format!("expect.at_least: `{}` is not a rate: expected COUNT/PERIOD, e.g. \"1/day\", \"4/hour\", \"2/12h\"", a.get_ref()),
                );
                None
            }
        });
        if within.is_some() && !matches!(trigger, Some(Trigger::Schedule(_))) {
            self.err(within_at, "expect.within is for a schedule (it counts from each slot); a file, queue or webhook workflow takes expect.at_least = \"1/day\"");
        }
        if within.is_none() && at_least.is_none() {
            self.err(
                span,
                "[expect] needs within = \"15m\" (a schedule) or at_least = \"1/day\"",
            );
            return None;
        }
        Some(Expect { within, at_least })
    }

    /// `memory_max`, `pids_max` and `cpu_weight` of `[budget]`: held by cgroups.
    fn limits(&mut self, raw: &Spanned<RawBudget>) -> crate::limits::Limits {
        let b = raw.get_ref();
        let mut limits = crate::limits::Limits::default();
        if let Some(v) = &b.memory_max {
            match memory_bytes(v.get_ref()) {
                Some(bytes) => limits.memory_max = Some(bytes),
                None => self.err(
                    v.span(),
                    "budget.memory_max: expected bytes (an integer) or a size like \"512M\" or \"2G\" (K, M, G: powers of 1024), at least 1M",
                ),
            }
        }
        if let Some(v) = &b.pids_max {
            match u64::try_from(*v.get_ref()) {
                Ok(n) if n >= 1 => limits.pids_max = Some(n),
                _ => self.err(
                    v.span(),
                    "budget.pids_max: expected a whole number of processes, at least 1",
                ),
            }
        }
        if let Some(v) = &b.cpu_weight {
            match u32::try_from(*v.get_ref()) {
                Ok(n) if (1..=10_000).contains(&n) => limits.cpu_weight = Some(n),
                _ => self.err(
                    v.span(),
                    "budget.cpu_weight: expected 1 to 10000 (100 is an ordinary share)",
                ),
            }
        }
        limits
    }

    fn count(&mut self, table: &Range<usize>, name: &str, v: Option<Spanned<i64>>) -> Option<u64> {
        let Some(v) = v else {
            self.err(
                table.clone(),
                format!(
                    "budget.{name} is missing: every cap is a concrete number (0 if never used)"
                ),
            );
            return None;
        };
        match u64::try_from(*v.get_ref()) {
            Ok(n) => Some(n),
            Err(_) => {
                self.err(
                    v.span(),
                    format!("budget.{name} must be zero or more, got {}", v.get_ref()),
                );
                None
            }
        }
    }

    fn amount(&mut self, table: &Range<usize>, name: &str, v: Option<Spanned<f64>>) -> Option<f64> {
        let Some(v) = v else {
            self.err(
                table.clone(),
                format!(
                    "budget.{name} is missing: every cap is a concrete number (0 if never used)"
                ),
            );
            return None;
        };
        let x = *v.get_ref();
        if x.is_finite() && x >= 0.0 {
            Some(x)
        } else {
            self.err(
                v.span(),
                format!("budget.{name} must be a number zero or more, got {x}"),
            );
            None
        }
    }

    fn seconds(
        &mut self,
        table: &Range<usize>,
        name: &str,
        v: Option<Spanned<f64>>,
        positive: bool,
    ) -> Option<Duration> {
        let Some(v) = v else {
            self.err(
                table.clone(),
                format!("budget.{name} is missing: every run is bounded in time"),
            );
            return None;
        };
        let x = *v.get_ref();
        // A year is far beyond any sane unattended step, and keeps Duration arithmetic safe.
        if x.is_finite() && (if positive { x > 0.0 } else { x >= 0.0 }) && x <= 31_536_000.0 {
            Some(Duration::from_secs_f64(x))
        } else {
            let want = if positive {
                "more than zero"
            } else {
                "zero or more"
            };
            self.err(
                v.span(),
                format!("{name} must be a number of seconds {want} (at most a year), got {x}"),
            );
            None
        }
    }

    fn step(
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
            use crate::gateway::agent_cli::UsageFrom;
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

/// `memory_max` as bytes: an integer, or a number with K, M or G (powers of 1024).
fn memory_bytes(v: &toml::Value) -> Option<u64> {
    let bytes = match v {
        toml::Value::Integer(n) => u64::try_from(*n).ok()?,
        toml::Value::String(s) => {
            let s = s.trim();
            let (number, unit) = match s.char_indices().last()? {
                (i, c) if c.is_ascii_alphabetic() => (&s[..i], c.to_ascii_uppercase()),
                _ => (s, 'B'),
            };
            let scale: u64 = match unit {
                'B' => 1,
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return None,
            };
            number.trim().parse::<u64>().ok()?.checked_mul(scale)?
        }
        _ => return None,
    };
    (bytes >= 1 << 20).then_some(bytes)
}

/// `"1/day"`, `"4/hour"`, `"2/12h"`: (count, period).
fn parse_rate(text: &str) -> Option<(u32, Duration)> {
    let (n, per) = text.split_once('/')?;
    let n: u32 = n.trim().parse().ok().filter(|n| *n > 0)?;
    let per = per.trim();
    let period = match per {
        "minute" => Duration::from_secs(60),
        "hour" => Duration::from_secs(3600),
        "day" => Duration::from_secs(86_400),
        "week" => Duration::from_secs(7 * 86_400),
        _ => humantime::parse_duration(per)
            .ok()
            .filter(|d| !d.is_zero())?,
    };
    Some((n, period))
}
