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

use crate::alerts::Alert;
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

/// Where `key`'s rate window is kept.
fn gate_key(key: &GateKey) -> String {
    format!("{GATE}{}\0{}\0{}", key.0, key.1, key.2.name())
}

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
            Self::warn("keep a rate window", store.put_owed(&gate_key(key), &bytes));
        }
    }

    /// Takes `key`'s rate window for a send at `now`: Ok when no send within `every` is
    /// kept (the window is now this send's), Err with the time of the send kept when one
    /// is — another daemon's of the cluster, which this alert is held back behind. Of two
    /// daemons sending at once, one takes the window. Without a store, or when the store
    /// cannot answer, Ok: better sent twice than not at all.
    pub fn take_window(
        &self,
        key: &GateKey,
        every: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<(), DateTime<Utc>> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let every = chrono::Duration::from_std(every).unwrap_or(chrono::Duration::MAX);
        let sent_at = std::cell::Cell::new(None);
        let took = store.update_owed(&gate_key(key), &|kept| {
            let kept: Option<SavedGate> = kept.and_then(|b| serde_json::from_slice(b).ok());
            // A send kept from the future past one window (a clock far off) holds nothing.
            let within = |g: &SavedGate| now - g.last_sent < every && g.last_sent - now < every;
            if let Some(g) = kept.filter(within) {
                sent_at.set(Some(g.last_sent));
                return None;
            }
            let mine = SavedGate {
                last_sent: now,
                held: 0,
                latest: None,
            };
            serde_json::to_vec(&mine).ok()
        });
        match Self::warn("take a rate window", took) {
            Some(false) => Err(sent_at.get().unwrap_or(now)),
            _ => Ok(()),
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
