//! Agency cases across the cluster: a case's events are the messages of its own subject
//! (`steward.case.CASE`) in one stream. An append is a publish that expects the subject's
//! last sequence to be the one the appender read, so when two drivers on two daemons
//! append the same version, the server takes the first and refuses the second: the
//! lease-by-append of one machine (see [`crate::agency`]), decided by the server.

use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage, stream};

use super::connection::Cluster;
use super::error::ClusterError;
use super::names::{from_key_part, key_part};

/// The stream of every case's events.
pub const STREAM: &str = "STEWARD_CASES";
/// The header that carries an event's version (1 for a case's first).
pub const VERSION: &str = "Steward-Case-Version";

fn subject(case: &str) -> String {
    format!("steward.case.{}", key_part(case))
}

impl Cluster {
    async fn case_stream(&self) -> Result<stream::Stream, ClusterError> {
        self.case_stream
            .get_or_try_init(|| self.make_case_stream())
            .await
            .cloned()
    }

    async fn make_case_stream(&self) -> Result<stream::Stream, ClusterError> {
        self.js
            .get_or_create_stream(stream::Config {
                name: STREAM.into(),
                description: Some("steward: agency case events, a subject per case".into()),
                subjects: vec!["steward.case.>".into()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(ClusterError::store)
    }

    /// Appends event `version` of `case` if it is the next one: false when another
    /// append took that version first (or the case is not at `version - 1`).
    pub async fn append_case_event(
        &self,
        case: &str,
        version: u64,
        event: &[u8],
    ) -> Result<bool, ClusterError> {
        let stream = self.case_stream().await?;
        let subject = subject(case);
        // The subject's last message: its sequence is what the publish expects.
        let last = match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => Some((m.sequence, version_of(&m)?)),
            Err(e) if e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
                None
            }
            Err(e) => return Err(ClusterError::store(e)),
        };
        let expected = match last {
            None if version == 1 => 0,
            Some((seq, v)) if v + 1 == version => seq,
            _ => return Ok(false),
        };
        let publish = PublishMessage::build()
            .payload(event.to_vec().into())
            .header(VERSION, version.to_string().as_str())
            .expected_last_subject_sequence(expected);
        let ack = match self.js.send_publish(subject, publish).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(false),
            Err(e) => Err(ClusterError::store(e)),
        }
    }

    /// Every event of `case`, in version order.
    pub async fn case_events(&self, case: &str) -> Result<Vec<(u64, Vec<u8>)>, ClusterError> {
        let stream = self.case_stream().await?;
        let subject = subject(case);
        let mut out = Vec::new();
        let mut from = 1;
        loop {
            let next = stream
                .raw_message_builder()
                .sequence(from)
                .next_by_subject(subject.clone())
                .send()
                .await;
            match next {
                Ok(m) => {
                    out.push((version_of(&m)?, m.payload.to_vec()));
                    from = m.sequence + 1;
                }
                Err(e) if e.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound => {
                    break
                }
                Err(e) => return Err(ClusterError::store(e)),
            }
        }
        out.sort_by_key(|(v, _)| *v);
        Ok(out)
    }

    /// Every case with at least one event.
    pub async fn case_ids(&self) -> Result<Vec<String>, ClusterError> {
        use futures_util::StreamExt;
        let stream = self.case_stream().await?;
        let mut subjects = stream
            .info_with_subjects("steward.case.>")
            .await
            .map_err(ClusterError::store)?;
        let mut out = Vec::new();
        while let Some(entry) = subjects.next().await {
            let (subject, _) = entry.map_err(ClusterError::store)?;
            if let Some(id) = subject
                .strip_prefix("steward.case.")
                .and_then(from_key_part)
            {
                out.push(id);
            }
        }
        out.sort();
        Ok(out)
    }
}

fn version_of(m: &jetstream::message::StreamMessage) -> Result<u64, ClusterError> {
    m.headers
        .get(VERSION)
        .and_then(|v| v.as_str().parse().ok())
        .ok_or_else(|| ClusterError::Corrupt {
            bucket: STREAM,
            key: m.subject.to_string(),
            why: format!("message {} has no {VERSION} header", m.sequence),
        })
}
