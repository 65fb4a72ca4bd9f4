//! `/metrics`: the engine's counters, with the sizes the store and folders hold set just
//! before the text is written. Classic Prometheus text unless the scraper asks for
//! OpenMetrics in its `Accept` header.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};

use super::context::Dashboard;
use crate::metrics::Snapshot;
use crate::store::{RunQuery, RunState};

pub async fn metrics(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    let engine = &d.service.engine;
    engine.metrics.set_snapshot(&snapshot(&d));
    (
        [(
            header::CONTENT_TYPE,
            crate::metrics::content_type(openmetrics),
        )],
        engine.metrics.encode(openmetrics),
    )
        .into_response()
}

fn snapshot(d: &Dashboard) -> Snapshot {
    let service = &d.service;
    let store = &service.engine.store;
    let counts = store.counts().unwrap_or_default();
    let mut snap = Snapshot {
        dead_letters: counts.dead_letters,
        review_waiting: counts.review_waiting,
        keys_in_doubt: counts.keys_in_doubt,
        in_flight: service.runner.in_flight().len(),
        forced_dry_run: service.runner.forced_dry_run(),
        uptime_s: service
            .daemon
            .as_ref()
            .map_or(0.0, |daemon| daemon.uptime().as_secs_f64()),
        ..Snapshot::default()
    };
    let Some(config) = d.config() else {
        return snap;
    };
    let mut queues = std::collections::BTreeMap::new();
    for wf in config.workflows.values() {
        if let crate::config::Trigger::Queue { queue } = &wf.trigger {
            queues
                .entry(queue.clone())
                .or_insert_with(|| crate::trigger::queue::pending(&service.state_dir, queue).len());
        }
        let last = store.run_page(&RunQuery {
            workflow: Some(wf.id.clone()),
            state: Some(RunState::Success),
            limit: 1,
            ..RunQuery::default()
        });
        if let Ok(Some(p)) = store.paused(&wf.id) {
            snap.paused.push((wf.id.clone(), p.cause.name()));
        }
        if let Some(run) = last.ok().and_then(|runs| runs.into_iter().next()) {
            let at = run.ended_at.unwrap_or(run.started_at);
            snap.last_success
                .push((wf.id.clone(), at.timestamp_millis() as f64 / 1000.0));
        }
    }
    snap.queues = queues.into_iter().collect();
    snap
}
