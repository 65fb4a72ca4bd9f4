//! What the daemon's tasks, its signal loop and the control socket share: the engine and
//! runner, the config it runs on now, queue wake-ups and the webhook address.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::Value;

use crate::config::{Config, Workflow};
use crate::governed::{Engine, Fire};
use crate::live::Ask;
use crate::runner::{Job, Runner};
use crate::store::RunRecord;

/// What the daemon's tasks and the control socket share.
pub struct Shared {
    pub engine: Engine,
    pub runner: Runner,
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    pub(super) config: RwLock<Arc<Config>>,
    pub(super) started: Instant,
    pub(super) queue_wakes: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Notify>>>,
    pub(super) webhook_addr: Mutex<Option<SocketAddr>>,
}

impl Shared {
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn forced_dry_run(&self) -> bool {
        self.runner.forced_dry_run()
    }

    /// The current definition of a workflow (it may have changed with a reload).
    pub fn workflow(&self, id: &str) -> Option<Arc<Workflow>> {
        self.config().workflows.get(id).cloned().map(Arc::new)
    }

    /// A triggered fire; resolves to the run's record, None if nothing ran (stopping,
    /// workflow gone).
    pub async fn fire(&self, workflow: &str, fire: Fire) -> Option<RunRecord> {
        let Some(wf) = self.workflow(workflow) else {
            tracing::warn!(
                workflow,
                "fire dropped: the workflow is no longer in the config"
            );
            return None;
        };
        match self.runner.run(Job::fire(wf, fire, Ask::Auto)).await {
            Ok(rec) => {
                // A digest agent's summary line goes to stdout (journald) as well.
                if let Some(line) = &rec.summary {
                    println!("{line}");
                }
                Some(rec)
            }
            Err(e) => {
                tracing::warn!(workflow, "fire not run: {e}");
                None
            }
        }
    }

    pub fn enqueue(&self, queue: &str, payload: &Value) -> Result<String> {
        let id = crate::trigger::queue::write_item(&self.state_dir, queue, payload)?;
        if let Some(wake) = self
            .queue_wakes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
        {
            wake.notify_one();
        }
        Ok(id)
    }

    pub(super) fn queue_wake(&self, queue: &str) -> Arc<tokio::sync::Notify> {
        self.queue_wakes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(queue.to_string())
            .or_default()
            .clone()
    }
}

impl crate::service::Daemon for Shared {
    fn config(&self) -> Arc<Config> {
        Shared::config(self)
    }

    fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    fn webhook_listen(&self) -> Option<String> {
        self.webhook_addr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|a| a.to_string())
    }

    fn enqueue(&self, queue: &str, payload: &Value) -> Result<String> {
        Shared::enqueue(self, queue, payload)
    }
}
