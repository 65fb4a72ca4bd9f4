//! Handlers about workflows and the daemon: `status`, `enqueue`, `list`, `go-live`,
//! `dry-run`, `in-doubt`.

use anyhow::{anyhow, bail};
use serde_json::Value;

use super::context::{Handled, Service};
use crate::api::{Response, Status, WorkflowKind, WorkflowRow};
use crate::config::Config;
use crate::live::{self, Ask, Mode};

/// Every workflow with whether it runs live and why, as the runner would decide now.
fn rows(service: &Service, config: &Config) -> anyhow::Result<Vec<WorkflowRow>> {
    let forced = service.runner.forced_dry_run();
    let mut rows = Vec::new();
    for wf in config.workflows.values() {
        let status = service.engine.live_status(wf)?;
        let mode = live::decide(&status, forced, Ask::Auto, &wf.id)?;
        let why = match mode {
            Mode::Dry(live::DryReason::ForcedDryRun) => {
                "dry-run (forced for every workflow by SIGUSR1; SIGUSR2 lifts it)".to_string()
            }
            _ => status.describe(&wf.id),
        };
        rows.push(WorkflowRow {
            id: wf.id.clone(),
            kind: if wf.agent.is_some() {
                WorkflowKind::Agent
            } else {
                WorkflowKind::Workflow
            },
            trigger: wf.trigger.kind().to_string(),
            live: mode.is_live(),
            mode: why,
            description: wf.description.clone(),
            file: wf.file.clone(),
            next_fire: wf.next_fire_json(),
            paused: service.engine.pause_of(&wf.id)?,
            follows: wf.trigger.after().map(|a| a.describe()),
            followers: config
                .workflows
                .values()
                .filter(|f| {
                    f.trigger
                        .after()
                        .is_some_and(|a| a.upstream.contains(&wf.id))
                })
                .map(|f| f.id.clone())
                .collect(),
        });
    }
    Ok(rows)
}

pub(super) fn status(service: &Service) -> Handled {
    let Some(daemon) = &service.daemon else {
        bail!(
            "no steward daemon is running on state folder {} (start one with `steward daemon`)",
            service.state_dir.display()
        );
    };
    let running = daemon.running_config();
    let up = daemon.uptime().as_secs();
    Ok(Response::Status(Box::new(Status {
        pid: std::process::id(),
        uptime: format!("{}h{:02}m{:02}s", up / 3600, up / 60 % 60, up % 60),
        uptime_s: up,
        config_dir: running.config.root.clone(),
        state_dir: service.state_dir.clone(),
        forced_dry_run: service.runner.forced_dry_run(),
        in_flight: service.runner.in_flight(),
        waiting: service.runner.waiting(),
        workflows: rows(service, &running.config)?,
        config_loaded_at: running
            .loaded_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        config_errors: running.errors,
        webhook_listen: daemon.webhook_listen(),
        dashboard_listen: daemon.dashboard_listen(),
        gateway_listen: service
            .engine
            .gateway
            .as_ref()
            .map(|g| g.addr().to_string()),
        process_containment: crate::containment::describe(),
        cluster: daemon.member().map(cluster_status),
    })))
}

