//! `config/steward.toml`: settings for the whole daemon.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::workflow::file::read_toml;

/// `config/steward.toml`: settings for the whole daemon (optional file).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The notes vault (digests, inbox, queue markers); relative paths resolve against the
    /// folder holding `config/`. Default: `vault/` beside `config/`.
    #[serde(default)]
    pub vault: Option<String>,
    /// Where webhooks listen (default 127.0.0.1:8787).
    #[serde(default)]
    pub webhook_listen: Option<String>,
    /// Seconds between catch-up runs at start-up, so a restart does not start every job at once.
    #[serde(default)]
    pub catchup_stagger_s: Option<f64>,
    /// How digests are mailed.
    #[serde(default)]
    pub smtp: Option<Smtp>,
    /// How many finished run records the store keeps.
    #[serde(default)]
    pub retention: Option<RetentionSettings>,
    /// Every workflow's default `[sandbox]` (see [`crate::workflow::sandbox`]).
    #[serde(default)]
    pub sandbox: Option<crate::workflow::sandbox::SandboxSettings>,
    /// The web dashboard and `/metrics` (see [`super::dashboard`]).
    #[serde(default)]
    pub dashboard: super::dashboard::DashboardSettings,
    /// `[[notify]]`: where alerts go (see [`super::notify`]).
    #[serde(default)]
    pub notify: Vec<super::notify::NotifyChannel>,
    /// The metered model gateway: upstreams, prices, listen address (see
    /// [`super::gateway`]).
    #[serde(default)]
    pub gateway: crate::workflow::gateway::GatewaySettings,
    /// `[cluster]`: several daemons sharing work through NATS JetStream (see
    /// [`super::cluster`]); without it, sled in the state folder.
    #[serde(default)]
    pub cluster: Option<super::cluster::ClusterSettings>,
}

/// `[retention]` in steward.toml: run records beyond either limit are pruned, oldest
/// first (dead letters keep their own copy; runs awaiting review are kept).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    /// Newest run records kept (default 10,000).
    #[serde(default)]
    pub runs: Option<usize>,
    /// Days a run record is kept (default 30).
    #[serde(default)]
    pub days: Option<u32>,
}

impl Settings {
    /// The store's retention: the `[retention]` table over the defaults.
    pub fn retention(&self) -> crate::store::Retention {
        let default = crate::store::Retention::default();
        let r = self.retention.clone().unwrap_or_default();
        crate::store::Retention {
            runs: r.runs.unwrap_or(default.runs),
            days: r.days.unwrap_or(default.days),
        }
    }

    /// steward.toml in `root`, or the defaults when it is missing or does not parse
    /// (commands that only read the store should not fail on it; `validate` reports it).
    pub fn load_lenient(root: &Path) -> Settings {
        read_toml::<Settings>(&root.join("steward.toml"))
            .map(|(s, _)| s)
            .unwrap_or_default()
    }
}

/// `[smtp]` in steward.toml. Credentials are env var names, never values.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Smtp {
    pub host: String,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub security: SmtpSecurity,
    pub from: String,
    #[serde(default)]
    pub username_env: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
    /// The `List-Id` of the digests (RFC 2919), e.g. `steward digests <digests.example.org>`;
    /// default: `<AGENT>.steward` at the sender's domain.
    #[serde(default)]
    pub list_id: Option<String>,
    /// A `List-Unsubscribe` value (RFC 2369), e.g. `<mailto:digest-off@example.org>`.
    #[serde(default)]
    pub list_unsubscribe: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// STARTTLS on port 587 (the default).
    #[default]
    Starttls,
    /// Implicit TLS on port 465.
    Tls,
    /// No TLS: allowed only for a loopback host (tests, a local relay).
    Plain,
}
