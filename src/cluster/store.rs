//! The store of a daemon in a cluster: what must be decided once for the whole cluster —
//! idempotency keys — is kept in the cluster ([`super::keys`]), compare-and-set on
//! revision; the rest stays in this daemon's own store for now (runs, review, dead
//! letters, approvals, pauses, the alert outbox; the next step of issue 28 moves them).
//!
//! A key this daemon reserved is held with a lease (the revision it last wrote); each move
//! of the key is made at that revision, so a daemon whose key was freed or taken over
//! meanwhile (it was cut off past its heartbeat) gets an error instead of moving it, and
//! its run does not commit.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::bridge::Bridge;
use super::connection::Cluster;
use super::keys::Lease;
use crate::store::{
    Approval, Backend, Counts, DaySpend, DeadLetter, KeyPhase, KeyRecord, Pause, Result, Retention,
    RunQuery, RunRecord, RunState, SeenDelivery, Store, StoreError,
};

/// A cluster member's store: keys in the cluster, the rest in `local`.
pub struct MemberStore {
    local: Store,
    cluster: Cluster,
    bridge: Bridge,
    /// The keys this daemon holds, by (workflow, key).
    leases: Mutex<HashMap<(String, String), Lease>>,
}

impl MemberStore {
    pub fn new(local: Store, cluster: Cluster, bridge: Bridge) -> MemberStore {
        MemberStore {
            local,
            cluster,
            bridge,
            leases: Mutex::new(HashMap::new()),
        }
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Lease>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lease(&self, workflow: &str, key: &str) -> Option<Lease> {
        self.leases()
            .get(&(workflow.to_string(), key.to_string()))
            .cloned()
    }

    /// The lease to move a key with: this daemon's own, or (for an operator's settling of
    /// a key another daemon left) the key's current revision.
    fn lease_or_current(&self, workflow: &str, key: &str) -> Result<Option<Lease>> {
        if let Some(lease) = self.lease(workflow, key) {
            return Ok(Some(lease));
        }
        let cluster = self.cluster.clone();
        let (w, k) = (workflow.to_string(), key.to_string());
        let held = self
            .bridge
            .block(async move { cluster.held_key(&w, &k).await })
            .map_err(shared)?;
        Ok(held.map(|(_, revision)| Lease {
            workflow: workflow.to_string(),
            key: key.to_string(),
            revision,
        }))
    }
}

fn shared(e: super::ClusterError) -> StoreError {
    StoreError::Shared(e.to_string())
}

fn fenced(workflow: &str, key: &str, now: Option<&super::keys::HeldKey>) -> StoreError {
    StoreError::Shared(match now {
        Some(h) => format!(
            "idempotency key `{key}` of `{workflow}` moved on without this daemon: it is {} by {} for run {}; not committing",
            serde_json::to_value(h.record.phase).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            h.daemon,
            h.record.run_id
        ),
        None => format!(
            "idempotency key `{key}` of `{workflow}` was freed while this daemon held it (cut off past its heartbeat?); not committing"
        ),
    })
}

impl Backend for MemberStore {
    fn flush(&self) -> Result<()> {
        // The cluster's writes are on its server's disk once acknowledged.
        self.local.flush()
    }

    fn key(&self, workflow: &str, key: &str) -> Result<Option<KeyRecord>> {
        let cluster = self.cluster.clone();
        let (w, k) = (workflow.to_string(), key.to_string());
        let held = self
            .bridge
            .block(async move { cluster.held_key(&w, &k).await })
            .map_err(shared)?;
        Ok(held.map(|(h, _)| h.record))
    }

