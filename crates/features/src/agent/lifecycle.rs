//! Steps 1–10 of a digest agent's run (`steward agent-step run AGENT`): load
//! conventions, load last-run state, fetch candidates, filter new, extract claims, verify
//! load-bearing claims, build the digest input, write the digest, curate findings, mark
//! surfaced. Each step reports itself on fd 3; the output is [`RunOutput`] on stdout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::digest::{self, Failure, SourceStatus};
use super::email;
use super::feed::{self, Item, Validators};
use super::output::{report, RunOutput};
use super::seen::{Novelty, Seen};
use crate::config::agent::{Agent, Source};
use crate::config::Config;
use crate::helper::HelperError;

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

/// A step failed and said so on fd 3: the run step exits 1.
struct Stopped;

/// One run of steps 1–10 and what they share.
struct Lifecycle<'a> {
    cfg: &'a Config,
    agent: &'a Agent,
    vault: PathBuf,
    base: PathBuf,
    date: String,
    /// `steward digest --dry-run`: write nothing, show the digest.
    preview: bool,
    out: RunOutput,
    /// HTTP validators by feed URL: read at the start, saved with the seen-tracker (a
    /// validator is worth keeping only once what it answered for has been surfaced).
    http: BTreeMap<String, Validators>,
}

/// `state/agents/<agent>/http.json`: each HTTP feed's ETag and Last-Modified.
fn http_file(dir: &Path) -> PathBuf {
    dir.join("http.json")
}

/// What steps 3 and 4 found.
struct Found<'a> {
    sources: Vec<&'a Source>,
    statuses: Vec<SourceStatus>,
    surfaced: Vec<(Item, Novelty)>,
}

/// Steps 1–10. Returns the process exit code; prints [`RunOutput`] as JSON.
pub async fn run_step(cfg: &Config, agent: &Agent, state: &Path, ctx: &Value) -> i32 {
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
    let mut run = Lifecycle {
        cfg,
        agent,
        vault: cfg.vault(),
        base: cfg.base(),
        out: RunOutput {
            agent: agent.name.clone(),
            date: date.clone(),
            ..Default::default()
        },
        date,
        preview: ctx["trigger"]["payload"]["preview"] == true,
        http: BTreeMap::new(),
    };
    match run.steps(state).await {
        Ok(()) => {
            println!("{}", serde_json::to_string(&run.out).unwrap_or_default());
            0
        }
        Err(Stopped) => 1,
    }
}

impl<'a> Lifecycle<'a> {
    async fn steps(&mut self, state: &Path) -> Result<(), Stopped> {
        self.load_conventions();
        let dir = agent_dir(state, &self.agent.name);
        let (mut seen, last) = self.load_last_run_state(&dir)?;
        self.http = std::fs::read_to_string(http_file(&dir))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let found = self.fetch_and_filter(&seen).await;
        self.claims(&found.surfaced).await;
        let (input, path, keep_existing) = self.build_digest_input(&found, &last);
        self.write_digest(&input, &path, keep_existing)?;
        self.curate_findings(&found.surfaced, &path);
        self.mark_surfaced(&mut seen, &found.surfaced, &dir)
    }

    /// Step 1.
    fn load_conventions(&mut self) {
        let conventions = self.vault.join("_config");
        let n = std::fs::read_dir(&conventions)
            .map(|rd| rd.count())
            .unwrap_or(0);
        let shown = display(&self.base, &conventions);
        report("load_conventions", "ok", &format!("{shown} ({n} files)"));
        match email::recipients(&self.vault) {
            Ok(r) => self.out.recipients = r,
            Err(e) => self.out.recipients_error = Some(e.to_string()),
        }
    }

