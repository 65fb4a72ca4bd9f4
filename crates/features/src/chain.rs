//! Workflows that follow workflows (`[trigger] after = …`): when a run ends, each
//! workflow that follows its workflow on that outcome fires, through the one runner like
//! any trigger — so forced dry-run, pauses, the breaker, overlap and the caps hold for a
//! follower as for any run — and a follower of a dry upstream run runs dry, so a whole
//! chain can be rehearsed.
//!
//! Each fire is recorded before the follower starts, in the store's `owed` tree under
//! `chain/FOLLOWER/IDS` (the upstream run ids, `+`-joined for a fan-in), with the run id
//! the follower's run will have. The record is made by compare-and-set, so a set of
//! upstream runs fires a follower once — across a restart, and across the daemons of a
//! cluster. At start-up ([`missed`]) the upstream runs that ended while no daemon ran,
//! or between their end and their follower's fire, fire it then; a record whose run
//! never started fires it again, with the same run id.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::config::workflow::AfterTrigger;
use crate::config::{Config, Workflow};
use crate::governed::{Engine, Fire};
use crate::live::Ask;
use crate::store::{RunQuery, RunRecord, Store};

/// Where a fire of a follower is recorded: `chain/FOLLOWER/IDS`.
const FIRED: &str = "chain/";
/// Since when a follower follows (when its `after` was first seen): `chain-since/FOLLOWER`.
const SINCE: &str = "chain-since/";
/// Days a fire record is kept: the run records' default retention.
const KEEP_DAYS: i64 = 30;
/// How many of an upstream's newest runs a start-up looks at.
const LOOK_BACK: usize = 200;

/// A follower's fire for a set of upstream runs, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fired {
    /// The follower's run (it may not have started yet).
    pub run_id: String,
    pub at: DateTime<Utc>,
    /// The upstream runs that fired it.
    pub upstream: Vec<String>,
}

/// A follower to fire, for these upstream runs.
#[derive(Debug, Clone)]
pub struct Due {
    pub follower: String,
    pub upstream: Vec<RunRecord>,
}

/// A follower's fire, recorded: run it with `ask`.
#[derive(Debug)]
pub struct ChainFire {
    pub follower: String,
    pub fire: Fire,
    pub ask: Ask,
}

fn fired_key(follower: &str, ids: &str) -> String {
    format!("{FIRED}{follower}/{ids}")
}

fn ids(upstream: &[RunRecord]) -> String {
    let mut ids: Vec<&str> = upstream.iter().map(|r| r.run_id.as_str()).collect();
    ids.sort();
    ids.join("+")
}

/// The followers of workflows in `config`, with their `after`.
fn followers(config: &Config) -> impl Iterator<Item = (&Workflow, &AfterTrigger)> {
    config
        .workflows
        .values()
        .filter_map(|wf| wf.trigger.after().map(|a| (wf, a)))
}

/// Whether any workflow of `config` follows `workflow`.
pub fn is_followed(config: &Config, workflow: &str) -> bool {
    followers(config).any(|(_, a)| a.upstream.iter().any(|u| u == workflow))
}

/// The followers due now that `ended` ended: a follower of its workflow on its outcome
/// (for a fan-in, once every other upstream has a run to go with it).
pub fn due_after(config: &Config, store: &Store, ended: &RunRecord) -> Vec<Due> {
    let mut due = Vec::new();
    for (wf, after) in followers(config) {
        if !after.fired_by(&ended.workflow, ended.state) {
            continue;
        }
        if !after.all {
            due.push(Due {
                follower: wf.id.clone(),
                upstream: vec![ended.clone()],
            });
            continue;
        }
        match fan_in(store, &wf.id, after, Some(ended)) {
            Ok(Some(upstream)) => due.push(Due {
                follower: wf.id.clone(),
                upstream,
            }),
            Ok(None) => {}
            Err(e) => {
                tracing::error!(follower = %wf.id, "cannot look at a fan-in's upstream runs: {e}")
            }
        }
    }
    due
}

/// A fan-in's set: for each upstream, its newest run ending in `on` since the follower's
/// last fire by them (`ended` for its own workflow); None while one has none.
fn fan_in(
    store: &Store,
    follower: &str,
    after: &AfterTrigger,
    ended: Option<&RunRecord>,
) -> crate::store::Result<Option<Vec<RunRecord>>> {
    let since = last_fan_in(store, follower)?.max(since(store, follower)?);
    let mut set = Vec::new();
    for up in &after.upstream {
        let newest = match ended.filter(|r| &r.workflow == up) {
            Some(r) => Some(r.clone()),
            None => newest_ended(store, up, after, since)?,
        };
        match newest {
            Some(run) => set.push(run),
            None => return Ok(None),
        }
    }
    Ok(Some(set))
}

