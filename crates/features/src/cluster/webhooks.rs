//! Webhook deliveries seen, across the cluster: a delivery may arrive at any daemon (a
//! load balancer in front, a sender's retry to another address), and a replay to a
//! second daemon must find the first sighting. Each is a key created only if absent (or
//! taken over, compare-and-set, once past its time), like the one machine's tree.

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;

use super::buckets::WEBHOOKS as BUCKET;
use super::connection::Cluster;
use super::error::ClusterError;
use super::names::key_part;
use crate::store::SeenDelivery;

impl Cluster {
    /// Remembers `workflow`'s delivery `id` as `seen`, unless a sighting not past its time
    /// at `now` is remembered already: then that one, and nothing changes. Of two daemons
    /// racing, one remembers.
    pub async fn remember_delivery(
        &self,
        workflow: &str,
        id: &str,
        seen: &SeenDelivery,
        now: DateTime<Utc>,
    ) -> Result<Option<SeenDelivery>, ClusterError> {
        let key = format!("{}.{}", key_part(workflow), key_part(id));
        let bytes: bytes::Bytes = serde_json::to_vec(seen)
            .map_err(ClusterError::store)?
            .into();
        loop {
            match self.webhooks.create(&key, bytes.clone()).await {
                Ok(_) => return Ok(None),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
                Err(e) => return Err(ClusterError::store(e)),
            }
            let Some(entry) = self
                .webhooks
                .entry(&key)
                .await
                .map_err(ClusterError::store)?
            else {
                continue; // gone meanwhile: create again
            };
            let earlier: SeenDelivery =
                serde_json::from_slice(&entry.value).map_err(|e| ClusterError::Corrupt {
                    bucket: BUCKET,
                    key: key.clone(),
                    why: e.to_string(),
                })?;
            if earlier.until >= now {
                return Ok(Some(earlier));
            }
            // Remembered, but past its time: take its place (or lose to another who did).
            match self
                .webhooks
                .update(&key, bytes.clone(), entry.revision)
                .await
            {
                Ok(_) => return Ok(None),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(ClusterError::store(e)),
            }
        }
    }

    /// Forgets the deliveries past their time at `now`; returns how many.
    pub async fn forget_deliveries(&self, now: DateTime<Utc>) -> Result<usize, ClusterError> {
        let mut keys = self.webhooks.keys().await.map_err(ClusterError::store)?;
        let mut gone = 0;
        while let Some(key) = keys.next().await {
            let key = key.map_err(ClusterError::store)?;
            let Some(entry) = self
                .webhooks
                .entry(&key)
                .await
                .map_err(ClusterError::store)?
            else {
                continue;
            };
            let past = serde_json::from_slice::<SeenDelivery>(&entry.value)
                .map(|s| s.until < now)
                .unwrap_or(false);
            if past
                && self
                    .webhooks
                    .delete_expect_revision(&key, Some(entry.revision))
                    .await
                    .is_ok()
            {
                gone += 1;
            }
        }
        Ok(gone)
    }
}