    /// Step 2.
    fn load_last_run_state(&mut self, dir: &Path) -> Result<(Seen, LastRun), Stopped> {
        let seen = match Seen::load(dir) {
            Ok(s) => s,
            Err(e) => {
                report("load_last_run_state", "failed", &e.to_string());
                eprintln!("cannot read the seen-tracker: {e}");
                return Err(Stopped);
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
        Ok((seen, last))
    }

    /// Steps 3 and 4.
    async fn fetch_and_filter(&mut self, seen: &Seen) -> Found<'a> {
        let (cfg, agent) = (self.cfg, self.agent);
        let sources = agent.sources(&cfg.sources);
        let max = agent.source_filter.max_items_per_source.unwrap_or(20);
        let fetches = sources.iter().map(|s| {
            let sent = s.url.as_ref().and_then(|u| self.http.get(u));
            feed::fetch(s, &cfg.root, max, sent)
        });
        let results = futures_util::future::join_all(fetches).await;
        let mut statuses = Vec::new();
        let mut candidates: Vec<Item> = Vec::new();
        for (s, r) in sources.iter().zip(results) {
            match r {
                Ok(fetched) => {
                    let mut status = if fetched.not_modified {
                        "ok (not modified since the last poll)".to_string()
                    } else {
                        "ok".to_string()
                    };
                    if let Some(to) = &fetched.moved_to {
                        status.push_str(&format!(
                            "; moved permanently to {to}: update its url in sources.toml"
                        ));
                    }
                    statuses.push(SourceStatus {
                        name: s.name.clone(),
                        status,
                        items: fetched.items.len(),
                    });
                    if let (Some(url), Some(v)) = (&s.url, fetched.validators) {
                        self.http.insert(url.clone(), v);
                    }
                    candidates.extend(fetched.items);
                }
                Err(reason) => {
                    statuses.push(SourceStatus {
                        name: s.name.clone(),
                        status: format!("failed: {reason}"),
                        items: 0,
                    });
                    self.out.failures.push(Failure {
                        source: s.name.clone(),
                        reason: reason.to_string(),
                    });
                }
            }
        }
        self.out.polled = sources.len();
        report(
            "fetch_candidates",
            "ok",
            &format!(
                "polled {} sources, {} candidates, {} failed",
                sources.len(),
                candidates.len(),
                self.out.failures.len()
            ),
        );
        let mut surfaced: Vec<(Item, Novelty)> = Vec::new();
        for item in candidates {
            if surfaced.iter().any(|(i, _)| i.id == item.id) {
                continue; // the same item in two sources: shown once
            }
            if let Some(n) = seen.novelty(&item) {
                surfaced.push((item, n));
            }
        }
        self.out.new_items = surfaced.iter().filter(|(_, n)| *n == Novelty::New).count();
        self.out.updated_items = surfaced.len() - self.out.new_items;
        report(
            "filter_new",
            "ok",
            &format!(
                "{} new, {} updated",
                self.out.new_items, self.out.updated_items
            ),
        );
        Found {
            sources,
            statuses,
            surfaced,
        }
    }

    /// Steps 5 and 6.
    async fn claims(&mut self, surfaced: &[(Item, Novelty)]) {
        let (cfg, agent) = (self.cfg, self.agent);
        let claims = extract_claims(agent, &cfg.root, surfaced).await;
        match &claims {
            None => report(
                "extract_claims",
                "skipped",
                "no [claims] extract command for this agent",
            ),
            Some(Ok(c)) => report("extract_claims", "ok", &format!("{} claims", c.len())),
            Some(Err(e)) => {
                report("extract_claims", "failed", &e.to_string());
                self.out.failures.push(Failure {
                    source: "extract_claims".into(),
                    reason: e.to_string(),
                });
            }
        }
        if !agent.verify_loadbearing {
            report(
                "verify_loadbearing",
                "skipped",
                "verify_loadbearing = false",
            );
            return;
        }
        let list = claims
            .as_ref()
            .and_then(|c| c.as_ref().ok())
            .cloned()
            .unwrap_or_default();
        let (verified, problems) = verify_claims(agent, &cfg.root, &list).await;
        self.out.verified = verified;
        report(
            "verify_loadbearing",
            "ok",
            &format!("{verified} verified, {} not", problems.len()),
        );
        self.out.failures.extend(problems);
    }

    /// Step 7: the template's input, where the digest goes, and whether today's stays.
    fn build_digest_input(&self, found: &Found<'_>, last: &LastRun) -> (Value, PathBuf, bool) {
        let (agent, out, date) = (self.agent, &self.out, &self.date);
        let Found {
            sources,
            statuses,
            surfaced,
        } = found;
        let mut groups: Vec<Value> = Vec::new();
        for s in sources {
            let items: Vec<Value> = surfaced
                .iter()
                .filter(|(i, _)| i.source == s.name)
                .map(|(i, n)| item_json(i, *n))
                .collect();
            if !items.is_empty() {
                groups.push(json!({ "source": s.name, "items": items }));
            }
        }
        let mut path = digest::path_for(&self.vault, agent.cadence.name(), date, &agent.name);
        // A second run on the same date: with nothing new, today's digest already says it
        // all; with new items, they get a digest of their own beside it (nothing is
        // overwritten).
        let mut keep_existing = false;
        if path.exists() && !self.preview {
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
            .filter(|p| *p != display(&self.base, &path));
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
        (input, path, keep_existing)
    }

    /// Step 8.
    fn write_digest(
        &mut self,
        input: &Value,
        path: &Path,
        keep_existing: bool,
    ) -> Result<(), Stopped> {
        let custom = match &self.agent.overrides.template {
            Some(t) => match std::fs::read_to_string(self.cfg.root.join(t)) {
                Ok(text) => Some(text),
                Err(e) => {
                    report("write_digest", "failed", &format!("override template: {e}"));
                    return Err(Stopped);
                }
            },
            None => None,
        };
        let text = match digest::render(input, custom.as_deref()) {
            Ok(t) => t,
            Err(e) => {
                report("write_digest", "failed", &e.to_string());
                eprintln!("{e}");
                return Err(Stopped);
            }
        };
        let shown = display(&self.base, path);
        if self.preview {
            report("write_digest", "skipped", "dry-run: nothing written");
            self.out.preview = Some(text);
            return Ok(());
        }
        if keep_existing {
            report(
                "write_digest",
                "ok",
                &format!("nothing new: kept today's {shown}"),
            );
        } else {
            if let Err(e) = digest::write_atomic(path, &text) {
                report("write_digest", "failed", &e.to_string());
                eprintln!("cannot write {}: {e}", path.display());
                return Err(Stopped);
            }
            report("write_digest", "ok", &shown);
        }
        self.out.written = Some(shown);
        self.out.digest_file = Some(path.to_path_buf());
        Ok(())
    }

    /// Step 9.
    fn curate_findings(&self, surfaced: &[(Item, Novelty)], path: &Path) {
        let agent = self.agent;
        if !agent.curate_findings {
            report("curate_findings", "skipped", "curate_findings = false");
            return;
        }
        if self.preview {
            report("curate_findings", "skipped", "dry-run: nothing written");
            return;
        }
        let inbox = self.vault.join("_inbox").join(&agent.name);
        let mut staged = 0;
        for (i, (item, n)) in surfaced.iter().enumerate() {
            let note = format!(
                "---\nsource: {}\nagent: {}\nnovelty: {}\nlink: {}\ndigest: {}\n---\n# {}\n\n{}\n",
                serde_json::to_string(&item.source).unwrap_or_default(),
                serde_json::to_string(&agent.name).unwrap_or_default(),
                if *n == Novelty::New { "new" } else { "updated" },
                serde_json::to_string(&item.link).unwrap_or_default(),
                serde_json::to_string(&display(&self.base, path)).unwrap_or_default(),
                item.title,
                item.summary
            );
            let file = inbox.join(format!("{}-{:03}.md", self.date, i + 1));
            if digest::write_atomic(&file, &note).is_ok() {
                staged += 1;
            }
        }
        report(
            "curate_findings",
            "ok",
            &format!(
                "{staged} findings staged in {}",
                display(&self.base, &inbox)
            ),
        );
    }

    /// Step 10.
    fn mark_surfaced(
        &self,
        seen: &mut Seen,
        surfaced: &[(Item, Novelty)],
        dir: &Path,
    ) -> Result<(), Stopped> {
        if self.preview {
            report(
                "mark_surfaced",
                "skipped",
                "dry-run: seen-tracker unchanged",
            );
            return Ok(());
        }
        let items: Vec<&Item> = surfaced.iter().map(|(i, _)| i).collect();
        if let Err(e) = seen.mark_surfaced(&items) {
            report("mark_surfaced", "failed", &e.to_string());
            return Err(Stopped);
        }
        let state_json = LastRun {
            last_run_at: Some(
                chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ),
            last_digest_path: self.out.written.clone(),
        };
        let _ = digest::write_atomic(
            &dir.join("state.json"),
            &serde_json::to_string_pretty(&state_json).unwrap_or_default(),
        );
        let _ = digest::write_atomic(
            &http_file(dir),
            &serde_json::to_string_pretty(&self.http).unwrap_or_default(),
        );
        report(
            "mark_surfaced",
            "ok",
            &format!(
                "{} items marked in {}",
                items.len(),
                display(&self.base, &dir.join("seen.jsonl"))
            ),
        );
        Ok(())
    }
}

fn item_json(i: &Item, n: Novelty) -> Value {
    json!({ "title": i.title, "link": i.link, "summary": i.summary, "source": i.source, "published": i.published, "flags": i.flags, "novelty": n })
}

type ClaimList = Vec<Value>;

async fn extract_claims(
    agent: &Agent,
    cwd: &Path,
    items: &[(Item, Novelty)],
) -> Option<Result<ClaimList, ClaimsError>> {
    let cmd = agent.claims.extract.as_ref()?;
    let input =
        serde_json::to_vec(&items.iter().map(|(i, _)| i).collect::<Vec<_>>()).unwrap_or_default();
    Some(match run_json(cmd, cwd, &input).await {
        Ok((0, stdout)) => {
            serde_json::from_slice::<ClaimList>(&stdout).map_err(ClaimsError::NotAList)
        }
        Ok((code, _)) => Err(ClaimsError::Exited(code)),
        Err(e) => Err(ClaimsError::Helper(e)),
    })
}

/// Why an agent's claim extraction gave no claims.
#[derive(Debug, thiserror::Error)]
enum ClaimsError {
    #[error("claims are not a JSON list: {0}")]
    NotAList(serde_json::Error),
    #[error("extract command exited {0}")]
    Exited(i32),
    #[error(transparent)]
    Helper(#[from] HelperError),
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

async fn run_json(
    argv: &[String],
    cwd: &Path,
    input: &[u8],
) -> Result<(i32, Vec<u8>), HelperError> {
    let out = crate::helper::run(argv, cwd, Some(input), CLAIM_TIMEOUT).await?;
    Ok((out.code, out.stdout))
}
