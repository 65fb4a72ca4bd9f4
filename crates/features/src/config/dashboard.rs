//! `[dashboard]` in `steward.toml`: where the daemon serves its web pages and `/metrics`.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The default address: loopback, so only this machine's users reach it (and each still
/// needs the token).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8484";

/// `[dashboard]`: every key optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DashboardSettings {
    /// `"127.0.0.1:8484"` (the default), another address, or `"off"`.
    #[serde(default)]
    pub listen: Option<Listen>,
    /// Lets `listen` be an address other machines can reach (off by default).
    #[serde(default)]
    pub allow_remote: bool,
    /// Who may read `/metrics`: `"loopback"` (the default: any client on this machine,
    /// no token) or `"token"` (a bearer token from `state/metrics.token`).
    #[serde(default)]
    pub metrics: MetricsAccess,
}

/// Where the dashboard listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    Off,
    At(SocketAddr),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAccess {
    #[default]
    Loopback,
    Token,
}

impl DashboardSettings {
    /// The address to serve on, or None when turned off.
    pub fn address(&self) -> Option<SocketAddr> {
        match self.listen {
            Some(Listen::Off) => None,
            Some(Listen::At(addr)) => Some(addr),
            None => DEFAULT_LISTEN.parse().ok(),
        }
    }

    /// Why this table may not be used as written, if it may not.
    pub fn problem(&self) -> Option<String> {
        let addr = self.address()?;
        (!addr.ip().is_loopback() && !self.allow_remote).then(|| {
            format!(
                "[dashboard] listen = \"{addr}\" is reachable from other machines: use a loopback address (127.0.0.1), or set allow_remote = true to mean it"
            )
        })
    }
}

impl Serialize for Listen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Listen::Off => s.serialize_str("off"),
            Listen::At(addr) => s.serialize_str(&addr.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "off" {
            return Ok(Listen::Off);
        }
        text.parse().map(Listen::At).map_err(|_| {
            serde::de::Error::custom(format!(
                "listen: expected an address and port like \"{DEFAULT_LISTEN}\", or \"off\"; got \"{text}\""
            ))
        })
    }
}
