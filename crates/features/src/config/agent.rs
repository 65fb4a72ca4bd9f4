//! Digest agent configs (`config/agents/*.toml`) and the source registry
//! (`config/sources.toml`), validated to the same standard as workflows.
//!
//! Each agent becomes a workflow: its schedule is the trigger, its three steps are steward
//! itself (`steward agent-step run|check|email AGENT`), so an agent run is a governed run
//! with a budget, runlog records, dead-letter and go-live like any other. The approval is
//! bound to the agent file, `sources.toml` and `steward.toml` together.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::budget::Caps;
use crate::workflow::file::{read_toml, toml_files, valid_id, ConfigError};
use crate::workflow::{Overlap, Retry, ScheduleTrigger, StepCommand, Trigger, Workflow};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cadence {
    Daily,
    Weekly,
    Biweekly,
    Monthly,
    Quarterly,
}

impl Cadence {
    pub fn name(self) -> &'static str {
        match self {
            Cadence::Daily => "daily",
            Cadence::Weekly => "weekly",
            Cadence::Biweekly => "biweekly",
            Cadence::Monthly => "monthly",
            Cadence::Quarterly => "quarterly",
        }
    }

    /// How long a missed run's marker stays worth running (DESIGN §5).
    pub fn expiry_days(self) -> u64 {
        match self {
            Cadence::Daily => 2,
            Cadence::Weekly => 8,
            Cadence::Biweekly => 15,
            Cadence::Monthly => 32,
            Cadence::Quarterly => 93,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFilter {
    #[serde(default)]
    pub topic_tags: Vec<String>,
    /// Sources with a tier number at or above this one are polled.
    #[serde(default)]
    pub min_tier: Option<u32>,
    #[serde(default)]
    pub max_items_per_source: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateOverrides {
    /// A line shown under the TL;DR ("why you care").
    #[serde(default)]
    pub why_you_care_extra: Option<String>,
    /// A minijinja template file (relative to the config folder) that may
    /// `{% extends "digest.md" %}` and override its blocks: `tldr`, `items`, `sources`.
    #[serde(default)]
    pub template: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// Gets the new items as JSON on stdin; prints `[{"item_id", "claim", "loadbearing"}]`.
    #[serde(default)]
    pub extract: Option<Vec<String>>,
    /// Gets one load-bearing claim as JSON on stdin; exit 0 verified, 1 refuted, else inconclusive.
    #[serde(default)]
    pub verify: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    agent_name: String,
    cadence: Cadence,
    #[serde(default)]
    schedule: Option<String>,
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    source_filter: SourceFilter,
    #[serde(default)]
    verify_loadbearing: bool,
    #[serde(default)]
    curate_findings: bool,
    #[serde(default)]
    digest_template_overrides: TemplateOverrides,
    #[serde(default)]
    claims: Claims,
    /// Days a missed run's marker stays worth running (default by cadence).
    #[serde(default)]
    expiry_days: Option<u64>,
    /// Email goes out only after `dry_run = false` and `steward go-live AGENT`.
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(default)]
    max_runtime_s: Option<u64>,
    /// Claim commands call models through the metered gateway (as a workflow's
    /// `[gateway]`).
    #[serde(default)]
    gateway: Option<RawAgentGateway>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgentGateway {
    providers: Vec<crate::metering::meter::Provider>,
    models: Vec<String>,
}

/// A validated agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    pub name: String,
    pub cadence: Cadence,
    pub schedule: Option<String>,
    pub timezone: Option<String>,
    pub source_filter: SourceFilter,
    pub verify_loadbearing: bool,
    pub curate_findings: bool,
    pub overrides: TemplateOverrides,
    pub claims: Claims,
    pub expiry_days: u64,
    pub file: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    Rss,
    Atom,
    Json,
    File,
    Command,
}

/// One entry of `config/sources.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub name: String,
    pub kind: SourceKind,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub topic_tags: Vec<String>,
    #[serde(default = "default_tier")]
    pub tier: u32,
    /// Seconds a fetch may take.
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

fn default_tier() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSources {
    #[serde(default)]
    source: Vec<Source>,
}

impl Source {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(
            self.timeout_s
                .filter(|t| t.is_finite() && *t > 0.0)
                .unwrap_or(20.0)
                .min(600.0),
        )
    }
}

impl Agent {
    /// The sources this agent polls, in registry order.
    pub fn sources<'a>(&self, registry: &'a [Source]) -> Vec<&'a Source> {
        registry
            .iter()
            .filter(|s| {
                self.source_filter.topic_tags.is_empty()
                    || s.topic_tags
                        .iter()
                        .any(|t| self.source_filter.topic_tags.contains(t))
            })
            .filter(|s| self.source_filter.min_tier.is_none_or(|m| s.tier >= m))
            .collect()
    }
}

