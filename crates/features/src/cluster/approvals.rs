//! Go-live approvals across the cluster: one `steward go-live` on any daemon (or any
//! machine of the cluster without one) lets every daemon run the workflow live, and one
//! `revoke` takes it back everywhere. Each approval is bound to the sha256 of the
//! workflow's file, as on one machine, and every daemon loads the same config folder.

use async_nats::jetstream::kv;

use super::buckets::APPROVALS;
use super::connection::Cluster;
use super::error::ClusterError;
use super::names::key_part;
use crate::store::Approval;

impl Cluster {
    /// The approvals bucket as records (keys are [`key_part`]s of workflow names), for a
    /// daemon to follow.
    pub fn approval_records(&self) -> super::records::Records {
        super::records::Records::new(self.approvals.clone(), APPROVALS, self.js.clone())
    }

    /// The approval of `workflow`, if any.
    pub async fn approval(&self, workflow: &str) -> Result<Option<Approval>, ClusterError> {
        let key = key_part(workflow);
        let Some(entry) = self
            .approvals
            .entry(&key)
            .await
            .map_err(ClusterError::store)?
        else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        serde_json::from_slice(&entry.value)
            .map(Some)
            .map_err(|e| ClusterError::Corrupt {
                bucket: APPROVALS,
                key,
                why: e.to_string(),
            })
    }

    pub async fn approve_go_live(&self, approval: &Approval) -> Result<(), ClusterError> {
        let bytes = serde_json::to_vec(approval).map_err(ClusterError::store)?;
        self.approvals
            .put(key_part(&approval.workflow), bytes.into())
            .await
            .map_err(ClusterError::store)?;
        Ok(())
    }

    /// Takes `workflow`'s approval back; false when it had none.
    pub async fn revoke_go_live(&self, workflow: &str) -> Result<bool, ClusterError> {
        let had = self.approval(workflow).await?.is_some();
        if had {
            self.approvals
                .delete(key_part(workflow))
                .await
                .map_err(ClusterError::store)?;
        }
        Ok(had)
    }
}
