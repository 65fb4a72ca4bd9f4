//! Each daemon's heartbeat: an entry of its own in a bucket whose entries the server drops
//! `heartbeat` after they were written. A daemon writes its entry three times a heartbeat;
//! one whose entry is gone is gone (killed, cut off, or stopped), and the others free what
//! it held ([`super::keys`]). The server's clock alone decides: no two machines' clocks
//! are compared.

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::connection::Cluster;
use super::error::ClusterError;

/// What a daemon says of itself in each beat (what `steward status` shows of the cluster).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Beat {
    pub daemon: String,
    pub host: String,
    pub pid: u32,
    pub started_at: DateTime<Utc>,
    /// When this beat was written, by the daemon's clock (shown, never compared).
    pub at: DateTime<Utc>,
    pub runs_in_flight: u64,
}

impl Cluster {
    /// Writes this daemon's beat.
    pub async fn beat(&self, beat: &Beat) -> Result<(), ClusterError> {
        let bytes = serde_json::to_vec(beat).map_err(ClusterError::store)?;
        self.daemons
            .put(&self.daemon, bytes.into())
            .await
            .map_err(ClusterError::store)?;
        Ok(())
    }

    /// Whether `daemon` has beaten within the heartbeat. Its entry is gone once the
    /// server expires it; sooner, its last beat is older by more than a heartbeat than
    /// this daemon's own latest — two times the server stamped, never a daemon's clock.
    pub async fn is_alive(&self, daemon: &str) -> Result<bool, ClusterError> {
        let Some(theirs) = self.beat_entry(daemon).await? else {
            return Ok(false);
        };
        self.within_heartbeat(theirs.created).await
    }

    /// Every live daemon's latest beat, by name.
    pub async fn alive(&self) -> Result<Vec<Beat>, ClusterError> {
        let mut names = self.daemons.keys().await.map_err(ClusterError::store)?;
        let mut out = Vec::new();
        while let Some(name) = names.next().await {
            let name = name.map_err(ClusterError::store)?;
            // Gone between the listing and the read: not alive.
            let Some(entry) = self.beat_entry(&name).await? else {
                continue;
            };
            if !self.within_heartbeat(entry.created).await? {
                continue;
            }
            match serde_json::from_slice::<Beat>(&entry.value) {
                Ok(beat) => out.push(beat),
                Err(e) => {
                    return Err(ClusterError::Corrupt {
                        bucket: super::buckets::DAEMONS,
                        key: name,
                        why: e.to_string(),
                    })
                }
            }
        }
        out.sort_by(|a, b| a.daemon.cmp(&b.daemon));
        Ok(out)
    }

    async fn beat_entry(&self, daemon: &str) -> Result<Option<kv::Entry>, ClusterError> {
        let entry = self
            .daemons
            .entry(daemon)
            .await
            .map_err(ClusterError::store)?;
        Ok(entry.filter(|e| e.operation == kv::Operation::Put))
    }

    /// Whether a beat stored at `stamped` (by the server) is within a heartbeat of this
    /// daemon's own latest beat. A daemon that has not beaten yet judges nobody gone.
    async fn within_heartbeat(&self, stamped: chrono::DateTime<Utc>) -> Result<bool, ClusterError> {
        let Some(ours) = self.beat_entry(&self.daemon).await? else {
            return Ok(true);
        };
        let heartbeat =
            chrono::Duration::from_std(self.settings.heartbeat).unwrap_or(chrono::Duration::MAX);
        Ok(ours.created - stamped <= heartbeat)
    }

    /// Takes this daemon out at a clean stop, so the others need not wait out its
    /// heartbeat.
    pub async fn leave(&self) -> Result<(), ClusterError> {
        self.daemons
            .delete(&self.daemon)
            .await
            .map_err(ClusterError::store)
    }
}

/// Beats three times a heartbeat until `stop`, then leaves. A failed beat is logged and
/// tried again at the next tick (the connection reconnects by itself).
pub async fn keep_beating(
    cluster: Cluster,
    started_at: DateTime<Utc>,
    in_flight: impl Fn() -> u64 + Send + 'static,
    stop: CancellationToken,
) {
    let every = cluster.settings.heartbeat / 3;
    let host = super::names::hostname();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let beat = Beat {
            daemon: cluster.daemon.clone(),
            host: host.clone(),
            pid: std::process::id(),
            started_at,
            at: Utc::now(),
            runs_in_flight: in_flight(),
        };
        if let Err(e) = cluster.beat(&beat).await {
            tracing::warn!("cluster heartbeat not written: {e}");
        }
    }
    if let Err(e) = cluster.leave().await {
        tracing::warn!("cluster: could not say this daemon left: {e}");
    }
}
