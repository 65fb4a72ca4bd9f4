//! steward's features on its run engine: the config folder ([`config`]), the triggers
//! that fire workflows ([`trigger`], [`catchup`], [`drain`], [`chain`]), digest agents
//! ([`agent`]), agency cases ([`agency`]), alerts to the `[[notify]]` channels
//! ([`alert`], [`mail`]), the model gateway's listener ([`gateway`]), the dead-man's
//! switch ([`expect`]), the per-slot [`ledger`], accepting connections ([`listener`]),
//! and several daemons on NATS JetStream ([`cluster`]).
//!
//! Each reaches the engine (`steward-engine`, whose modules are re-exported here under
//! the same paths) through its modules and hooks; [`hooks`] installs the features' hooks
//! on an engine it opens. Nothing here knows the wire, the service, the daemon or the CLI
//! above it.

pub mod agency;
pub mod agent;
pub mod alert;
pub mod catchup;
pub mod chain;
pub mod cluster;
pub mod config;
pub mod drain;
pub mod expect;
pub mod gateway;
pub mod hooks;
pub mod ledger;
pub mod listener;
pub mod mail;
pub mod trigger;

// The run engine, under the same paths as the features' own modules.
pub use steward_engine::{
    alerts, budget, calendar, containment, control, governed, helper, limits, live, metering,
    metrics, process, redact, runlog, runner, sandbox, schedule, secret, step, store, template,
    throttle, workflow,
};
