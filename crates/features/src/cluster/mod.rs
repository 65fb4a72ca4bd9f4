//! Several daemons, one set of workflows: the state they must agree on kept in a NATS
//! JetStream server (`[cluster] nats = …`, see [`crate::config::cluster`]), through the
//! `async-nats` client. No scheduler or election of steward's own: every decision that
//! two daemons could race for is a compare-and-set the server settles.
//!
//! - [`slots`]: a schedule slot is claimed by creating its key (only if absent), so it
//!   fires once cluster-wide; the claim's revision is the fencing token a commit checks.
//! - [`keys`]: idempotency keys reserved, moved to committing and committed by
//!   compare-and-set on revision; a gone daemon's keys whose commit had not begun are
//!   released, those caught committing are left in doubt for an operator.
//! - [`queue`]: queue items in a work-queue stream, pulled by every daemon, kept with
//!   `+WPI` while run, redelivered after the ack wait, a late ack fenced, given up on
//!   into a dead-letter stream after `max_attempts`.
//! - [`cases`]: an agency case's events on a subject of their own; an append expects the
//!   subject's last sequence, so of two drivers the server takes one.
//! - [`approvals`]: go-live approvals, one for the whole cluster.
//! - [`webhooks`]: deliveries seen, so a replay to another daemon runs nothing.
//! - [`files`]: a file of a watched folder shared between machines, taken by one daemon.
//! - [`state`] and [`runs`]: the rest of the state in [`records`] buckets (review, dead
//!   letters, pauses, day spend, alerts owed); every daemon's runs, and each daemon's
//!   view of them all.
//! - [`log`]: every daemon's runlog lines in one stream, for `steward logs --cluster`.
//! - [`heartbeat`]: each daemon's heartbeat in a bucket whose entries expire. Whether a
//!   daemon is gone is decided by the server's clock alone, never by comparing two
//!   machines' clocks.
//!
//! Buckets are made on first connection with fixed settings ([`buckets`]), so every daemon
//! of a cluster finds the same ones.

pub mod approvals;
pub mod bridge;
pub mod buckets;
pub mod cases;
pub mod connection;
pub mod error;
pub mod files;
pub mod heartbeat;
pub mod keys;
pub mod log;
pub mod member;
pub mod names;
pub mod queue;
pub mod records;
pub mod runs;
pub mod slots;
pub mod state;
pub mod store;
pub mod webhooks;

pub use crate::config::cluster::Cluster as Settings;
pub use connection::Cluster;
pub use error::ClusterError;
pub use member::Member;
pub use names::key_part;
