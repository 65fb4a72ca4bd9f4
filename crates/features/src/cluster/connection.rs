//! The connection to the cluster's NATS server, and the buckets every daemon opens.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

use super::buckets;
use super::error::ClusterError;
use super::names::hostname;
use super::records::Records;
use crate::config::cluster::Cluster as Settings;

/// A connection to the cluster, with its buckets; clones share it.
#[derive(Clone)]
pub struct Cluster {
    /// This daemon's name in the cluster: host, process and a random part, so a restarted
    /// daemon is a new member (its predecessor's leftovers are reaped like any gone one's).
    pub daemon: String,
    pub settings: Settings,
    client: async_nats::Client,
    pub(super) js: jetstream::Context,
    pub(super) slots: jetstream::kv::Store,
    pub(super) open_slots: jetstream::kv::Store,
    pub(super) keys: jetstream::kv::Store,
    pub(super) daemons: jetstream::kv::Store,
    pub(super) webhooks: jetstream::kv::Store,
    pub(super) approvals: jetstream::kv::Store,
    /// The rest of the state ([`super::records`]).
    pub(super) records: Arc<RecordBuckets>,
    /// The queue and case streams, made or found once (each enqueue and append used to
    /// ask the server first).
    pub(super) queue_stream: Arc<tokio::sync::OnceCell<jetstream::stream::Stream>>,
    pub(super) case_stream: Arc<tokio::sync::OnceCell<jetstream::stream::Stream>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("daemon", &self.daemon)
            .field("servers", &self.settings.servers)
            .finish()
    }
}

impl Cluster {
    /// Connects as `daemon` and opens (making, the first time) the buckets.
    pub async fn connect(settings: &Settings, daemon: String) -> Result<Cluster, ClusterError> {
        let servers = settings.servers.join(", ");
        let connect_error = |why: String| ClusterError::Connect {
            servers: servers.clone(),
            why,
        };
        let options = options(settings, &daemon)
            .await
            .map_err(|e| connect_error(e.to_string()))?;
        let addrs: Vec<async_nats::ServerAddr> = settings
            .servers
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()
            .map_err(|e: std::io::Error| connect_error(e.to_string()))?;
        let client = options
            .connect(addrs)
            .await
            .map_err(|e| connect_error(e.to_string()))?;
        let js = jetstream::new(client.clone());
        let slots = buckets::open(&js, buckets::slots()).await?;
        let open_slots = buckets::open(&js, buckets::open_slots()).await?;
        let keys = buckets::open(&js, buckets::keys()).await?;
        let daemons = buckets::open(&js, buckets::daemons(settings.heartbeat)).await?;
        let webhooks = buckets::open(&js, buckets::webhooks()).await?;
        let approvals = buckets::open(&js, buckets::approvals()).await?;
        let records = Arc::new(RecordBuckets::open(&js).await?);
        Ok(Cluster {
            daemon,
            settings: settings.clone(),
            client,
            js,
            slots,
            open_slots,
            keys,
            daemons,
            webhooks,
            approvals,
            records,
            queue_stream: Default::default(),
            case_stream: Default::default(),
        })
    }

    /// The underlying client, for streams of other modules.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// A name for this daemon: `HOST-PID-RANDOM`, safe as a NATS key.
    pub fn daemon_name() -> String {
        let mut rand = [0u8; 3];
        let _ = getrandom::fill(&mut rand);
        let name = format!(
            "{}-{}-{}",
            hostname(),
            std::process::id(),
            hex::encode(rand)
        );
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }
}

/// The buckets of the rest of the state, one per kind of record.
pub struct RecordBuckets {
    pub runs: Records,
    pub review: Records,
    pub dead_letters: Records,
    pub pauses: Records,
    pub spend: Records,
    pub owed: Records,
    pub files: Records,
}

impl RecordBuckets {
    async fn open(js: &jetstream::Context) -> Result<RecordBuckets, ClusterError> {
        use buckets::*;
        let days = |n: u64| Duration::from_secs(n * 24 * 3600);
        let open = |name: &'static str, what: &'static str, max_age: Duration| async move {
            let store = buckets::open(js, records(name, what, max_age)).await?;
            Ok::<_, ClusterError>(Records::new(store, name, js.clone()))
        };
        Ok(RecordBuckets {
            runs: open(RUNS, "run records, with the daemon of each", days(30)).await?,
            review: open(REVIEW, "runs waiting for review", Duration::ZERO).await?,
            dead_letters: open(DEAD_LETTERS, "dead-lettered runs", Duration::ZERO).await?,
            pauses: open(PAUSES, "paused workflows", Duration::ZERO).await?,
            spend: open(SPEND, "each workflow's spend by day", days(40)).await?,
            owed: open(
                OWED,
                "alerts owed, rate windows, lapses told",
                Duration::ZERO,
            )
            .await?,
            files: open(FILES, "files of shared folders, claimed once", days(1)).await?,
        })
    }
}

/// A credentials file named in the environment that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{var} {path}: {source}")]
struct BadCredentials {
    var: &'static str,
    path: String,
    source: std::io::Error,
}

/// The client's options: credentials from the environment, TLS as configured, and a
/// name the server's monitoring shows.
async fn options(
    settings: &Settings,
    daemon: &str,
) -> Result<async_nats::ConnectOptions, BadCredentials> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let unreadable = |var, path: &str| {
        let path = path.to_string();
        move |source| BadCredentials { var, path, source }
    };
    let mut options = if let Some(path) = env("NATS_CREDS") {
        async_nats::ConnectOptions::with_credentials_file(&path)
            .await
            .map_err(unreadable("NATS_CREDS", &path))?
    } else if let Some(path) = env("NATS_NKEY") {
        let seed = std::fs::read_to_string(&path).map_err(unreadable("NATS_NKEY", &path))?;
        async_nats::ConnectOptions::with_nkey(seed.trim().to_string())
    } else if let Some(token) = env("NATS_TOKEN") {
        async_nats::ConnectOptions::with_token(token)
    } else if let (Some(user), Some(password)) = (env("NATS_USER"), env("NATS_PASSWORD")) {
        async_nats::ConnectOptions::with_user_and_password(user, password)
    } else {
        async_nats::ConnectOptions::new()
    };
    options = options
        .name(format!("steward {daemon}"))
        .connection_timeout(Duration::from_secs(5))
        .require_tls(settings.tls || settings.servers.iter().any(|s| s.starts_with("tls://")));
    if let Some(ca) = &settings.ca {
        options = options.add_root_certificates(ca.clone());
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_name_is_a_key() {
        let name = Cluster::daemon_name();
        assert_eq!(super::super::names::key_part(&name), name);
        assert_ne!(name, Cluster::daemon_name());
    }
}
