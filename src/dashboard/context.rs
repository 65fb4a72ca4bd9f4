//! What every page handler shares: the service, the keys, the templates.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::service::Service;

/// What every page handler shares.
pub struct Dashboard {
    pub(super) service: Arc<Service>,
    pub(super) keys: super::keys::Keys,
    /// `Host` values accepted; the first is the listen address.
    pub(super) hosts: Vec<String>,
    pub(super) templates: minijinja::Environment<'static>,
    /// Ends the live-log streams, so a graceful stop does not wait on them forever.
    pub(super) stop: CancellationToken,
}

impl Dashboard {
    /// The config the daemon runs on (the CLI's own process has none to show).
    pub(super) fn config(&self) -> Option<Arc<crate::config::Config>> {
        let daemon = self.service.daemon.as_ref()?;
        Some(daemon.running_config().config)
    }
}
