//! What a model call costs and who may make it: a response's usage as the provider tells
//! it ([`meter`]), an agent CLI's own report of its spend ([`agent_cli`]), a step's
//! per-run key with its grant ([`keys`]), and a call's worst case reserved out of the
//! budget before it is forwarded ([`reserve`]).
//!
//! The listener that forwards calls to the providers is a feature above the engine; the
//! engine reaches it through [`ModelGateway`].

pub mod agent_cli;
pub mod keys;
pub mod meter;
pub mod reserve;

pub use keys::{Call, Event, Grant, Issued, Registry, Upstream};
pub use meter::{Metered, Price, Provider, StreamMeter, Usage};

/// A running model gateway, as the engine uses it: it issues a step's key (in force while
/// its lease is held), and tells where each provider's API is served.
pub trait ModelGateway: Send + Sync {
    /// The keys in force, and the grant behind each.
    fn registry(&self) -> &Registry;
    /// The base URL a step's SDK is pointed at for `provider` (`OPENAI_BASE_URL`, …).
    fn base_url(&self, provider: Provider) -> String;
    /// Where it listens, on loopback (a confined step may connect to its port).
    fn addr(&self) -> std::net::SocketAddr;
}