/// `workflow`'s newest run that ended in `after.on` after `since`.
fn newest_ended(
    store: &Store,
    workflow: &str,
    after: &AfterTrigger,
    since: DateTime<Utc>,
) -> crate::store::Result<Option<RunRecord>> {
    let page = store.run_page(&RunQuery {
        workflow: Some(workflow.to_string()),
        limit: LOOK_BACK,
        ..Default::default()
    })?;
    Ok(page.into_iter().find(|r| {
        r.ended_at.is_some_and(|t| t > since) && after.on.iter().any(|o| o.matches(r.state))
    }))
}

/// When the follower last fired by a fan-in (the newest upstream end it used).
fn last_fan_in(store: &Store, follower: &str) -> crate::store::Result<DateTime<Utc>> {
    let newest = store
        .owed(&format!("{FIRED}{follower}/"))?
        .into_iter()
        .filter_map(|(_, v)| serde_json::from_slice::<Fired>(&v).ok())
        .filter(|f| f.upstream.len() > 1)
        .map(|f| f.at)
        .max();
    Ok(newest.unwrap_or(DateTime::UNIX_EPOCH))
}

/// Since when `follower` follows (its `after` first seen by a daemon on this store).
fn since(store: &Store, follower: &str) -> crate::store::Result<DateTime<Utc>> {
    let key = format!("{SINCE}{follower}");
    Ok(store
        .owed(&key)?
        .into_iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| serde_json::from_slice(&v).ok())
        .unwrap_or(DateTime::UNIX_EPOCH))
}

/// Notes when each follower of `config` was first seen (a follower added today does not
/// fire for what its upstream did yesterday).
pub fn note_followers(store: &Store, config: &Config, now: DateTime<Utc>) {
    for (wf, _) in followers(config) {
        let key = format!("{SINCE}{}", wf.id);
        let first = store.update_owed(&key, &|kept| {
            kept.is_none()
                .then(|| serde_json::to_vec(&now).unwrap_or_default())
        });
        if let Err(e) = first {
            tracing::error!(follower = %wf.id, "cannot note when it began to follow: {e}");
        }
    }
}

/// Records `due`'s fire (durably, before the follower starts) unless it was recorded
/// before: then None — fired already, by this daemon or another.
pub fn record(store: &Store, due: &Due) -> crate::store::Result<Option<ChainFire>> {
    let fire = Fire::new("after", None, context(&due.upstream));
    let fired = Fired {
        run_id: fire.run_id.clone(),
        at: due
            .upstream
            .iter()
            .filter_map(|r| r.ended_at)
            .max()
            .unwrap_or_else(Utc::now),
        upstream: due.upstream.iter().map(|r| r.run_id.clone()).collect(),
    };
    let bytes = serde_json::to_vec(&fired).unwrap_or_default();
    let key = fired_key(&due.follower, &ids(&due.upstream));
    if !store.update_owed(&key, &|kept| kept.is_none().then(|| bytes.clone()))? {
        return Ok(None);
    }
    store.flush()?;
    Ok(Some(ChainFire {
        follower: due.follower.clone(),
        fire,
        ask: ask_for(&due.upstream),
    }))
}

/// A follower of any dry upstream run runs dry.
fn ask_for(upstream: &[RunRecord]) -> Ask {
    if upstream.iter().any(|r| r.dry_run) {
        Ask::DryUpstream
    } else {
        Ask::Auto
    }
}

/// What the follower's `trigger` holds: `upstream` (the run that fired it, the last to end
/// of a fan-in's), `upstreams` (all of them), and `upstream_ids` (its default key).
fn context(upstream: &[RunRecord]) -> serde_json::Value {
    let one = |r: &RunRecord| {
        json!({
            "run_id": r.run_id,
            "workflow": r.workflow,
            "state": r.state,
            "dry_run": r.dry_run,
            "slot": r.trigger.get("scheduled_for").cloned().unwrap_or_default(),
            "ended_at": r.ended_at,
            "output": r.output,
        })
    };
    let last = upstream.iter().max_by_key(|r| r.ended_at);
    json!({
        "upstream": last.map(one),
        "upstreams": upstream.iter().map(one).collect::<Vec<_>>(),
        "upstream_ids": ids(upstream),
    })
}

