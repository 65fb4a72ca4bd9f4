//! `steward next WORKFLOW` and `steward calendar 'EXPR'`: when a schedule fires, the way
//! `systemd-analyze calendar --iterations=N` shows it — each fire with its UTC offset, and
//! a mark on fires a daylight-saving change shaped. Both read only the config on disk and
//! the clock, so they need no daemon and never touch the state folder.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use chrono::{DateTime, Utc};

use crate::calendar::{Calendar, Fire, Kind};
use crate::config::{self, ScheduleTrigger, Trigger};
use crate::schedule::{parse_zone, Schedule};

/// What to preview: how many fires, after when, and in which form.
pub struct Preview {
    pub count: usize,
    pub from: Option<String>,
    pub json: bool,
}

impl From<super::args::PreviewArgs> for Preview {
    fn from(a: super::args::PreviewArgs) -> Preview {
        Preview {
            count: a.count,
            from: a.from,
            json: a.json,
        }
    }
}

impl Preview {
    fn start(&self) -> Result<DateTime<Utc>> {
        match &self.from {
            None => Ok(Utc::now()),
            Some(text) => DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| {
                    anyhow!("--from `{text}` is not an RFC 3339 time ({e}); e.g. 2027-10-31T02:45:00+02:00")
                }),
        }
    }
}

/// `steward calendar 'EXPR' [--tz ZONE]`.
pub fn expression(expr: &str, tz: Option<&str>, preview: &Preview) -> Result<i32> {
    let zone = parse_zone(tz.unwrap_or("UTC")).map_err(|e| anyhow!("--tz: {e}"))?;
    let calendar = Calendar::parse(expr, zone).map_err(|e| anyhow!("{e}"))?;
    show(expr, &calendar, std::time::Duration::ZERO, preview)
}

/// `steward next WORKFLOW`: a workflow's (or a digest agent's, or an agency's) schedule,
/// from the config folder as it is on disk now.
pub fn workflow(config_dir: &Path, id: &str, preview: &Preview) -> Result<i32> {
    let cfg = crate::service::load_config(config_dir)?;
    let spec = schedule_of(&cfg, id)?;
    let schedule = Schedule::parse(spec)
        .map_err(|e| anyhow!("{id}: {e}"))?
        .for_workflow(id);
    show(&spec.cron, &schedule.calendar, schedule.delay, preview)
}

fn schedule_of<'a>(cfg: &'a config::Config, id: &str) -> Result<&'a ScheduleTrigger> {
    if let Some(wf) = cfg.workflows.get(id) {
        return match &wf.trigger {
            Trigger::Schedule(s) => Ok(s),
            other => bail!(
                "workflow `{id}` has no schedule: its trigger is `{}` ({})",
                other.kind(),
                wf.file.display()
            ),
        };
    }
    if let Some(agency) = cfg.agencies.get(id) {
        return agency.trigger.schedule.as_ref().ok_or_else(|| {
            anyhow!("agency `{id}` has no `[trigger] schedule`: its cases advance only by hand")
        });
    }
    let known: Vec<&str> = schedules(cfg).into_iter().map(|(id, _)| id).collect();
    bail!(
        "no workflow, agent or agency named `{id}` in {} (scheduled: {})",
        cfg.root.display(),
        crate::config::list_or_none(&known)
    )
}

/// Every schedule of the config: workflows (digest agents among them) and agencies.
pub fn schedules(cfg: &config::Config) -> Vec<(&str, &ScheduleTrigger)> {
    let workflows = cfg.workflows.values().filter_map(|w| match &w.trigger {
        Trigger::Schedule(s) => Some((w.id.as_str(), s)),
        _ => None,
    });
    let agencies = cfg
        .agencies
        .values()
        .filter_map(|a| Some((a.id.as_str(), a.trigger.schedule.as_ref()?)));
    workflows.chain(agencies).collect()
}

/// `heartbeat: next 2026-12-03T14:50:10+00:00 (`*/10 * * * * *` in UTC)`.
pub fn next_line(id: &str, spec: &ScheduleTrigger) -> String {
    let zone = spec.timezone.as_deref().unwrap_or("UTC");
    let next = Schedule::parse(spec).ok().and_then(|s| {
        let s = s.for_workflow(id);
        Some(
            s.calendar
                .local_rfc3339(s.fire_at(s.next_after(Utc::now())?)),
        )
    });
    match next {
        Some(next) => format!("{id}: next {next} (`{}` in {zone})", spec.cron),
        None => format!("{id}: never fires (`{}` in {zone})", spec.cron),
    }
}

/// More fires than anyone reads, and a bound on the work one command does.
const MAX_COUNT: usize = 100_000;

/// The fires after the preview's start; each is `delay` (a workflow's jitter) after its slot.
fn show(
    expr: &str,
    calendar: &Calendar,
    delay: std::time::Duration,
    preview: &Preview,
) -> Result<i32> {
    if preview.count > MAX_COUNT {
        bail!("--count {} is more than {MAX_COUNT}", preview.count);
    }
    let start = preview.start()?;
    let fires: Vec<Fire> = calendar
        .fires(start, preview.count)
        .into_iter()
        .map(|f| Fire {
            at: f.at + delay,
            ..f
        })
        .collect();
    if preview.json {
        let fires: Vec<String> = fires.iter().map(|f| calendar.local_rfc3339(f.at)).collect();
        super::output::print_out(&format!("{}\n", serde_json::json!({ "fires": fires })));
        return Ok(0);
    }
    let rule = match calendar.kind {
        Kind::Wildcard => "wildcard job: runs in both passes of a repeated hour",
        Kind::FixedTime => "fixed-time job: once in a repeated hour, right after a skipped one",
    };
    let mut text = format!(
        "  expression: {}\n   time zone: {} ({rule})\n        from: {}\n",
        expr.trim(),
        calendar.tz.name(),
        calendar.local_rfc3339(start)
    );
    if !delay.is_zero() {
        text.push_str(&format!(
            "      jitter: each fire starts {:.1}s after its slot (the same delay every time for this workflow)\n",
            delay.as_secs_f64()
        ));
    }
    if fires.is_empty() {
        text.push_str("no fires after that\n");
    }
    for (n, fire) in fires.iter().enumerate() {
        text.push_str(&line(calendar, n + 1, fire));
        text.push('\n');
    }
    super::output::print_out(&text);
    Ok(0)
}

fn line(calendar: &Calendar, n: usize, fire: &Fire) -> String {
    let utc = fire.at.format("%a %Y-%m-%d %H:%M:%S UTC");
    let mark = fire.dst.map(|d| format!("  ← {d}")).unwrap_or_default();
    format!("{n:>4}  {}  {utc}{mark}", calendar.local_rfc3339(fire.at))
}
