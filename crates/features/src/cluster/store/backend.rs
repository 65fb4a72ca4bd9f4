//! A member's answers to [`Backend`]: what is decided once for the cluster goes to the
//! cluster's buckets; what concerns this state folder stays in its own store.

use super::*;

impl Backend for MemberStore {
    fn flush(&self) -> Result<()> {
        // The cluster's writes are on its server's disk once acknowledged.
        self.local.flush()
    }

    fn flush_among(&self, others: usize) -> Result<()> {
        self.local.flush_among(others)
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
        let mut run = run.clone();
        run.daemon = Some(self.cluster.daemon.clone());
        self.local.put_run(&run)?;
        self.view.put_run(&run)?;
        self.mirror.send(run);
        Ok(())
    }

    fn set_retention(&self, retention: Retention) {
        self.local.set_retention(retention);
        self.view.set_retention(retention)
    }

    fn prune_runs(&self, now: DateTime<Utc>) -> Result<usize> {
        self.view.prune_runs(now)?;
        self.local.prune_runs(now)
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        // This daemon's runs in flight are newest here; any other, in the view (an
        // operator may have settled one of ours from another daemon).
        if self.running(id) {
            if let Some(run) = self.local.run(id)? {
                return Ok(Some(run));
            }
        }
        match self.view.run(id)? {
            Some(run) => Ok(Some(run)),
            None => self.local.run(id),
        }
    }

    fn runs(&self, keep: &dyn Fn(&RunRecord) -> bool, limit: usize) -> Result<Vec<RunRecord>> {
        self.view.runs(keep, limit)
    }

    fn run_page(&self, query: &RunQuery) -> Result<Vec<RunRecord>> {
        self.view.run_page(query)
    }

    fn recent_states(&self, workflow: &str, limit: usize) -> Result<Vec<(String, RunState)>> {
        self.view.recent_states(workflow, limit)
    }

