//! Queues across the cluster: one JetStream work-queue stream, a subject per queue, and a
//! durable pull consumer per queue that every daemon pulls from. `steward enqueue`
//! publishes; the server hands each item to one daemon and hands it again to another when
//! it is not acknowledged within the ack wait (a daemon killed mid-run).
//!
//! - A run in progress keeps its item with `+WPI` ([`Delivery::in_progress`]).
//! - A late acknowledgement must not acknowledge another daemon's redelivery of the same
//!   item (nats-server #4786: an ack names the stream sequence, not the delivery). Each
//!   delivery is recorded in a bucket, by item, with its attempt number, compare-and-set;
//!   a daemon acknowledges only while the record is still its own, so a superseded one
//!   leaves the item to the daemon that has it now. (Between that check and the ack is a
//!   window of one round trip; the item's idempotency key keeps its commit single even
//!   then.)
//! - An item delivered more than `max_attempts` times goes to the dead-letter stream with
//!   its context (queue, attempts, the daemon that had it last) and is taken off the
//!   queue. JetStream has no dead-letter queue of its own; the count is ours.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream, AckKind};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::connection::Cluster;
use super::error::ClusterError;
use super::names::key_part;

/// The stream every queue's items are published to, under `steward.queue.QUEUE`.
pub const STREAM: &str = "STEWARD_QUEUE";
/// Items given up on, under `steward.dead.QUEUE`, with their context in headers.
pub const DEAD: &str = "STEWARD_DEAD";
/// Deliveries in progress: `QUEUE.SEQUENCE` → who has the item, at which attempt.
pub const DELIVERIES: &str = "steward_deliveries";

/// The header naming an item (the `--id` given to `steward enqueue`, or its sequence).
pub const ITEM_ID: &str = "Steward-Item-Id";

fn subject(queue: &str) -> String {
    format!("steward.queue.{}", key_part(queue))
}

fn consumer_name(queue: &str) -> String {
    format!("steward_q_{}", key_part(queue).replace('=', "_"))
}

/// Who has an item now, as kept in [`DELIVERIES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub daemon: String,
    pub attempt: u64,
}