/// The daemons alive, as the cluster's heartbeats say (waited for at most 2 s).
fn cluster_status(member: &crate::cluster::Member) -> crate::api::ClusterStatus {
    let cluster = member.cluster.clone();
    let alive = member.bridge.block(async move {
        tokio::time::timeout(std::time::Duration::from_secs(2), cluster.alive())
            .await
            .unwrap_or_else(|_| {
                Err(crate::cluster::ClusterError::Store(
                    "no answer from the server in 2 s".into(),
                ))
            })
    });
    let (alive, error) = match alive {
        Ok(list) => (list, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    crate::api::ClusterStatus {
        daemon: member.cluster.daemon.clone(),
        servers: member.cluster.settings.servers.clone(),
        alive,
        error,
    }
}

pub(super) fn enqueue(service: &Service, queue: &str, payload: &Value) -> Handled {
    let cluster = service
        .config()
        .ok()
        .and_then(|c| c.settings.cluster.clone());
    let item = match (&service.daemon, cluster) {
        (Some(d), _) => d.enqueue(queue, payload)?,
        // No daemon here, but a cluster: straight to its queue, for any daemon to pull.
        (None, Some(settings)) => crate::cluster::member::enqueue_once(&settings, queue, payload)?,
        (None, None) => crate::trigger::queue::write_item(&service.state_dir, queue, payload)?,
    };
    let warning = service
        .config()
        .ok()
        .and_then(|c| unread_queue_warning(&c, queue));
    Ok(Response::Enqueued {
        queue: queue.to_string(),
        item,
        warning,
    })
}

/// A warning when no workflow of `config` reads `queue` (a typo, or a workflow not yet
/// written): the item is kept and waits until one does.
pub fn unread_queue_warning(config: &Config, queue: &str) -> Option<String> {
    let read: Vec<&str> = config
        .workflows
        .values()
        .filter_map(|w| match &w.trigger {
            crate::config::Trigger::Queue { queue } => Some(queue.as_str()),
            _ => None,
        })
        .collect();
    if read.contains(&queue) {
        return None;
    }
    Some(format!(
        "no workflow reads queue `{queue}` (queues read: {}); the item waits until one does",
        crate::config::list_or_none(&read)
    ))
}

pub(super) fn list(service: &Service) -> Handled {
    let config = service.config()?;
    let mut workflows = rows(service, &config)?;
    workflows.extend(agency_rows(&config));
    let cluster = service
        .daemon
        .as_ref()
        .and_then(|d| d.member())
        .map(cluster_status);
    Ok(Response::Workflows { workflows, cluster })
}

/// Agencies, listed beside the workflows their members run.
fn agency_rows(config: &Config) -> Vec<WorkflowRow> {
    config
        .agencies
        .values()
        .map(|a| {
            let schedule = a
                .trigger
                .schedule
                .as_ref()
                .and_then(|s| crate::schedule::Schedule::parse(s).ok());
            let members: Vec<String> = a
                .roster
                .iter()
                .map(|m| format!("{} → {}", m.name, m.workflow))
                .collect();
            WorkflowRow {
                id: a.id.clone(),
                kind: WorkflowKind::Agency,
                trigger: if schedule.is_some() { "schedule" } else { "manual" }.into(),
                live: false,
                mode: format!(
                    "agency: each member runs as its own workflow, live or dry as that workflow is ({})",
                    members.join(", ")
                ),
                description: a.mandate.clone(),
                file: a.file.clone(),
                next_fire: schedule.and_then(|s| s.next_fire_json()),
                paused: None,
                follows: None,
                followers: Vec::new(),
            }
        })
        .collect()
}

pub(super) fn go_live(service: &Service, workflow: &str) -> Handled {
    let config = service.config()?;
    let wf = service.workflow(&config, workflow)?;
    let a = service.engine.go_live(&wf)?;
    Ok(Response::WentLive {
        workflow: wf.id.clone(),
        config_hash: a.config_hash,
        approved_by: a.approved_by,
        file: wf.file.clone(),
    })
}

pub(super) fn dry_run(service: &Service, workflow: &str) -> Handled {
    let config = service.config()?;
    let wf = service.workflow(&config, workflow)?;
    Ok(Response::WentDry {
        workflow: wf.id.clone(),
        was_live: service.engine.dry_run(&wf)?,
    })
}

pub(super) fn pause(service: &Service, workflow: &str, reason: Option<&str>) -> Handled {
    let config = service.config()?;
    let wf = service.workflow(&config, workflow)?;
    Ok(Response::Paused {
        pause: service.engine.pause(&wf.id, reason)?,
    })
}

/// Lifts the pause; a paused schedule's catch-up policy then decides what runs (the
/// daemon runs it, see [`crate::catchup::after_pause`]).
pub(super) fn resume(service: &Service, workflow: &str) -> Handled {
    let config = service.config()?;
    let wf = service.workflow(&config, workflow)?;
    let pause = service.engine.resume(&wf.id)?;
    match &service.daemon {
        Some(daemon) => daemon.catch_up_after_pause(&wf, &pause),
        // No daemon runs now: the next one to start catches up (see
        // [`crate::catchup::owe_resume`]).
        None => crate::catchup::owe_resume(&service.engine, &pause)?,
    }
    Ok(Response::Resumed { pause })
}

pub(super) fn in_doubt(service: &Service) -> Handled {
    Ok(Response::KeysInDoubt {
        keys: service.engine.store.keys_in_doubt()?,
    })
}

pub(super) fn settle(service: &Service, workflow: &str, key: &str, committed: bool) -> Handled {
    service
        .engine
        .settle_key(workflow, key, committed)
        .map_err(|e| anyhow!(e))?;
    Ok(Response::KeySettled {
        workflow: workflow.to_string(),
        key: key.to_string(),
        committed,
    })
}
