//! A workflow as steward runs it, once its file was read and checked
//! ([`super::parse`]): one TOML file per workflow under `config/workflows/`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::budget::Caps;
use crate::schedule::Schedule;
pub use crate::schedule::ScheduleTrigger;

/// What a fire does while the workflow's previous run is still active (Temporal's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    #[default]
    Skip,
    BufferOne,
    BufferAll,
    CancelOther,
    AllowAll,
}

/// The one trigger kind a workflow has.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Trigger {
    Manual,
    Schedule(ScheduleTrigger),
    File(FileTrigger),
    Queue {
        queue: String,
    },
    Webhook(WebhookTrigger),
    /// Another workflow's run ended (see [`AfterTrigger`]).
    After(AfterTrigger),
}

impl Trigger {
    pub fn kind(&self) -> &'static str {
        match self {
            Trigger::Manual => "manual",
            Trigger::Schedule(_) => "schedule",
            Trigger::File(_) => "file",
            Trigger::Queue { .. } => "queue",
            Trigger::Webhook(_) => "webhook",
            Trigger::After(_) => "after",
        }
    }

    /// The `after` trigger, if this is one.
    pub fn after(&self) -> Option<&AfterTrigger> {
        match self {
            Trigger::After(a) => Some(a),
            _ => None,
        }
    }
}

/// `after = { workflow = "fetch", on = ["success"] }`: fired by each run of `fetch` that
/// ends in one of `on` (several followers of one workflow each fire: a fan-out).
/// `after = { all = ["fetch-a", "fetch-b"] }`: fired once every one of them has a run
/// ending in `on` newer than this workflow's last fire by them (a fan-in).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AfterTrigger {
    /// The workflows whose runs fire this one.
    pub upstream: Vec<String>,
    /// All of them (fan-in), or the one.
    pub all: bool,
    pub on: Vec<Outcome>,
}

impl AfterTrigger {
    /// Whether a run of upstream `workflow` that ended `state` counts.
    pub fn fired_by(&self, workflow: &str, state: crate::store::RunState) -> bool {
        self.upstream.iter().any(|u| u == workflow) && self.on.iter().any(|o| o.matches(state))
    }

    /// `fetch (success)`, `all of a, b (success, failure)`: who it follows, as a person
    /// reads it.
    pub fn describe(&self) -> String {
        let on: Vec<&str> = self.on.iter().map(|o| o.name()).collect();
        let who = if self.all {
            format!("all of {}", self.upstream.join(", "))
        } else {
            self.upstream.join(", ")
        };
        format!("{who} ({})", on.join(", "))
    }
}

/// How an upstream run ended, as an `after` trigger's `on` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It succeeded (committed, or ran dry to its end).
    Success,
    /// It failed, exhausted its budget or stagnated: it was dead-lettered.
    Failure,
    /// Either of those, or a clean no-op.
    Any,
}

impl Outcome {
    pub fn matches(self, state: crate::store::RunState) -> bool {
        use crate::store::RunState as S;
        let failure = matches!(state, S::Failed | S::Exhausted | S::Stagnated);
        match self {
            Outcome::Success => state == S::Success,
            Outcome::Failure => failure,
            Outcome::Any => failure || matches!(state, S::Success | S::CleanNoOp),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Any => "any",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileTrigger {
    pub path: String,
    #[serde(default = "default_pattern")]
    pub pattern: String,
    #[serde(default)]
    pub debounce_ms: Option<u64>,
}

fn default_pattern() -> String {
    "*".to_string()
}

#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookTrigger {
    pub path: String,
    pub secret_env: String,
    #[serde(default)]
    pub max_body_bytes: Option<u64>,
    /// Whose signature scheme the endpoint checks: steward (default), github, stripe,
    /// standard (Standard Webhooks).
    #[serde(default)]
    pub format: crate::workflow::webhook::Format,
}

/// `[retry]`: how often a `failed` or `stagnated` run is tried again, and how long to wait.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// Total attempts, the first included (1 = no retry).
    pub attempts: u32,
    #[serde(default)]
    pub backoff: Backoff,
    /// Seconds before the first retry.
    #[serde(default = "default_retry_base")]
    pub base: f64,
    /// Longest wait between attempts, in seconds.
    #[serde(default = "default_retry_max")]
    pub max: f64,
}

fn default_retry_base() -> f64 {
    1.0
}
fn default_retry_max() -> f64 {
    300.0
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 1,
            backoff: Backoff::Fixed,
            base: default_retry_base(),
            max: default_retry_max(),
        }
    }
}

