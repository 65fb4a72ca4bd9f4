//! Scheduled digest agents: the fixed 12-step lifecycle on top of the governed run.
//!
//! An agent's run is a governed run whose three steps are steward itself:
//!
//! * run (`steward agent-step run AGENT`): steps 1–10 — load conventions, load last-run
//!   state, fetch candidates, filter new, extract claims, verify load-bearing claims,
//!   build the digest input, write the digest, curate findings, mark surfaced. The vault
//!   is the agent's own working space, so this is the maker's output, not a side effect.
//! * verify (`check`): the digest exists, has its frontmatter and Sources section.
//! * commit (`email`): step 11, the one thing that leaves the machine; it runs only live.
//!
//! Step 12, the summary line, is composed from the run record when the run ends, however
//! it ended. Each step reports itself on fd 3 (`step NAME STATUS DETAIL`), so every
//! lifecycle step is its own runlog record, skipped ones included.

pub mod digest;
pub mod email;
pub mod feed;
mod lifecycle;
mod output;
pub mod seen;

pub use lifecycle::run_step;
use output::report;
pub use output::RunOutput;

use std::path::Path;

use serde_json::Value;

use crate::config::agent::Agent;
use crate::config::Config;
use crate::store::RunRecord;

/// The checker: the digest the run step reports exists and is well-formed.
pub fn check_step(ctx: &Value) -> i32 {
    let out: RunOutput = match serde_json::from_value(ctx["output"].clone()) {
        Ok(o) => o,
        Err(e) => {
            println!("fail\nthe run step's output is not a digest report: {e}");
            return 0;
        }
    };
    let text = match (&out.preview, &out.digest_file) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) => match std::fs::read_to_string(p) {
            Ok(t) => t,
            Err(e) => {
                println!("fail\ndigest {} is not readable: {e}", p.display());
                return 0;
            }
        },
        (None, None) => {
            println!("fail\nno digest was written");
            return 0;
        }
    };
    let ok = text.starts_with("---\n")
        && text.contains(&format!("agent: \"{}\"", out.agent))
        && text.contains("\n## Sources");
    if ok {
        println!("pass");
    } else {
        println!("fail\nthe digest lacks its frontmatter or its Sources section");
    }
    0
}

/// Step 11 as the commit: send the digest; prints the [`email::Delivery`] as JSON.
pub async fn email_step(cfg: &Config, agent: &Agent, state: &Path, ctx: &Value) -> i32 {
    let out: RunOutput = serde_json::from_value(ctx["output"].clone()).unwrap_or_default();
    let delivery = if let Some(err) = &out.recipients_error {
        email::Delivery {
            error: Some(err.clone()),
            ..Default::default()
        }
    } else {
        let body = out
            .digest_file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .or(out.preview.clone())
            .unwrap_or_default();
        let subject = format!("{} digest — {}", agent.name, out.date);
        let digest = email::Digest {
            agent: &agent.name,
            subject: &subject,
            markdown: &body,
        };
        let mut log =
            email::SentLog::open(state.join("agents").join(&agent.name).join("sent.jsonl"));
        email::send(
            cfg.settings.smtp.as_ref(),
            &out.recipients,
            &digest,
            &mut log,
        )
        .await
    };
    match &delivery.error {
        Some(e) => report("maybe_email", "failed", e),
        None => report(
            "maybe_email",
            "ok",
            &format!("{}/{} sent", delivery.sent, delivery.total),
        ),
    }
    println!("{}", serde_json::to_string(&delivery).unwrap_or_default());
    // The digest stands whatever happened to the mail: the run does not fail over it.
    0
}

/// Step 12: the one summary line, for any run of an agent, however it ended.
pub fn summary_line(rec: &RunRecord) -> String {
    let out: RunOutput = rec
        .output
        .clone()
        .and_then(|o| serde_json::from_value(o).ok())
        .unwrap_or_default();
    let delivery: Option<email::Delivery> = rec
        .commit_output
        .clone()
        .and_then(|o| serde_json::from_value(o).ok());
    let mut failures: Vec<String> = out
        .failures
        .iter()
        .map(|f| format!("{} {}", f.source, f.reason))
        .collect();
    let email = match (&delivery, &out.recipients_error) {
        // A dry run sends nothing by design: not a failure, whatever the list says.
        (None, _) if rec.dry_run => "email_skipped=dry-run".to_string(),
        (Some(d), _) if d.error.is_some() => {
            format!("email_failed={}", d.error.as_deref().unwrap_or(""))
        }
        (Some(d), _) => {
            failures.extend(d.failures.iter().cloned());
            match d.already_sent {
                0 => format!("emailed={}/{}", d.sent, d.total),
                n => format!(
                    "emailed={}/{} ({n} already had this digest)",
                    d.sent, d.total
                ),
            }
        }
        (None, Some(e)) => format!("email_failed={e}"),
        (None, None) => format!("email_failed=run {}", rec.state),
    };
    if !matches!(rec.state, crate::store::RunState::Success) {
        failures.push(format!("run {}: {}", rec.state, rec.reason));
    }
    let failures = if failures.is_empty() {
        "failures=0".to_string()
    } else {
        format!("failures={} ({})", failures.len(), failures.join(", "))
    };
    let written = out.written.clone().unwrap_or_else(|| {
        if out.preview.is_some() {
            "none (dry-run)".into()
        } else {
            "none".into()
        }
    });
    format!(
        "[{}] {}: polled={} sources, new_items={}, verified={}, written={}, {}, {}",
        rec.ended_at
            .unwrap_or_else(chrono::Utc::now)
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        rec.workflow,
        out.polled,
        out.new_items + out.updated_items,
        out.verified,
        written,
        email,
        failures
    )
}

/// Whether a run's commit (the email) ran; if not, step 11 is logged as skipped.
pub fn email_skipped_reason(rec: &RunRecord) -> Option<String> {
    if rec.commit_output.is_some() {
        return None;
    }
    let out: RunOutput = rec
        .output
        .clone()
        .and_then(|o| serde_json::from_value(o).ok())
        .unwrap_or_default();
    Some(match (&out.recipients_error, rec.dry_run) {
        (_, true) => "dry-run: no email".into(),
        (Some(e), false) => e.clone(),
        (None, false) => format!("run ended {}", rec.state),
    })
}