/// At start-up: the follower fires owed — recorded but never started (a stop between
/// the record and the run), and upstream runs that ended while no daemon ran (`steward
/// run` by hand, a run that ended as the daemon stopped) — each recorded now, once.
pub fn missed(engine: &Engine, config: &Config) -> Vec<ChainFire> {
    let store = &engine.store;
    forget_old(store, Utc::now());
    let mut out = Vec::new();
    for (wf, after) in followers(config) {
        match missed_of(store, wf, after) {
            Ok(mut fires) => out.append(&mut fires),
            Err(e) => {
                tracing::error!(follower = %wf.id, "cannot look for upstream runs it missed: {e}")
            }
        }
    }
    out
}

fn missed_of(
    store: &Store,
    wf: &Workflow,
    after: &AfterTrigger,
) -> crate::store::Result<Vec<ChainFire>> {
    let mut out = Vec::new();
    let recorded = store.owed(&format!("{FIRED}{}/", wf.id))?;
    // Recorded, never started: again, with the run id it was to have.
    for (_, bytes) in &recorded {
        let Ok(fired) = serde_json::from_slice::<Fired>(bytes) else {
            continue;
        };
        if store.run(&fired.run_id)?.is_some() {
            continue;
        }
        let mut upstream = Vec::new();
        for id in &fired.upstream {
            upstream.extend(store.run(id)?);
        }
        if upstream.len() == fired.upstream.len() {
            let mut fire = Fire::new("after", None, context(&upstream));
            fire.run_id = fired.run_id.clone();
            out.push(ChainFire {
                follower: wf.id.clone(),
                fire,
                ask: ask_for(&upstream),
            });
        }
    }
    // Ended without firing it.
    let since = since(store, &wf.id)?;
    let dues: Vec<Due> = if after.all {
        fan_in(store, &wf.id, after, None)?
            .map(|upstream| Due {
                follower: wf.id.clone(),
                upstream,
            })
            .into_iter()
            .collect()
    } else {
        let mut dues = Vec::new();
        for up in &after.upstream {
            let page = store.run_page(&RunQuery {
                workflow: Some(up.clone()),
                limit: LOOK_BACK,
                ..Default::default()
            })?;
            for run in page.into_iter().rev() {
                let ended = run.ended_at.is_some_and(|t| t > since);
                if ended && after.fired_by(&run.workflow, run.state) {
                    dues.push(Due {
                        follower: wf.id.clone(),
                        upstream: vec![run],
                    });
                }
            }
        }
        dues
    };
    for due in dues {
        if let Some(fire) = record(store, &due)? {
            tracing::info!(follower = %wf.id, upstream = %ids(&due.upstream), "an upstream run ended while steward was not running: firing its follower now");
            out.push(fire);
        }
    }
    Ok(out)
}

/// Fire records are kept as long as the run records they name ([`KEEP_DAYS`]).
fn forget_old(store: &Store, now: DateTime<Utc>) {
    let before = now - chrono::Duration::days(KEEP_DAYS);
    for (key, bytes) in store.owed(FIRED).unwrap_or_default() {
        let old = serde_json::from_slice::<Fired>(&bytes).map_or(true, |f| f.at < before);
        if old {
            if let Err(e) = store.remove_owed(&key) {
                tracing::warn!("cannot forget an old follower fire record: {e}");
            }
        }
    }
}

/// The fires recorded of `follower`, newest first: which upstream runs fired which of
/// its runs (for `steward why`).
pub fn fired_of(store: &Store, follower: &str) -> Vec<Fired> {
    let mut fired: Vec<Fired> = store
        .owed(&format!("{FIRED}{follower}/"))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(_, v)| serde_json::from_slice(&v).ok())
        .collect();
    fired.sort_by_key(|f| std::cmp::Reverse(f.at));
    fired
}

