//! Person-readable renderings of runs, workflows and keys, written into a buffer so the
//! same text can be printed locally or sent back over the control socket.

use std::fmt::Write;

use serde_json::Value;

/// `writeln!` into a String cannot fail.
macro_rules! wln {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

use crate::store::{KeyRecord, RunRecord};

pub fn run_summary(out: &mut String, r: &RunRecord) {
    let mode = if r.dry_run { "dry-run" } else { "live" };
    wln!(
        out,
        "run {} ({}, {mode}): {}",
        r.run_id,
        r.workflow,
        r.state
    );
    wln!(out, "  {}", r.reason);
    let f = &r.figures;
    wln!(
        out,
        "  tokens {} · tool_calls {} · cost_usd {} · runtime {:.1}s · attempt {}",
        f.tokens,
        f.tool_calls,
        f.cost_usd,
        f.runtime_ms as f64 / 1000.0,
        r.attempt
    );
    if r.state.dead_letters() {
        wln!(
            out,
            "  dead-lettered: `steward dead-letter show {}`",
            r.run_id
        );
    }
    if r.state == crate::store::RunState::ApprovalRequired {
        wln!(
            out,
            "  waiting for review: `steward approve {0}` or `steward reject {0}`",
            r.run_id
        );
    }
}

pub fn run_detail(out: &mut String, r: &RunRecord) {
    run_summary(out, r);
    let field = |out: &mut String, name: &str, v: String| wln!(out, "{name:>16}: {v}");
    field(out, "config sha256", r.config_hash.clone());
    field(out, "started", r.started_at.to_rfc3339());
    if let Some(end) = r.ended_at {
        field(out, "ended", end.to_rfc3339());
    }
    field(out, "committed", r.committed.to_string());
    if let Some(k) = &r.idempotency_key {
        field(out, "idempotency key", k.clone());
    }
    if let Some(b) = &r.breach {
        field(out, "breach", b.clone());
    }
    if let Some(of) = &r.retry_of {
        field(out, "retry of", of.clone());
    }
    if let Some(m) = &r.model_spend {
        field(out, "model calls", model_spend(m));
    }
    if let Some(m) = &r.misreported {
        field(out, "misreported", m.clone());
    }
    field(out, "trigger", compact(&r.trigger));
    if let Some(o) = &r.output {
        field(out, "output", compact(o));
    }
    if let Some(v) = &r.verify {
        let conf = v
            .confidence
            .as_deref()
            .map(|c| format!(" (confidence {c})"))
            .unwrap_or_default();
        field(out, "verify", format!("{}{conf}: {}", v.verdict, v.reason));
    }
    if let Some(o) = &r.commit_output {
        field(out, "commit output", compact(o));
    }
    for a in &r.attempts {
        field(
            out,
            &format!("attempt {}", a.attempt),
            format!("{}: {}", a.state, a.reason),
        );
    }
    for n in &r.notes {
        field(out, "note", n.clone());
    }
    for (step, tail) in &r.stderr {
        wln!(out, "{:>16}:", format!("{step} stderr"));
        for line in tail
            .lines()
            .rev()
            .take(10)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            wln!(out, "{:>16}  {line}", "");
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

pub fn runs_table(out: &mut String, runs: &[RunRecord]) {
    if runs.is_empty() {
        wln!(out, "no runs");
        return;
    }
    wln!(
        out,
        "{:<26} {:<22} {:<18} {:<7} {:<20} REASON",
        "RUN",
        "WORKFLOW",
        "STATE",
        "MODE",
        "STARTED"
    );
    for r in runs {
        let reason: String = r.reason.chars().take(70).collect();
        wln!(
            out,
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

pub fn workflows_table(out: &mut String, rows: &[Value]) {
    if rows.is_empty() {
        wln!(out, "no workflows (create one with `steward new NAME`)");
        return;
    }
    wln!(
        out,
        "{:<22} {:<8} {:<9} {:<5} DESCRIPTION",
        "WORKFLOW",
        "KIND",
        "TRIGGER",
        "LIVE"
    );
    for r in rows {
        wln!(
            out,
            "{:<22} {:<8} {:<9} {:<5} {}",
            r["id"].as_str().unwrap_or(""),
            r["kind"].as_str().unwrap_or("workflow"),
            r["trigger"].as_str().unwrap_or(""),
            if r["live"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            r["description"].as_str().unwrap_or("")
        );
        wln!(out, "{:<22} {}", "", r["mode"].as_str().unwrap_or(""));
        if let Some(up) = r["follows"].as_str() {
            wln!(out, "{:<22} follows {up}", "");
        }
        if let Some(f) = r["followers"].as_array().filter(|f| !f.is_empty()) {
            let names: Vec<&str> = f.iter().filter_map(Value::as_str).collect();
            wln!(out, "{:<22} followed by {}", "", names.join(", "));
        }
        if let Some(p) = r["paused"].as_object() {
            wln!(
                out,
                "{:<22} PAUSED by {} since {}: {}",
                "",
                p.get("cause").and_then(Value::as_str).unwrap_or(""),
                p.get("since").and_then(Value::as_str).unwrap_or(""),
                p.get("reason").and_then(Value::as_str).unwrap_or("")
            );
        }
        if let Some(n) = r["next_fire"].as_object() {
            wln!(
                out,
                "{:<22} next fire {} ({} UTC)",
                "",
                n.get("local").and_then(Value::as_str).unwrap_or(""),
                n.get("utc").and_then(Value::as_str).unwrap_or("")
            );
        }
    }
}

pub fn in_doubt_table(out: &mut String, keys: &[KeyRecord]) {
    wln!(out, "{:<22} {:<30} {:<26} FOUND", "WORKFLOW", "KEY", "RUN");
    for k in keys {
        let found = match k.found_in {
            Some(crate::store::KeyPhase::Committing) => "during commit: it may have happened",
            _ => "before commit started",
        };
        wln!(
            out,
            "{:<22} {:<30} {:<26} {found}",
            k.workflow,
            k.key,
            k.run_id
        );
    }
    wln!(
        out,
        "settle each with `steward in-doubt resolve WORKFLOW KEY --committed|--not-committed`"
    );
}

/// `steward status`: the daemon's own view of itself.
pub fn status(out: &mut String, s: &Value) {
    wln!(
        out,
        "steward daemon pid {} · up {} · state {}",
        s["pid"],
        s["uptime"].as_str().unwrap_or("?"),
        s["state_dir"].as_str().unwrap_or("?")
    );
    if s["forced_dry_run"].as_bool() == Some(true) {
        wln!(
            out,
            "FORCED DRY-RUN: every workflow skips its commit (SIGUSR2 lifts it)"
        );
    }
    let errors = s["config_errors"].as_array().map_or(&[][..], Vec::as_slice);
    wln!(
        out,
        "config: {} · loaded {}",
        s["config_dir"].as_str().unwrap_or("?"),
        s["config_loaded_at"].as_str().unwrap_or("?")
    );
    if !errors.is_empty() {
        wln!(
            out,
            "CONFIG EDIT NOT LOADED: {} error(s); the daemon keeps running the config above until they are fixed:",
            errors.len()
        );
        for e in errors {
            wln!(out, "  {}", e.as_str().unwrap_or(""));
        }
    }
    wln!(
        out,
        "runs in flight: {}",
        s["in_flight"].as_array().map_or(0, |a| a.len())
    );
    for r in s["in_flight"].as_array().into_iter().flatten() {
        wln!(
            out,
            "  {} {} since {}",
            r["workflow"].as_str().unwrap_or(""),
            r["run_id"].as_str().unwrap_or(""),
            r["started_at"].as_str().unwrap_or("")
        );
    }
    wln!(
        out,
        "{:<22} {:<9} {:<5} NEXT FIRE",
        "WORKFLOW",
        "TRIGGER",
        "LIVE"
    );
    for w in s["workflows"].as_array().into_iter().flatten() {
        let next = match &w["next_fire"] {
            Value::Object(n) => format!(
                "{} ({} UTC)",
                n.get("local").and_then(Value::as_str).unwrap_or(""),
                n.get("utc").and_then(Value::as_str).unwrap_or("")
            ),
            _ => "-".to_string(),
        };
        wln!(
            out,
            "{:<22} {:<9} {:<5} {next}",
            w["id"].as_str().unwrap_or(""),
            w["trigger"].as_str().unwrap_or(""),
            if w["live"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
        );
    }
    if let Some(addr) = s["gateway_listen"].as_str() {
        wln!(
            out,
            "model gateway: http://{addr} (for workflows with [gateway])"
        );
    }
    if let Some(note) = s["process_containment"].as_str() {
        wln!(out, "process containment: {note}");
    }
    if let Some(c) = s["cluster"].as_object() {
        cluster(out, c);
    }
}

/// The cluster as this daemon sees it: its name, the servers, each daemon alive.
pub fn cluster(out: &mut String, c: &serde_json::Map<String, Value>) {
    let servers: Vec<&str> = c["servers"]
        .as_array()
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    wln!(
        out,
        "cluster: this daemon is {} on {}",
        c["daemon"].as_str().unwrap_or(""),
        servers.join(", ")
    );
    if let Some(e) = c.get("error").and_then(Value::as_str) {
        wln!(out, "  cannot read the cluster: {e}");
    }
    for b in c["alive"].as_array().into_iter().flatten() {
        wln!(
            out,
            "  {:<32} {} pid {}, {} run(s) in flight, since {}, last beat {}",
            b["daemon"].as_str().unwrap_or(""),
            b["host"].as_str().unwrap_or(""),
            b["pid"],
            b["runs_in_flight"],
            b["started_at"].as_str().unwrap_or(""),
            b["at"].as_str().unwrap_or("")
        );
    }
}

/// A run's model calls through the gateway, on one line.
fn model_spend(m: &crate::store::ModelSpend) -> String {
    let mut parts = vec![
        m.calls.to_string(),
        format!(
            "{} in ({} cached)",
            m.input_tokens + m.cached_input_tokens,
            m.cached_input_tokens
        ),
        format!("{} out", m.output_tokens),
        format!("{} tool calls", m.tool_calls),
        format!("${:.6}", m.cost_usd),
    ];
    if m.unreported > 0 {
        parts.push(format!(
            "{} told no usage (charged {} reserved tokens)",
            m.unreported, m.reserved_tokens
        ));
    }
    if m.cut > 0 {
        parts.push(format!("{} stream(s) cut at the cap", m.cut));
    }
    if m.refused > 0 {
        parts.push(format!("{} refused over budget", m.refused));
    }
    parts.join(" · ")
}
