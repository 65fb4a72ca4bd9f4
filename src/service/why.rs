//! `steward why WORKFLOW [TIME]` and `steward why WORKFLOW --since 24h`: what became of
//! a slot (or of each slot and fire in a span), from the ledger ([`crate::ledger`]).

use anyhow::{anyhow, bail};
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;

use super::context::{Handled, Service};
use crate::api::Response;
use crate::config::Workflow;
use crate::ledger::{self, Entry};
use crate::schedule::Schedule;
use crate::store::RunQuery;

/// Run records read at most for one answer (a span's, or the slot's neighbours).
const MAX_RECORDS: usize = 10_000;

/// Slots listed at most for `--since` (a minutely schedule over a week is too many).
const MAX_SLOTS: usize = 2_000;

/// Slots walked at most to find the newest of a span (a secondly schedule's 11 days).
const MAX_WALK: usize = 1_000_000;

pub(super) fn why(
    service: &Service,
    workflow: &str,
    at: Option<String>,
    since: Option<String>,
) -> Handled {
    let config = service.config()?;
    let wf = service.workflow(&config, workflow)?;
    let sched = wf.schedule();
    let tz = sched.as_ref().map_or(Tz::UTC, |s| s.tz);
    let now = Utc::now();
    let entries = match (at, since) {
        (Some(_), Some(_)) => bail!("give a TIME or --since, not both"),
        (None, Some(span)) => {
            let span = humantime::parse_duration(&span)
                .map_err(|e| anyhow!("--since `{span}`: {e}; e.g. 24h, 90m, 7days"))?;
            let from =
                now - chrono::Duration::from_std(span).unwrap_or(chrono::Duration::days(3650));
            span_entries(service, &wf, sched.as_ref(), from, now)?
        }
        (at, None) => {
            let at = match at {
                Some(text) => parse_time(&text, tz, now)?,
                None => now,
            };
            slot_entry(service, &wf, sched.as_ref(), at)?
                .into_iter()
                .collect()
        }
    };
    Ok(Response::Why {
        workflow: wf.id.clone(),
        timezone: tz.name().to_string(),
        entries,
        upstream: upstream_ends(service, &wf)?,
    })
}

/// Upstream runs listed for a follower, per upstream workflow.
const UPSTREAM_SHOWN: usize = 10;

/// A follower's upstream runs, newest first, each with the run of it that it fired or why
/// none: an outcome it does not follow, a fan-in still waiting for the others.
fn upstream_ends(service: &Service, wf: &Workflow) -> anyhow::Result<Vec<crate::api::UpstreamEnd>> {
    let Some(after) = wf.trigger.after() else {
        return Ok(Vec::new());
    };
    let store = &service.engine.store;
    let fired = crate::chain::fired_of(store, &wf.id);
    let on: Vec<&str> = after.on.iter().map(|o| o.name()).collect();
    let mut out = Vec::new();
    for up in &after.upstream {
        let page = store.run_page(&RunQuery {
            workflow: Some(up.clone()),
            limit: UPSTREAM_SHOWN,
            ..Default::default()
        })?;
        for run in page.into_iter().filter(|r| r.ended_at.is_some()) {
            let by = fired.iter().find(|f| f.upstream.contains(&run.run_id));
            let why = match by {
                Some(f) => format!("fired {} run {}", wf.id, f.run_id),
                None if !after.fired_by(&run.workflow, run.state) => format!(
                    "not fired: it ended {}, and {} follows it on {}",
                    run.state.name(),
                    wf.id,
                    on.join(", ")
                ),
                None if after.all => {
                    "not fired yet: a fan-in, waiting for a run of each of the others".into()
                }
                None => {
                    "not fired: it ended while no daemon ran, or before this workflow followed it"
                        .into()
                }
            };
            out.push(crate::api::UpstreamEnd {
                run_id: run.run_id.clone(),
                workflow: run.workflow.clone(),
                state: run.state,
                ended_at: run.ended_at,
                fired: by.map(|f| f.run_id.clone()),
                why,
            });
        }
    }
    Ok(out)
}

/// The runs of `wf` that started at or after `from`, newest first.
fn records_since(
    service: &Service,
    wf: &Workflow,
    from: DateTime<Utc>,
) -> anyhow::Result<Vec<crate::store::RunRecord>> {
    Ok(service.engine.store.run_page(&RunQuery {
        workflow: Some(wf.id.clone()),
        since: Some(from),
        limit: MAX_RECORDS,
        ..Default::default()
    })?)
}

