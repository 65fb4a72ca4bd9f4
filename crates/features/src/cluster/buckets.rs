//! The cluster's buckets, by name and settings: every daemon makes them the same way, and
//! the first to connect makes them.

use std::time::Duration;

use async_nats::jetstream::{self, kv};

use super::error::ClusterError;

/// Slot claims: `WORKFLOW.SLOT` (the slot as Unix seconds). Kept a week: past that, the
/// catch-up policy does not reach a slot.
pub const SLOTS: &str = "steward_slots";
/// Slot claims whose run has not ended: the same keys as [`SLOTS`], removed when the run
/// ends, so a gone daemon's unfinished slots are found without reading every claim.
pub const OPEN_SLOTS: &str = "steward_open_slots";
/// Idempotency keys: `WORKFLOW.KEY` (see [`super::key_part`]).
pub const KEYS: &str = "steward_keys";
/// Heartbeats: one entry per live daemon, gone `heartbeat` after its last beat.
pub const DAEMONS: &str = "steward_daemons";

/// Go-live approvals, by workflow.
pub const APPROVALS: &str = "steward_approvals";

pub fn approvals() -> kv::Config {
    kv::Config {
        bucket: APPROVALS.into(),
        description: "steward: go-live approvals, bound to each workflow file's sha256".into(),
        history: 1,
        ..Default::default()
    }
}

/// Webhook deliveries seen: `WORKFLOW.ID`.
pub const WEBHOOKS: &str = "steward_webhooks";

pub fn webhooks() -> kv::Config {
    kv::Config {
        bucket: WEBHOOKS.into(),
        description: "steward: webhook deliveries seen, for as long as a replay could verify"
            .into(),
        history: 1,
        // An upper bound: each entry says how long it counts (`until`).
        max_age: Duration::from_secs(30 * 24 * 3600),
        ..Default::default()
    }
}

pub fn slots() -> kv::Config {
    kv::Config {
        bucket: SLOTS.into(),
        description: "steward: schedule slots claimed, one daemon each".into(),
        history: 1,
        max_age: Duration::from_secs(7 * 24 * 3600),
        ..Default::default()
    }
}

pub fn open_slots() -> kv::Config {
    kv::Config {
        bucket: OPEN_SLOTS.into(),
        description: "steward: slots claimed whose run has not ended".into(),
        history: 1,
        max_age: Duration::from_secs(7 * 24 * 3600),
        ..Default::default()
    }
}

pub fn keys() -> kv::Config {
    kv::Config {
        bucket: KEYS.into(),
        description: "steward: idempotency keys, reserved and committed".into(),
        history: 1,
        ..Default::default()
    }
}

pub fn daemons(heartbeat: Duration) -> kv::Config {
    kv::Config {
        bucket: DAEMONS.into(),
        description: "steward: the daemons alive, by heartbeat".into(),
        history: 1,
        max_age: heartbeat,
        // On disk, like the rest: a bucket in memory is gone when the server restarts.
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    }
}

/// Run records, by run id, each with the daemon that ran it: every daemon's view of the
/// cluster's runs is made from it ([`super::runs`]). Kept as long as the default run
/// retention keeps a record.
pub const RUNS: &str = "steward_runs";
/// Runs waiting for an operator's review, by run id.
pub const REVIEW: &str = "steward_review";
/// Dead-lettered runs, by run id.
pub const DEAD_LETTERS: &str = "steward_dead_letters";
/// Paused workflows (by an operator or the breaker), by workflow.
pub const PAUSES: &str = "steward_pauses";
/// What each workflow spent on a day, for its daily caps: `WORKFLOW DAY`.
pub const SPEND: &str = "steward_spend";
/// What alerting and the dead-man's switch owe or told, by the one machine's keys.
pub const OWED: &str = "steward_owed";
/// Files of shared watched folders, claimed by one daemon each.
pub const FILES: &str = "steward_files";

/// A bucket of records, one value per key, kept at most `max_age` (zero: until removed).
pub fn records(bucket: &str, description: &str, max_age: Duration) -> kv::Config {
    kv::Config {
        bucket: bucket.into(),
        description: format!("steward: {description}"),
        history: 1,
        max_age,
        ..Default::default()
    }
}

/// The bucket `config` names: opened, or made when it does not exist yet. Two daemons
/// making it at once both end up with the one the server kept.
pub async fn open(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store, ClusterError> {
    if let Ok(store) = js.get_key_value(config.bucket.clone()).await {
        return Ok(store);
    }
    let name = config.bucket.clone();
    match js.create_key_value(config).await {
        Ok(store) => Ok(store),
        Err(made) => js
            .get_key_value(name.clone())
            .await
            .map_err(|_| ClusterError::Store(format!("cannot open or make bucket {name}: {made}"))),
    }
}