    fn reserve_key(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<std::result::Result<(), KeyRecord>> {
        let cluster = self.cluster.clone();
        let (w, k, r) = (workflow.to_string(), key.to_string(), run_id.to_string());
        let reserved = self
            .bridge
            .block(async move { cluster.reserve_key(&w, &k, &r).await })
            .map_err(shared)?;
        Ok(match reserved {
            Ok(lease) => {
                self.leases()
                    .insert((workflow.to_string(), key.to_string()), lease);
                Ok(())
            }
            Err(held) => Err(held.record),
        })
    }

    fn set_key(&self, workflow: &str, key: &str, run_id: &str, phase: KeyPhase) -> Result<()> {
        let lease = match self.lease_or_current(workflow, key)? {
            Some(lease) => lease,
            None => {
                // Not held by anyone (a dry run's key is never reserved; an operator's
                // settling): make it.
                let cluster = self.cluster.clone();
                let (w, k, r) = (workflow.to_string(), key.to_string(), run_id.to_string());
                match self
                    .bridge
                    .block(async move { cluster.reserve_key(&w, &k, &r).await })
                    .map_err(shared)?
                {
                    Ok(lease) => lease,
                    Err(now) => return Err(fenced(workflow, key, Some(&now))),
                }
            }
        };
        let cluster = self.cluster.clone();
        let r = run_id.to_string();
        let moved = self
            .bridge
            .block(async move { cluster.advance_key(&lease, &r, phase).await })
            .map_err(shared)?;
        match moved {
            Ok(lease) => {
                let done = matches!(phase, KeyPhase::Committed | KeyPhase::InDoubt);
                let mut leases = self.leases();
                let id = (workflow.to_string(), key.to_string());
                if done {
                    leases.remove(&id);
                } else {
                    leases.insert(id, lease);
                }
                Ok(())
            }
            Err(f) => {
                self.leases()
                    .remove(&(workflow.to_string(), key.to_string()));
                Err(fenced(workflow, key, f.now.as_ref()))
            }
        }
    }

    fn release_key(&self, workflow: &str, key: &str) -> Result<()> {
        let Some(lease) = self.lease_or_current(workflow, key)? else {
            return Ok(()); // free already
        };
        self.leases()
            .remove(&(workflow.to_string(), key.to_string()));
        let cluster = self.cluster.clone();
        let released = self
            .bridge
            .block(async move { cluster.release_key(&lease).await })
            .map_err(shared)?;
        // Fenced: another daemon has it now; it is not ours to free.
        released.map_err(|f| fenced(workflow, key, f.now.as_ref()))
    }

    fn keys_in_doubt(&self) -> Result<Vec<KeyRecord>> {
        let cluster = self.cluster.clone();
        self.bridge
            .block(async move { cluster.keys_in_doubt().await })
            .map_err(shared)
    }

    fn put_run(&self, run: &RunRecord) -> Result<()> {
        self.local.put_run(run)
    }

    fn set_retention(&self, retention: Retention) {
        self.local.set_retention(retention)
    }

    fn prune_runs(&self, now: DateTime<Utc>) -> Result<usize> {
        self.local.prune_runs(now)
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        self.local.run(id)
    }

    fn runs(&self, keep: &dyn Fn(&RunRecord) -> bool, limit: usize) -> Result<Vec<RunRecord>> {
        self.local.runs(keep, limit)
    }

    fn run_page(&self, query: &RunQuery) -> Result<Vec<RunRecord>> {
        self.local.run_page(query)
    }

    fn recent_states(&self, workflow: &str, limit: usize) -> Result<Vec<(String, RunState)>> {
        self.local.recent_states(workflow, limit)
    }

    fn counts(&self) -> Result<Counts> {
        self.local.counts()
    }

    fn last_slot(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        self.local.last_slot(workflow)
    }

    fn set_last_slot(&self, workflow: &str, slot: DateTime<Utc>) -> Result<()> {
        self.local.set_last_slot(workflow, slot)
    }

    fn first_loaded(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        self.local.first_loaded(workflow)
    }

    fn set_first_loaded(&self, workflow: &str, at: DateTime<Utc>) -> Result<()> {
        self.local.set_first_loaded(workflow, at)
    }

    fn add_day_spend(
        &self,
        workflow: &str,
        day: chrono::NaiveDate,
        spend: &DaySpend,
    ) -> Result<()> {
        self.local.add_day_spend(workflow, day, spend)
    }

    fn day_spend(&self, workflow: &str, day: chrono::NaiveDate) -> Result<DaySpend> {
        self.local.day_spend(workflow, day)
    }

    fn put_owed(&self, key: &str, bytes: &[u8]) -> Result<()> {
        self.local.put_owed(key, bytes)
    }

    fn remove_owed(&self, key: &str) -> Result<()> {
        self.local.remove_owed(key)
    }

    fn owed(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.local.owed(prefix)
    }

    fn remember_delivery(
        &self,
        workflow: &str,
        id: &str,
        seen: &SeenDelivery,
        now: DateTime<Utc>,
    ) -> Result<Option<SeenDelivery>> {
        self.local.remember_delivery(workflow, id, seen, now)
    }

    fn forget_deliveries(&self, now: DateTime<Utc>) -> Result<usize> {
        self.local.forget_deliveries(now)
    }

    fn case_events(&self, case: &str) -> Result<Vec<(u64, Vec<u8>)>> {
        self.local.case_events(case)
    }

    fn append_case_event(&self, case: &str, version: u64, event: &[u8]) -> Result<bool> {
        self.local.append_case_event(case, version, event)
    }

    fn overwrite_case_event_for_tests(&self, case: &str, version: u64, event: &[u8]) -> Result<()> {
        self.local
            .overwrite_case_event_for_tests(case, version, event)
    }

    fn case_ids(&self) -> Result<Vec<String>> {
        self.local.case_ids()
    }

    fn dead_letter(&self, run: &RunRecord) -> Result<()> {
        self.local.dead_letter(run)
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        self.local.dead_letters()
    }

    fn dead_letter_entry(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        self.local.dead_letter_entry(run_id)
    }

    fn remove_dead_letter(&self, run_id: &str) -> Result<bool> {
        self.local.remove_dead_letter(run_id)
    }

    fn queue_review(&self, run_id: &str) -> Result<()> {
        self.local.queue_review(run_id)
    }

    fn in_review(&self, run_id: &str) -> Result<bool> {
        self.local.in_review(run_id)
    }

    fn remove_review(&self, run_id: &str) -> Result<bool> {
        self.local.remove_review(run_id)
    }

    fn review_queue(&self) -> Result<Vec<String>> {
        self.local.review_queue()
    }

    fn approval(&self, workflow: &str) -> Result<Option<Approval>> {
        self.local.approval(workflow)
    }

    fn approve_go_live(&self, approval: &Approval) -> Result<()> {
        self.local.approve_go_live(approval)
    }

    fn revoke_go_live(&self, workflow: &str) -> Result<bool> {
        self.local.revoke_go_live(workflow)
    }

    fn pause(&self, pause: &Pause) -> Result<()> {
        self.local.pause(pause)
    }

    fn resume(&self, workflow: &str) -> Result<Option<Pause>> {
        self.local.resume(workflow)
    }

    fn paused(&self, workflow: &str) -> Result<Option<Pause>> {
        self.local.paused(workflow)
    }
}
