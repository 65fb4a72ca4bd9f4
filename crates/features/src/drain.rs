//! Queue markers for missed scheduled runs, and the drain that works them off.
//!
//! A marker is `VAULT/_inbox/scheduled-jobs/YYYY-MM-DD-<job>.md` whose frontmatter says
//! `status: queued` (and, when steward wrote it, the exact `scheduled_for` slot). The
//! drain groups markers by job, runs the newest one still inside its job's expiry window,
//! then deletes it and every older marker of that job; expired markers are deleted
//! without running. A marker whose frontmatter cannot be read is reported and left in
//! place — never deleted silently — and so is one for a job steward does not know.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};

pub fn marker_dir(vault: &Path) -> PathBuf {
    vault.join("_inbox").join("scheduled-jobs")
}

#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub path: PathBuf,
    pub job: String,
    pub date: NaiveDate,
    /// The slot it stands for; the file's date at midnight UTC when not given.
    pub scheduled_for: DateTime<Utc>,
}

/// Writes a queued marker for `job`'s missed slot (`date` in the job's own time zone).
pub fn write_marker(
    dir: &Path,
    job: &str,
    date: NaiveDate,
    slot: DateTime<Utc>,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}-{job}.md", date.format("%Y-%m-%d")));
    let text = format!(
        "---\nstatus: queued\njob: {job}\nscheduled_for: {}\nwritten_by: steward\n---\nMissed while steward was down; the drain runs it at start-up.\n",
        slot.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    let tmp = dir.join(format!(".{}-{job}.md.tmp", date.format("%Y-%m-%d")));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Why a marker file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BadMarker {
    #[error("file name is not UTF-8")]
    NameNotUtf8,
    #[error("not a .md file")]
    NotMarkdown,
    #[error("name is not YYYY-MM-DD-<job>.md")]
    BadName,
    #[error("`{0}` is not a date")]
    BadDate(String),
    #[error("cannot read: {0}")]
    Unreadable(std::io::Error),
    #[error("larger than 64 KiB: not a marker")]
    TooLarge,
    #[error("no frontmatter (the file must start with a `---` line)")]
    NoFrontmatter,
    #[error("frontmatter line `{0}` is not `key: value`")]
    BadLine(String),
    #[error("frontmatter is not closed by a `---` line")]
    Unclosed,
    #[error("frontmatter has no `status`")]
    NoStatus,
    #[error("scheduled_for `{0}` is not an RFC 3339 time")]
    BadScheduledFor(String),
    #[error("bad date")]
    DateOutOfRange,
    #[error("job `{0}` is not a valid name")]
    BadJob(String),
}

/// Reads every marker in `dir`: the queued ones, and the ones that could not be read
/// (with why). Markers with another status are not ours to touch and are skipped.
pub fn scan(dir: &Path) -> (Vec<Marker>, Vec<(PathBuf, BadMarker)>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (good, bad);
    };
    let mut paths: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    paths.sort();
    for path in paths {
        match parse(&path) {
            Ok(Some(m)) => good.push(m),
            Ok(None) => {}
            Err(why) => bad.push((path, why)),
        }
    }
    (good, bad)
}

/// One marker file: Ok(None) when its status is not `queued`.
pub fn parse(path: &Path) -> Result<Option<Marker>, BadMarker> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or(BadMarker::NameNotUtf8)?;
    let (date, job) = parse_name(name)?;
    let meta = std::fs::metadata(path).map_err(BadMarker::Unreadable)?;
    if meta.len() > 64 << 10 {
        return Err(BadMarker::TooLarge);
    }
    let text = std::fs::read_to_string(path).map_err(BadMarker::Unreadable)?;
    parse_text(path, date, job, &text)
}

/// A marker's file name: its date and job (`YYYY-MM-DD-<job>.md`).
pub fn parse_name(name: &str) -> Result<(NaiveDate, &str), BadMarker> {
    let stem = name.strip_suffix(".md").ok_or(BadMarker::NotMarkdown)?;
    let (date, job) = match (stem.get(..10), stem.get(10..11), stem.get(11..)) {
        (Some(d), Some("-"), Some(j)) if !j.is_empty() => (d, j),
        _ => return Err(BadMarker::BadName),
    };
    let date = NaiveDate::parse_from_str(date, "%Y-%m-%d")
        .map_err(|_| BadMarker::BadDate(date.to_string()))?;
    Ok((date, job))
}

/// A marker's contents, given what its name said. Never panics, whatever the text
/// (a fuzz target holds it to that).
pub fn parse_text(
    path: &Path,
    date: NaiveDate,
    job: &str,
    text: &str,
) -> Result<Option<Marker>, BadMarker> {
    let fields = frontmatter(text)?;
    let status = fields.get("status").ok_or(BadMarker::NoStatus)?;
    if status != "queued" {
        return Ok(None);
    }
    let scheduled_for = match fields.get("scheduled_for") {
        Some(s) => DateTime::parse_from_rfc3339(s)
            .map_err(|_| BadMarker::BadScheduledFor(s.clone()))?
            .with_timezone(&Utc),
        None => date
            .and_hms_opt(0, 0, 0)
            .map(|t| t.and_utc())
            .ok_or(BadMarker::DateOutOfRange)?,
    };
    let job = fields
        .get("job")
        .cloned()
        .unwrap_or_else(|| job.to_string());
    if !crate::config::valid_id(&job) {
        return Err(BadMarker::BadJob(job));
    }
    Ok(Some(Marker {
        path: path.to_path_buf(),
        job,
        date,
        scheduled_for,
    }))
}

