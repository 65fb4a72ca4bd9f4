//! This daemon as a member of a cluster: its connection, the runtime it talks on
//! ([`super::bridge`]), its heartbeat, and the reaping of gone daemons' keys. The daemon
//! joins before it takes any work and leaves at its stop.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::bridge::Bridge;
use super::connection::Cluster;
use super::error::ClusterError;
use super::heartbeat::{keep_beating, Beat};
use super::queue::Puller;
use super::slots::Claim;
use crate::config::cluster::Cluster as Settings;

/// A gone daemon's slot, taken over by this one: run it.
#[derive(Debug, Clone)]
pub struct TakenSlot {
    pub workflow: String,
    pub slot: DateTime<Utc>,
    /// The daemon that had claimed it.
    pub from: String,
    pub claim: Claim,
}

/// A daemon's membership; clones share it.
#[derive(Clone, Debug)]
pub struct Member {
    pub cluster: Cluster,
    pub bridge: Bridge,
    stop: CancellationToken,
    started_at: DateTime<Utc>,
}

impl Member {
    /// Connects, and says this daemon is alive (before it reserves anything, so no other
    /// daemon takes its keys for a gone daemon's).
    pub async fn join(settings: &Settings) -> Result<Member, ClusterError> {
        let bridge = Bridge::start()?;
        let name = Cluster::daemon_name();
        let settings = settings.clone();
        let cluster = bridge
            .run(async move { Cluster::connect(&settings, name).await })
            .await??;
        let started_at = Utc::now();
        let member = Member {
            cluster,
            bridge,
            stop: CancellationToken::new(),
            started_at,
        };
        let first = member.beat_now(0);
        let c = member.cluster.clone();
        member
            .bridge
            .run(async move { c.beat(&first).await })
            .await??;
        Ok(member)
    }

    fn beat_now(&self, runs_in_flight: u64) -> Beat {
        Beat {
            daemon: self.cluster.daemon.clone(),
            host: super::names::hostname(),
            pid: std::process::id(),
            started_at: self.started_at,
            at: Utc::now(),
            runs_in_flight,
        }
    }

    /// Keeps the heartbeat going, and nothing else: for a command run where no daemon
    /// is, whose own runs hold keys in the cluster like a daemon's.
    pub fn beat_only(&self) {
        self.bridge.spawn(keep_beating(
            self.cluster.clone(),
            self.started_at,
            || 0,
            self.stop.clone(),
        ));
    }

