//! A store that keeps everything in memory: the same answers as the sled backend, for
//! tests of the engine's and the runner's rules that need no disk, and for a command
//! that must not leave state behind. Nothing survives the process; a flush does nothing.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use super::model::*;

/// Everything the store keeps, in maps ordered as sled's trees are.
#[derive(Default)]
struct Kept {
    runs: BTreeMap<String, RunRecord>,
    keys: BTreeMap<(String, String), KeyRecord>,
    dead_letters: BTreeMap<String, DeadLetter>,
    review: BTreeMap<String, DateTime<Utc>>,
    approvals: BTreeMap<String, Approval>,
    pauses: BTreeMap<String, Pause>,
    last_slots: BTreeMap<String, DateTime<Utc>>,
    first_loaded: BTreeMap<String, DateTime<Utc>>,
    spend: BTreeMap<(String, chrono::NaiveDate), DaySpend>,
    owed: BTreeMap<String, Vec<u8>>,
    deliveries: BTreeMap<(String, String), SeenDelivery>,
    case_events: BTreeMap<(String, u64), Vec<u8>>,
    retention: Retention,
}

/// The in-memory [`Backend`].
#[derive(Default)]
pub struct MemoryStore {
    kept: Mutex<Kept>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Backend for MemoryStore {
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn put_run(&self, run: &RunRecord) -> Result<()> {
        self.kept().runs.insert(run.run_id.clone(), run.clone());
        Ok(())
    }

    fn set_retention(&self, retention: Retention) {
        self.kept().retention = retention;
    }

    fn prune_runs(&self, now: DateTime<Utc>) -> Result<usize> {
        let mut kept = self.kept();
        let cutoff = run_id_prefix(now - chrono::Duration::days(i64::from(kept.retention.days)));
        let excess = kept.runs.len().saturating_sub(kept.retention.runs);
        let doomed: Vec<String> = kept
            .runs
            .values()
            .enumerate()
            .take_while(|(older, r)| *older < excess || r.run_id < cutoff)
            .filter(|(_, r)| r.state != RunState::Running && !kept.review.contains_key(&r.run_id))
            .map(|(_, r)| r.run_id.clone())
            .collect();
        for id in &doomed {
            kept.runs.remove(id);
        }
        Ok(doomed.len())
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        Ok(self.kept().runs.get(id).cloned())
    }

    fn runs(&self, keep: &dyn Fn(&RunRecord) -> bool, limit: usize) -> Result<Vec<RunRecord>> {
        Ok(self
            .kept()
            .runs
            .values()
            .rev()
            .filter(|r| keep(r))
            .take(limit)
            .cloned()
            .collect())
    }

    fn run_page(&self, q: &RunQuery) -> Result<Vec<RunRecord>> {
        let since = q.since.map(run_id_prefix).unwrap_or_default();
        let mut until = q.until.map(run_id_prefix);
        if let Some(before) = &q.before {
            until = Some(until.map_or(before.clone(), |u| u.min(before.clone())));
        }
        Ok(self
            .kept()
            .runs
            .values()
            .rev()
            .filter(|r| r.run_id >= since && until.as_ref().is_none_or(|u| &r.run_id < u))
            .filter(|r| q.workflow.as_ref().is_none_or(|w| &r.workflow == w))
            .filter(|r| q.state.is_none_or(|s| r.state == s))
            .take(q.limit)
            .cloned()
            .collect())
    }

    fn recent_states(&self, workflow: &str, limit: usize) -> Result<Vec<(String, RunState)>> {
        Ok(self
            .kept()
            .runs
            .values()
            .rev()
            .filter(|r| r.workflow == workflow)
            .take(limit)
            .map(|r| (r.run_id.clone(), r.state))
            .collect())
    }

    fn counts(&self) -> Result<Counts> {
        let kept = self.kept();
        Ok(Counts {
            dead_letters: kept.dead_letters.len(),
            review_waiting: kept.review.len(),
            keys_in_doubt: kept
                .keys
                .values()
                .filter(|k| k.phase == KeyPhase::InDoubt)
                .count(),
        })
    }

    fn last_slot(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        Ok(self.kept().last_slots.get(workflow).copied())
    }

    fn set_last_slot(&self, workflow: &str, slot: DateTime<Utc>) -> Result<()> {
        self.kept().last_slots.insert(workflow.to_string(), slot);
        Ok(())
    }

    fn first_loaded(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        Ok(self.kept().first_loaded.get(workflow).copied())
    }

    fn set_first_loaded(&self, workflow: &str, at: DateTime<Utc>) -> Result<()> {
        self.kept().first_loaded.insert(workflow.to_string(), at);
        Ok(())
    }

    fn add_day_spend(
        &self,
        workflow: &str,
        day: chrono::NaiveDate,
        spend: &DaySpend,
    ) -> Result<()> {
        let mut kept = self.kept();
        let sum = kept.spend.entry((workflow.to_string(), day)).or_default();
        sum.cost_usd = (sum.cost_usd + spend.cost_usd).min(f64::MAX);
        sum.tokens = sum.tokens.saturating_add(spend.tokens);
        sum.runs += spend.runs;
        Ok(())
    }

    fn day_spend(&self, workflow: &str, day: chrono::NaiveDate) -> Result<DaySpend> {
        let kept = self.kept();
        Ok(kept
            .spend
            .get(&(workflow.to_string(), day))
            .cloned()
            .unwrap_or_default())
    }

    fn put_owed(&self, key: &str, bytes: &[u8]) -> Result<()> {
        self.kept().owed.insert(key.to_string(), bytes.to_vec());
        Ok(())
    }

    fn remove_owed(&self, key: &str) -> Result<()> {
        self.kept().owed.remove(key);
        Ok(())
    }

    fn owed(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(self
            .kept()
            .owed
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn update_owed(&self, key: &str, next: &OwedUpdate<'_>) -> Result<bool> {
        let mut kept = self.kept();
        let now = kept.owed.get(key).cloned();
        match next(now.as_deref()) {
            Some(new) => {
                kept.owed.insert(key.to_string(), new);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn remember_delivery(
        &self,
        workflow: &str,
        id: &str,
        seen: &SeenDelivery,
        now: DateTime<Utc>,
    ) -> Result<Option<SeenDelivery>> {
        let mut kept = self.kept();
        let key = (workflow.to_string(), id.to_string());
        if let Some(earlier) = kept.deliveries.get(&key).filter(|e| e.until >= now) {
            return Ok(Some(earlier.clone()));
        }
        kept.deliveries.insert(key, seen.clone());
        Ok(None)
    }

    fn forget_deliveries(&self, now: DateTime<Utc>) -> Result<usize> {
        let mut kept = self.kept();
        let before = kept.deliveries.len();
        kept.deliveries.retain(|_, seen| seen.until >= now);
        Ok(before - kept.deliveries.len())
    }

    fn case_events(&self, case: &str) -> Result<Vec<(u64, Vec<u8>)>> {
        Ok(self
            .kept()
            .case_events
            .iter()
            .filter(|((c, _), _)| c == case)
            .map(|((_, v), e)| (*v, e.clone()))
            .collect())
    }

    fn append_case_event(&self, case: &str, version: u64, event: &[u8]) -> Result<bool> {
        let mut kept = self.kept();
        let slot = (case.to_string(), version);
        if kept.case_events.contains_key(&slot) {
            return Ok(false);
        }
        kept.case_events.insert(slot, event.to_vec());
        Ok(true)
    }

    fn case_ids(&self) -> Result<Vec<String>> {
        let mut ids: Vec<String> = self
            .kept()
            .case_events
            .keys()
            .map(|(c, _)| c.clone())
            .collect();
        ids.dedup();
        Ok(ids)
    }

    fn key(&self, workflow: &str, key: &str) -> Result<Option<KeyRecord>> {
        let id = (workflow.to_string(), key.to_string());
        Ok(self.kept().keys.get(&id).cloned())
    }

    fn set_key(&self, workflow: &str, key: &str, run_id: &str, phase: KeyPhase) -> Result<()> {
        let id = (workflow.to_string(), key.to_string());
        self.kept()
            .keys
            .insert(id, KeyRecord::now(workflow, key, run_id, phase));
        Ok(())
    }

    fn release_key(&self, workflow: &str, key: &str) -> Result<()> {
        let id = (workflow.to_string(), key.to_string());
        self.kept().keys.remove(&id);
        Ok(())
    }

    fn reserve_key(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<std::result::Result<(), KeyRecord>> {
        let mut kept = self.kept();
        let id = (workflow.to_string(), key.to_string());
        if let Some(held) = kept.keys.get(&id) {
            return Ok(Err(held.clone()));
        }
        kept.keys.insert(
            id,
            KeyRecord::now(workflow, key, run_id, KeyPhase::Reserved),
        );
        Ok(Ok(()))
    }

    fn keys_in_doubt(&self) -> Result<Vec<KeyRecord>> {
        Ok(self
            .kept()
            .keys
            .values()
            .filter(|k| k.phase == KeyPhase::InDoubt)
            .cloned()
            .collect())
    }

    fn dead_letter(&self, run: &RunRecord) -> Result<()> {
        let entry = DeadLetter {
            run: run.clone(),
            dead_lettered_at: Utc::now(),
        };
        self.kept().dead_letters.insert(run.run_id.clone(), entry);
        Ok(())
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        Ok(self.kept().dead_letters.values().cloned().collect())
    }

    fn dead_letter_entry(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        Ok(self.kept().dead_letters.get(run_id).cloned())
    }

    fn remove_dead_letter(&self, run_id: &str) -> Result<bool> {
        Ok(self.kept().dead_letters.remove(run_id).is_some())
    }

    fn queue_review(&self, run_id: &str) -> Result<()> {
        self.kept().review.insert(run_id.to_string(), Utc::now());
        Ok(())
    }

    fn in_review(&self, run_id: &str) -> Result<bool> {
        Ok(self.kept().review.contains_key(run_id))
    }

    fn remove_review(&self, run_id: &str) -> Result<bool> {
        Ok(self.kept().review.remove(run_id).is_some())
    }

    fn review_queue(&self) -> Result<Vec<String>> {
        Ok(self.kept().review.keys().cloned().collect())
    }

    fn approval(&self, workflow: &str) -> Result<Option<Approval>> {
        Ok(self.kept().approvals.get(workflow).cloned())
    }

    fn approve_go_live(&self, approval: &Approval) -> Result<()> {
        self.kept()
            .approvals
            .insert(approval.workflow.clone(), approval.clone());
        Ok(())
    }

    fn revoke_go_live(&self, workflow: &str) -> Result<bool> {
        Ok(self.kept().approvals.remove(workflow).is_some())
    }

    fn pause(&self, pause: &Pause) -> Result<()> {
        self.kept()
            .pauses
            .insert(pause.workflow.clone(), pause.clone());
        Ok(())
    }

    fn resume(&self, workflow: &str) -> Result<Option<Pause>> {
        Ok(self.kept().pauses.remove(workflow))
    }

    fn paused(&self, workflow: &str) -> Result<Option<Pause>> {
        Ok(self.kept().pauses.get(workflow).cloned())
    }
}
