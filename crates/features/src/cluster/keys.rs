//! Idempotency keys across the cluster: the same phases as on one machine
//! ([`crate::store::KeyPhase`]), each move a compare-and-set on the key's revision, and
//! each key marked with the daemon that holds it.
//!
//! - Reserve: create the key (only if absent). Of two daemons running the same item, one
//!   reserves; the other finds the key taken — unless the holder is gone and had not
//!   begun its commit: then the key is freed at its revision and reserved anew.
//! - Move (committing, committed, awaiting approval): update at the revision this daemon
//!   last wrote. A daemon whose key was freed or taken meanwhile is *fenced*: it learns so
//!   before its commit, and does not commit.
//! - A daemon gone (its heartbeat expired): its keys whose commit had not begun are
//!   released, so a redelivered item runs again; those caught committing are left in
//!   doubt, as after a crash on one machine, for an operator.

use async_nats::jetstream::kv;
use chrono::Utc;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::connection::Cluster;
use super::error::ClusterError;
use super::names::key_part;
use crate::store::{KeyPhase, KeyRecord};

/// A key as kept in the bucket: the record and who holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldKey {
    pub record: KeyRecord,
    pub daemon: String,
}

/// A key this daemon holds, at the revision it last wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub workflow: String,
    pub key: String,
    pub revision: u64,
}

/// The key moved on without this daemon: freed, taken by another, or put in doubt.
#[derive(Debug, Clone, PartialEq)]
pub struct Fenced {
    /// What the key holds now (None: freed).
    pub now: Option<HeldKey>,
}

/// What [`Cluster::reap_gone`] did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Reaped {
    /// Reserved by a gone daemon, commit not begun: freed for the item to run again.
    pub released: Vec<KeyRecord>,
    /// Caught committing by a gone daemon: in doubt, for an operator.
    pub in_doubt: Vec<KeyRecord>,
}

fn bucket_key(workflow: &str, key: &str) -> String {
    format!("{}.{}", key_part(workflow), key_part(key))
}

impl Cluster {
    /// Reserves `workflow`'s `key` for `run_id`: the lease, or what holds the key now.
    pub async fn reserve_key(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<Result<Lease, HeldKey>, ClusterError> {
        let id = bucket_key(workflow, key);
        let held = self.held(workflow, key, run_id, KeyPhase::Reserved, None);
        match self.keys.create(&id, encode(&held)?).await {
            Ok(revision) => Ok(Ok(Lease {
                workflow: workflow.to_string(),
                key: key.to_string(),
                revision,
            })),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                match self.held_key(workflow, key).await? {
                    // Our own reservation, made by an earlier try whose answer was lost.
                    Some((now, revision)) if self.is_mine(&now, run_id, KeyPhase::Reserved) => {
                        Ok(Ok(Lease {
                            workflow: workflow.to_string(),
                            key: key.to_string(),
                            revision,
                        }))
                    }
                    // Reserved by a daemon that is gone (its item came back to us sooner
                    // than the reaper came round): freed now, at its revision, and ours.
                    Some((now, revision))
                        if now.record.phase == KeyPhase::Reserved
                            && now.daemon != self.daemon
                            && !self.is_alive(&now.daemon).await? =>
                    {
                        if self
                            .keys
                            .delete_expect_revision(&id, Some(revision))
                            .await
                            .is_err()
                        {
                            return Ok(Err(now));
                        }
                        match self.keys.create(&id, encode(&held)?).await {
                            Ok(revision) => Ok(Ok(Lease {
                                workflow: workflow.to_string(),
                                key: key.to_string(),
                                revision,
                            })),
                            Err(_) => Ok(Err(self
                                .held_key(workflow, key)
                                .await?
                                .map(|(h, _)| h)
                                .unwrap_or(held))),
                        }
                    }
                    Some((now, _)) => Ok(Err(now)),
                    // Freed between the create and the read: the caller may try again.
                    None => Ok(Err(held)),
                }
            }
            Err(e) => Err(ClusterError::store(e)),
        }
    }

