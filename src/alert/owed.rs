//! What alerting owes across a restart, kept in the store's `owed` tree so a stop, a
//! deploy or a crash neither loses nor repeats an alert:
//!
//! - `alert/outbox/ID/CHANNEL`: a delivery not yet done — the alert (with its stable event
//!   id, which a receiver sees as `Idempotency-Key` and in the JSON body) and the
//!   attempts made. Written before the first attempt (and flushed), taken out when it is
//!   sent or given up; at most [`MAX_PENDING`] are kept, the oldest dropped first.
//! - `alert/gate/CHANNEL\0WORKFLOW\0EVENT`: a channel's rate window for a workflow and
//!   event — when it last sent, how many it held back since, and the newest held back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::message::Alert;
use crate::config::notify::Event;
use crate::store::Store;

/// (channel id, workflow, event). The id is a hash of the whole channel table: two
/// webhooks on one host are two channels, and no URL is kept where a log could show it.
pub type GateKey = (String, String, Event);

/// Deliveries kept at most (like the run records, the outbox is bounded).
pub const MAX_PENDING: usize = 1_000;

/// Deliveries are work one daemon carries out: the store keeps them owned (see
/// [`crate::store::OWNED_OWED`]).
const OUTBOX: &str = crate::store::OWNED_OWED;
const GATE: &str = "alert/gate/";

/// A delivery owed to a channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pending {
    /// The channel's id (a hash of its table).
    pub channel: String,
    pub alert: Alert,
    pub attempts_made: u32,
}

/// A channel's rate window for one workflow and event, in wall-clock time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedGate {
    pub last_sent: DateTime<Utc>,
    pub held: u32,
    pub latest: Option<Alert>,
}

/// The store, where there is one (none for the CLI's own process and tests of the rules).
#[derive(Clone, Default)]
pub struct Owed {
    store: Option<Store>,
}

impl Owed {
    pub fn new(store: Option<Store>) -> Owed {
        Owed { store }
    }

    fn warn<T>(what: &str, r: crate::store::Result<T>) -> Option<T> {
        r.map_err(|e| tracing::error!("alerts: cannot {what} in the store: {e}"))
            .ok()
    }

    /// Keeps `p`; returns its key. The oldest beyond [`MAX_PENDING`] are dropped.
    pub fn keep(&self, p: &Pending) -> String {
        let key = format!("{OUTBOX}{}/{}", p.alert.id, p.channel);
        if let Some(store) = &self.store {
            if let Ok(bytes) = serde_json::to_vec(p) {
                Self::warn("keep an alert", store.put_owed(&key, &bytes));
            }
            let all = Self::warn("list the outbox", store.owed(OUTBOX)).unwrap_or_default();
            for (old, _) in all.iter().take(all.len().saturating_sub(MAX_PENDING)) {
                tracing::warn!("alerts: the outbox holds over {MAX_PENDING} deliveries: dropped the oldest, {old}");
                Self::warn("drop an alert", store.remove_owed(old));
            }
        }
        key
    }

    /// Makes what was kept durable (before a first attempt: a crash then still owes it).
    pub fn flush(&self) {
        if let Some(store) = &self.store {
            Self::warn("flush the outbox", store.flush());
        }
    }

    pub fn attempted(&self, key: &str, p: &Pending) {
        if let (Some(store), Ok(bytes)) = (&self.store, serde_json::to_vec(p)) {
            Self::warn("note an attempt", store.put_owed(key, &bytes));
        }
    }

    pub fn done(&self, key: &str) {
        if let Some(store) = &self.store {
            Self::warn("settle an alert", store.remove_owed(key));
        }
    }

    /// The deliveries owed, oldest first, with their keys.
    pub fn pending(&self) -> Vec<(String, Pending)> {
        let Some(store) = &self.store else {
            return Vec::new();
        };
        Self::warn("read the outbox", store.owed(OUTBOX))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| Some((k, serde_json::from_slice(&v).ok()?)))
            .collect()
    }

    pub fn save_gate(&self, key: &GateKey, gate: &SavedGate) {
        if let (Some(store), Ok(bytes)) = (&self.store, serde_json::to_vec(gate)) {
            let k = format!("{GATE}{}\0{}\0{}", key.0, key.1, key.2.name());
            Self::warn("keep a rate window", store.put_owed(&k, &bytes));
        }
    }

    /// The rate windows kept, by gate.
    pub fn gates(&self) -> Vec<(GateKey, SavedGate)> {
        let Some(store) = &self.store else {
            return Vec::new();
        };
        Self::warn("read the rate windows", store.owed(GATE))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| {
                let mut parts = k.strip_prefix(GATE)?.splitn(3, '\0');
                let (channel, workflow, event) = (parts.next()?, parts.next()?, parts.next()?);
                let event: Event = serde_json::from_value(serde_json::json!(event)).ok()?;
                let gate = serde_json::from_slice(&v).ok()?;
                Some(((channel.to_string(), workflow.to_string(), event), gate))
            })
            .collect()
    }
}
