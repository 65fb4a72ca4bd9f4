//! The metered model gateway: steward between each run and its model provider, counting
//! what is really spent rather than what the maker reports.
//!
//! A workflow opts in with `[gateway]` (see [`crate::config::gateway`]). Its maker and
//! checker then get `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL` pointing here and a per-run
//! key ([`keys`]) that works only while that step runs. The listener ([`forward`]) serves
//! the provider APIs unchanged on loopback: it checks key and model, reserves the call's
//! worst case out of the run's budget and lowers its output limit to fit ([`reserve`]),
//! forwards with the real key, and passes the answer back as it arrives while [`meter`]
//! reads what it spent. Each call is charged to the run's budget as it ends. Agent CLIs
//! with a transport of their own are metered from the usage they print ([`agent_cli`]).

pub mod forward;

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

pub use crate::metering::{agent_cli, keys, meter, reserve};
pub use crate::metering::{Call, Event, Grant, Issued, ModelGateway, Provider, Registry, Upstream};

/// A running gateway: where it listens, and the keys it honours.
#[derive(Clone)]
pub struct Gateway {
    pub addr: SocketAddr,
    pub registry: Registry,
}

impl Gateway {
    /// Binds `listen` (a loopback address) and serves until `cancel`.
    pub async fn start(listen: &str, cancel: CancellationToken) -> std::io::Result<Gateway> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let registry = Registry::default();
        tokio::spawn(forward::serve(listener, registry.clone(), cancel));
        Ok(Gateway { addr, registry })
    }

    /// What a step sets `OPENAI_BASE_URL` or `ANTHROPIC_BASE_URL` to, as each provider's
    /// SDK expects it.
    pub fn base_url(&self, provider: Provider) -> String {
        match provider {
            Provider::Openai => format!("http://{}/openai/v1", self.addr),
            Provider::Anthropic => format!("http://{}/anthropic", self.addr),
        }
    }
}

impl ModelGateway for Gateway {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn base_url(&self, provider: Provider) -> String {
        Gateway::base_url(self, provider)
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }
}
