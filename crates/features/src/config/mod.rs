//! The config folder: workflows (`workflows/*.toml`), digest agents (`agents/*.toml` over
//! `sources.toml`), agencies (`agencies/*.toml`) and the daemon's `steward.toml`.
//!
//! [`load_dir`] reads all of it and reports every error of the folder, not just the
//! first, each naming file, line and column and what was expected.

pub mod after;
pub mod agency;
pub mod agent;
pub mod cluster;
pub mod dashboard;
pub mod notify;
pub mod settings;

// A workflow's own config is the engine's.
pub use crate::workflow::{file, gateway, parse, sandbox};
pub use crate::workflow::{types as workflow, *};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use settings::{RetentionSettings, Settings, Smtp, SmtpSecurity};

/// A workflow id the config does not have.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no workflow named `{id}` in {} (known: {})", .dir.display(), list_or_none(.known))]
pub struct UnknownWorkflow {
    pub id: String,
    pub dir: PathBuf,
    pub known: Vec<String>,
}

/// The variable an agent's steps find their config snapshot in.
pub const AGENT_SNAPSHOT_ENV: &str = "STEWARD_AGENT_SNAPSHOT";

/// What a digest agent's steps need of the config, as it was when the run was fired.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AgentSnapshot {
    pub root: PathBuf,
    pub settings: Settings,
    pub agent: agent::Agent,
    /// The sources the agent's filter selects.
    pub sources: Vec<agent::Source>,
}

impl AgentSnapshot {
    /// The config an agent step works from: its agent, its sources, the settings.
    pub fn into_config(self) -> Config {
        let mut agents = BTreeMap::new();
        agents.insert(self.agent.name.clone(), self.agent);
        Config {
            root: self.root,
            settings: self.settings,
            sources: self.sources,
            agents,
            ..Config::default()
        }
    }
}

/// Every workflow of a config folder, and the daemon settings.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub root: PathBuf,
    pub settings: Settings,
    pub workflows: BTreeMap<String, Workflow>,
    /// Digest agents by name; each also has a workflow of the same id.
    pub agents: BTreeMap<String, agent::Agent>,
    /// The source registry (`sources.toml`).
    pub sources: Vec<agent::Source>,
    /// Agencies by id.
    pub agencies: BTreeMap<String, agency::Agency>,
    /// The folder's [`fingerprint`] just before it was read.
    pub fingerprint: String,
}

impl Config {
    /// The folder holding the config folder: where relative vault and watch paths start.
    pub fn base(&self) -> PathBuf {
        self.root
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.root.clone())
    }

    pub fn vault(&self) -> PathBuf {
        match &self.settings.vault {
            Some(v) => self.base().join(v),
            None => self.base().join("vault"),
        }
    }

    pub fn workflow(&self, id: &str) -> Result<&Workflow, UnknownWorkflow> {
        self.workflows.get(id).ok_or_else(|| UnknownWorkflow {
            id: id.to_string(),
            dir: self.root.join("workflows"),
            known: self.workflows.keys().cloned().collect(),
        })
    }
}

/// What the config folder's TOML files look like on disk — each one's path, size,
/// modification time and inode — hashed. Equal fingerprints mean no file was edited,
/// added, removed or replaced; it costs a `stat` per file, no reads.
pub fn fingerprint(root: &Path) -> String {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::MetadataExt;
    let mut files = Vec::new();
    toml_tree(root, 0, &mut files);
    files.sort();
    let mut hash = Sha256::new();
    for path in files {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        hash.update(path.as_os_str().as_encoded_bytes());
        for n in [
            meta.len(),
            meta.mtime() as u64,
            meta.mtime_nsec() as u64,
            meta.ino(),
        ] {
            hash.update(n.to_le_bytes());
        }
    }
    format!("{:x}", hash.finalize())
}

