//! Steer by exception, against a real daemon and receivers steward did not write
//! (aiosmtpd for mail, Python's http.server for webhooks, `tests/fixtures/alert_sink.py`):
//! the breaker's alert goes out once per channel, a spend window pauses a workflow, a
//! daemon stopped across a slot reports `missed` and `overdue` when it starts, `steward
//! why` names what became of each slot, and a webhook that is down neither delays a run
//! nor loses its alert.

mod exceptions;
mod missed;
mod pauses;
mod restarts;
mod schedules;
#[path = "../util/mod.rs"]
mod util;

#[allow(unused_imports)]
use exceptions::*;
#[allow(unused_imports)]
use missed::*;
#[allow(unused_imports)]
use pauses::*;
#[allow(unused_imports)]
use restarts::*;
#[allow(unused_imports)]
use schedules::*;

use std::time::{Duration, Instant};

use serde_json::Value;
use util::sink::{first_hook, hooks, sink, Sink};
use util::{wait_for, Env, Spec};

/// steward.toml with the sink's SMTP server and the given `[[notify]]` tables.
fn settings(env: &Env, sink: &Sink, notify: &str) {
    std::fs::write(
        env.config.join("steward.toml"),
        format!("{}\n{notify}", util::smtp_settings(sink.smtp)),
    )
    .unwrap();
}

fn alert_lines(env: &Env, status: &str) -> Vec<Value> {
    env.runlog()
        .into_iter()
        .filter(|l| l["step"] == "alert" && l["status"] == status)
        .collect()
}

fn paused(env: &Env, wf: &str) -> Value {
    env.steward(&["list", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == wf)
        .map(|w| w["paused"].clone())
        .unwrap_or_default()
}