    /// Moves a held key to `phase` for `run_id`, if this daemon still holds it as leased.
    pub async fn advance_key(
        &self,
        lease: &Lease,
        run_id: &str,
        phase: KeyPhase,
    ) -> Result<Result<Lease, Fenced>, ClusterError> {
        let id = bucket_key(&lease.workflow, &lease.key);
        let held = self.held(&lease.workflow, &lease.key, run_id, phase, None);
        match self.keys.update(&id, encode(&held)?, lease.revision).await {
            Ok(revision) => Ok(Ok(Lease {
                revision,
                ..lease.clone()
            })),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                let now = self.held_key(&lease.workflow, &lease.key).await?;
                match now {
                    // Our own move, made by an earlier try whose answer was lost.
                    Some((h, revision)) if self.is_mine(&h, run_id, phase) => Ok(Ok(Lease {
                        revision,
                        ..lease.clone()
                    })),
                    now => Ok(Err(Fenced {
                        now: now.map(|(h, _)| h),
                    })),
                }
            }
            Err(e) => Err(ClusterError::store(e)),
        }
    }

    /// Whether `held` is what this daemon wrote for `run_id` at `phase`.
    fn is_mine(&self, held: &HeldKey, run_id: &str, phase: KeyPhase) -> bool {
        held.daemon == self.daemon && held.record.run_id == run_id && held.record.phase == phase
    }

    /// Frees a held key (the run failed, was rejected, or ended without a commit), if this
    /// daemon still holds it as leased.
    pub async fn release_key(&self, lease: &Lease) -> Result<Result<(), Fenced>, ClusterError> {
        let id = bucket_key(&lease.workflow, &lease.key);
        match self
            .keys
            .delete_expect_revision(&id, Some(lease.revision))
            .await
        {
            Ok(()) => Ok(Ok(())),
            Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision => {
                match self.held_key(&lease.workflow, &lease.key).await? {
                    // Freed: by an earlier try whose answer was lost, or by a reaper.
                    None => Ok(Ok(())),
                    now => Ok(Err(Fenced {
                        now: now.map(|(h, _)| h),
                    })),
                }
            }
            Err(e) => Err(ClusterError::store(e)),
        }
    }

    /// What holds `workflow`'s `key`, and at which revision (None: free).
    pub async fn held_key(
        &self,
        workflow: &str,
        key: &str,
    ) -> Result<Option<(HeldKey, u64)>, ClusterError> {
        let id = bucket_key(workflow, key);
        let Some(entry) = self.keys.entry(&id).await.map_err(ClusterError::store)? else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        Ok(Some((decode(&id, &entry.value)?, entry.revision)))
    }

    /// Every key in doubt.
    pub async fn keys_in_doubt(&self) -> Result<Vec<KeyRecord>, ClusterError> {
        Ok(self
            .all_keys()
            .await?
            .into_iter()
            .filter(|(h, _, _)| h.record.phase == KeyPhase::InDoubt)
            .map(|(h, _, _)| h.record)
            .collect())
    }

    /// Frees what gone daemons held: reserved keys are released, committing ones put in
    /// doubt. Any daemon may run it; two at once settle each key once (compare-and-set).
    pub async fn reap_gone(&self) -> Result<Reaped, ClusterError> {
        let alive: std::collections::BTreeSet<String> =
            self.alive().await?.into_iter().map(|b| b.daemon).collect();
        let mut reaped = Reaped::default();
        for (held, id, revision) in self.all_keys().await? {
            if alive.contains(&held.daemon) || held.daemon == self.daemon {
                continue;
            }
            match held.record.phase {
                KeyPhase::Reserved => {
                    if self
                        .keys
                        .delete_expect_revision(&id, Some(revision))
                        .await
                        .is_ok()
                    {
                        reaped.released.push(held.record);
                    }
                }
                KeyPhase::Committing => {
                    let mut record = held.record.clone();
                    record.found_in = Some(KeyPhase::Committing);
                    record.phase = KeyPhase::InDoubt;
                    record.updated_at = Utc::now();
                    let doubt = HeldKey {
                        record: record.clone(),
                        daemon: held.daemon,
                    };
                    if self
                        .keys
                        .update(&id, encode(&doubt)?, revision)
                        .await
                        .is_ok()
                    {
                        reaped.in_doubt.push(record);
                    }
                }
                // An approval waits for an operator, not for the daemon; committed and
                // in-doubt keys stay as they are.
                KeyPhase::AwaitingApproval | KeyPhase::Committed | KeyPhase::InDoubt => {}
            }
        }
        Ok(reaped)
    }

    /// Every key, with its bucket key and revision.
    async fn all_keys(&self) -> Result<Vec<(HeldKey, String, u64)>, ClusterError> {
        let mut ids = self.keys.keys().await.map_err(ClusterError::store)?;
        let mut out = Vec::new();
        while let Some(id) = ids.next().await {
            let id = id.map_err(ClusterError::store)?;
            let Some(entry) = self.keys.entry(&id).await.map_err(ClusterError::store)? else {
                continue;
            };
            if entry.operation == kv::Operation::Put {
                out.push((decode(&id, &entry.value)?, id, entry.revision));
            }
        }
        Ok(out)
    }

    fn held(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
        phase: KeyPhase,
        found_in: Option<KeyPhase>,
    ) -> HeldKey {
        HeldKey {
            record: KeyRecord {
                found_in,
                ..KeyRecord::now(workflow, key, run_id, phase)
            },
            daemon: self.daemon.clone(),
        }
    }
}

fn encode(held: &HeldKey) -> Result<bytes::Bytes, ClusterError> {
    serde_json::to_vec(held)
        .map(Into::into)
        .map_err(ClusterError::store)
}

fn decode(id: &str, bytes: &[u8]) -> Result<HeldKey, ClusterError> {
    serde_json::from_slice(bytes).map_err(|e| ClusterError::Corrupt {
        bucket: super::buckets::KEYS,
        key: id.to_string(),
        why: e.to_string(),
    })
}
