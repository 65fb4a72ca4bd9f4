//! The sled backend's answers to [`Backend`]: each of the store's questions as a read or
//! write of its trees.

use chrono::{DateTime, Utc};

use super::super::model::*;
use super::*;

impl Backend for SledStore {
    fn flush(&self) -> Result<()> {
        self.flush_among(0)
    }

    fn flush_among(&self, others: usize) -> Result<()> {
        super::super::group::off_runtime(|| {
            self.group.flush_among(others, || {
                FLUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let delay = flush_delay().unwrap_or_default();
                std::thread::sleep(delay / 2);
                let flushed = self.db.flush().map(|_| ());
                std::thread::sleep(delay - delay / 2);
                flushed
            })
        })?;
        Ok(())
    }

    fn put_run(&self, run: &RunRecord) -> Result<()> {
        // Index first: a crash between the two leaves an index entry without a record
        // (readers skip it, pruning removes it), never a record pruning cannot see.
        self.index_run(run)?;
        self.put(&self.runs, &run.run_id, run)?;
        if run.state == RunState::Running {
            self.active.insert(run.run_id.as_bytes(), &[])?;
        } else {
            self.active.remove(run.run_id.as_bytes())?;
            if self.finished_since_prune.fetch_add(1, Ordering::Relaxed) + 1 >= PRUNE_EVERY {
                self.finished_since_prune.store(0, Ordering::Relaxed);
                self.prune_runs(Utc::now())?;
            }
        }
        Ok(())
    }

    fn set_retention(&self, retention: Retention) {
        *self.retention.lock().unwrap_or_else(|p| p.into_inner()) = retention;
    }

    fn prune_runs(&self, now: DateTime<Utc>) -> Result<usize> {
        let retention = *self.retention.lock().unwrap_or_else(|p| p.into_inner());
        // Run ids start with their start time, so key order is age order.
        let cutoff = (now - chrono::Duration::days(i64::from(retention.days)))
            .format("%Y%m%dT%H%M%S%3f")
            .to_string();
        // Oldest first, and only as far as the doomed go: the runs beyond the newest
        // `retention.runs`, and the expired. A walk over every run would pull each
        // record into memory (tens of MiB with 100,000 runs) to keep almost all of them.
        let excess = self.run_count()?.saturating_sub(retention.runs as u64);
        let mut doomed = Vec::new();
        for (older, key) in self.run_meta.iter().keys().enumerate() {
            let key = key?;
            if older as u64 >= excess && key.as_ref() >= cutoff.as_bytes() {
                break;
            }
            if self.active.contains_key(&key)? || self.review.contains_key(&key)? {
                continue;
            }
            doomed.push(key);
        }
        for key in &doomed {
            self.runs.remove(key)?;
            if let Some(meta) = self.run_meta.remove(key)? {
                self.unindex(&String::from_utf8_lossy(key), &meta)?;
                self.count_runs(-1)?;
            }
        }
        if !doomed.is_empty() {
            tracing::debug!(pruned = doomed.len(), "old run records pruned");
        }
        Ok(doomed.len())
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        get(&self.runs, "runs", id)
    }

