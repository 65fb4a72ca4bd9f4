//! The cluster's rules against a real `nats-server -js` (see `util::nats`), with several
//! daemons' connections in one test process: a slot claimed once of three racing, a
//! claim taken over only from a gone daemon and fencing the first, keys reserved once,
//! and a gone daemon's keys freed or put in doubt once its heartbeat expires on the
//! server. The real daemons' tests build on these.

mod cases;
mod daemons;
mod keys;
mod queue;
mod slots;
mod state;
#[path = "../util/mod.rs"]
mod util;

#[allow(unused_imports)]
use cases::*;
#[allow(unused_imports)]
use daemons::*;
#[allow(unused_imports)]
use keys::*;
#[allow(unused_imports)]
use queue::*;
#[allow(unused_imports)]
use slots::*;
#[allow(unused_imports)]
use state::*;

use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use steward::cluster::Cluster;
use steward::config::cluster::ClusterSettings;
use steward::store::KeyPhase;
use util::cluster::{three, three_with, Three, KEEP_CONTEXT};
use util::nats::NatsServer;

async fn daemon(server: &NatsServer, name: &str, heartbeat: &str) -> Cluster {
    daemon_with(server, name, heartbeat, "30s").await
}

async fn daemon_with(server: &NatsServer, name: &str, heartbeat: &str, ack_wait: &str) -> Cluster {
    let settings = ClusterSettings {
        nats: server.url(),
        heartbeat: Some(heartbeat.into()),
        ack_wait: Some(ack_wait.into()),
        ..Default::default()
    }
    .check()
    .unwrap();
    Cluster::connect(&settings, name.to_string())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()))
}

async fn beat(c: &Cluster) {
    let now = Utc::now();
    c.beat(&steward::cluster::heartbeat::Beat {
        daemon: c.daemon.clone(),
        host: "test".into(),
        pid: 1,
        started_at: now,
        at: now,
        runs_in_flight: 0,
    })
    .await
    .unwrap();
}