/// The runs `run_id` fired: (follower, its run id).
pub fn followers_of_run(store: &Store, run_id: &str) -> Vec<(String, String)> {
    store
        .owed(FIRED)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| {
            let fired: Fired = serde_json::from_slice(&v).ok()?;
            let follower = k.strip_prefix(FIRED)?.split('/').next()?.to_string();
            fired
                .upstream
                .iter()
                .any(|u| u == run_id)
                .then_some((follower, fired.run_id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunState;

    const BODY: &str = "[budget]\nmax_tokens = 10\nmax_tool_calls = 1\nmax_runtime_s = 5\nmax_cost_usd = 0.01\n[run]\ncommand = [\"/bin/true\"]\n[verify]\ncommand = [\"/bin/true\"]\n";

    /// A config of `fetch` (manual) and `merge`, which follows as `after` says; an engine
    /// on a state folder of its own.
    fn setup(dir: &std::path::Path, after: &str) -> (Config, Engine) {
        let wf = dir.join("config/workflows");
        std::fs::create_dir_all(&wf).unwrap();
        for (id, trigger) in [
            ("fetch", "manual = true".to_string()),
            ("other", "manual = true".to_string()),
            ("merge", format!("after = {{ {after} }}")),
        ] {
            std::fs::write(
                wf.join(format!("{id}.toml")),
                format!("id = \"{id}\"\n[trigger]\n{trigger}\n{BODY}"),
            )
            .unwrap();
        }
        let config = crate::config::load_dir(&dir.join("config")).unwrap();
        let (engine, _) = crate::governed::open(&dir.join("state")).unwrap();
        (config, engine)
    }

    /// A run of `workflow` that ended `state` a moment ago, in the store.
    fn ended(engine: &Engine, workflow: &str, state: RunState) -> RunRecord {
        let mut run: RunRecord = serde_json::from_value(json!({
            "run_id": crate::governed::new_run_id(), "workflow": workflow, "config_hash": "h",
            "state": state, "reason": "", "dry_run": false, "committed": false, "attempt": 1,
            "idempotency_key": null, "trigger": {"kind": "manual"},
            "started_at": Utc::now(), "ended_at": Utc::now(),
            "figures": {"tokens": 0, "tool_calls": 0, "cost_usd": 0.0, "runtime_ms": 0},
            "breach": null, "output": {"n": 1}, "verify": null, "commit_output": null,
            "stderr": {}, "notes": [], "attempts": []
        }))
        .unwrap();
        run.workflow = workflow.to_string();
        engine.store.put_run(&run).unwrap();
        run
    }

    #[test]
    fn a_fire_recorded_whose_run_never_started_fires_again_with_its_run_id() {
        let dir = tempfile::tempdir().unwrap();
        let (config, engine) = setup(dir.path(), "workflow = \"fetch\"");
        note_followers(
            &engine.store,
            &config,
            Utc::now() - chrono::Duration::hours(1),
        );
        let up = ended(&engine, "fetch", RunState::Success);
        let due = due_after(&config, &engine.store, &up);
        assert_eq!(due.len(), 1);
        // Recorded, then the daemon stopped before the follower started.
        let fire = record(&engine.store, &due[0]).unwrap().unwrap();
        assert!(
            record(&engine.store, &due[0]).unwrap().is_none(),
            "recorded twice"
        );
        let again = missed(&engine, &config);
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!(again[0].fire.run_id, fire.fire.run_id);
        assert_eq!(
            again[0].fire.trigger["upstream"]["run_id"],
            up.run_id.as_str()
        );
        assert_eq!(again[0].ask, Ask::Auto);
        // Once its run exists, nothing is owed.
        let mut run = ended(&engine, "merge", RunState::Success);
        run.run_id = fire.fire.run_id.clone();
        engine.store.put_run(&run).unwrap();
        assert!(missed(&engine, &config).is_empty());
    }

    #[test]
    fn a_fan_in_is_due_once_each_upstream_has_a_run_since_its_last_fire() {
        let dir = tempfile::tempdir().unwrap();
        let (config, engine) = setup(dir.path(), "all = [\"fetch\", \"other\"], on = [\"any\"]");
        note_followers(
            &engine.store,
            &config,
            Utc::now() - chrono::Duration::hours(1),
        );
        let a = ended(&engine, "fetch", RunState::Failed);
        assert!(due_after(&config, &engine.store, &a).is_empty());
        let b = ended(&engine, "other", RunState::Success);
        let due = due_after(&config, &engine.store, &b);
        assert_eq!(due.len(), 1);
        assert!(record(&engine.store, &due[0]).unwrap().is_some());
        // A newer run of one of them alone is not enough.
        let a2 = ended(&engine, "fetch", RunState::Success);
        assert!(due_after(&config, &engine.store, &a2).is_empty());
        // An end it does not follow never counts.
        let skipped = ended(&engine, "other", RunState::Skipped);
        assert!(due_after(&config, &engine.store, &skipped).is_empty());
        let b2 = ended(&engine, "other", RunState::Success);
        let due = due_after(&config, &engine.store, &b2);
        assert_eq!(due.len(), 1);
        let ids: Vec<&str> = due[0].upstream.iter().map(|r| r.run_id.as_str()).collect();
        assert!(ids.contains(&a2.run_id.as_str()) && ids.contains(&b2.run_id.as_str()));
    }
}