    fn runs(&self, keep: &dyn Fn(&RunRecord) -> bool, limit: usize) -> Result<Vec<RunRecord>> {
        let mut out = Vec::new();
        for item in self.runs.iter().rev() {
            let (k, v) = item?;
            let run: RunRecord = decode("runs", &k, &v)?;
            if keep(&run) {
                out.push(run);
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn run_page(&self, q: &RunQuery) -> Result<Vec<RunRecord>> {
        let prefix = match (&q.workflow, q.state) {
            (Some(w), Some(s)) => format!("x\0{w}\0{}\0", s.name()),
            (Some(w), None) => format!("w\0{w}\0"),
            (None, Some(s)) => format!("s\0{}\0", s.name()),
            (None, None) => String::new(),
        };
        let low = format!("{prefix}{}", q.since.map(run_id_prefix).unwrap_or_default());
        let mut high = q.until.map(run_id_prefix);
        if let Some(before) = &q.before {
            high = Some(high.map_or(before.clone(), |h| h.min(before.clone())));
        }
        let high = match high {
            Some(h) => format!("{prefix}{h}").into_bytes(),
            // Past every id under the prefix (ids are ASCII, below 0xff).
            None => format!("{prefix}\u{7f}").into_bytes(),
        };
        let tree = if prefix.is_empty() {
            &self.runs
        } else {
            &self.run_index
        };
        let keep = |r: &RunRecord| {
            q.workflow.as_ref().is_none_or(|w| &r.workflow == w)
                && q.state.is_none_or(|s| r.state == s)
        };
        let mut out = Vec::new();
        for key in tree.range(low.into_bytes()..high).keys().rev() {
            let key = key?;
            let id = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
            if let Some(run) = self.run(&id)?.filter(keep) {
                out.push(run);
                if out.len() >= q.limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn recent_states(&self, workflow: &str, limit: usize) -> Result<Vec<(String, RunState)>> {
        let prefix = format!("w\0{workflow}\0");
        let mut out = Vec::new();
        for key in self.run_index.scan_prefix(prefix.as_bytes()).keys().rev() {
            let key = key?;
            let Some(meta) = self.run_meta.get(&key[prefix.len()..])? else {
                continue;
            };
            let meta = String::from_utf8_lossy(&meta).into_owned();
            let state = meta.split('\0').next().and_then(RunState::from_name);
            if let Some(state) = state {
                out.push((
                    String::from_utf8_lossy(&key[prefix.len()..]).into_owned(),
                    state,
                ));
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn counts(&self) -> Result<Counts> {
        let mut in_doubt = 0;
        for value in self.keys.iter().values() {
            // Read without decoding: a scrape must stay cheap with many keys.
            if memchr::memmem::find(&value?, b"\"in-doubt\"").is_some() {
                in_doubt += 1;
            }
        }
        Ok(Counts {
            dead_letters: self.dead_letter.len(),
            review_waiting: self.review.len(),
            keys_in_doubt: in_doubt,
        })
    }

    fn last_slot(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        get(&self.meta, "meta", &format!("last_slot/{workflow}"))
    }

    fn set_last_slot(&self, workflow: &str, slot: DateTime<Utc>) -> Result<()> {
        self.put(&self.meta, &format!("last_slot/{workflow}"), &slot)
    }

    fn remember_delivery(
        &self,
        workflow: &str,
        id: &str,
        seen: &SeenDelivery,
        now: DateTime<Utc>,
    ) -> Result<Option<SeenDelivery>> {
        let key = format!("{workflow}\0{id}");
        let new = encode(seen);
        let mut expected: Option<sled::IVec> = None;
        loop {
            match self.deliveries.compare_and_swap(
                key.as_bytes(),
                expected.clone(),
                Some(new.clone()),
            )? {
                Ok(()) => break,
                Err(current) => {
                    let Some(bytes) = current.current else {
                        expected = None;
                        continue;
                    };
                    let earlier: SeenDelivery = decode("deliveries", key.as_bytes(), &bytes)?;
                    if earlier.until >= now {
                        return Ok(Some(earlier));
                    }
                    // Remembered, but past its time: take its place.
                    expected = Some(bytes);
                }
            }
        }
        // No flush of its own on the request's path: sled's own (every 500 ms), the run's
        // key reservation and the daemon's last flush carry it; the delivery id is the
        // run's idempotency key too, so one lost in a crash still never commits twice.
        Ok(None)
    }

    fn forget_deliveries(&self, now: DateTime<Utc>) -> Result<usize> {
        let mut gone = 0;
        for item in self.deliveries.iter() {
            let (k, v) = item?;
            let seen: SeenDelivery = decode("deliveries", &k, &v)?;
            if seen.until < now
                && self
                    .deliveries
                    .compare_and_swap(&k, Some(v), None::<sled::IVec>)?
                    .is_ok()
            {
                gone += 1;
            }
        }
        Ok(gone)
    }

    fn add_day_spend(
        &self,
        workflow: &str,
        day: chrono::NaiveDate,
        spend: &DaySpend,
    ) -> Result<()> {
        let key = format!("spend/{workflow}/{day}");
        self.meta.update_and_fetch(key.as_bytes(), |old| {
            let mut sum: DaySpend = old
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or_default();
            sum.cost_usd = (sum.cost_usd + spend.cost_usd).min(f64::MAX);
            sum.tokens = sum.tokens.saturating_add(spend.tokens);
            sum.runs += spend.runs;
            serde_json::to_vec(&sum).ok()
        })?;
        Ok(())
    }

    fn day_spend(&self, workflow: &str, day: chrono::NaiveDate) -> Result<DaySpend> {
        Ok(get(&self.meta, "meta", &format!("spend/{workflow}/{day}"))?.unwrap_or_default())
    }

    fn put_owed(&self, key: &str, bytes: &[u8]) -> Result<()> {
        self.owed.insert(key.as_bytes(), bytes)?;
        Ok(())
    }

    fn remove_owed(&self, key: &str) -> Result<()> {
        self.owed.remove(key.as_bytes())?;
        Ok(())
    }

    fn owed(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.owed
            .scan_prefix(prefix.as_bytes())
            .map(|item| {
                let (k, v) = item?;
                Ok((String::from_utf8_lossy(&k).into_owned(), v.to_vec()))
            })
            .collect()
    }

    fn update_owed(&self, key: &str, next: &OwedUpdate<'_>) -> Result<bool> {
        loop {
            let now = self.owed.get(key.as_bytes())?;
            let Some(new) = next(now.as_deref()) else {
                return Ok(false);
            };
            if self
                .owed
                .compare_and_swap(key.as_bytes(), now, Some(new))?
                .is_ok()
            {
                return Ok(true);
            }
        }
    }

    fn first_loaded(&self, workflow: &str) -> Result<Option<DateTime<Utc>>> {
        get(&self.meta, "meta", &format!("first_loaded/{workflow}"))
    }

    fn set_first_loaded(&self, workflow: &str, at: DateTime<Utc>) -> Result<()> {
        self.put(&self.meta, &format!("first_loaded/{workflow}"), &at)
    }

    fn case_events(&self, case: &str) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut prefix = case.as_bytes().to_vec();
        prefix.push(0);
        self.case_events
            .scan_prefix(&prefix)
            .map(|item| {
                let (k, v) = item?;
                let mut ver = [0u8; 8];
                ver.copy_from_slice(&k[k.len().saturating_sub(8)..]);
                Ok((u64::from_be_bytes(ver), v.to_vec()))
            })
            .collect()
    }

    fn append_case_event(&self, case: &str, version: u64, event: &[u8]) -> Result<bool> {
        let key = Self::case_key(case, version);
        match self
            .case_events
            .compare_and_swap(&key, None as Option<&[u8]>, Some(event))?
        {
            Ok(()) => {
                self.flush()?;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    fn case_ids(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for item in self.case_events.iter().keys() {
            let k = item?;
            let id = String::from_utf8_lossy(&k[..k.len().saturating_sub(9)]).into_owned();
            if out.last() != Some(&id) {
                out.push(id);
            }
        }
        Ok(out)
    }

    fn key(&self, workflow: &str, key: &str) -> Result<Option<KeyRecord>> {
        let id = Self::key_id(workflow, key);
        match self.keys.get(&id)? {
            Some(v) => Ok(Some(decode("keys", &id, &v)?)),
            None => Ok(None),
        }
    }

    fn set_key(&self, workflow: &str, key: &str, run_id: &str, phase: KeyPhase) -> Result<()> {
        let rec = KeyRecord::now(workflow, key, run_id, phase);
        self.keys
            .insert(Self::key_id(workflow, key), encode(&rec))?;
        Ok(())
    }

    fn release_key(&self, workflow: &str, key: &str) -> Result<()> {
        self.keys.remove(Self::key_id(workflow, key))?;
        Ok(())
    }

    fn reserve_key(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<std::result::Result<(), KeyRecord>> {
        let id = Self::key_id(workflow, key);
        let rec = KeyRecord::now(workflow, key, run_id, KeyPhase::Reserved);
        match self
            .keys
            .compare_and_swap(&id, None as Option<&[u8]>, Some(encode(&rec)))?
        {
            Ok(()) => Ok(Ok(())),
            Err(cas) => match cas.current {
                Some(v) => Ok(Err(decode("keys", &id, &v)?)),
                None => Ok(Err(rec)),
            },
        }
    }

    fn keys_in_doubt(&self) -> Result<Vec<KeyRecord>> {
        let mut out = Vec::new();
        for item in self.keys.iter() {
            let (k, v) = item?;
            let rec: KeyRecord = decode("keys", &k, &v)?;
            if rec.phase == KeyPhase::InDoubt {
                out.push(rec);
            }
        }
        Ok(out)
    }

    fn dead_letter(&self, run: &RunRecord) -> Result<()> {
        let entry = DeadLetter {
            run: run.clone(),
            dead_lettered_at: Utc::now(),
        };
        self.put(&self.dead_letter, &run.run_id, &entry)
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        all(&self.dead_letter, "dead_letter")
    }

    fn dead_letter_entry(&self, run_id: &str) -> Result<Option<DeadLetter>> {
        get(&self.dead_letter, "dead_letter", run_id)
    }

    fn remove_dead_letter(&self, run_id: &str) -> Result<bool> {
        Ok(self.dead_letter.remove(run_id.as_bytes())?.is_some())
    }

    fn queue_review(&self, run_id: &str) -> Result<()> {
        self.review.insert(run_id.as_bytes(), encode(&Utc::now()))?;
        Ok(())
    }

    fn in_review(&self, run_id: &str) -> Result<bool> {
        Ok(self.review.contains_key(run_id.as_bytes())?)
    }

    fn remove_review(&self, run_id: &str) -> Result<bool> {
        Ok(self.review.remove(run_id.as_bytes())?.is_some())
    }

    fn review_queue(&self) -> Result<Vec<String>> {
        self.review
            .iter()
            .keys()
            .map(|k| Ok(String::from_utf8_lossy(&k?).into_owned()))
            .collect()
    }

    fn approval(&self, workflow: &str) -> Result<Option<Approval>> {
        get(&self.approvals, "approvals", workflow)
    }

    fn approve_go_live(&self, approval: &Approval) -> Result<()> {
        self.put(&self.approvals, &approval.workflow, approval)
    }

    fn revoke_go_live(&self, workflow: &str) -> Result<bool> {
        Ok(self.approvals.remove(workflow.as_bytes())?.is_some())
    }

    fn pause(&self, pause: &Pause) -> Result<()> {
        self.put(&self.pauses, &pause.workflow, pause)
    }

    fn resume(&self, workflow: &str) -> Result<Option<Pause>> {
        match self.pauses.remove(workflow.as_bytes())? {
            Some(v) => Ok(Some(decode("pauses", workflow.as_bytes(), &v)?)),
            None => Ok(None),
        }
    }

    fn paused(&self, workflow: &str) -> Result<Option<Pause>> {
        get(&self.pauses, "pauses", workflow)
    }
}