    fn counts(&self) -> Result<Counts> {
        self.view.counts()
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
        // Off the run's path: a sum for the dashboard, added when the server answers.
        let (w, spend, cluster) = (workflow.to_string(), *spend, self.cluster.clone());
        self.bridge.spawn(async move {
            let deadline = tokio::time::Instant::now() + STORE_WAIT;
            while let Err(e) = cluster.add_day_spend(&w, day, &spend).await {
                if tokio::time::Instant::now() >= deadline {
                    return tracing::warn!(workflow = %w, "cluster: a run's spend was not added to its day: {e}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ok(())
    }

    fn day_spend(&self, workflow: &str, day: chrono::NaiveDate) -> Result<DaySpend> {
        let w = workflow.to_string();
        self.call(move |c| {
            let w = w.clone();
            async move { c.day_spend(&w, day).await }
        })
    }

    fn put_owed(&self, key: &str, bytes: &[u8]) -> Result<()> {
        let (k, b, owned) = (key.to_string(), bytes.to_vec(), key.starts_with(OUTBOX));
        self.call_within(OWED_WAIT, move |c| {
            let (k, b) = (k.clone(), b.clone());
            async move { c.put_owed(&k, &b, owned).await }
        })
    }

    fn remove_owed(&self, key: &str) -> Result<()> {
        let k = key.to_string();
        self.call_within(OWED_WAIT, move |c| {
            let k = k.clone();
            async move { c.remove_owed(&k).await }
        })
    }

    fn owed(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let (p, owned) = (prefix.to_string(), prefix.starts_with(OUTBOX));
        self.call_within(OWED_WAIT, move |c| {
            let p = p.clone();
            async move { c.owed(&p, owned).await }
        })
    }

    fn update_owed(&self, key: &str, next: &OwedUpdate<'_>) -> Result<bool> {
        let k = key.to_string();
        loop {
            let now = self.call_within(OWED_WAIT, {
                let k = k.clone();
                move |c| {
                    let k = k.clone();
                    async move { c.owed_entry(&k).await }
                }
            })?;
            let Some(new) = next(now.as_ref().map(|r| r.value.as_slice())) else {
                return Ok(false);
            };
            let revision = now.map(|r| r.revision);
            let swapped = self.call_within(OWED_WAIT, {
                let k = k.clone();
                move |c| {
                    let (k, new) = (k.clone(), new.clone());
                    async move { c.swap_owed(&k, revision, new).await }
                }
            })?;
            if swapped {
                return Ok(true);
            }
        }
    }

    fn claim_file(&self, workflow: &str, file: &str) -> Result<bool> {
        let (w, f) = (workflow.to_string(), file.to_string());
        self.call(move |c| {
            let (w, f) = (w.clone(), f.clone());
            async move { c.claim_file(&w, &f).await }
        })
    }

    fn release_file(&self, workflow: &str, file: &str) -> Result<()> {
        let (w, f) = (workflow.to_string(), file.to_string());
        self.call(move |c| {
            let (w, f) = (w.clone(), f.clone());
            async move { c.release_file(&w, &f).await }
        })
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

    fn case_ids(&self) -> Result<Vec<String>> {
        self.call(|c| async move { c.case_ids().await })
    }

    fn dead_letter(&self, run: &RunRecord) -> Result<()> {
        let mut run = run.clone();
        run.daemon = Some(self.cluster.daemon.clone());
        self.call(move |c| {
            let run = run.clone();
            async move { c.dead_letter(&run).await }
        })
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        self.call(|c| async move { c.dead_letters().await })
    }

    fn dead_letter_entry(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        self.named(
            run_id,
            |c, id| async move { c.dead_letter_entry(&id).await },
        )
    }

    fn remove_dead_letter(&self, run_id: &str) -> Result<bool> {
        self.named(
            run_id,
            |c, id| async move { c.remove_dead_letter(&id).await },
        )
    }

    fn queue_review(&self, run_id: &str) -> Result<()> {
        self.named(run_id, |c, id| async move { c.queue_review(&id).await })
    }

    fn in_review(&self, run_id: &str) -> Result<bool> {
        self.named(run_id, |c, id| async move { c.in_review(&id).await })
    }

    fn remove_review(&self, run_id: &str) -> Result<bool> {
        self.named(run_id, |c, id| async move { c.remove_review(&id).await })
    }

    fn review_queue(&self) -> Result<Vec<String>> {
        self.call(|c| async move { c.review_queue().await })
    }

    fn approval(&self, workflow: &str) -> Result<Option<Approval>> {
        cached(&self.approvals, "approval", workflow)
    }

    fn approve_go_live(&self, approval: &Approval) -> Result<()> {
        let a = approval.clone();
        self.call(move |c| {
            let a = a.clone();
            async move { c.approve_go_live(&a).await }
        })?;
        let bytes = serde_json::to_vec(approval).map_err(|e| StoreError::Shared(e.to_string()))?;
        self.approvals.set(&approval.workflow, Some(bytes));
        Ok(())
    }

    fn revoke_go_live(&self, workflow: &str) -> Result<bool> {
        let had = self.named(workflow, |c, w| async move { c.revoke_go_live(&w).await })?;
        self.approvals.set(workflow, None);
        Ok(had)
    }

    fn pause(&self, pause: &Pause) -> Result<()> {
        let p = pause.clone();
        self.call(move |c| {
            let p = p.clone();
            async move { c.pause(&p).await }
        })?;
        let bytes = serde_json::to_vec(pause).map_err(|e| StoreError::Shared(e.to_string()))?;
        self.pauses.set(&pause.workflow, Some(bytes));
        Ok(())
    }

    fn resume(&self, workflow: &str) -> Result<Option<Pause>> {
        let had = self.named(workflow, |c, w| async move { c.resume(&w).await })?;
        self.pauses.set(workflow, None);
        Ok(had)
    }

    fn paused(&self, workflow: &str) -> Result<Option<Pause>> {
        cached(&self.pauses, "pause", workflow)
    }
}
