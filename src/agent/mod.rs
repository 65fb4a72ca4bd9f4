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
pub mod seen;

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::agent::Agent;
use crate::config::Config;
use crate::store::RunRecord;
use digest::{Failure, SourceStatus};
use feed::Item;
use seen::{Novelty, Seen};

/// What the run step hands to check and email (its stdout).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunOutput {
    pub agent: String,
    pub date: String,
    /// Shown in the summary: relative to the folder holding `config/`.
    pub written: Option<String>,
    pub digest_file: Option<PathBuf>,
    pub polled: usize,
    pub new_items: usize,
    pub updated_items: usize,
    pub verified: usize,
    pub failures: Vec<Failure>,
    pub recipients: Vec<String>,
    pub recipients_error: Option<String>,
    /// `steward digest --dry-run`: nothing was written; the digest is here instead.
    pub preview: Option<String>,
}

/// Reports one lifecycle step on the control channel.
fn report(step: &str, status: &str, detail: &str) {
    let line = format!("step {step} {status} {}\n", detail.replace('\n', " "));
    // fd 3 is the control channel when steward runs us; a hand run has none.
    let channel = std::env::var("STEWARD_CONTROL_FD")
        .ok()
        .filter(|fd| fd == "3")
        .and_then(|_| {
            std::fs::OpenOptions::new()
                .append(true)
                .open("/dev/fd/3")
                .ok()
        });
    match channel {
        Some(mut f) => {
            let _ = f.write_all(line.as_bytes());
        }
        None => eprint!("{line}"),
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LastRun {
    last_run_at: Option<String>,
    last_digest_path: Option<String>,
}

fn agent_dir(state: &Path, agent: &str) -> PathBuf {
    state.join("agents").join(agent)
}

fn display(base: &Path, p: &Path) -> String {
    p.strip_prefix(base)
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

/// Steps 1–10. Returns the process exit code; prints [`RunOutput`] as JSON.
pub async fn run_step(cfg: &Config, agent: &Agent, state: &Path, ctx: &Value) -> i32 {
    let preview = ctx["trigger"]["payload"]["preview"] == true;
    let vault = cfg.vault();
    let base = cfg.base();
    let tz: chrono_tz::Tz = agent
        .timezone
        .as_deref()
        .and_then(|t| t.parse().ok())
        .unwrap_or(chrono_tz::UTC);
    // The date of the slot for a scheduled (or catch-up) run, else of now.
    let when = ctx["trigger"]["scheduled_for"]
        .as_str()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&chrono::Utc))
        .unwrap_or_else(chrono::Utc::now);
    let date = when.with_timezone(&tz).format("%Y-%m-%d").to_string();
    let mut out = RunOutput {
        agent: agent.name.clone(),
        date: date.clone(),
        ..Default::default()
    };

    // 1. load conventions
    let conventions = vault.join("_config");
    let n = std::fs::read_dir(&conventions)
        .map(|rd| rd.count())
        .unwrap_or(0);
    report(
        "load_conventions",
        "ok",
        &format!("{} ({n} files)", display(&base, &conventions)),
    );
    match email::recipients(&vault) {
        Ok(r) => out.recipients = r,
        Err(e) => out.recipients_error = Some(e),
    }

    // 2. load last-run state
    let dir = agent_dir(state, &agent.name);
    let mut seen = match Seen::load(&dir) {
        Ok(s) => s,
        Err(e) => {
            report("load_last_run_state", "failed", &e.to_string());
            eprintln!("cannot read the seen-tracker: {e}");
            return 1;
        }
    };
    let last: LastRun = std::fs::read(dir.join("state.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    report(
        "load_last_run_state",
        "ok",
        &format!(
            "{} seen items, last run {}{}",
            seen.len(),
            last.last_run_at.as_deref().unwrap_or("never"),
            if seen.bad_lines > 0 {
                format!(", {} unreadable seen lines skipped", seen.bad_lines)
            } else {
                String::new()
            }
        ),
    );

    // 3. fetch candidates
    let sources = agent.sources(&cfg.sources);
    let max = agent.source_filter.max_items_per_source.unwrap_or(20);
    let fetches = sources.iter().map(|s| feed::fetch(s, &cfg.root, max));
    let results = futures_util::future::join_all(fetches).await;
    let mut statuses = Vec::new();
    let mut candidates: Vec<Item> = Vec::new();
    for (s, r) in sources.iter().zip(results) {
        match r {
            Ok(items) => {
                statuses.push(SourceStatus {
                    name: s.name.clone(),
                    status: "ok".into(),
                    items: items.len(),
                });
                candidates.extend(items);
            }
            Err(reason) => {
                statuses.push(SourceStatus {
                    name: s.name.clone(),
                    status: format!("failed: {reason}"),
                    items: 0,
                });
                out.failures.push(Failure {
                    source: s.name.clone(),
                    reason,
                });
            }
        }
    }
    out.polled = sources.len();
    report(
        "fetch_candidates",
        "ok",
        &format!(
            "polled {} sources, {} candidates, {} failed",
            sources.len(),
            candidates.len(),
            out.failures.len()
        ),
    );

    // 4. filter new
    let mut surfaced: Vec<(Item, Novelty)> = Vec::new();
    for item in candidates {
        if surfaced.iter().any(|(i, _)| i.id == item.id) {
            continue; // the same item in two sources: shown once
        }
        if let Some(n) = seen.novelty(&item) {
            surfaced.push((item, n));
        }
    }
    out.new_items = surfaced.iter().filter(|(_, n)| *n == Novelty::New).count();
    out.updated_items = surfaced.len() - out.new_items;
    report(
        "filter_new",
        "ok",
        &format!("{} new, {} updated", out.new_items, out.updated_items),
    );

    // 5 and 6. claims
    let claims = extract_claims(agent, &cfg.root, &surfaced).await;
    match &claims {
        None => report(
            "extract_claims",
            "skipped",
            "no [claims] extract command for this agent",
        ),
        Some(Ok(c)) => report("extract_claims", "ok", &format!("{} claims", c.len())),
        Some(Err(e)) => {
            report("extract_claims", "failed", e);
            out.failures.push(Failure {
                source: "extract_claims".into(),
                reason: e.clone(),
            });
        }
    }
    if agent.verify_loadbearing {
        let list = claims
            .as_ref()
            .and_then(|c| c.as_ref().ok())
            .cloned()
            .unwrap_or_default();
        let (verified, problems) = verify_claims(agent, &cfg.root, &list).await;
        out.verified = verified;
        report(
            "verify_loadbearing",
            "ok",
            &format!("{verified} verified, {} not", problems.len()),
        );
        out.failures.extend(problems);
    } else {
        report(
            "verify_loadbearing",
            "skipped",
            "verify_loadbearing = false",
        );
    }

    // 7. build the digest input
    let mut groups: Vec<Value> = Vec::new();
    for s in &sources {
        let items: Vec<Value> = surfaced
            .iter()
            .filter(|(i, _)| i.source == s.name)
            .map(|(i, n)| item_json(i, *n))
            .collect();
        if !items.is_empty() {
            groups.push(json!({ "source": s.name, "items": items }));
        }
    }
    let mut path = digest::path_for(&vault, agent.cadence.name(), &date, &agent.name);
    // A second run on the same date: with nothing new, today's digest already says it all;
    // with new items, they get a digest of their own beside it (nothing is overwritten).
    let mut keep_existing = false;
    if path.exists() && !preview {
        if surfaced.is_empty() {
            keep_existing = true;
        } else {
            let mut n = 2;
            while path.exists() {
                path = path.with_file_name(format!("{date}-{}-{n}.md", agent.name));
                n += 1;
            }
        }
    }
    let previous = last
        .last_digest_path
        .clone()
        .filter(|p| *p != display(&base, &path));
    let input = json!({
        "agent": agent.name,
        "cadence": agent.cadence.name(),
        "date": date,
        "since": last.last_run_at,
        "previous_digest": previous,
        "counts": { "new": out.new_items, "updated": out.updated_items, "polled": out.polled, "failed": out.failures.iter().filter(|f| sources.iter().any(|s| s.name == f.source)).count() },
        "items": surfaced.iter().map(|(i, n)| item_json(i, *n)).collect::<Vec<_>>(),
        "groups": groups,
        "sources": statuses,
        "failures": out.failures,
        "why_you_care_extra": agent.overrides.why_you_care_extra,
    });
    report(
        "build_digest_input",
        "ok",
        &format!("{} items in {} groups", surfaced.len(), groups.len()),
    );

    // 8. write the digest
    let custom = match &agent.overrides.template {
        Some(t) => match std::fs::read_to_string(cfg.root.join(t)) {
            Ok(text) => Some(text),
            Err(e) => {
                report("write_digest", "failed", &format!("override template: {e}"));
                return 1;
            }
        },
        None => None,
    };
    let text = match digest::render(&input, custom.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            report("write_digest", "failed", &e);
            eprintln!("{e}");
            return 1;
        }
    };
    if preview {
        report("write_digest", "skipped", "dry-run: nothing written");
        out.preview = Some(text);
    } else if keep_existing {
        out.written = Some(display(&base, &path));
        out.digest_file = Some(path.clone());
        report(
            "write_digest",
            "ok",
            &format!("nothing new: kept today's {}", display(&base, &path)),
        );
    } else {
        if let Err(e) = digest::write_atomic(&path, &text) {
            report("write_digest", "failed", &e.to_string());
            eprintln!("cannot write {}: {e}", path.display());
            return 1;
        }
        out.written = Some(display(&base, &path));
        out.digest_file = Some(path.clone());
        report("write_digest", "ok", &display(&base, &path));
    }

    // 9. curate findings
    if !agent.curate_findings {
        report("curate_findings", "skipped", "curate_findings = false");
    } else if preview {
        report("curate_findings", "skipped", "dry-run: nothing written");
    } else {
        let inbox = vault.join("_inbox").join(&agent.name);
        let mut staged = 0;
        for (i, (item, n)) in surfaced.iter().enumerate() {
            let note = format!(
                "---\nsource: {}\nagent: {}\nnovelty: {}\nlink: {}\ndigest: {}\n---\n# {}\n\n{}\n",
                serde_json::to_string(&item.source).unwrap_or_default(),
                serde_json::to_string(&agent.name).unwrap_or_default(),
                if *n == Novelty::New { "new" } else { "updated" },
                serde_json::to_string(&item.link).unwrap_or_default(),
                serde_json::to_string(&display(&base, &path)).unwrap_or_default(),
                item.title,
                item.summary
            );
            if digest::write_atomic(&inbox.join(format!("{date}-{:03}.md", i + 1)), &note).is_ok() {
                staged += 1;
            }
        }
        report(
            "curate_findings",
            "ok",
            &format!("{staged} findings staged in {}", display(&base, &inbox)),
        );
    }

    // 10. mark surfaced
    if preview {
        report(
            "mark_surfaced",
            "skipped",
            "dry-run: seen-tracker unchanged",
        );
    } else {
        let items: Vec<&Item> = surfaced.iter().map(|(i, _)| i).collect();
        if let Err(e) = seen.mark_surfaced(&items) {
            report("mark_surfaced", "failed", &e.to_string());
            return 1;
        }
        let state_json = LastRun {
            last_run_at: Some(
                chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ),
            last_digest_path: out.written.clone(),
        };
        let _ = digest::write_atomic(
            &dir.join("state.json"),
            &serde_json::to_string_pretty(&state_json).unwrap_or_default(),
        );
        report(
            "mark_surfaced",
            "ok",
            &format!(
                "{} items marked in {}",
                items.len(),
                display(&base, &dir.join("seen.jsonl"))
            ),
        );
    }
    println!("{}", serde_json::to_string(&out).unwrap_or_default());
    0
}

fn item_json(i: &Item, n: Novelty) -> Value {
    json!({ "title": i.title, "link": i.link, "summary": i.summary, "source": i.source, "published": i.published, "flags": i.flags, "novelty": n })
}

type ClaimList = Vec<Value>;

async fn extract_claims(
    agent: &Agent,
    cwd: &Path,
    items: &[(Item, Novelty)],
) -> Option<Result<ClaimList, String>> {
    let cmd = agent.claims.extract.as_ref()?;
    let input =
        serde_json::to_vec(&items.iter().map(|(i, _)| i).collect::<Vec<_>>()).unwrap_or_default();
    Some(match run_json(cmd, cwd, &input).await {
        Ok((0, stdout)) => serde_json::from_slice::<ClaimList>(&stdout)
            .map_err(|e| format!("claims are not a JSON list: {e}")),
        Ok((code, _)) => Err(format!("extract command exited {code}")),
        Err(e) => Err(e),
    })
}

async fn verify_claims(agent: &Agent, cwd: &Path, claims: &[Value]) -> (usize, Vec<Failure>) {
    let Some(cmd) = &agent.claims.verify else {
        return (0, Vec::new());
    };
    let mut verified = 0;
    let mut problems = Vec::new();
    for c in claims.iter().filter(|c| c["loadbearing"] == true) {
        let what = c["claim"]
            .as_str()
            .unwrap_or("(claim)")
            .chars()
            .take(60)
            .collect::<String>();
        match run_json(cmd, cwd, &serde_json::to_vec(c).unwrap_or_default()).await {
            Ok((0, _)) => verified += 1,
            Ok((1, _)) => problems.push(Failure {
                source: "verify_loadbearing".into(),
                reason: format!("refuted: {what}"),
            }),
            Ok(_) | Err(_) => problems.push(Failure {
                source: "verify_loadbearing".into(),
                reason: format!("inconclusive: {what}"),
            }),
        }
    }
    (verified, problems)
}

/// Claim commands get five minutes each.
const CLAIM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

async fn run_json(argv: &[String], cwd: &Path, input: &[u8]) -> Result<(i32, Vec<u8>), String> {
    let out = crate::helper::run(argv, cwd, Some(input), CLAIM_TIMEOUT).await?;
    Ok((out.code, out.stdout))
}

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
pub async fn email_step(cfg: &Config, agent: &Agent, ctx: &Value) -> i32 {
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
        email::send(cfg.settings.smtp.as_ref(), &out.recipients, &subject, &body).await
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
        (Some(d), _) if d.error.is_some() => {
            format!("email_failed={}", d.error.as_deref().unwrap_or(""))
        }
        (Some(d), _) => {
            failures.extend(d.failures.iter().cloned());
            format!("emailed={}/{}", d.sent, d.total)
        }
        (None, Some(e)) => format!("email_failed={e}"),
        (None, None) if rec.dry_run && rec.state == crate::store::RunState::Success => {
            "email_failed=dry-run (not approved for go-live)".to_string()
        }
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
        (Some(e), _) => e.clone(),
        (None, true) => "dry-run: no email".into(),
        (None, false) => format!("run ended {}", rec.state),
    })
}
