//! What every handler works against: the engine, the runner, the folders, and — in the
//! daemon — what only the daemon can say.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::api::Response;
use crate::config::{Config, ConfigError, Workflow};
use crate::governed::Engine;
use crate::runner::Runner;

/// What the running daemon lends the service.
pub trait Daemon: Send + Sync {
    /// The config as the folder holds it now (the daemon reloads first if it changed), or
    /// the errors of an edit it could not load.
    fn config(&self) -> anyhow::Result<Arc<Config>>;
    /// The config the daemon runs on, and what keeps a newer edit out.
    fn running_config(&self) -> RunningConfig;
    fn uptime(&self) -> Duration;
    fn webhook_listen(&self) -> Option<String>;
    /// Where the dashboard listens, if it does.
    fn dashboard_listen(&self) -> Option<String>;
    /// Puts an item on a queue and wakes the queue's trigger.
    fn enqueue(&self, queue: &str, payload: &Value) -> anyhow::Result<String>;
    /// A pause was lifted: runs the slots the schedule's catch-up policy owes for it.
    fn catch_up_after_pause(&self, wf: &Arc<Workflow>, pause: &crate::store::Pause);
    /// This daemon's membership of a cluster, if it has one.
    fn member(&self) -> Option<&crate::cluster::Member> {
        None
    }
}

/// The config a daemon runs on, when it was loaded, and the errors of a later edit that
/// could not be (empty when the folder and the daemon agree).
pub struct RunningConfig {
    pub config: Arc<Config>,
    pub loaded_at: chrono::DateTime<chrono::Utc>,
    pub errors: Vec<String>,
}

pub struct Service {
    pub engine: Engine,
    pub runner: Runner,
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    /// None in the CLI's own process.
    pub daemon: Option<Arc<dyn Daemon>>,
}

/// A handler's result: the response, or an error for a person.
pub(crate) type Handled = anyhow::Result<Response>;

impl Service {
    /// The config requests are answered against: the daemon's, or the folder's now.
    pub fn config(&self) -> anyhow::Result<Arc<Config>> {
        match &self.daemon {
            Some(d) => d.config(),
            None => Ok(Arc::new(load_config(&self.config_dir)?)),
        }
    }

    pub(crate) fn workflow(&self, config: &Config, id: &str) -> anyhow::Result<Arc<Workflow>> {
        Ok(Arc::new(config.workflow(id)?.clone()))
    }
}

/// Loads a config folder; every error is listed, with the hint to run `validate`.
pub fn load_config(dir: &std::path::Path) -> anyhow::Result<Config> {
    crate::config::load_dir(dir).map_err(|errors| config_errors(dir, &errors))
}

fn config_errors(dir: &std::path::Path, errors: &[ConfigError]) -> anyhow::Error {
    let list: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    anyhow::anyhow!(
        "the config in {} has {} error(s); fix them (see `steward validate`):\n{}",
        dir.display(),
        errors.len(),
        list.join("\n")
    )
}
