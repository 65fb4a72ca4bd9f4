//! The per-slot ledger behind `steward why`: what became of every slot of a schedule and
//! every file, queue or webhook fire — `fired` (with its run), `skipped` (overlap, paused,
//! breaker, budget, forced dry-run), `missed` (steward was down), `caught-up` (run late,
//! at start-up or after a pause) or `coalesced` (a missed slot one catch-up run stood in
//! for). It is read from the run records steward keeps anyway — every fire leaves one,
//! skipped and missed ones included — so it costs a governed run nothing and is bounded
//! by the same retention; a schedule's slot with no record at all is reported `missed`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::store::{RunRecord, RunState};

/// How one slot or fire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Fired,
    Skipped,
    Missed,
    CaughtUp,
    Coalesced,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Fired => "fired",
            Outcome::Skipped => "skipped",
            Outcome::Missed => "missed",
            Outcome::CaughtUp => "caught-up",
            Outcome::Coalesced => "coalesced",
        }
    }
}

/// One line of `steward why`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The schedule's slot, or when a file, queue or webhook fire came.
    pub slot: DateTime<Utc>,
    pub outcome: Outcome,
    /// A word for the cause (`overlap`, `paused`, `breaker`, `budget`, `forced-dry-run`,
    /// `daemon-down`, or the run's end state), then a colon and the words.
    pub reason: String,
    pub run_id: Option<String>,
    /// What fired it: `schedule`, `file`, `queue`, `webhook`, `manual`.
    pub trigger: String,
}

/// The ledger entry a run record stands for.
pub fn entry(rec: &RunRecord) -> Entry {
    let t = &rec.trigger;
    let slot = t
        .get("scheduled_for")
        .and_then(|v| v.as_str())
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|d| d.with_timezone(&Utc))
        .unwrap_or(rec.started_at);
    let flag = |name: &str| t.get(name).and_then(|v| v.as_bool()).unwrap_or(false);
    let (outcome, cause) = match rec.state {
        RunState::Missed if t.get("coalesced_into").is_some() => {
            (Outcome::Coalesced, "daemon-down")
        }
        RunState::Missed => (Outcome::Missed, "daemon-down"),
        RunState::Skipped => (Outcome::Skipped, skip_cause(&rec.reason)),
        _ if rec.dry_run
            && rec
                .dry_run_reason
                .as_deref()
                .is_some_and(|r| r.contains("forced")) =>
        {
            (Outcome::Skipped, "forced-dry-run")
        }
        state => (
            if flag("catchup") {
                Outcome::CaughtUp
            } else {
                Outcome::Fired
            },
            state.name(),
        ),
    };
    let run_id = match outcome {
        Outcome::Missed | Outcome::Coalesced => None,
        _ => Some(rec.run_id.clone()),
    };
    Entry {
        slot,
        outcome,
        reason: format!("{cause}: {}", rec.reason),
        run_id,
        trigger: t
            .get("kind")
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string(),
    }
}

/// Why a fire was skipped, in a word, from the reason the runner recorded.
fn skip_cause(reason: &str) -> &'static str {
    if reason.starts_with("overlap") {
        "overlap"
    } else if reason.starts_with("paused (breaker") {
        "breaker"
    } else if reason.starts_with("paused (budget") {
        "budget"
    } else if reason.starts_with("paused") {
        "paused"
    } else {
        "skipped"
    }
}

/// The entries of a workflow's records (newest first, as the store gives them), oldest
/// first, one per slot: a run beats a `missed` record of the same slot (the catch-up ran it).
pub fn entries(records: &[RunRecord]) -> Vec<Entry> {
    let mut out: Vec<Entry> = records.iter().rev().map(entry).collect();
    out.sort_by_key(|e| e.slot);
    let mut kept: Vec<Entry> = Vec::with_capacity(out.len());
    for e in out {
        match kept.last_mut() {
            Some(last)
                if last.slot == e.slot && last.trigger == "schedule" && e.trigger == "schedule" =>
            {
                if rank(e.outcome) >= rank(last.outcome) {
                    *last = e;
                }
            }
            _ => kept.push(e),
        }
    }
    kept
}

