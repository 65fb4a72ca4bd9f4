//! Person-readable renderings of runs, workflows and keys.

use serde_json::Value;

use crate::store::{KeyRecord, RunRecord};

pub fn run_summary(r: &RunRecord) {
    let mode = if r.dry_run { "dry-run" } else { "live" };
    println!("run {} ({}, {mode}): {}", r.run_id, r.workflow, r.state);
    println!("  {}", r.reason);
    let f = &r.figures;
    println!(
        "  tokens {} · tool_calls {} · cost_usd {} · runtime {:.1}s · attempt {}",
        f.tokens,
        f.tool_calls,
        f.cost_usd,
        f.runtime_ms as f64 / 1000.0,
        r.attempt
    );
    if r.state.dead_letters() {
        println!("  dead-lettered: `steward dead-letter show {}`", r.run_id);
    }
    if r.state == crate::store::RunState::ApprovalRequired {
        println!(
            "  waiting for review: `steward approve {0}` or `steward reject {0}`",
            r.run_id
        );
    }
}

pub fn run_detail(r: &RunRecord) {
    run_summary(r);
    let field = |name: &str, v: String| println!("{name:>16}: {v}");
    field("config sha256", r.config_hash.clone());
    field("started", r.started_at.to_rfc3339());
    if let Some(end) = r.ended_at {
        field("ended", end.to_rfc3339());
    }
    field("committed", r.committed.to_string());
    if let Some(k) = &r.idempotency_key {
        field("idempotency key", k.clone());
    }
    if let Some(b) = &r.breach {
        field("breach", b.clone());
    }
    if let Some(of) = &r.retry_of {
        field("retry of", of.clone());
    }
    field("trigger", compact(&r.trigger));
    if let Some(o) = &r.output {
        field("output", compact(o));
    }
    if let Some(v) = &r.verify {
        let conf = v
            .confidence
            .as_deref()
            .map(|c| format!(" (confidence {c})"))
            .unwrap_or_default();
        field("verify", format!("{}{conf}: {}", v.verdict, v.reason));
    }
    if let Some(o) = &r.commit_output {
        field("commit output", compact(o));
    }
    for a in &r.attempts {
        field(
            &format!("attempt {}", a.attempt),
            format!("{}: {}", a.state, a.reason),
        );
    }
    for n in &r.notes {
        field("note", n.clone());
    }
    for (step, tail) in &r.stderr {
        println!("{:>16}:", format!("{step} stderr"));
        for line in tail
            .lines()
            .rev()
            .take(10)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            println!("{:>16}  {line}", "");
        }
    }
}

fn compact(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

pub fn runs_table(runs: &[RunRecord]) {
    if runs.is_empty() {
        println!("no runs");
        return;
    }
    println!(
        "{:<26} {:<22} {:<18} {:<7} {:<20} REASON",
        "RUN", "WORKFLOW", "STATE", "MODE", "STARTED"
    );
    for r in runs {
        let reason: String = r.reason.chars().take(70).collect();
        println!(
            "{:<26} {:<22} {:<18} {:<7} {:<20} {}",
            r.run_id,
            r.workflow,
            r.state.name(),
            if r.dry_run { "dry" } else { "live" },
            r.started_at.format("%Y-%m-%d %H:%M:%S"),
            reason
        );
    }
}

pub fn workflows_table(rows: &[Value]) {
    if rows.is_empty() {
        println!("no workflows (create one with `steward new NAME`)");
        return;
    }
    println!(
        "{:<22} {:<9} {:<5} DESCRIPTION",
        "WORKFLOW", "TRIGGER", "LIVE"
    );
    for r in rows {
        println!(
            "{:<22} {:<9} {:<5} {}",
            r["id"].as_str().unwrap_or(""),
            r["trigger"].as_str().unwrap_or(""),
            if r["live"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            r["description"].as_str().unwrap_or("")
        );
        println!("{:<22} {}", "", r["mode"].as_str().unwrap_or(""));
    }
}

pub fn in_doubt_table(keys: &[KeyRecord]) {
    println!("{:<22} {:<30} {:<26} FOUND", "WORKFLOW", "KEY", "RUN");
    for k in keys {
        let found = match k.found_in {
            Some(crate::store::KeyPhase::Committing) => "during commit: it may have happened",
            _ => "before commit started",
        };
        println!("{:<22} {:<30} {:<26} {found}", k.workflow, k.key, k.run_id);
    }
    println!(
        "settle each with `steward in-doubt resolve WORKFLOW KEY --committed|--not-committed`"
    );
}