    /// Keeps the heartbeat going (with `in_flight` runs), and every heartbeat frees what
    /// gone daemons held — their keys, and their open slots, each handed to `take_over`
    /// to be run here — and hands the daemons alive to `alive` (for the runs of those gone
    /// to be settled), until [`Member::leave`].
    pub fn start(
        &self,
        in_flight: impl Fn() -> u64 + Send + Sync + 'static,
        take_over: impl Fn(TakenSlot) + Send + Sync + 'static,
        alive: impl Fn(Vec<String>) + Send + Sync + 'static,
    ) {
        self.bridge.spawn(keep_beating(
            self.cluster.clone(),
            self.started_at,
            in_flight,
            self.stop.clone(),
        ));
        let cluster = self.cluster.clone();
        let stop = self.stop.clone();
        self.bridge.spawn(async move {
            let mut tick = tokio::time::interval(cluster.settings.heartbeat);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match cluster.reap_gone().await {
                    Ok(reaped) => {
                        for k in &reaped.released {
                            tracing::warn!(workflow = %k.workflow, key = %k.key, run = %k.run_id, "cluster: a gone daemon held this key before its commit: released, so its item may run again");
                        }
                        for k in &reaped.in_doubt {
                            tracing::warn!(workflow = %k.workflow, key = %k.key, run = %k.run_id, "cluster: a gone daemon was committing this key: in doubt, see `steward in-doubt list`");
                        }
                    }
                    Err(e) => tracing::warn!("cluster: cannot look for gone daemons: {e}"),
                }
                match cluster.alive().await {
                    Ok(beats) => alive(beats.into_iter().map(|b| b.daemon).collect()),
                    Err(e) => tracing::warn!("cluster: cannot read the daemons alive: {e}"),
                }
                match cluster.take_over_open_slots().await {
                    Ok(taken) => {
                        for (workflow, slot, from, claim) in taken {
                            tracing::warn!(workflow = %workflow, %slot, from = %from, "cluster: a gone daemon's slot had not finished: taken over, running it here");
                            take_over(TakenSlot { workflow, slot, from, claim });
                        }
                    }
                    Err(e) => tracing::warn!("cluster: cannot look for gone daemons' slots: {e}"),
                }
            }
        });
    }

    /// The run of a slot this daemon claimed ended: the slot is no longer open.
    pub async fn finish_slot(&self, claim: Claim) {
        let cluster = self.cluster.clone();
        let done = self
            .bridge
            .run(async move { cluster.finish_slot(&claim).await })
            .await;
        if let Ok(Err(e)) | Err(e) = done {
            tracing::warn!("cluster: cannot mark a slot finished ({e}); were this daemon to die now, another would run it again");
        }
    }

    /// Stops the heartbeat; the last beat is deleted, so the others need not wait it out.
    pub async fn leave(&self) {
        self.stop.cancel();
        let cluster = self.cluster.clone();
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.bridge.run(async move { cluster.leave().await }),
        )
        .await;
    }

    /// Claims `workflow`'s `slot` (see [`super::slots`]).
    pub async fn claim_slot(
        &self,
        workflow: &str,
        slot: DateTime<Utc>,
    ) -> Result<Option<Claim>, ClusterError> {
        let cluster = self.cluster.clone();
        let workflow = workflow.to_string();
        self.bridge
            .run(async move { cluster.claim_slot(&workflow, slot).await })
            .await?
    }

    /// Publishes a queue item and waits until the server stored it (from synchronous
    /// code: the control socket's handler). Its id: a time and a random part.
    pub fn enqueue_blocking(&self, queue: &str, payload: Vec<u8>) -> Result<String, ClusterError> {
        let cluster = self.cluster.clone();
        let queue = queue.to_string();
        let item_id = new_item_id();
        let id = item_id.clone();
        self.bridge
            .block(async move { cluster.enqueue(&queue, &id, payload).await })?;
        Ok(item_id)
    }

    /// A puller for `queue`, shared with every daemon (see [`super::queue`]).
    pub async fn puller(
        &self,
        queue: &str,
        max_attempts: u32,
    ) -> Result<Arc<tokio::sync::Mutex<Puller>>, ClusterError> {
        let cluster = self.cluster.clone();
        let queue = queue.to_string();
        let puller = self
            .bridge
            .run(async move { cluster.puller(&queue, max_attempts).await })
            .await??;
        Ok(Arc::new(tokio::sync::Mutex::new(puller)))
    }
}

/// Why an item could not be published where no daemon runs.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error(transparent)]
    Settings(#[from] crate::config::cluster::ClusterSettingsError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// Publishes one item to `queue` of the cluster `settings` name, for a command run where
/// no daemon is (`steward enqueue` on a machine of the cluster without one): connects,
/// publishes, waits for the server to store it.
pub fn enqueue_once(
    settings: &crate::config::cluster::ClusterSettings,
    queue: &str,
    payload: &serde_json::Value,
) -> Result<String, EnqueueError> {
    let settings = settings.checked()?;
    let bridge = Bridge::start()?;
    let bytes = serde_json::to_vec(payload).map_err(|e| ClusterError::Store(e.to_string()))?;
    let name = format!("cli-{}", Cluster::daemon_name());
    let queue = queue.to_string();
    let item_id = new_item_id();
    let id = item_id.clone();
    bridge.block(async move {
        let cluster = Cluster::connect(&settings, name).await?;
        cluster.enqueue(&queue, &id, bytes).await?;
        cluster
            .client()
            .flush()
            .await
            .map_err(|e| ClusterError::Store(e.to_string()))
    })?;
    Ok(item_id)
}

/// A queue item's id: its time and a random part.
fn new_item_id() -> String {
    let mut rand = [0u8; 4];
    let _ = getrandom::fill(&mut rand);
    format!(
        "{}-{}",
        Utc::now().format("%Y%m%dT%H%M%S%6f"),
        hex::encode(rand)
    )
}