/// Which of two records of one slot tells its story: the last thing that happened to it.
fn rank(o: Outcome) -> u8 {
    match o {
        Outcome::Missed | Outcome::Coalesced => 0,
        Outcome::Skipped => 1,
        Outcome::Fired | Outcome::CaughtUp => 2,
    }
}

/// The entry for a schedule's slot that left no record: steward was not running.
pub fn unrecorded(slot: DateTime<Utc>) -> Entry {
    Entry {
        slot,
        outcome: Outcome::Missed,
        reason: "daemon-down: no record of this slot: steward was not running then (or has not started since)".into(),
        run_id: None,
        trigger: "schedule".into(),
    }
}

/// `2026-12-04 09:00:00 UTC  skipped    paused: paused (operator: …)  run 2026…`.
pub fn line(e: &Entry, local: impl Fn(DateTime<Utc>) -> String) -> String {
    let run = e
        .run_id
        .as_deref()
        .map(|r| format!("  run {r}"))
        .unwrap_or_default();
    format!(
        "{}  {:<9}  {}{run}",
        local(e.slot),
        e.outcome.name(),
        e.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(id: &str, state: RunState, reason: &str, trigger: serde_json::Value) -> RunRecord {
        let mut r: RunRecord = serde_json::from_value(json!({
            "run_id": id, "workflow": "w", "config_hash": "h", "state": state, "reason": reason,
            "dry_run": true, "committed": false, "attempt": 1, "idempotency_key": null,
            "trigger": trigger, "started_at": "2026-12-04T09:00:01Z", "ended_at": null,
            "figures": {"tokens": 0, "tool_calls": 0, "cost_usd": 0.0, "runtime_ms": 0},
            "breach": null, "output": null, "verify": null, "commit_output": null,
            "stderr": {}, "notes": [], "attempts": []
        }))
        .unwrap();
        r.workflow = "w".into();
        r
    }

    #[test]
    fn each_record_names_its_outcome_and_cause() {
        let at = json!({"kind": "schedule", "scheduled_for": "2026-12-04T09:00:00Z"});
        let skip = rec(
            "a",
            RunState::Skipped,
            "paused (breaker: the last 3 runs failed)",
            at.clone(),
        );
        let e = entry(&skip);
        assert_eq!(
            (e.outcome, e.reason.split(':').next()),
            (Outcome::Skipped, Some("breaker"))
        );
        assert_eq!(e.slot.to_rfc3339(), "2026-12-04T09:00:00+00:00");
        let over = rec(
            "b",
            RunState::Skipped,
            "overlap = skip: run x is still active",
            at.clone(),
        );
        assert!(entry(&over).reason.starts_with("overlap:"));
        let missed = rec(
            "c",
            RunState::Missed,
            "missed: …",
            json!({"kind": "schedule", "scheduled_for": "2026-12-04T09:00:00Z", "missed": true}),
        );
        let caught = rec(
            "d",
            RunState::Success,
            "verify passed",
            json!({"kind": "schedule", "scheduled_for": "2026-12-04T09:00:00Z", "catchup": true}),
        );
        let mut forced = rec("f", RunState::Success, "verify passed", at.clone());
        forced.dry_run_reason = Some("forced dry-run is on (SIGUSR1; SIGUSR2 lifts it)".into());
        let e = entry(&forced);
        assert_eq!(
            (e.outcome, e.run_id.as_deref()),
            (Outcome::Skipped, Some("f"))
        );
        assert!(e.reason.starts_with("forced-dry-run:"), "{e:?}");
        // Newest first, as the store lists them: the catch-up run tells the slot's story.
        let both = entries(&[caught, missed]);
        assert_eq!(both.len(), 1);
        assert_eq!(
            (both[0].outcome, both[0].run_id.as_deref()),
            (Outcome::CaughtUp, Some("d"))
        );
    }
}
