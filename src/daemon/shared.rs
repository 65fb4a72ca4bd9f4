//! What the daemon's tasks, its signal loop and the control socket share: the engine and
//! runner, the config it runs on now, queue wake-ups and the webhook address.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::Value;

use super::live_config::LiveConfig;
use crate::config::{Config, Workflow};
use crate::governed::{Engine, Fire};
use crate::live::Ask;
use crate::runner::{Job, Runner};
use crate::service::RunningConfig;
use crate::store::RunRecord;

/// What the daemon's tasks and the control socket share.
pub struct Shared {
    pub engine: Engine,
    pub runner: Runner,
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    pub(super) config: Arc<LiveConfig>,
    pub(super) started: Instant,
    pub(super) queue_wakes: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Notify>>>,
    pub(super) webhook_addr: Mutex<Option<SocketAddr>>,
    /// Where the dashboard listens (None when it is off).
    pub(super) dashboard_addr: Mutex<Option<SocketAddr>>,
    /// Where a reload puts the `[[notify]]` channels it read.
    pub(super) alert_channels: crate::alert::ChannelsUpdate,
    /// Notified after each look of the dead-man's switch (start-up waits for the first).
    pub(super) expect_checked: tokio::sync::Notify,
    /// This daemon's membership of a cluster (`[cluster]`), if any.
    pub member: Option<crate::cluster::Member>,
}

impl Shared {
    /// The config the daemon runs on (the last valid one).
    pub fn config(&self) -> Arc<Config> {
        self.config.running()
    }

    pub fn forced_dry_run(&self) -> bool {
        self.runner.forced_dry_run()
    }

    /// A workflow as its file says now (reloaded first if the folder changed; the last
    /// valid definition while an edit is broken).
    pub fn workflow(&self, id: &str) -> Option<Arc<Workflow>> {
        self.config
            .fresh_or_running()
            .workflows
            .get(id)
            .cloned()
            .map(Arc::new)
    }

    /// A triggered fire; resolves to the run's record, None if nothing ran (stopping,
    /// workflow gone).
    pub async fn fire(&self, workflow: &str, fire: Fire) -> Option<RunRecord> {
        self.fire_asking(workflow, fire, Ask::Auto).await
    }

    /// [`Shared::fire`], live or dry as `ask` says (a follower of a dry run asks dry).
    pub async fn fire_asking(&self, workflow: &str, fire: Fire, ask: Ask) -> Option<RunRecord> {
        let Some(wf) = self.workflow(workflow) else {
            tracing::warn!(
                workflow,
                "fire dropped: the workflow is no longer in the config"
            );
            return None;
        };
        match self.runner.run(Job::fire(wf, fire, ask)).await {
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
        if let Some(member) = &self.member {
            let bytes = serde_json::to_vec(payload)?;
            return Ok(member.enqueue_blocking(queue, bytes)?);
        }
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

    /// After a config swap: the alert channels it names, and a `go_live_needed` alert
    /// for each approved workflow whose file changed since its approval.
    pub(super) fn config_swapped(&self, config: &Config) {
        self.alert_channels.set(crate::alert::Channels::of(config));
        let alerts = &self.engine.alerts;
        if !alerts.wants(crate::alert::Event::GoLiveNeeded) {
            return;
        }
        for wf in config.workflows.values() {
            match self.engine.store.approval(&wf.id) {
                Ok(Some(a)) if a.config_hash != wf.config_hash => alerts.raise(crate::alert::Alert::new(
                    crate::alert::Event::GoLiveNeeded,
                    &wf.id,
                    format!(
                        "{} changed since {} approved it for go-live: it runs dry until `steward go-live {}`",
                        wf.file.display(),
                        a.approved_by,
                        wf.id
                    ),
                )),
                Ok(_) => {}
                Err(e) => tracing::error!(workflow = %wf.id, "cannot read the go-live approval: {e}"),
            }
        }
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
    fn member(&self) -> Option<&crate::cluster::Member> {
        self.member.as_ref()
    }

    fn config(&self) -> Result<Arc<Config>> {
        self.config.fresh().map_err(|p| self.config.explain(&p))
    }

    fn running_config(&self) -> RunningConfig {
        let _ = self.config.fresh();
        RunningConfig {
            config: self.config.running(),
            loaded_at: self.config.loaded_at(),
            errors: self
                .config
                .problem()
                .map(|p| p.errors.iter().map(|e| e.to_string()).collect())
                .unwrap_or_default(),
        }
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

    fn dashboard_listen(&self) -> Option<String> {
        self.dashboard_addr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|a| a.to_string())
    }

    fn enqueue(&self, queue: &str, payload: &Value) -> Result<String> {
        Shared::enqueue(self, queue, payload)
    }

    fn catch_up_after_pause(&self, wf: &Arc<Workflow>, pause: &crate::store::Pause) {
        let slots = crate::catchup::after_pause(wf, pause.since, chrono::Utc::now());
        self.catch_up_slots(wf, slots);
    }
}

impl Shared {
    /// Runs `slots` of `wf` one after the other, as catch-up after a pause.
    pub fn catch_up_slots(&self, wf: &Arc<Workflow>, slots: Vec<chrono::DateTime<chrono::Utc>>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !slots.is_empty() {
            tracing::info!(workflow = %wf.id, runs = slots.len(), "resumed: catching up the slots skipped while paused");
        }
        let (runner, wf) = (self.runner.clone(), wf.clone());
        rt.spawn(async move {
            // One after the other, as a drain does: the overlap policy still applies.
            for slot in slots {
                let fire = Fire::new(
                    "schedule",
                    Some(slot),
                    serde_json::json!({ "catchup": true, "after_pause": true }),
                );
                if let Err(e) = runner.run(Job::fire(wf.clone(), fire, Ask::Auto)).await {
                    tracing::warn!(workflow = %wf.id, "catch-up after the pause not run: {e}");
                }
            }
        });
    }
}
