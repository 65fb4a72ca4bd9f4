//! The store of a daemon in a cluster: what must be decided once for the whole cluster —
//! idempotency keys ([`super::keys`], compare-and-set on revision), agency cases
//! ([`super::cases`], appends that expect the last sequence), webhook deliveries seen
//! ([`super::webhooks`]) and go-live approvals ([`super::approvals`]) — is kept in the
//! cluster; the rest stays in this daemon's own store for now (runs, review, dead
//! letters, pauses, the alert outbox; the next step of issue 28 moves them).
//!
//! A key this daemon reserved is held with a lease (the revision it last wrote); each move
//! of the key is made at that revision, so a daemon whose key was freed or taken over
//! meanwhile (it was cut off past its heartbeat) gets an error instead of moving it, and
//! its run does not commit. A server that cannot be reached is waited for, up to
//! [`STORE_WAIT`]: a run in flight across a short outage finishes, its commit waiting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::bridge::Bridge;
use super::connection::Cluster;
use super::keys::Lease;
use crate::store::{
    Approval, Backend, Counts, DaySpend, DeadLetter, KeyPhase, KeyRecord, Pause, Result, Retention,
    RunQuery, RunRecord, RunState, SeenDelivery, Store, StoreError,
};

/// How long a key's move waits for an unreachable server before the run gives up on it:
/// a short outage (a restart of the server) is waited out; a long one fails the run
/// before its commit, or leaves its key in doubt after it.
pub const STORE_WAIT: Duration = Duration::from_secs(30);

/// Whether a run of this daemon is in flight, by run id.
pub type InFlight = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A cluster member's store: keys in the cluster, the rest in `local`.
pub struct MemberStore {
    local: Store,
    cluster: Cluster,
    bridge: Bridge,
    /// The keys this daemon holds, by (workflow, key).
    leases: Mutex<HashMap<(String, String), Lease>>,
    /// Which of this daemon's runs are in flight (set once the runner exists).
    in_flight: std::sync::RwLock<Option<InFlight>>,
}

impl MemberStore {
    pub fn new(local: Store, cluster: Cluster, bridge: Bridge) -> MemberStore {
        MemberStore {
            local,
            cluster,
            bridge,
            leases: Mutex::new(HashMap::new()),
            in_flight: std::sync::RwLock::new(None),
        }
    }

    /// Tells the store how to ask whether one of this daemon's runs is in flight: a key it
    /// holds for a run that is not (the run ended in an error, the server gone meanwhile)
    /// is its own leftover, settled when the key is wanted again.
    pub fn set_in_flight(&self, in_flight: InFlight) {
        *self.in_flight.write().unwrap_or_else(|p| p.into_inner()) = Some(in_flight);
    }

