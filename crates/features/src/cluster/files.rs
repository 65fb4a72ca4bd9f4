//! Files of a watched folder shared between machines (NFS): every daemon sees a file
//! arrive, and moving it out of the folder cannot decide who takes it when the state
//! folder is on another filesystem (a copy and a remove, which two daemons can both do).
//! So each daemon first creates the file's key — its workflow, name, size and
//! modification time — and the one the server lets create it takes the file, and lets go
//! of the key once the file is out of the folder. A claim whose daemon is gone before it
//! moved the file is taken over, compare-and-set.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::connection::Cluster;
use super::error::ClusterError;

/// Who took a file, as kept in the bucket.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FileClaim {
    daemon: String,
    claimed_at: DateTime<Utc>,
}

impl Cluster {
    /// Claims `file` of `workflow`'s folder: true when it is this daemon's to take.
    pub async fn claim_file(&self, workflow: &str, file: &str) -> Result<bool, ClusterError> {
        let key = format!("{workflow}/{file}");
        let bucket = &self.records.files;
        let mine = serde_json::to_vec(&FileClaim {
            daemon: self.daemon.clone(),
            claimed_at: Utc::now(),
        })
        .map_err(ClusterError::store)?;
        loop {
            if bucket.swap(&key, None, mine.clone()).await? {
                return Ok(true);
            }
            let Some(read) = bucket.get(&key).await? else {
                continue; // gone meanwhile: create again
            };
            let holder: FileClaim = bucket.decode(&key, &read.value)?;
            if holder.daemon == self.daemon {
                return Ok(true); // a retried try that took effect
            }
            if self.is_alive(&holder.daemon).await? {
                return Ok(false);
            }
            return bucket.swap(&key, Some(read.revision), mine).await;
        }
    }

    /// Lets go of `file` of `workflow`'s folder, moved out of it by this daemon.
    pub async fn release_file(&self, workflow: &str, file: &str) -> Result<(), ClusterError> {
        self.records
            .files
            .remove(&format!("{workflow}/{file}"))
            .await
            .map(|_| ())
    }
}