/// Loads `sources.toml` and `agents/*.toml` under `root`; returns the agents, the
/// registry, and the workflows the agents become.
pub fn load(
    root: &Path,
    errors: &mut Vec<ConfigError>,
) -> (Vec<Agent>, Vec<Source>, Vec<Workflow>) {
    let mut sources = Vec::new();
    let sources_file = root.join("sources.toml");
    let mut shared_bytes = Vec::new();
    if sources_file.exists() {
        match read_toml::<RawSources>(&sources_file) {
            Ok((raw, (_, bytes))) => {
                shared_bytes.extend(bytes);
                let mut seen = BTreeMap::new();
                for s in raw.source {
                    if let Some(problem) = source_problem(&s) {
                        errors.push(ConfigError::whole_file(
                            &sources_file,
                            format!("source `{}`: {problem}", s.name),
                        ));
                    } else if seen.insert(s.name.clone(), ()).is_some() {
                        errors.push(ConfigError::whole_file(
                            &sources_file,
                            format!("source `{}` is defined twice", s.name),
                        ));
                    } else {
                        sources.push(s);
                    }
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if let Ok(bytes) = std::fs::read(root.join("steward.toml")) {
        shared_bytes.extend(bytes);
    }
    let mut agents = Vec::new();
    let mut workflows = Vec::new();
    let dir = root.join("agents");
    let files = match toml_files(&dir) {
        Ok(files) => files,
        Err(e) => {
            errors.push(ConfigError::whole_file(
                dir.to_path_buf(),
                format!("cannot read: {e}"),
            ));
            Vec::new()
        }
    };
    for file in files {
        let (raw, (text, bytes)) = match read_toml::<RawAgent>(&file) {
            Ok(v) => v,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if !valid_id(&raw.agent_name) {
            errors.push(ConfigError::at_key(
                &file,
                &text,
                "agent_name",
                format!(
                    "agent_name `{}` is not allowed: use 1-64 of a-z, 0-9, `-`, `_`",
                    raw.agent_name
                ),
            ));
            continue;
        }
        let agent = Agent {
            name: raw.agent_name.clone(),
            cadence: raw.cadence,
            schedule: raw.schedule.clone(),
            timezone: raw.timezone.clone(),
            source_filter: raw.source_filter,
            verify_loadbearing: raw.verify_loadbearing,
            curate_findings: raw.curate_findings,
            overrides: raw.digest_template_overrides,
            claims: raw.claims,
            expiry_days: raw.expiry_days.unwrap_or(raw.cadence.expiry_days()),
            file: file.clone(),
        };
        if agent.verify_loadbearing && agent.claims.verify.is_none() {
            errors.push(ConfigError::at_key(
                &file,
                &text,
                "verify_loadbearing",
                "verify_loadbearing = true needs [claims] verify = [\"command\", …]",
            ));
            continue;
        }
        if let Some(t) = &agent.overrides.template {
            if !root.join(t).is_file() {
                errors.push(ConfigError::at_key(
                    &file,
                    &text,
                    "digest_template_overrides.template",
                    format!(
                        "digest_template_overrides.template: {} not found",
                        root.join(t).display()
                    ),
                ));
                continue;
            }
        }
        let trigger = match &agent.schedule {
            None => Trigger::Manual,
            Some(cron) => {
                let s = ScheduleTrigger {
                    cron: cron.clone(),
                    timezone: agent.timezone.clone(),
                    catchup: None,
                    catchup_window_s: Some(agent.expiry_days * 86_400),
                    jitter: None,
                };
                if let Err(e) = crate::schedule::Schedule::parse(&s) {
                    let key = match e {
                        crate::schedule::ScheduleError::Timezone(_) => "timezone",
                        _ => "schedule",
                    };
                    errors.push(ConfigError::at_key(&file, &text, key, e.to_string()));
                    continue;
                }
                Trigger::Schedule(s)
            }
        };
        let mut hash = Sha256::new();
        hash.update(&bytes);
        hash.update(&shared_bytes);
        workflows.push(workflow_for(
            root,
            &agent,
            trigger,
            raw.dry_run.unwrap_or(true),
            raw.max_runtime_s,
            hex::encode(hash.finalize()),
            raw.gateway
                .map(|g| crate::workflow::gateway::GatewayUse::new(g.providers, g.models)),
        ));
        agents.push(agent);
    }
    (agents, sources, workflows)
}

fn source_problem(s: &Source) -> Option<String> {
    if !valid_id(&s.name) {
        return Some("name must be 1-64 of a-z, 0-9, `-`, `_`".into());
    }
    let given = [s.url.is_some(), s.path.is_some(), s.command.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if given != 1 {
        return Some("give exactly one of url, path or command".into());
    }
    match s.kind {
        SourceKind::Command if s.command.as_ref().is_none_or(|c| c.is_empty()) => {
            Some("kind = \"command\" needs command = [\"program\", …]".into())
        }
        SourceKind::File if s.path.is_none() => Some("kind = \"file\" needs path".into()),
        _ => match &s.url {
            Some(u) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                Some(format!("url `{u}` must start with http:// or https://"))
            }
            _ => None,
        },
    }
}

/// The governed workflow an agent runs as.
fn workflow_for(
    root: &Path,
    agent: &Agent,
    trigger: Trigger,
    dry_run: bool,
    max_runtime_s: Option<u64>,
    config_hash: String,
    gateway: Option<crate::workflow::gateway::GatewayUse>,
) -> Workflow {
    let exe = std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "steward".into());
    let step = |what: &str| StepCommand {
        argv: vec![
            exe.clone(),
            "agent-step".into(),
            what.into(),
            agent.name.clone(),
        ],
        timeout: None,
        usage_from: None,
    };
    Workflow {
        id: agent.name.clone(),
        description: format!(
            "{} digest agent ({} sources)",
            agent.cadence.name(),
            agent.source_filter.topic_tags.join(", ")
        ),
        dry_run,
        idempotency_key: None,
        overlap: Overlap::Skip,
        trigger,
        caps: Caps {
            // Claim commands may charge; fetching and writing cost nothing.
            max_tokens: 200_000,
            max_tool_calls: 1_000,
            max_runtime: Duration::from_secs(max_runtime_s.unwrap_or(900).clamp(1, 86_400)),
            max_cost_usd: 5.0,
            stall_timeout: None,
            kill_grace: Duration::from_secs(2),
        },
        run: step("run"),
        verify: step("check"),
        commit: Some(StepCommand {
            timeout: Some(Duration::from_secs(300)),
            ..step("email")
        }),
        retry: Retry::default(),
        breaker_after: None,
        spend_window: None,
        expect: None,
        env: BTreeMap::new(),
        cwd: root.to_path_buf(),
        file: agent.file.clone(),
        config_hash,
        agent: Some(agent.name.clone()),
        limits: Default::default(),
        // Its steps are steward's own code (fetching feeds, writing the vault), not a
        // maker to distrust.
        sandbox_own: crate::workflow::sandbox::SandboxSettings {
            enabled: Some(false),
            ..Default::default()
        },
        sandbox: crate::workflow::sandbox::Sandbox {
            enabled: false,
            ..Default::default()
        },
        gateway,
    }
}