/// Every slot and fire from `from` to `now`, oldest first; a schedule's slot with no
/// record is listed missed.
fn span_entries(
    service: &Service,
    wf: &Workflow,
    sched: Option<&Schedule>,
    from: DateTime<Utc>,
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<Entry>> {
    let mut entries: Vec<Entry> = ledger::entries(&records_since(service, wf, from)?)
        .into_iter()
        .filter(|e| e.slot >= from)
        .collect();
    // Slots before the workflow's oldest record kept say nothing: it may not have existed.
    let horizon = match recorded_before(service, wf, from)? {
        true => Some(from),
        false => entries.iter().map(|e| e.slot).min(),
    };
    if let (Some(s), Some(horizon)) = (sched, horizon) {
        for slot in newest_slots(s, horizon, now, MAX_SLOTS) {
            // The slot of the minute now is still on its way (jitter, a run starting).
            if s.fire_at(slot) + chrono::Duration::seconds(2) > now {
                continue;
            }
            if !entries
                .iter()
                .any(|e| e.slot == slot && e.trigger == "schedule")
            {
                entries.push(ledger::unrecorded(slot));
            }
        }
        entries.sort_by_key(|e| e.slot);
    }
    // The newest ones, when a span holds more than a screenful of screens.
    let extra = entries.len().saturating_sub(MAX_SLOTS);
    entries.drain(..extra);
    Ok(entries)
}

/// The newest `n` slots in `(after, until]`, newest first: the schedule is walked forward
/// in chunks (it has no backward step), at most [`MAX_WALK`] slots in all.
fn newest_slots(
    s: &Schedule,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
    n: usize,
) -> Vec<DateTime<Utc>> {
    let mut from = after;
    let mut walked = 0;
    let mut tail: Vec<DateTime<Utc>> = Vec::new();
    loop {
        let chunk = s.fires_between(from, until);
        walked += chunk.len();
        let Some(&last) = chunk.last() else { break };
        let full = chunk.len() >= crate::schedule::MAX_MISSED;
        tail.extend(chunk);
        let keep = tail.len().saturating_sub(n);
        tail.drain(..keep);
        if !full || walked >= MAX_WALK {
            break;
        }
        from = last;
    }
    tail.reverse();
    tail
}

/// Whether a run record of `wf` started before `t`.
fn recorded_before(service: &Service, wf: &Workflow, t: DateTime<Utc>) -> anyhow::Result<bool> {
    Ok(!service
        .engine
        .store
        .run_page(&RunQuery {
            workflow: Some(wf.id.clone()),
            until: Some(t),
            limit: 1,
            ..Default::default()
        })?
        .is_empty())
}

/// The slot at or before `at` (a schedule's) or the newest fire at or before it.
fn slot_entry(
    service: &Service,
    wf: &Workflow,
    sched: Option<&Schedule>,
    at: DateTime<Utc>,
) -> anyhow::Result<Option<Entry>> {
    match sched {
        Some(s) => {
            let Some(slot) = s.last_at_or_before(at) else {
                return Ok(None);
            };
            // A slot's own fire starts within moments of it; a `missed` record or a
            // catch-up comes at the next start, which may be days later.
            let near = service.engine.store.run_page(&RunQuery {
                workflow: Some(wf.id.clone()),
                since: Some(slot),
                until: Some(slot + chrono::Duration::hours(1)),
                limit: MAX_RECORDS,
                ..Default::default()
            })?;
            let of_slot = |records: &[crate::store::RunRecord]| {
                ledger::entries(records)
                    .into_iter()
                    .find(|e| e.slot == slot && e.trigger == "schedule")
            };
            let ran = |e: &Entry| {
                matches!(
                    e.outcome,
                    ledger::Outcome::Fired | ledger::Outcome::CaughtUp
                )
            };
            let found = match of_slot(&near) {
                Some(e) if ran(&e) => Some(e),
                // Skipped or missed then: a catch-up may have run it since.
                _ => {
                    let mut all = records_since(service, wf, slot)?;
                    all.extend(near);
                    of_slot(&all)
                }
            };
            Ok(match found {
                Some(e) => Some(e),
                // Not recorded, after records of it: steward was not running.
                None if recorded_before(service, wf, slot)? => Some(ledger::unrecorded(slot)),
                None => None,
            })
        }
        None => {
            let newest = service.engine.store.run_page(&RunQuery {
                workflow: Some(wf.id.clone()),
                until: Some(at + chrono::Duration::milliseconds(1)),
                limit: 1,
                ..Default::default()
            })?;
            Ok(newest.first().map(ledger::entry))
        }
    }
}

/// RFC 3339, or `YYYY-MM-DD HH:MM[:SS]` or `HH:MM[:SS]` (today) in the schedule's zone.
fn parse_time(text: &str, tz: Tz, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let local = ["%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
        .or_else(|| {
            let today: NaiveDate = now.with_timezone(&tz).date_naive();
            ["%H:%M:%S", "%H:%M"]
                .iter()
                .find_map(|f| NaiveTime::parse_from_str(text, f).ok())
                .map(|t| today.and_time(t))
        })
        .ok_or_else(|| {
            anyhow!("TIME `{text}` is not a time: give RFC 3339 (2026-12-04T09:00:00Z), `2026-12-04 09:00` or `09:00` (today), read in {}", tz.name())
        })?;
    tz.from_local_datetime(&local)
        .latest()
        .map(|t| t.with_timezone(&Utc))
        .ok_or_else(|| {
            anyhow!(
                "TIME `{text}` does not exist in {} (a daylight-saving gap)",
                tz.name()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_slots_of_a_long_span_are_found_past_the_listing_bound() {
        let spec = crate::config::ScheduleTrigger {
            cron: "* * * * * *".into(),
            timezone: None,
            catchup: None,
            catchup_window_s: None,
            jitter: None,
        };
        let s = Schedule::parse(&spec).unwrap();
        let until: DateTime<Utc> = "2026-12-04T09:00:00Z".parse().unwrap();
        // A day of secondly slots: 86,400, more than one listing holds.
        let got = newest_slots(&s, until - chrono::Duration::days(1), until, 3);
        let want: Vec<DateTime<Utc>> = (0..3)
            .map(|n| until - chrono::Duration::seconds(n))
            .collect();
        assert_eq!(got, want);
    }
}
