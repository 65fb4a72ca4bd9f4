//! The rest of the state, kept once for the whole cluster ([`super::records`] buckets):
//! the review queue, dead letters, pauses (an operator's or the breaker's: one pause
//! holds every daemon), each workflow's spend by day (its daily caps count every
//! daemon's runs), and what alerting and the dead-man's switch owe or told.
//!
//! Alerts owed are each owned by the daemon that is delivering them: a starting daemon
//! resumes its predecessors' on the same state folder and those of daemons gone, never
//! one another daemon is still delivering.

use chrono::Utc;

use super::connection::Cluster;
use super::error::ClusterError;
use super::records::Read;
use crate::store::{DaySpend, DeadLetter, Pause, RunRecord};

/// An alert owed, with the daemon delivering it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Owned {
    daemon: String,
    /// The one machine's bytes (the alert module's JSON).
    owed: serde_json::Value,
}

impl Cluster {
    pub async fn queue_review(&self, run_id: &str) -> Result<(), ClusterError> {
        self.records
            .review
            .put_json(run_id, &Utc::now())
            .await
            .map(|_| ())
    }

    pub async fn in_review(&self, run_id: &str) -> Result<bool, ClusterError> {
        Ok(self.records.review.get(run_id).await?.is_some())
    }

    pub async fn remove_review(&self, run_id: &str) -> Result<bool, ClusterError> {
        self.records.review.remove(run_id).await
    }

    pub async fn review_queue(&self) -> Result<Vec<String>, ClusterError> {
        self.records.review.keys().await
    }

    pub async fn dead_letter(&self, run: &RunRecord) -> Result<(), ClusterError> {
        let entry = DeadLetter {
            run: run.clone(),
            dead_lettered_at: Utc::now(),
        };
        self.records
            .dead_letters
            .put_json(&run.run_id, &entry)
            .await
            .map(|_| ())
    }

    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, ClusterError> {
        let bucket = &self.records.dead_letters;
        bucket
            .list("")
            .await?
            .into_iter()
            .map(|(k, v)| bucket.decode(&k, &v))
            .collect()
    }

    pub async fn dead_letter_entry(
        &self,
        run_id: &str,
    ) -> Result<Option<DeadLetter>, ClusterError> {
        self.records.dead_letters.get_json(run_id).await
    }

    pub async fn remove_dead_letter(&self, run_id: &str) -> Result<bool, ClusterError> {
        self.records.dead_letters.remove(run_id).await
    }

    pub async fn pause(&self, pause: &Pause) -> Result<(), ClusterError> {
        self.records
            .pauses
            .put_json(&pause.workflow, pause)
            .await
            .map(|_| ())
    }

    pub async fn paused(&self, workflow: &str) -> Result<Option<Pause>, ClusterError> {
        self.records.pauses.get_json(workflow).await
    }

    /// Lifts `workflow`'s pause; the pause it had.
    pub async fn resume(&self, workflow: &str) -> Result<Option<Pause>, ClusterError> {
        let had = self.paused(workflow).await?;
        if had.is_some() {
            self.records.pauses.remove(workflow).await?;
        }
        Ok(had)
    }

    /// Adds `spend` to `workflow`'s `day`, compare-and-set: two daemons' runs both count.
    pub async fn add_day_spend(
        &self,
        workflow: &str,
        day: chrono::NaiveDate,
        spend: &DaySpend,
    ) -> Result<(), ClusterError> {
        let key = format!("{workflow} {day}");
        let bucket = &self.records.spend;
        loop {
            let now = bucket.get(&key).await?;
            let mut sum: DaySpend = match &now {
                Some(read) => bucket.decode(&key, &read.value)?,
                None => DaySpend::default(),
            };
            sum.cost_usd = (sum.cost_usd + spend.cost_usd).min(f64::MAX);
            sum.tokens = sum.tokens.saturating_add(spend.tokens);
            sum.runs += spend.runs;
            let bytes = serde_json::to_vec(&sum).map_err(ClusterError::store)?;
            if bucket.swap(&key, now.map(|r| r.revision), bytes).await? {
                return Ok(());
            }
        }
    }

    pub async fn day_spend(
        &self,
        workflow: &str,
        day: chrono::NaiveDate,
    ) -> Result<DaySpend, ClusterError> {
        Ok(self
            .records
            .spend
            .get_json(&format!("{workflow} {day}"))
            .await?
            .unwrap_or_default())
    }

    /// Keeps `bytes` under `key`; an alert owed (`owned`) is marked as this daemon's.
    pub async fn put_owed(&self, key: &str, bytes: &[u8], owned: bool) -> Result<(), ClusterError> {
        let value = if owned {
            let owed = serde_json::from_slice(bytes).map_err(ClusterError::store)?;
            serde_json::to_vec(&Owned {
                daemon: self.daemon.clone(),
                owed,
            })
            .map_err(ClusterError::store)?
        } else {
            bytes.to_vec()
        };
        self.records.owed.put(key, value).await.map(|_| ())
    }

    pub async fn remove_owed(&self, key: &str) -> Result<(), ClusterError> {
        self.records.owed.remove(key).await.map(|_| ())
    }

    /// What is kept under `prefix`. Of alerts owed (`owned`), those this daemon may
    /// deliver: its own, and those of daemons gone, taken over first (compare-and-set,
    /// so of two starting daemons one resumes each).
    pub async fn owed(
        &self,
        prefix: &str,
        owned: bool,
    ) -> Result<Vec<(String, Vec<u8>)>, ClusterError> {
        let kept = self.records.owed.list(prefix).await?;
        if !owned {
            return Ok(kept);
        }
        let mut mine = Vec::new();
        for (key, _) in kept {
            if let Some(bytes) = self.adopt_owed(&key).await? {
                mine.push((key, bytes));
            }
        }
        Ok(mine)
    }

    /// The alert owed under `key`, if it is this daemon's or now taken over from a gone one.
    async fn adopt_owed(&self, key: &str) -> Result<Option<Vec<u8>>, ClusterError> {
        let bucket = &self.records.owed;
        let Some(read) = bucket.get(key).await? else {
            return Ok(None);
        };
        let Ok(owned) = serde_json::from_slice::<Owned>(&read.value) else {
            return Ok(None);
        };
        let bytes = serde_json::to_vec(&owned.owed).map_err(ClusterError::store)?;
        if owned.daemon == self.daemon {
            return Ok(Some(bytes));
        }
        if self.is_alive(&owned.daemon).await? {
            return Ok(None);
        }
        let taken = serde_json::to_vec(&Owned {
            daemon: self.daemon.clone(),
            owed: owned.owed,
        })
        .map_err(ClusterError::store)?;
        Ok(bucket
            .swap(key, Some(read.revision), taken)
            .await?
            .then_some(bytes))
    }

    /// What is kept under `key`, with the revision to [`Cluster::swap_owed`] it at.
    pub async fn owed_entry(&self, key: &str) -> Result<Option<Read>, ClusterError> {
        self.records.owed.get(key).await
    }

    /// Writes `bytes` under `key` if it is still at `revision` (None: absent).
    pub async fn swap_owed(
        &self,
        key: &str,
        revision: Option<u64>,
        bytes: Vec<u8>,
    ) -> Result<bool, ClusterError> {
        self.records.owed.swap(key, revision, bytes).await
    }
}
