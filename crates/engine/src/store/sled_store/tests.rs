//! Unit tests of `sled_store`.

use super::*;
use crate::budget::Figures;
use crate::store::Store;

fn record(run_id: String, state: RunState) -> RunRecord {
    RunRecord {
        run_id,
        workflow: "wf".into(),
        config_hash: String::new(),
        state,
        reason: String::new(),
        dry_run: false,
        committed: false,
        attempt: 1,
        idempotency_key: None,
        trigger: serde_json::Value::Null,
        started_at: Utc::now(),
        ended_at: None,
        figures: Figures::default(),
        breach: None,
        output: None,
        verify: None,
        commit_output: None,
        stderr: Default::default(),
        notes: Vec::new(),
        attempts: Vec::new(),
        retry_of: None,
        summary: None,
        dry_run_reason: None,
        model_spend: None,
        misreported: None,
        daemon: None,
        sandbox: None,
    }
}

/// Every run id the store holds, newest first.
fn run_ids(store: &dyn Backend) -> Vec<String> {
    store
        .runs(&|_| true, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect()
}

/// The page is what a scan of every record with the same filter would give, in the
/// same order; a state change moves a run between index entries; pruning drops them.
#[test]
fn run_pages_match_a_full_scan_and_follow_state_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path()).unwrap();
    let base = Utc::now() - chrono::Duration::hours(1);
    let states = [RunState::Success, RunState::Failed, RunState::Skipped];
    let mut ids = Vec::new();
    for i in 0..60i64 {
        let t = base + chrono::Duration::seconds(i);
        let id = format!("{}-{i:06}", run_id_prefix(t));
        let mut r = record(id.clone(), RunState::Running);
        r.workflow = ["a", "b"][i as usize % 2].into();
        r.started_at = t;
        store.put_run(&r).unwrap();
        r.state = states[i as usize % 3];
        store.put_run(&r).unwrap();
        ids.push((id, r.workflow.clone(), r.state, t));
    }
    let check = |q: RunQuery| {
        let got: Vec<String> = store
            .run_page(&q)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        let want: Vec<String> = ids
            .iter()
            .rev()
            .filter(|(id, w, s, t)| {
                q.workflow.as_ref().is_none_or(|x| x == w)
                    && q.state.is_none_or(|x| x == *s)
                    && q.since.is_none_or(|x| *t >= x)
                    && q.until.is_none_or(|x| *t < x)
                    && q.before.as_ref().is_none_or(|b| id < b)
            })
            .take(q.limit)
            .map(|(id, ..)| id.clone())
            .collect();
        assert_eq!(got, want, "{q:?}");
        assert!(!got.is_empty(), "{q:?}");
    };
    for workflow in [None, Some("a".to_string())] {
        for state in [None, Some(RunState::Failed)] {
            check(RunQuery {
                workflow: workflow.clone(),
                state,
                limit: 7,
                ..Default::default()
            });
            check(RunQuery {
                workflow: workflow.clone(),
                state,
                since: Some(base + chrono::Duration::seconds(10)),
                until: Some(base + chrono::Duration::seconds(50)),
                before: Some(ids[40].0.clone()),
                limit: 5,
            });
        }
    }
    // No running entry is left behind by the state changes.
    let running = RunQuery {
        state: Some(RunState::Running),
        limit: 100,
        ..Default::default()
    };
    assert!(store.run_page(&running).unwrap().is_empty());
    let strip = store.recent_states("b", 3).unwrap();
    assert_eq!(strip.len(), 3);
    assert_eq!(strip[0].0, ids[59].0);
    assert_eq!(strip[0].1, ids[59].2);
    store.set_retention(Retention { runs: 10, days: 30 });
    assert_eq!(store.prune_runs(Utc::now()).unwrap(), 50);
    let all = RunQuery {
        workflow: Some("a".into()),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(store.run_page(&all).unwrap().len(), 5);
    assert_eq!(store.recent_states("a", 100).unwrap().len(), 5);
}

#[test]
fn retention_prunes_the_oldest_and_the_expired_but_never_running_or_reviewed_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path()).unwrap();
    let now = Utc::now();
    // Run i started i hours ago; 40 days ago and older for the last five.
    let id = |hours: i64| {
        format!(
            "{}-000000",
            (now - chrono::Duration::hours(hours)).format("%Y%m%dT%H%M%S%3f")
        )
    };
    let ages: Vec<i64> = (0..20).chain(960..965).collect();
    for &h in &ages {
        store.put_run(&record(id(h), RunState::Success)).unwrap();
    }
    // An old run still awaiting review and one still running (as far as the store knows).
    store
        .put_run(&record(id(970), RunState::ApprovalRequired))
        .unwrap();
    store.queue_review(&id(970)).unwrap();
    store.put_run(&record(id(971), RunState::Running)).unwrap();

    store.set_retention(Retention { runs: 12, days: 30 });
    let pruned = store.prune_runs(now).unwrap();
    let left = run_ids(&*store);
    let mut expected: Vec<String> = (0..12).map(id).collect();
    expected.extend([id(970), id(971)]);
    assert_eq!(left, expected, "newest 12 kept, plus reviewed and running");
    assert_eq!(pruned, 8 + 5);

    // Age alone: with room for 1000 records, only the expired go.
    store.set_retention(Retention {
        runs: 1000,
        days: 0,
    });
    store.prune_runs(now + chrono::Duration::hours(1)).unwrap();
    assert_eq!(store.runs(&|_| true, usize::MAX).unwrap().len(), 2);
}

/// The count pruning trusts follows new runs (not state changes), prunes and a
/// reopen, and a store from before it existed gets one.
#[test]
fn the_run_count_follows_puts_prunes_and_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..5)
        .map(|i| format!("20261201T00000{i}000-000000"))
        .collect();
    {
        let (store, _) = SledStore::open(dir.path()).unwrap();
        for id in &ids {
            store
                .put_run(&record(id.clone(), RunState::Running))
                .unwrap();
            store
                .put_run(&record(id.clone(), RunState::Success))
                .unwrap();
        }
        assert_eq!(store.run_count().unwrap(), 5);
        store.set_retention(Retention {
            runs: 3,
            days: 3650,
        });
        assert_eq!(store.prune_runs(Utc::now()).unwrap(), 2);
        assert_eq!(store.run_count().unwrap(), 3);
        store.meta.remove(RUN_COUNT).unwrap(); // as a store written before the count
        store.flush().unwrap();
    }
    // sled's flusher thread lets go of the file lock a moment after the drop.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let store = loop {
        match SledStore::open(dir.path()) {
            Ok((store, _)) => break store,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => panic!("cannot reopen the store: {e}"),
        }
    };
    assert_eq!(store.run_count().unwrap(), 3);
    let left = run_ids(&store);
    assert_eq!(left, vec![ids[4].clone(), ids[3].clone(), ids[2].clone()]);
}