impl Retry {
    /// The wait before attempt `next_attempt` (2 for the first retry).
    pub fn delay_before(&self, next_attempt: u32) -> Duration {
        let secs = match self.backoff {
            Backoff::Fixed => self.base,
            Backoff::Exponential => {
                let exp = next_attempt.saturating_sub(2).min(30);
                self.base * f64::from(1u32 << exp)
            }
        };
        Duration::from_secs_f64(secs.min(self.max).max(0.0))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    #[default]
    Fixed,
    Exponential,
}

/// One entry of a workflow's `[env]` table: a literal, or a value looked up in steward's
/// own environment (`{ from_env = "NAME" }`, secret unless `secret = false`).
#[derive(Debug, Clone, PartialEq)]
pub enum EnvValue {
    Literal { value: String, secret: bool },
    FromEnv { var: String, secret: bool },
}

impl EnvValue {
    pub fn is_secret(&self) -> bool {
        match self {
            EnvValue::Literal { secret, .. } | EnvValue::FromEnv { secret, .. } => *secret,
        }
    }
}

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Spec {
            value: Option<String>,
            from_env: Option<String>,
            secret: Option<bool>,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EnvValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, or a table { value = \"…\" } or { from_env = \"VAR\" } with optional secret = true|false")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<EnvValue, E> {
                Ok(EnvValue::Literal {
                    value: v.to_string(),
                    secret: false,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<EnvValue, A::Error> {
                let spec = Spec::deserialize(de::value::MapAccessDeserializer::new(map))?;
                match (spec.value, spec.from_env) {
                    (Some(value), None) => Ok(EnvValue::Literal {
                        value,
                        secret: spec.secret.unwrap_or(false),
                    }),
                    (None, Some(var)) => Ok(EnvValue::FromEnv {
                        var,
                        secret: spec.secret.unwrap_or(true),
                    }),
                    _ => Err(de::Error::custom(
                        "an env entry needs exactly one of `value` or `from_env`",
                    )),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A step command, resolved: `argv[0]` made absolute when it is a path.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepCommand {
    pub argv: Vec<String>,
    /// Only `[commit]` may set one; run and verify are bounded by the budget.
    pub timeout: Option<Duration>,
    /// `usage_from`: the step is an agent CLI whose stdout tells what it spent (a second
    /// meter beside the gateway's; run and verify only).
    #[serde(default)]
    pub usage_from: Option<crate::metering::agent_cli::UsageFrom>,
}

/// A validated workflow, ready to run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Workflow {
    pub id: String,
    pub description: String,
    /// What the file asks for; going live also needs an operator's approval of this exact file.
    pub dry_run: bool,
    pub idempotency_key: Option<String>,
    pub overlap: Overlap,
    pub trigger: Trigger,
    pub caps: Caps,
    pub run: StepCommand,
    pub verify: StepCommand,
    pub commit: Option<StepCommand>,
    pub retry: Retry,
    #[serde(skip)]
    pub env: BTreeMap<String, EnvValue>,
    pub cwd: PathBuf,
    pub file: PathBuf,
    /// sha256 of the file's bytes: what a go-live approval is bound to.
    pub config_hash: String,
    /// `[breaker] after = N`: paused after N runs in a row end failed, exhausted or
    /// stagnated (see [`crate::governed::pause`]).
    pub breaker_after: Option<u32>,
    /// `[budget.window]`: spend across the runs of a rolling period.
    pub spend_window: Option<SpendWindow>,
    /// `[expect]`: when a successful run is due (the dead-man's switch).
    pub expect: Option<Expect>,
    /// Set when this workflow is a digest agent's run (see [`crate::agent`]).
    pub agent: Option<String>,
    /// `memory_max`, `pids_max`, `cpu_weight` of its `[budget]`: the maker's and checker's
    /// cgroup caps.
    pub limits: crate::limits::Limits,
    /// The file's own `[sandbox]` table, as written.
    #[serde(skip)]
    pub sandbox_own: super::sandbox::SandboxSettings,
    /// What its maker and checker may touch: `sandbox_own` over steward.toml's default.
    pub sandbox: super::sandbox::Sandbox,
    /// `[gateway]`: its maker and checker call models through the metered gateway.
    pub gateway: Option<super::gateway::GatewayUse>,
}

impl Workflow {
    /// The workflow's schedule, if it has one (its config was validated at load).
    pub fn schedule(&self) -> Option<Schedule> {
        match &self.trigger {
            Trigger::Schedule(s) => Schedule::parse(s).ok().map(|s| s.for_workflow(&self.id)),
            _ => None,
        }
    }

    /// The next fire as `{"local", "utc", "timezone"}`, for `list` and `status`.
    pub fn next_fire_json(&self) -> Option<serde_json::Value> {
        self.schedule()?.next_fire_json()
    }
}

/// `[budget.window]`: when the sums over the runs of the last `period` reach any of the
/// limits given, the workflow is paused (reason `budget`) until an operator resumes it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SpendWindow {
    pub period: Duration,
    pub cost_usd: Option<f64>,
    pub tokens: Option<u64>,
    pub runs: Option<u64>,
}

/// `[expect]`: a schedule's successful run is due `within` of each slot; a file or queue
/// workflow's `at_least` (count, period) successful runs per period.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Expect {
    pub within: Option<Duration>,
    pub at_least: Option<(u32, Duration)>,
}

/// Default seconds a commit may take before it is killed (its key is then in doubt).
pub const DEFAULT_COMMIT_TIMEOUT_S: f64 = 300.0;
/// Default seconds between SIGTERM and SIGKILL when a step is stopped.
pub const DEFAULT_KILL_GRACE_S: f64 = 2.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_backoff_doubles_and_caps() {
        let r = Retry {
            attempts: 5,
            backoff: Backoff::Exponential,
            base: 1.0,
            max: 3.0,
        };
        assert_eq!(r.delay_before(2), Duration::from_secs(1));
        assert_eq!(r.delay_before(3), Duration::from_secs(2));
        assert_eq!(r.delay_before(4), Duration::from_secs(3));
    }
}
