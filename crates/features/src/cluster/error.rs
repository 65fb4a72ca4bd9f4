//! What can go wrong talking to the cluster's store.

/// What went wrong talking to the cluster's store.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The server could not be reached or refused us.
    #[error("cannot connect to NATS at {servers}: {why}")]
    Connect { servers: String, why: String },
    /// A request to the store failed (unreachable, timed out, refused).
    #[error("cluster store: {0}")]
    Store(String),
    /// A value in the store could not be read.
    #[error("cluster store: {bucket}/{key}: {why}")]
    Corrupt {
        bucket: &'static str,
        key: String,
        why: String,
    },
}

impl ClusterError {
    pub(super) fn store(e: impl std::fmt::Display) -> ClusterError {
        ClusterError::Store(e.to_string())
    }
}