/// `key: value` lines between the leading `---` fences.
fn frontmatter(text: &str) -> Result<BTreeMap<String, String>, BadMarker> {
    let mut lines = text.lines();
    if lines.next().map(str::trim) != Some("---") {
        return Err(BadMarker::NoFrontmatter);
    }
    let mut fields = BTreeMap::new();
    for line in lines {
        let line = line.trim_end();
        if line.trim() == "---" {
            return Ok(fields);
        }
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| BadMarker::BadLine(line.to_string()))?;
        fields.insert(
            k.trim().to_string(),
            v.trim().trim_matches('"').trim_matches('\'').to_string(),
        );
    }
    Err(BadMarker::Unclosed)
}

/// Each known job's expiry window: a schedule's catch-up window (an agent's is its
/// cadence's expiry), or an unscheduled agent's expiry.
pub fn windows(config: &crate::config::Config, now: DateTime<Utc>) -> BTreeMap<String, Duration> {
    let mut w: BTreeMap<String, Duration> = config
        .workflows
        .values()
        .filter_map(|wf| wf.schedule().map(|s| (wf.id.clone(), s.window(now))))
        .collect();
    for a in config.agents.values() {
        w.entry(a.name.clone())
            .or_insert(Duration::from_secs(a.expiry_days * 86_400));
    }
    w
}

/// What the drain will do.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// The newest unexpired marker of each job: run it, then delete it and `older`.
    pub run: Vec<(Marker, Vec<PathBuf>)>,
    /// Expired markers of jobs with nothing to run: delete without running.
    pub expired: Vec<PathBuf>,
    /// Markers left in place, with why (unknown job, unreadable).
    pub left: Vec<(PathBuf, String)>,
}

/// Plans the drain. `expiry` gives a job's window, or None for a job steward does not know.
pub fn plan(
    markers: Vec<Marker>,
    expiry: impl Fn(&str) -> Option<Duration>,
    now: DateTime<Utc>,
) -> Plan {
    let mut by_job: BTreeMap<String, Vec<Marker>> = BTreeMap::new();
    for m in markers {
        by_job.entry(m.job.clone()).or_default().push(m);
    }
    let mut plan = Plan::default();
    for (job, mut ms) in by_job {
        let Some(window) = expiry(&job) else {
            for m in ms {
                plan.left
                    .push((m.path, format!("no scheduled job named `{job}`")));
            }
            continue;
        };
        ms.sort_by_key(|m| (m.scheduled_for, m.path.clone()));
        let fresh = |m: &Marker| {
            (now - m.scheduled_for)
                .to_std()
                .map_or(true, |age| age <= window)
        };
        match ms.iter().rposition(fresh) {
            Some(i) => {
                let newest = ms[i].clone();
                let older: Vec<PathBuf> = ms
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, m)| m.path.clone())
                    .collect();
                plan.run.push((newest, older));
            }
            None => plan.expired.extend(ms.into_iter().map(|m| m.path)),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn newest_fresh_marker_runs_older_go_expired_are_deleted_bad_are_left() {
        let dir = tempfile::tempdir().unwrap();
        let d = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        write_marker(
            dir.path(),
            "daily",
            d("2026-06-18"),
            utc("2026-06-18T07:00:00Z"),
        )
        .unwrap();
        write_marker(
            dir.path(),
            "daily",
            d("2026-06-19"),
            utc("2026-06-19T07:00:00Z"),
        )
        .unwrap();
        write_marker(
            dir.path(),
            "stale",
            d("2026-05-01"),
            utc("2026-05-01T07:00:00Z"),
        )
        .unwrap();
        write_marker(
            dir.path(),
            "ghost",
            d("2026-06-19"),
            utc("2026-06-19T07:00:00Z"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("2026-06-19-broken.md"),
            "no frontmatter here",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("2026-06-19-done.md"),
            "---\nstatus: done\n---\n",
        )
        .unwrap();
        let (markers, bad) = scan(dir.path());
        assert_eq!(bad.len(), 1);
        assert!(bad[0].1.to_string().contains("frontmatter"), "{}", bad[0].1);
        let window = |job: &str| match job {
            "daily" | "stale" => Some(Duration::from_secs(2 * 86_400)),
            _ => None,
        };
        let p = plan(markers, window, utc("2026-06-20T08:00:00Z"));
        assert_eq!(p.run.len(), 1);
        assert_eq!(p.run[0].0.scheduled_for, utc("2026-06-19T07:00:00Z"));
        assert_eq!(p.run[0].1, vec![dir.path().join("2026-06-18-daily.md")]);
        assert_eq!(p.expired, vec![dir.path().join("2026-05-01-stale.md")]);
        assert_eq!(p.left.len(), 1, "unknown job left in place");
    }
}
