//! Schedule slots, each fired once cluster-wide. Every daemon's scheduler sees the same
//! slot come due; each tries to create the slot's key, and the server lets one create it.
//! Not the `Nats-Msg-Id` dedup window: it forgets a message id once acknowledged
//! (nats-server #2921, #5142), and a restart may fire a slot long after.
//!
//! The claim's revision is its fencing token. A claim is taken over only from a daemon
//! that is gone, by compare-and-set on that revision; the commit of a run checks that its
//! claim still stands ([`Cluster::holds`]), so a daemon that was only cut off, and comes
//! back, does not commit a slot another daemon ran.
//!
//! A claim stays *open* (in a bucket of its own) until its run ends. A daemon that dies
//! with a slot's run in flight leaves it open; once its heartbeat is gone another daemon
//! takes the slot over ([`Cluster::take_over_open_slots`]) and runs it, so scheduled work
//! in flight is not lost with a node.

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::connection::Cluster;
use super::error::ClusterError;
use super::names::key_part;

/// Who holds a slot, as kept in the bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotClaim {
    pub workflow: String,
    pub slot: DateTime<Utc>,
    pub daemon: String,
    pub claimed_at: DateTime<Utc>,
}

/// A slot this daemon holds: its key and the revision that fences it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub key: String,
    pub revision: u64,
}

fn slot_key(workflow: &str, slot: DateTime<Utc>) -> String {
    format!("{}.{}", key_part(workflow), slot.timestamp())
}

impl Cluster {
    /// Claims `workflow`'s `slot` for this daemon: Some when it is ours to fire, None when
    /// another daemon claimed it first.
    pub async fn claim_slot(
        &self,
        workflow: &str,
        slot: DateTime<Utc>,
    ) -> Result<Option<Claim>, ClusterError> {
        let key = slot_key(workflow, slot);
        let claim = self.slot_claim(workflow, slot);
        match self.slots.create(&key, claim.clone().into()).await {
            Ok(revision) => self.opened(key, claim, revision).await.map(Some),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(ClusterError::store(e)),
        }
    }

    /// Who holds `workflow`'s `slot`, and at which revision.
    pub async fn slot_holder(
        &self,
        workflow: &str,
        slot: DateTime<Utc>,
    ) -> Result<Option<(SlotClaim, u64)>, ClusterError> {
        let key = slot_key(workflow, slot);
        let Some(entry) = self.slots.entry(&key).await.map_err(ClusterError::store)? else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        let claim = serde_json::from_slice(&entry.value).map_err(|e| ClusterError::Corrupt {
            bucket: super::buckets::SLOTS,
            key: key.clone(),
            why: e.to_string(),
        })?;
        Ok(Some((claim, entry.revision)))
    }

    /// Takes over `workflow`'s `slot` from a gone daemon that held it at `revision`: Some
    /// when this daemon now holds it, None when another took it over first.
    pub async fn take_over_slot(
        &self,
        workflow: &str,
        slot: DateTime<Utc>,
        revision: u64,
    ) -> Result<Option<Claim>, ClusterError> {
        let key = slot_key(workflow, slot);
        let claim = self.slot_claim(workflow, slot);
        match self
            .slots
            .update(&key, claim.clone().into(), revision)
            .await
        {
            Ok(revision) => self.opened(key, claim, revision).await.map(Some),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(ClusterError::store(e)),
        }
    }

    /// Whether `claim` still stands: nobody took the slot over since. A commit checks it
    /// first.
    pub async fn holds(&self, claim: &Claim) -> Result<bool, ClusterError> {
        let entry = self
            .slots
            .entry(&claim.key)
            .await
            .map_err(ClusterError::store)?;
        Ok(
            entry
                .is_some_and(|e| e.revision == claim.revision && e.operation == kv::Operation::Put),
        )
    }

    /// A claim just won at `revision`, marked open until its run ends (a daemon that dies
    /// between the two writes leaves a slot no one takes over: a window of one round trip).
    async fn opened(
        &self,
        key: String,
        claim: Vec<u8>,
        revision: u64,
    ) -> Result<Claim, ClusterError> {
        self.open_slots
            .put(&key, claim.into())
            .await
            .map_err(ClusterError::store)?;
        Ok(Claim { key, revision })
    }

    /// The slot's run ended (whatever its outcome): no longer open, so nobody takes it
    /// over. Only while `claim` still stands.
    pub async fn finish_slot(&self, claim: &Claim) -> Result<(), ClusterError> {
        if self.holds(claim).await? {
            self.open_slots
                .delete(&claim.key)
                .await
                .map_err(ClusterError::store)?;
        }
        Ok(())
    }

    /// Takes over every open slot whose holder is gone: (workflow, slot, the gone
    /// daemon, the new claim) for each this daemon now holds. Two daemons reaping at once
    /// take each slot once (compare-and-set on the claim's revision).
    pub async fn take_over_open_slots(
        &self,
    ) -> Result<Vec<(String, DateTime<Utc>, String, Claim)>, ClusterError> {
        use futures_util::StreamExt;
        let mut keys = self.open_slots.keys().await.map_err(ClusterError::store)?;
        let mut taken = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(ClusterError::store)?;
            let Some(entry) = self.slots.entry(&key).await.map_err(ClusterError::store)? else {
                continue;
            };
            let Ok(claim) = serde_json::from_slice::<SlotClaim>(&entry.value) else {
                continue;
            };
            // Past a day, a slot is the catch-up's to judge, not a take-over's.
            let stale = Utc::now() - claim.slot > chrono::Duration::days(1);
            if stale || claim.daemon == self.daemon || self.is_alive(&claim.daemon).await? {
                continue;
            }
            if let Some(mine) = self
                .take_over_slot(&claim.workflow, claim.slot, entry.revision)
                .await?
            {
                taken.push((claim.workflow, claim.slot, claim.daemon, mine));
            }
        }
        Ok(taken)
    }

    fn slot_claim(&self, workflow: &str, slot: DateTime<Utc>) -> Vec<u8> {
        let claim = SlotClaim {
            workflow: workflow.to_string(),
            slot,
            daemon: self.daemon.clone(),
            claimed_at: Utc::now(),
        };
        serde_json::to_vec(&claim).unwrap_or_default()
    }
}
