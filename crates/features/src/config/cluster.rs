//! `[cluster]` in `steward.toml`: several daemons sharing one set of workflows through a
//! NATS JetStream server (see [`crate::cluster`]). Without the table, one daemon keeps its
//! state in sled, as ever.
//!
//! ```toml
//! [cluster]
//! nats = "nats://127.0.0.1:4222"   # one server or several, comma-separated
//! ack_wait = "30s"                 # a queue item not acknowledged by then goes to another daemon
//! heartbeat = "5s"                 # a daemon silent this long is gone: its unstarted commits are freed
//! tls = true                       # optional: TLS to the server (tls:// URLs ask for it too)
//! ca = "/etc/steward/nats-ca.pem"  # optional: the server's CA, beside the system's roots
//! ```
//!
//! Credentials come from the environment, never the file: `NATS_CREDS` (a `.creds` file's
//! path), `NATS_NKEY` (a seed file's path), `NATS_TOKEN`, or `NATS_USER` with
//! `NATS_PASSWORD`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The default ack wait: a queue item a daemon neither acknowledged nor extended in this
/// long is handed to another daemon.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
/// The default heartbeat: a daemon not heard from in this long is taken for gone.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// `[cluster]`, as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// The NATS server's URL (`nats://host:4222`, `tls://host:4222`), or several,
    /// comma-separated.
    pub nats: String,
    /// How long a pulled queue item may go unacknowledged (`"30s"`).
    #[serde(default)]
    pub ack_wait: Option<String>,
    /// How long a daemon may go unheard before it is taken for gone (`"5s"`).
    #[serde(default)]
    pub heartbeat: Option<String>,
    /// TLS to the server even for `nats://` URLs.
    #[serde(default)]
    pub tls: bool,
    /// A CA file for the server's certificate.
    #[serde(default)]
    pub ca: Option<String>,
}

/// `[cluster]`, checked: what [`crate::cluster::Cluster::connect`] takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub servers: Vec<String>,
    pub ack_wait: Duration,
    pub heartbeat: Duration,
    pub tls: bool,
    pub ca: Option<std::path::PathBuf>,
}

impl ClusterSettings {
    /// The checked settings, or each problem as (key, what is wrong).
    pub fn check(&self) -> Result<Cluster, Vec<(&'static str, String)>> {
        let mut problems = Vec::new();
        let servers: Vec<String> = self
            .nats
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        if servers.is_empty() {
            problems.push((
                "nats",
                "expected a NATS URL such as \"nats://127.0.0.1:4222\"".into(),
            ));
        }
        for server in &servers {
            if let Some(problem) = url_problem(server) {
                problems.push(("nats", problem));
            }
        }
        let mut duration =
            |key: &'static str, value: &Option<String>, default: Duration| match value
                .as_deref()
                .map(humantime::parse_duration)
            {
                None => default,
                Some(Ok(d)) if d >= Duration::from_secs(1) => d,
                Some(Ok(_)) => {
                    problems.push((key, "expected at least 1s".into()));
                    default
                }
                Some(Err(e)) => {
                    problems.push((key, format!("expected a duration such as \"30s\" ({e})")));
                    default
                }
            };
        let ack_wait = duration("ack_wait", &self.ack_wait, DEFAULT_ACK_WAIT);
        let heartbeat = duration("heartbeat", &self.heartbeat, DEFAULT_HEARTBEAT);
        if problems.is_empty() {
            Ok(Cluster {
                servers,
                ack_wait,
                heartbeat,
                tls: self.tls,
                ca: self.ca.as_ref().map(std::path::PathBuf::from),
            })
        } else {
            Err(problems)
        }
    }
}

/// `[cluster]` as written cannot be used: each problem as `key: what`.
#[derive(Debug, thiserror::Error)]
#[error("[cluster] in steward.toml: {}", .0.join("; "))]
pub struct ClusterSettingsError(pub Vec<String>);

impl ClusterSettings {
    /// [`ClusterSettings::check`], its problems in one error.
    pub fn checked(&self) -> Result<Cluster, ClusterSettingsError> {
        self.check().map_err(|problems| {
            ClusterSettingsError(
                problems
                    .into_iter()
                    .map(|(key, why)| format!("{key}: {why}"))
                    .collect(),
            )
        })
    }
}

/// What is wrong with a server URL, if anything. Credentials belong in the environment:
/// a URL that carries a password would put it in the config folder and in logs.
fn url_problem(url: &str) -> Option<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!(
            "\"{url}\": expected nats://HOST:PORT or tls://HOST:PORT"
        ));
    };
    if !matches!(scheme, "nats" | "tls") {
        return Some(format!(
            "\"{url}\": the scheme must be nats or tls, not {scheme}"
        ));
    }
    if rest.contains('@') {
        return Some(format!(
            "\"{scheme}://…\" carries credentials: put them in NATS_USER and NATS_PASSWORD, NATS_TOKEN or NATS_CREDS instead"
        ));
    }
    if rest.is_empty() {
        return Some(format!("\"{url}\": no host"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> ClusterSettings {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn defaults_and_several_servers() {
        let c = settings("nats = \"nats://a:4222, nats://b:4222\"")
            .check()
            .unwrap();
        assert_eq!(c.servers, ["nats://a:4222", "nats://b:4222"]);
        assert_eq!(c.ack_wait, DEFAULT_ACK_WAIT);
        assert_eq!(c.heartbeat, DEFAULT_HEARTBEAT);
        let c = settings("nats = \"tls://a:4222\"\nack_wait = \"2m\"\nheartbeat = \"2s\"")
            .check()
            .unwrap();
        assert_eq!(c.ack_wait, Duration::from_secs(120));
        assert_eq!(c.heartbeat, Duration::from_secs(2));
    }

    #[test]
    fn each_mistake_names_its_key() {
        let keys = |text: &str| -> Vec<&'static str> {
            settings(text)
                .check()
                .unwrap_err()
                .into_iter()
                .map(|(k, _)| k)
                .collect()
        };
        assert_eq!(keys("nats = \"\""), ["nats"]);
        assert_eq!(keys("nats = \"http://a:4222\""), ["nats"]);
        assert_eq!(keys("nats = \"nats://u:secret@a:4222\""), ["nats"]);
        assert_eq!(
            keys("nats = \"nats://a\"\nack_wait = \"soon\""),
            ["ack_wait"]
        );
        assert_eq!(
            keys("nats = \"nats://a\"\nheartbeat = \"10ms\""),
            ["heartbeat"]
        );
        let said = settings("nats = \"nats://u:secret@a:4222\"")
            .check()
            .unwrap_err();
        assert!(!said[0].1.contains("secret"), "{said:?}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<ClusterSettings>("nats = \"nats://a\"\nack = \"1s\"").is_err());
    }
}
