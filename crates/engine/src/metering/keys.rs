//! Per-run keys: what a step shows the gateway instead of the real provider key. A key is
//! issued when a step starts and revoked when its [`Issued`] handle drops (the step
//! ended), so a key copied out of a step's environment is worthless after it. The grant
//! says which run it is, what it may call, and where its metered spend goes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::meter::{Metered, Price, Provider};
use super::reserve::{Refusal, Reservation};
use crate::budget::Headroom;
use crate::control::Resource;

/// Where a call's metered spend goes (the run's budget and runlog, in the daemon).
pub type Sink = Arc<dyn Fn(Event<'_>) + Send + Sync>;

/// What the gateway tells a grant's sink.
#[derive(Debug)]
pub enum Event<'a> {
    /// A call ended (or its client went away).
    Call(&'a Call),
    /// A call was refused before it was forwarded: the budget could not cover it.
    Refused(&'a Refusal),
}

/// One model call, as the gateway saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub provider: Provider,
    /// The model the request named.
    pub model: String,
    /// `chat/completions`, `responses`, `embeddings` or `messages`.
    pub endpoint: String,
    pub metered: Metered,
    /// The upstream's HTTP status.
    pub status: u16,
    pub latency_ms: u64,
    /// What was reserved for it (none when the grant has no budget).
    pub reserved: Option<Reservation>,
    /// What it was charged: its usage, or its whole reservation when it reported none.
    pub charges: Vec<(Resource, f64)>,
    /// Its cost at the model's price, if it has one.
    pub cost_usd: Option<f64>,
    /// The stream was cut at the cap.
    pub cut: bool,
    /// Prompt and answer, only under `log_bodies = true`.
    pub bodies: Option<(Value, String)>,
}

/// A real provider: where it is and its key (from the daemon's environment).
#[derive(Clone)]
pub struct Upstream {
    /// Ends in `/v1`: e.g. `https://api.openai.com/v1`, `https://api.anthropic.com/v1`.
    pub base_url: String,
    pub key: String,
}

/// What a key allows.
#[derive(Clone)]
pub struct Grant {
    pub run_id: String,
    pub workflow: String,
    /// `run` or `verify`.
    pub step: String,
    /// The providers it may call, and where each is.
    pub upstreams: Vec<(Provider, Upstream)>,
    pub models: Vec<String>,
    pub pricing: BTreeMap<String, Price>,
    /// The attempt's headroom; None: calls are not held to a budget.
    pub budget: Option<Headroom>,
    pub log_bodies: bool,
    pub sink: Sink,
}

impl Grant {
    pub fn allows(&self, provider: Provider, model: &str) -> bool {
        self.upstream(provider).is_some() && self.models.iter().any(|m| m == model)
    }

    pub fn upstream(&self, provider: Provider) -> Option<&Upstream> {
        self.upstreams
            .iter()
            .find(|(p, _)| *p == provider)
            .map(|(_, u)| u)
    }
}

/// The keys in force.
#[derive(Clone, Default)]
pub struct Registry {
    keys: Arc<Mutex<HashMap<String, Grant>>>,
}

/// A key in force; revoked when dropped.
pub struct Issued {
    pub key: String,
    registry: Registry,
}

impl Drop for Issued {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.key);
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grant>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new key for `grant`: `stw-` and 64 hex digits of the OS's randomness.
    pub fn issue(&self, grant: Grant) -> std::io::Result<Issued> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        let key = format!("stw-{}", hex::encode(bytes));
        self.lock().insert(key.clone(), grant);
        Ok(Issued {
            key,
            registry: self.clone(),
        })
    }

    /// The grant of `key`, if it is in force (compared in constant time per key).
    pub fn grant(&self, key: &str) -> Option<Grant> {
        use subtle::ConstantTimeEq;
        self.lock()
            .iter()
            .find(|(k, _)| k.as_bytes().ct_eq(key.as_bytes()).into())
            .map(|(_, g)| g.clone())
    }
}
