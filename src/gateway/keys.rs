//! Per-run keys: what a step shows the gateway instead of the real provider key. A key is
//! issued when a step starts and revoked when its [`Issued`] handle drops (the step
//! ended), so a key copied out of a step's environment is worthless after it. The grant
//! says which run it is, what it may call, and where its metered spend goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::meter::{Metered, Provider};

/// Where a call's metered spend goes: the run's budget, once the gateway serves runs.
pub type Sink = Arc<dyn Fn(&Call) + Send + Sync>;

/// One model call, as the gateway saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub provider: Provider,
    /// The model the request named.
    pub model: String,
    pub metered: Metered,
    /// The upstream's HTTP status.
    pub status: u16,
    pub latency_ms: u64,
}

/// What a key allows.
#[derive(Clone)]
pub struct Grant {
    pub run_id: String,
    pub workflow: String,
    pub providers: Vec<Provider>,
    pub models: Vec<String>,
    pub sink: Sink,
}

impl Grant {
    pub fn allows(&self, provider: Provider, model: &str) -> bool {
        self.providers.contains(&provider) && self.models.iter().any(|m| m == model)
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