/// The id a workflow file declares, read leniently (the file may be broken): its `id`
/// value, else its name without `.toml`.
fn declared_id(file: &Path) -> String {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .and_then(|t| t.get("id")?.as_str().map(str::to_string))
        .unwrap_or_else(|| {
            file.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
}

/// Every `*.toml` under `dir` (hidden names skipped, four levels at most).
fn toml_tree(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            if depth < 4 {
                toml_tree(&path, depth + 1, out);
            }
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

/// Loads every `*.toml` under `DIR/workflows/`, collecting all errors.
pub fn load_dir(root: &Path) -> Result<Config, Vec<ConfigError>> {
    // Steps run with the config folder as their working folder: resolve it once, absolutely.
    let root = &std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let dir = root.join("workflows");
    let mut errors = Vec::new();
    let mut config = Config {
        root: root.to_path_buf(),
        settings: Settings::default(),
        workflows: BTreeMap::new(),
        agents: BTreeMap::new(),
        sources: Vec::new(),
        agencies: BTreeMap::new(),
        // Taken before reading: an edit made while loading shows as a change later.
        fingerprint: fingerprint(root),
    };
    if let Some(settings) = load_settings(&root.join("steward.toml"), &mut errors) {
        config.settings = settings;
    }
    if !root.is_dir() {
        return Err(vec![ConfigError::whole_file(
            root,
            "config folder not found (pass --config DIR or create it)",
        )]);
    }
    let files = match toml_files(&dir) {
        Ok(files) => files,
        Err(e) => {
            return Err(vec![ConfigError::whole_file(
                &dir,
                format!("cannot read: {e}"),
            )])
        }
    };
    let (origin, broken) = load_workflows(root, files, &mut config, &mut errors);
    let (agents, sources, agent_workflows) = agent::load(root, &mut errors);
    for wf in agent_workflows {
        add_agent_workflow(&mut config, wf, &agents, &sources, &origin, &mut errors);
    }
    layer_over_settings(&mut config, &mut errors);
    config.agents = agents.into_iter().map(|a| (a.name.clone(), a)).collect();
    config.sources = sources;
    config.agencies = agency::load(root, &config.workflows, &broken, &mut errors);
    errors.extend(after::errors(&config.workflows, &broken));
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}

/// `steward.toml`, when there is one, with each of its problems at the key at fault.
fn load_settings(file: &Path, errors: &mut Vec<ConfigError>) -> Option<Settings> {
    if !file.exists() {
        return None;
    }
    let (s, text) = match read_toml::<Settings>(file) {
        Ok(read) => read,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    if let Some(problem) = s.dashboard.problem() {
        errors.push(ConfigError::at_key(
            file,
            &text.0,
            "dashboard.listen",
            problem,
        ));
    }
    errors.extend(notify_errors(file, &text.0, &s));
    if let Some(Err(problems)) = s.cluster.as_ref().map(|c| c.check()) {
        for (key, problem) in problems {
            errors.push(ConfigError::at_key(
                file,
                &text.0,
                &format!("cluster.{key}"),
                format!("cluster.{key}: {problem}"),
            ));
        }
    }
    for (key, problem) in s.gateway.problems() {
        let at = match key.as_str() {
            "listen" => "gateway.listen".to_string(),
            "base_url" => "base_url".to_string(),
            model => format!("gateway.pricing.{model}"),
        };
        errors.push(ConfigError::at_key(
            file,
            &text.0,
            &at,
            format!("gateway.{key}: {problem}"),
        ));
    }
    Some(s)
}

/// The workflow files into `config`: each id once, each queue read by one workflow.
/// Returns where each id came from, and the ids of the files that failed (their own
/// errors say why, once).
fn load_workflows(
    root: &Path,
    files: Vec<PathBuf>,
    config: &mut Config,
    errors: &mut Vec<ConfigError>,
) -> (
    BTreeMap<String, PathBuf>,
    std::collections::BTreeSet<String>,
) {
    let mut origin: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut broken = std::collections::BTreeSet::new();
    let mut queues: BTreeMap<String, String> = BTreeMap::new();
    for file in files {
        match load_file(root, &file) {
            Ok(wf) => {
                if let Some(first) = origin.get(&wf.id) {
                    errors.push(ConfigError::whole_file(
                        &file,
                        format!(
                            "duplicate workflow id `{}` (also in {})",
                            wf.id,
                            first.display()
                        ),
                    ));
                    continue;
                }
                if let Trigger::Queue { queue } = &wf.trigger {
                    if let Some(other) = queues.insert(queue.clone(), wf.id.clone()) {
                        errors.push(ConfigError::whole_file(
                            &file,
                            format!("queue `{queue}` is already consumed by workflow `{other}`: one workflow per queue"),
                        ));
                        continue;
                    }
                }
                origin.insert(wf.id.clone(), file.clone());
                config.workflows.insert(wf.id.clone(), wf);
            }
            Err(mut errs) => {
                broken.insert(declared_id(&file));
                errors.append(&mut errs);
            }
        }
    }
    (origin, broken)
}

/// A digest agent's workflow into `config`, carrying a snapshot of the config it was
/// loaded with; its id may not be a workflow file's.
fn add_agent_workflow(
    config: &mut Config,
    mut wf: Workflow,
    agents: &[agent::Agent],
    sources: &[agent::Source],
    origin: &BTreeMap<String, PathBuf>,
    errors: &mut Vec<ConfigError>,
) {
    if let Some(a) = agents.iter().find(|a| a.name == wf.id) {
        // The agent's steps work from the config it was fired with, not the folder's
        // state when they start: an unrelated broken file must not break them.
        let snapshot = AgentSnapshot {
            root: config.root.clone(),
            settings: config.settings.clone(),
            agent: a.clone(),
            sources: a.sources(sources).into_iter().cloned().collect(),
        };
        let value = serde_json::to_string(&snapshot).unwrap_or_default();
        wf.env.insert(
            AGENT_SNAPSHOT_ENV.to_string(),
            EnvValue::Literal {
                value,
                secret: false,
            },
        );
    }
    if let Some(other) = origin.get(&wf.id) {
        errors.push(ConfigError::whole_file(
            &wf.file,
            format!(
                "agent `{}` has the id of the workflow in {}: names must be unique",
                wf.id,
                other.display()
            ),
        ));
        return;
    }
    config.workflows.insert(wf.id.clone(), wf);
}

/// Each workflow's sandbox over steward.toml's default, and its gateway over the
/// settings' providers and prices (a model without a price is an error: fail closed).
fn layer_over_settings(config: &mut Config, errors: &mut Vec<ConfigError>) {
    let default = config.settings.sandbox.clone().unwrap_or_default();
    for wf in config.workflows.values_mut() {
        wf.sandbox = Sandbox::layered(&default, &wf.sandbox_own, &config.root);
        if let Some(g) = &mut wf.gateway {
            g.resolve(&config.settings.gateway);
            // Fail closed: a call whose cost cannot be priced cannot be held to the cap.
            let unpriced = g.unpriced();
            if !unpriced.is_empty() {
                errors.push(ConfigError::whole_file(
                    &wf.file,
                    format!(
                        "gateway.models: no [gateway.pricing] in steward.toml for {}: without a price its cost cannot be held to max_cost_usd (a free local model: input = 0, output = 0)",
                        unpriced.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
    }
}

/// Each `[[notify]]` table's problems, at the line of the key at fault in that table.
fn notify_errors(file: &Path, text: &str, s: &Settings) -> Vec<ConfigError> {
    let starts: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim().starts_with("[[notify]]"))
        .map(|(n, _)| n)
        .collect();
    let mut out = Vec::new();
    for (i, channel) in s.notify.iter().enumerate() {
        let from = starts.get(i).copied().unwrap_or(0);
        for (key, problem) in channel.problems(s.smtp.is_some()) {
            let line = text
                .lines()
                .enumerate()
                .skip(from + 1)
                .take_while(|(_, l)| !l.trim().starts_with('['))
                .find(|(_, l)| {
                    l.trim()
                        .strip_prefix(key)
                        .is_some_and(|r| r.trim_start().starts_with('='))
                })
                .map_or(from + 1, |(n, _)| n + 1);
            out.push(ConfigError {
                file: file.to_path_buf(),
                line,
                column: 1,
                message: format!("notify[{i}].{key}: {problem}"),
            });
        }
    }
    out
}