impl Cluster {
    /// Publishes an item to `queue`: its stream sequence, once the server stored it.
    pub async fn enqueue(
        &self,
        queue: &str,
        item_id: &str,
        payload: Vec<u8>,
    ) -> Result<u64, ClusterError> {
        self.queue_stream().await?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ITEM_ID, item_id);
        let ack = self
            .js
            .publish_with_headers(subject(queue), headers, payload.into())
            .await
            .map_err(ClusterError::store)?
            .await
            .map_err(ClusterError::store)?;
        Ok(ack.sequence)
    }

    /// A puller for `queue`'s items, shared by every daemon (one durable consumer).
    pub async fn puller(&self, queue: &str, max_attempts: u32) -> Result<Puller, ClusterError> {
        let stream = self.queue_stream().await?;
        let name = consumer_name(queue);
        let consumer = stream
            .get_or_create_consumer(
                &name,
                consumer::pull::Config {
                    durable_name: Some(name.clone()),
                    filter_subject: subject(queue),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: self.settings.ack_wait,
                    // Unlimited: the count against max_attempts is ours (see the module).
                    max_deliver: -1,
                    ..Default::default()
                },
            )
            .await
            .map_err(ClusterError::store)?;
        let deliveries = super::buckets::open(&self.js, deliveries_bucket()).await?;
        self.dead_stream().await?;
        Ok(Puller {
            given_up: Vec::new(),
            cluster: self.clone(),
            queue: queue.to_string(),
            consumer,
            deliveries,
            max_attempts: u64::from(max_attempts.max(1)),
        })
    }

    async fn queue_stream(&self) -> Result<stream::Stream, ClusterError> {
        self.queue_stream
            .get_or_try_init(|| self.make_queue_stream())
            .await
            .cloned()
    }

    async fn make_queue_stream(&self) -> Result<stream::Stream, ClusterError> {
        self.js
            .get_or_create_stream(stream::Config {
                name: STREAM.into(),
                description: Some("steward: queue items, one subject per queue".into()),
                subjects: vec!["steward.queue.>".into()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(ClusterError::store)
    }

    async fn dead_stream(&self) -> Result<stream::Stream, ClusterError> {
        self.js
            .get_or_create_stream(stream::Config {
                name: DEAD.into(),
                description: Some("steward: queue items given up on, with their context".into()),
                subjects: vec!["steward.dead.>".into()],
                storage: stream::StorageType::File,
                max_messages: 100_000,
                ..Default::default()
            })
            .await
            .map_err(ClusterError::store)
    }

    /// The items given up on in `queue`, oldest first: (payload, headers as pairs).
    pub async fn dead_items(&self, queue: &str) -> Result<Vec<DeadItem>, ClusterError> {
        let stream = self.dead_stream().await?;
        let last = stream
            .get_info()
            .await
            .map_err(ClusterError::store)?
            .state
            .last_sequence;
        let mut out = Vec::new();
        let wanted = format!("steward.dead.{}", key_part(queue));
        let mut seq = 1;
        while seq <= last {
            if let Ok(msg) = stream.get_raw_message(seq).await {
                if msg.subject.as_str() == wanted {
                    let header = |name: &str| {
                        msg.headers
                            .get(name)
                            .map(|v| v.as_str().to_string())
                            .unwrap_or_default()
                    };
                    out.push(DeadItem {
                        item_id: header(ITEM_ID),
                        attempts: header("Steward-Attempts").parse().unwrap_or(0),
                        last_daemon: header("Steward-Last-Daemon"),
                        payload: msg.payload.to_vec(),
                    });
                }
            }
            seq += 1;
        }
        Ok(out)
    }
}

fn deliveries_bucket() -> kv::Config {
    kv::Config {
        bucket: DELIVERIES.into(),
        description: "steward: queue items being run, and by whom".into(),
        history: 1,
        max_age: Duration::from_secs(7 * 24 * 3600),
        ..Default::default()
    }
}

/// An item given up on.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadItem {
    pub item_id: String,
    pub attempts: u64,
    pub last_daemon: String,
    pub payload: Vec<u8>,
}

/// Pulls one queue's items for this daemon.
pub struct Puller {
    cluster: Cluster,
    queue: String,
    consumer: consumer::Consumer<consumer::pull::Config>,
    deliveries: kv::Store,
    max_attempts: u64,
    /// Items this puller gave up on since the last [`Puller::given_up`].
    given_up: Vec<DeadItem>,
}

/// One delivery of an item to this daemon.
pub struct Delivery {
    message: jetstream::Message,
    deliveries: kv::Store,
    /// The item's key in [`DELIVERIES`] and this delivery's revision there.
    fence: (String, u64),
    pub item_id: String,
    pub sequence: u64,
    /// 1 for the first delivery.
    pub attempt: u64,
    pub payload: Vec<u8>,
}

impl Puller {
    /// The next item for this daemon, waiting up to `wait` (None: nothing came). An item
    /// past its attempts is moved to the dead-letter stream on the way.
    pub async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, ClusterError> {
        loop {
            let mut batch = self
                .consumer
                .fetch()
                .max_messages(1)
                .expires(wait)
                .messages()
                .await
                .map_err(ClusterError::store)?;
            let Some(message) = batch.next().await else {
                return Ok(None);
            };
            let message = message.map_err(ClusterError::store)?;
            let (sequence, attempt) = {
                let info = message.info().map_err(ClusterError::store)?;
                (info.stream_sequence, info.delivered.max(1) as u64)
            };
            let item_id = message
                .headers
                .as_ref()
                .and_then(|h| h.get(ITEM_ID))
                .map(|v| v.as_str().to_string())
                .unwrap_or_else(|| sequence.to_string());
            let key = format!("{}.{sequence}", key_part(&self.queue));
            let before = self.holder(&key).await?;
            if attempt > self.max_attempts {
                let dead = DeadItem {
                    item_id: item_id.clone(),
                    attempts: attempt - 1,
                    last_daemon: before.map(|(h, _)| h.daemon).unwrap_or_default(),
                    payload: message.payload.to_vec(),
                };
                self.give_up(&message, &dead).await?;
                self.given_up.push(dead);
                let _ = self.deliveries.purge(&key).await;
                continue;
            }
            // Record this delivery as the item's current one, over any earlier.
            let me = Holder {
                daemon: self.cluster.daemon.clone(),
                attempt,
            };
            let bytes: bytes::Bytes = serde_json::to_vec(&me).map_err(ClusterError::store)?.into();
            let written = match before {
                Some((held, _)) if held.attempt >= attempt => None, // a stale delivery
                Some((_, revision)) => self.deliveries.update(&key, bytes, revision).await.ok(),
                None => self.deliveries.create(&key, bytes).await.ok(),
            };
            let Some(revision) = written else {
                continue; // another delivery of it is newer: not ours
            };
            return Ok(Some(Delivery {
                payload: message.payload.to_vec(),
                message,
                deliveries: self.deliveries.clone(),
                fence: (key, revision),
                item_id,
                sequence,
                attempt,
            }));
        }
    }

    async fn holder(&self, key: &str) -> Result<Option<(Holder, u64)>, ClusterError> {
        let Some(entry) = self
            .deliveries
            .entry(key)
            .await
            .map_err(ClusterError::store)?
        else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        Ok(serde_json::from_slice(&entry.value)
            .ok()
            .map(|h| (h, entry.revision)))
    }

    /// The items given up on since the last call: for the daemon to record each as a
    /// dead-lettered run, which `steward dead-letter list` shows and `retry` runs again.
    pub fn given_up(&mut self) -> Vec<DeadItem> {
        std::mem::take(&mut self.given_up)
    }

    async fn give_up(
        &self,
        message: &jetstream::Message,
        dead: &DeadItem,
    ) -> Result<(), ClusterError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ITEM_ID, dead.item_id.as_str());
        headers.insert("Steward-Queue", self.queue.as_str());
        headers.insert("Steward-Attempts", dead.attempts.to_string().as_str());
        headers.insert("Steward-Last-Daemon", dead.last_daemon.as_str());
        self.cluster
            .js
            .publish_with_headers(
                format!("steward.dead.{}", key_part(&self.queue)),
                headers,
                message.payload.clone(),
            )
            .await
            .map_err(ClusterError::store)?
            .await
            .map_err(ClusterError::store)?;
        // Stored as dead: now off the queue for good.
        message
            .ack_with(AckKind::Term)
            .await
            .map_err(ClusterError::store)
    }
}

