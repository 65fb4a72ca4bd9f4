//! A bucket of records by text key: what the cluster keeps of the rest of the state (the
//! review queue, dead letters, pauses, day spend, what alerting owes, file claims) is
//! read, written, listed and compared-and-set through this one shape. A key may be any
//! text ([`key_part`] makes it a NATS key, and a listing reads it back).

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures_util::StreamExt;

use super::error::ClusterError;
use super::names::{from_key_part, key_part};

/// One of the cluster's buckets, with its name for errors.
#[derive(Clone)]
pub struct Records {
    store: kv::Store,
    name: &'static str,
    js: jetstream::Context,
}

/// A record as read: its value and the revision to compare-and-set it at.
pub struct Read {
    pub value: Vec<u8>,
    pub revision: u64,
}

impl Records {
    pub fn new(store: kv::Store, name: &'static str, js: jetstream::Context) -> Records {
        Records { store, name, js }
    }

    pub async fn get(&self, key: &str) -> Result<Option<Read>, ClusterError> {
        let entry = self
            .store
            .entry(key_part(key))
            .await
            .map_err(ClusterError::store)?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .map(|e| Read {
                value: e.value.to_vec(),
                revision: e.revision,
            }))
    }

    /// The record under `key`, read as JSON.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, ClusterError> {
        match self.get(key).await? {
            Some(read) => self.decode(key, &read.value).map(Some),
            None => Ok(None),
        }
    }

    pub fn decode<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        value: &[u8],
    ) -> Result<T, ClusterError> {
        serde_json::from_slice(value).map_err(|e| ClusterError::Corrupt {
            bucket: self.name,
            key: key.to_string(),
            why: e.to_string(),
        })
    }

    pub async fn put(&self, key: &str, value: Vec<u8>) -> Result<u64, ClusterError> {
        self.store
            .put(key_part(key), value.into())
            .await
            .map_err(ClusterError::store)
    }

    pub async fn put_json<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
    ) -> Result<u64, ClusterError> {
        self.put(key, serde_json::to_vec(value).map_err(ClusterError::store)?)
            .await
    }

    /// Writes `value` if the record is still at `revision` (`None`: still absent); false
    /// when another write came first.
    pub async fn swap(
        &self,
        key: &str,
        revision: Option<u64>,
        value: Vec<u8>,
    ) -> Result<bool, ClusterError> {
        let key = key_part(key);
        match revision {
            None => match self.store.create(&key, value.into()).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(ClusterError::store(e)),
            },
            Some(revision) => match self.store.update(&key, value.into(), revision).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(false),
                Err(e) => Err(ClusterError::store(e)),
            },
        }
    }

    /// Removes `key`; false when there was nothing.
    pub async fn remove(&self, key: &str) -> Result<bool, ClusterError> {
        let had = self.get(key).await?.is_some();
        if had {
            self.store
                .delete(key_part(key))
                .await
                .map_err(ClusterError::store)?;
        }
        Ok(had)
    }

    /// The keys held, read back as the texts they were made from, in order.
    pub async fn keys(&self) -> Result<Vec<String>, ClusterError> {
        let mut keys = self.store.keys().await.map_err(ClusterError::store)?;
        let mut out = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(ClusterError::store)?;
            out.extend(from_key_part(&key));
        }
        out.sort();
        Ok(out)
    }

    /// Every record whose key starts with `prefix`, in key order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, ClusterError> {
        let mut out = Vec::new();
        for key in self.keys().await? {
            if !key.starts_with(prefix) {
                continue;
            }
            if let Some(read) = self.get(&key).await? {
                out.push((key, read.value));
            }
        }
        Ok(out)
    }

    /// How many records the bucket holds now (asked of the server, not cached).
    async fn held(&self) -> Result<u64, ClusterError> {
        let mut stream = self
            .js
            .get_stream(format!("KV_{}", self.name))
            .await
            .map_err(ClusterError::store)?;
        let info = stream.info().await.map_err(ClusterError::store)?;
        Ok(info.state.messages)
    }

    /// Hands `apply` the newest record of each key, then each change, and returns once it
    /// has handed over every record there was at the start; goes on following (watching
    /// again from where it got to after a lost connection) until the process ends.
    pub async fn follow(
        &self,
        apply: impl Fn(&kv::Entry) + Send + 'static,
    ) -> Result<(), ClusterError> {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let mut ready = Some(ready_tx);
        if self.held().await? == 0 {
            let _ = ready.take().map(|tx| tx.send(()));
        }
        let mut watch = self
            .store
            .watch_with_history(">")
            .await
            .map_err(ClusterError::store)?;
        let store = self.store.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                while let Some(Ok(entry)) = watch.next().await {
                    last = entry.revision;
                    apply(&entry);
                    if entry.delta == 0 {
                        let _ = ready.take().map(|tx| tx.send(()));
                    }
                }
                // The watch ended (the server went away): again from where it got to.
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if let Ok(w) = store.watch_all_from_revision(last + 1).await {
                        watch = w;
                        break;
                    }
                }
            }
        });
        let _ = ready_rx.await;
        Ok(())
    }
}

/// A bucket's records in memory, by key, kept current by [`Records::follow`]: read on
/// every run (a pause), so without a round trip to the server. A write through this
/// daemon shows at once; another daemon's, as soon as the watch brings it.
#[derive(Clone, Default)]
pub struct Cached {
    map: std::sync::Arc<std::sync::RwLock<std::collections::HashMap<String, Vec<u8>>>>,
}

impl Cached {
    /// The records of `records`, followed from now on.
    pub async fn follow(records: &Records) -> Result<Cached, ClusterError> {
        let cached = Cached::default();
        let feed = cached.clone();
        records
            .follow(move |entry| {
                let Some(key) = from_key_part(&entry.key) else {
                    return;
                };
                let value = (entry.operation == kv::Operation::Put).then(|| entry.value.to_vec());
                feed.set(&key, value);
            })
            .await?;
        Ok(cached)
    }

    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Keeps `value` under `key` (None: removes it).
    pub fn set(&self, key: &str, value: Option<Vec<u8>>) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        match value {
            Some(v) => map.insert(key.to_string(), v),
            None => map.remove(key),
        };
    }
}
