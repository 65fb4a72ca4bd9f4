//! The cluster's runlog: every daemon keeps its own `runlog.jsonl`, and sends the same
//! lines to one stream (`steward.log.DAEMON`), so `steward logs --cluster` reads every
//! daemon's steps in the order the server got them. Sending never waits: a line the
//! server cannot take now is in the daemon's own file all the same.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;

use super::connection::Cluster;
use super::error::ClusterError;
use super::names::{from_key_part, key_part};

/// The stream of every daemon's runlog lines.
pub const STREAM: &str = "STEWARD_LOG";

impl Cluster {
    /// Makes the log stream (bounded: a week, 1 GiB).
    pub async fn log_stream(&self) -> Result<stream::Stream, ClusterError> {
        self.js
            .get_or_create_stream(stream::Config {
                name: STREAM.into(),
                description: Some("steward: every daemon's runlog lines".into()),
                subjects: vec!["steward.log.>".into()],
                storage: stream::StorageType::File,
                max_age: Duration::from_secs(7 * 24 * 3600),
                max_bytes: 1 << 30,
                ..Default::default()
            })
            .await
            .map_err(ClusterError::store)
    }

    /// Sends one runlog line, without waiting for the server.
    pub async fn send_log_line(&self, line: String) {
        let subject = format!("steward.log.{}", key_part(&self.daemon));
        if let Err(e) = self.client().publish(subject, line.into()).await {
            tracing::debug!("cluster: a runlog line was not sent: {e}");
        }
    }

    /// The last `last` lines of the cluster's runlog, then (with `follow`) each new one,
    /// handed to `each` with the daemon that wrote it, until it returns false.
    pub async fn read_log(
        &self,
        last: u64,
        follow: bool,
        mut each: impl FnMut(&str, &str) -> bool,
    ) -> Result<(), ClusterError> {
        let mut stream = self.log_stream().await?;
        let info = stream.info().await.map_err(ClusterError::store)?;
        let (first, end) = (info.state.first_sequence, info.state.last_sequence);
        if end == 0 && !follow {
            return Ok(());
        }
        let start = end.saturating_sub(last.saturating_sub(1)).max(first).max(1);
        let reader = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: start,
                },
                ..Default::default()
            })
            .await
            .map_err(ClusterError::store)?;
        let mut messages = reader.messages().await.map_err(ClusterError::store)?;
        loop {
            let next = if follow {
                messages.next().await
            } else {
                tokio::time::timeout(Duration::from_secs(2), messages.next())
                    .await
                    .unwrap_or_default()
            };
            let Some(message) = next else {
                return Ok(());
            };
            let message: jetstream::Message = message.map_err(ClusterError::store)?;
            let seq = message.info().map(|i| i.stream_sequence).unwrap_or(0);
            let daemon = message
                .subject
                .strip_prefix("steward.log.")
                .and_then(from_key_part)
                .unwrap_or_default();
            let line = String::from_utf8_lossy(&message.payload).into_owned();
            if !each(&daemon, &line) {
                return Ok(());
            }
            if !follow && seq >= end {
                return Ok(());
            }
        }
    }
}