impl Delivery {
    /// The run is still going: the ack deadline moves a whole ack wait out (`+WPI`).
    pub async fn in_progress(&self) -> Result<(), ClusterError> {
        self.message
            .ack_with(AckKind::Progress)
            .await
            .map_err(ClusterError::store)
    }

    /// Whether this delivery is still the item's current one (no later delivery to
    /// another daemon superseded it).
    pub async fn current(&self) -> Result<bool, ClusterError> {
        let entry = self
            .deliveries
            .entry(&self.fence.0)
            .await
            .map_err(ClusterError::store)?;
        Ok(entry.is_some_and(|e| e.revision == self.fence.1 && e.operation == kv::Operation::Put))
    }

    /// Acknowledges the item (its run ended: committed, or settled otherwise), unless a
    /// later delivery superseded this one: then false, and the item is left to the daemon
    /// that has it now.
    pub async fn ack(&self) -> Result<bool, ClusterError> {
        if !self.current().await? {
            return Ok(false);
        }
        self.message
            .double_ack()
            .await
            .map_err(ClusterError::store)?;
        let _ = self.deliveries.purge(&self.fence.0).await;
        Ok(true)
    }

    /// Hands the item back for another delivery after `delay` (a retryable failure).
    pub async fn retry(&self, delay: Duration) -> Result<(), ClusterError> {
        self.message
            .ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(ClusterError::store)
    }

    /// Takes an item that cannot be run (its payload is not JSON) off the queue for good.
    pub async fn reject(&self) -> Result<(), ClusterError> {
        self.message
            .ack_with(AckKind::Term)
            .await
            .map_err(ClusterError::store)
    }
}