    fn running(&self, run_id: &str) -> bool {
        self.in_flight
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|f| f(run_id))
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Lease>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, workflow: &str, key: &str) {
        self.leases()
            .remove(&(workflow.to_string(), key.to_string()));
    }

    /// Runs `op` on the cluster's runtime, trying again while the server cannot be
    /// reached, for at most [`STORE_WAIT`]. Each try is safe to repeat: a key's move that
    /// took effect but whose answer was lost is recognised as this daemon's own. The
    /// daemon's runtime thread hands its other work on while it waits.
    fn call<T, F, Fut>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Cluster) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, super::ClusterError>>
            + Send
            + 'static,
    {
        let wait = || {
            let deadline = std::time::Instant::now() + STORE_WAIT;
            let mut pause = Duration::from_millis(50);
            loop {
                match self.bridge.block(op(self.cluster.clone())) {
                    Err(super::ClusterError::Store(why))
                        if std::time::Instant::now() + pause < deadline =>
                    {
                        tracing::debug!("cluster store unreachable ({why}); trying again");
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                    done => return done.map_err(shared),
                }
            }
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            _ => wait(),
        }
    }

    /// What holds a key now, and at which revision.
    fn held(&self, workflow: &str, key: &str) -> Result<Option<(super::keys::HeldKey, u64)>> {
        let (w, k) = (workflow.to_string(), key.to_string());
        self.call(move |c| {
            let (w, k) = (w.clone(), k.clone());
            async move { c.held_key(&w, &k).await }
        })
    }

    /// The lease to move a key with: this daemon's own, or (for an operator's settling of
    /// a key another daemon left) the key's current revision.
    fn lease_or_current(&self, workflow: &str, key: &str) -> Result<Option<Lease>> {
        if let Some(lease) = self
            .leases()
            .get(&(workflow.to_string(), key.to_string()))
            .cloned()
        {
            return Ok(Some(lease));
        }
        Ok(self.held(workflow, key)?.map(|(_, revision)| Lease {
            workflow: workflow.to_string(),
            key: key.to_string(),
            revision,
        }))
    }

    fn reserve(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<std::result::Result<Lease, super::keys::HeldKey>> {
        let (w, k, r) = (workflow.to_string(), key.to_string(), run_id.to_string());
        self.call(move |c| {
            let (w, k, r) = (w.clone(), k.clone(), r.clone());
            async move { c.reserve_key(&w, &k, &r).await }
        })
    }

    fn advance(
        &self,
        lease: Lease,
        run_id: &str,
        phase: KeyPhase,
    ) -> Result<std::result::Result<Lease, super::keys::Fenced>> {
        let r = run_id.to_string();
        self.call(move |c| {
            let (lease, r) = (lease.clone(), r.clone());
            async move { c.advance_key(&lease, &r, phase).await }
        })
    }

    fn release(&self, lease: Lease) -> Result<std::result::Result<(), super::keys::Fenced>> {
        self.call(move |c| {
            let lease = lease.clone();
            async move { c.release_key(&lease).await }
        })
    }

    /// A key this daemon holds for a run of its own that is no longer in flight: freed if
    /// its commit had not begun (true), put in doubt if it had (false).
    fn settle_leftover(&self, held: &KeyRecord) -> Result<bool> {
        let Some((now, revision)) = self.held(&held.workflow, &held.key)? else {
            return Ok(true);
        };
        if now.daemon != self.cluster.daemon || now.record.run_id != held.run_id {
            return Ok(false);
        }
        self.forget(&held.workflow, &held.key);
        let lease = Lease {
            workflow: held.workflow.clone(),
            key: held.key.clone(),
            revision,
        };
        match now.record.phase {
            KeyPhase::Reserved => Ok(self.release(lease)?.is_ok()),
            KeyPhase::Committing => {
                let _ = self.advance(lease, &held.run_id, KeyPhase::InDoubt)?;
                tracing::warn!(workflow = %held.workflow, key = %held.key, run = %held.run_id, "cluster: this daemon's run ended in an error during its commit: key in doubt, see `steward in-doubt list`");
                Ok(false)
            }
            _ => Ok(false),
        }
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
        Ok(self.held(workflow, key)?.map(|(h, _)| h.record))
    }

    fn reserve_key(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<std::result::Result<(), KeyRecord>> {
        // Twice at most: once more after freeing a leftover of this daemon's own.
        for _ in 0..2 {
            match self.reserve(workflow, key, run_id)? {
                Ok(lease) => {
                    self.leases()
                        .insert((workflow.to_string(), key.to_string()), lease);
                    return Ok(Ok(()));
                }
                Err(held)
                    if held.daemon == self.cluster.daemon
                        && held.record.run_id != run_id
                        && matches!(
                            held.record.phase,
                            KeyPhase::Reserved | KeyPhase::Committing
                        )
                        && !self.running(&held.record.run_id) =>
                {
                    if !self.settle_leftover(&held.record)? {
                        return Ok(Err(self.key(workflow, key)?.unwrap_or(held.record)));
                    }
                }
                Err(held) => return Ok(Err(held.record)),
            }
        }
        match self.key(workflow, key)? {
            Some(now) => Ok(Err(now)),
            None => Err(StoreError::Shared(format!(
                "idempotency key `{key}` of `{workflow}`: freed, but another reservation came first"
            ))),
        }
    }

    fn set_key(&self, workflow: &str, key: &str, run_id: &str, phase: KeyPhase) -> Result<()> {
        let lease = match self.lease_or_current(workflow, key)? {
            Some(lease) => lease,
            // Not held by anyone (an operator's settling): make it.
            None => match self.reserve(workflow, key, run_id)? {
                Ok(lease) => lease,
                Err(now) => return Err(fenced(workflow, key, Some(&now))),
            },
        };
        match self.advance(lease, run_id, phase)? {
            Ok(lease) => {
                if matches!(phase, KeyPhase::Committed | KeyPhase::InDoubt) {
                    self.forget(workflow, key);
                } else {
                    self.leases()
                        .insert((workflow.to_string(), key.to_string()), lease);
                }
                Ok(())
            }
            Err(f) => {
                self.forget(workflow, key);
                Err(fenced(workflow, key, f.now.as_ref()))
            }
        }
    }

    fn release_key(&self, workflow: &str, key: &str) -> Result<()> {
        let Some(lease) = self.lease_or_current(workflow, key)? else {
            return Ok(()); // free already
        };
        self.forget(workflow, key);
        // Fenced: another daemon has it now; it is not ours to free.
        self.release(lease)?
            .map_err(|f| fenced(workflow, key, f.now.as_ref()))
    }

    fn keys_in_doubt(&self) -> Result<Vec<KeyRecord>> {
        self.call(|c| async move { c.keys_in_doubt().await })
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
        let (w, i, seen) = (workflow.to_string(), id.to_string(), seen.clone());
        self.call(move |c| {
            let (w, i, seen) = (w.clone(), i.clone(), seen.clone());
            async move {
                match c.remember_delivery(&w, &i, &seen, now).await {
                    // A retried try that took effect: the sighting found is this one.
                    Ok(Some(earlier)) if earlier == seen => Ok(None),
                    other => other,
                }
            }
        })
    }

    fn forget_deliveries(&self, now: DateTime<Utc>) -> Result<usize> {
        self.call(move |c| async move { c.forget_deliveries(now).await })
    }

    fn case_events(&self, case: &str) -> Result<Vec<(u64, Vec<u8>)>> {
        let case = case.to_string();
        self.call(move |c| {
            let case = case.clone();
            async move { c.case_events(&case).await }
        })
    }

    fn append_case_event(&self, case: &str, version: u64, event: &[u8]) -> Result<bool> {
        let (case, event) = (case.to_string(), event.to_vec());
        self.call(move |c| {
            let (case, event) = (case.clone(), event.clone());
            async move {
                match c.append_case_event(&case, version, &event).await {
                    // A retried append whose first try took effect: the event is ours.
                    Ok(false) => Ok(c
                        .case_events(&case)
                        .await?
                        .iter()
                        .any(|(v, e)| *v == version && *e == event)),
                    other => other,
                }
            }
        })
    }

    fn overwrite_case_event_for_tests(&self, case: &str, version: u64, event: &[u8]) -> Result<()> {
        self.local
            .overwrite_case_event_for_tests(case, version, event)
    }

    fn case_ids(&self) -> Result<Vec<String>> {
        self.call(|c| async move { c.case_ids().await })
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
        let workflow = workflow.to_string();
        self.call(move |c| {
            let workflow = workflow.clone();
            async move { c.approval(&workflow).await }
        })
    }

    fn approve_go_live(&self, approval: &Approval) -> Result<()> {
        let approval = approval.clone();
        self.call(move |c| {
            let approval = approval.clone();
            async move { c.approve_go_live(&approval).await }
        })
    }

    fn revoke_go_live(&self, workflow: &str) -> Result<bool> {
        let workflow = workflow.to_string();
        self.call(move |c| {
            let workflow = workflow.clone();
            async move { c.revoke_go_live(&workflow).await }
        })
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
