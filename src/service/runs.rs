//! Handlers about runs: `run`, `digest`, `drain`, `runs`, `show`, the dead-letter and
//! review queues. Every run they start goes through the runner.

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

use super::context::{Handled, Service};
use crate::api::{DrainReport, Response};
use crate::governed::Fire;
use crate::live::Ask;
use crate::runner::Job;
use crate::store::{RunRecord, RunState};

fn run_response(rec: RunRecord) -> Handled {
    Ok(Response::Run { run: Box::new(rec) })
}

pub(super) async fn run(
    service: &Service,
    workflow: &str,
    live: bool,
    payload: Option<Value>,
) -> Handled {
    let config = service.config()?;
    let wf = service.workflow(&config, workflow)?;
    let ask = if live { Ask::Live } else { Ask::Dry };
    let rec = service
        .runner
        .run(Job::fire(wf, Fire::manual(payload), ask))
        .await?;
    run_response(rec)
}

pub(super) async fn digest(service: &Service, agent: &str, preview: bool) -> Handled {
    let config = service.config()?;
    if !config.agents.contains_key(agent) {
        let known: Vec<&str> = config.agents.keys().map(String::as_str).collect();
        if config.workflows.contains_key(agent) {
            bail!("`{agent}` is a workflow, not a digest agent: use `steward run {agent}`");
        }
        bail!(
            "no digest agent named `{agent}` in {} (agents: {})",
            config.root.join("agents").display(),
            crate::config::list_or_none(&known)
        );
    }
    let wf = service.workflow(&config, agent)?;
    let fire = Fire::manual(preview.then(|| json!({ "preview": true })));
    let ask = if preview { Ask::Dry } else { Ask::Auto };
    run_response(service.runner.run(Job::fire(wf, fire, ask)).await?)
}

/// Per job, runs the newest unexpired marker, then deletes it and the older ones;
/// deletes expired markers unrun; reports and keeps unreadable ones.
pub(super) async fn drain(service: &Service, dry_run: bool) -> Handled {
    let config = service.config()?;
    let plan = crate::catchup::plan(&config, chrono::Utc::now());
    let mut lines = Vec::new();
    for (path, why) in &plan.kept {
        lines.push(format!("kept {}: {why}", path.display()));
    }
    for path in &plan.expired {
        if !dry_run {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot delete {}", path.display()))?;
        }
        let done = if dry_run { "would delete" } else { "deleted" };
        lines.push(format!("{done} {} (expired)", path.display()));
    }
    let mut worst = 0;
    for due in &plan.due {
        let Ok(wf) = service.workflow(&config, &due.job) else {
            continue;
        };
        let marker = due.marker.as_deref().unwrap_or(std::path::Path::new(""));
        if dry_run {
            lines.push(format!(
                "would run {} for {} (marker {}), then delete it and {} older",
                wf.id,
                due.slot,
                marker.display(),
                due.files.len().saturating_sub(1)
            ));
            continue;
        }
        let rec = crate::catchup::run_due(&service.runner, wf.clone(), due, || {}).await?;
        lines.push(format!(
            "ran {} for {}: {} ({})",
            wf.id, due.slot, rec.state, rec.run_id
        ));
        lines.extend(rec.summary.clone());
        worst = worst.max(rec.state.exit_code());
        if crate::catchup::left_undone(rec.state) {
            lines.push(format!(
                "kept the markers of {}: its run ended {}",
                wf.id, rec.state
            ));
        }
    }
    if lines.is_empty() {
        let dir = crate::drain::marker_dir(&config.vault());
        lines.push(format!("no queue markers in {}", dir.display()));
    }
    Ok(Response::Drained(DrainReport {
        lines,
        exit_code: worst,
    }))
}

pub(super) fn list(
    service: &Service,
    workflow: Option<String>,
    state: Option<RunState>,
    limit: usize,
) -> Handled {
    let query = crate::store::RunQuery {
        workflow,
        state,
        limit,
        ..Default::default()
    };
    let runs = service.engine.store.run_page(&query)?;
    Ok(Response::Runs { runs })
}

fn no_run(id: &str) -> anyhow::Error {
    anyhow!("no run with id `{id}` (see `steward runs`)")
}

pub(super) fn show(service: &Service, run: &str) -> Handled {
    let rec = service.engine.store.run(run)?.ok_or_else(|| no_run(run))?;
    run_response(rec)
}

pub(super) fn dead_letters(service: &Service) -> Handled {
    Ok(Response::DeadLetters {
        entries: service.engine.store.dead_letters()?,
    })
}

fn entry(service: &Service, run: &str) -> anyhow::Result<crate::store::DeadLetter> {
    service.engine.store.dead_letter_entry(run)?.ok_or_else(|| {
        anyhow!("no dead-letter entry for run `{run}` (see `steward dead-letter list`)")
    })
}

pub(super) fn dead_letter(service: &Service, run: &str) -> Handled {
    Ok(Response::DeadLetter {
        entry: Box::new(entry(service, run)?),
    })
}

/// Fires the workflow again with the dead run's trigger context: a dry run dry, a live
/// one live if the workflow still may be.
pub(super) async fn retry(service: &Service, run: &str) -> Handled {
    let entry = entry(service, run)?;
    let config = service.config()?;
    let wf = service.workflow(&config, &entry.run.workflow)?;
    let mut fire = Fire::manual(None);
    fire.trigger = entry.run.trigger.clone();
    fire.retry_of = Some(run.to_string());
    let ask = if entry.run.dry_run {
        Ask::Dry
    } else {
        Ask::Auto
    };
    let rec = service.runner.run(Job::fire(wf, fire, ask)).await?;
    service.engine.store.remove_dead_letter(run)?;
    service.engine.store.flush()?;
    run_response(rec)
}

pub(super) fn purge(service: &Service, runs: Vec<String>, all: bool) -> Handled {
    let store = &service.engine.store;
    let ids: Vec<String> = if all {
        store
            .dead_letters()?
            .into_iter()
            .map(|e| e.run.run_id)
            .collect()
    } else if runs.is_empty() {
        bail!("name the runs to purge, or pass --all");
    } else {
        runs
    };
    let (mut removed, mut missing) = (0, Vec::new());
    for id in ids {
        if store.remove_dead_letter(&id)? {
            removed += 1;
        } else {
            missing.push(id);
        }
    }
    store.flush()?;
    Ok(Response::Purged { removed, missing })
}

pub(super) fn review(service: &Service) -> Handled {
    let store = &service.engine.store;
    let mut runs = Vec::new();
    for id in store.review_queue()? {
        runs.extend(store.run(&id)?);
    }
    Ok(Response::Runs { runs })
}

pub(super) async fn approve(service: &Service, run: &str) -> Handled {
    let rec = service.engine.store.run(run)?.ok_or_else(|| no_run(run))?;
    let config = service.config()?;
    let wf = service.workflow(&config, &rec.workflow)?;
    run_response(service.runner.run(Job::approve(wf, run)).await?)
}

pub(super) fn reject(service: &Service, run: &str, reason: Option<&str>) -> Handled {
    let rec = service.engine.reject(run, reason)?;
    Ok(Response::Rejected { run_id: rec.run_id })
}
