//! Cron schedules, correct across daylight-saving changes.
//!
//! tokio-cron-scheduler freezes a time zone's UTC offset when a job is created (so after a
//! DST change a 09:00 Berlin job would fire at 10:00). steward therefore computes every
//! fire itself — [`super::calendar`], croner over the schedule's own time zone (chrono-tz)
//! with ISC cron's daylight-saving rules — and hands the scheduler a one-shot job for that
//! UTC instant.
//!
//! The scheduler stores one-shot times in whole seconds and can wake a job up to a second
//! early; the worker then waits out the rest, so no run ever starts before its slot.
//!
//! A schedule persists the last slot it fired and never fires a slot at or before it, so
//! a clock stepped backwards fires nothing twice. The run context carries the exact slot
//! as `scheduled_for`, however late the scheduler's 500 ms tick starts it.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;

use crate::calendar::{Calendar, Fire};

/// A `schedule = { cron, timezone, catchup, catchup_window_s }` trigger as configured.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleTrigger {
    pub cron: String,
    #[serde(default)]
    pub timezone: Option<String>,
    #[serde(default)]
    pub catchup: Option<String>,
    #[serde(default)]
    pub catchup_window_s: Option<u64>,
    /// Spreads fires over up to this long after each slot (`"30s"`), like systemd's
    /// RandomizedDelaySec but the same delay every time for a given workflow.
    #[serde(default)]
    pub jitter: Option<String>,
}

impl Schedule {
    /// `{"local": …, "utc": …, "timezone": …}` for the next fire, for `list` and `status`.
    pub fn next_fire_json(&self) -> Option<Value> {
        let next = self.next_after(Utc::now())? + self.delay;
        Some(json!({
            "local": self.local(next),
            "utc": next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "timezone": self.tz.name(),
        }))
    }
}

/// What is wrong with a schedule, by the value at fault.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule.cron: {0}")]
    Cron(crate::calendar::BadCron),
    #[error("{0}")]
    Timezone(BadZone),
    #[error("{0}")]
    Catchup(String),
    #[error("schedule.cron `{0}` never fires (no date matches it)")]
    NeverFires(String),
    #[error("schedule.jitter `{0}` is not a duration (e.g. \"30s\", \"5m\")")]
    Jitter(String),
}

/// A parsed schedule: the cron pattern and the zone it is read in.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub calendar: Calendar,
    pub tz: Tz,
    pub catchup: Catchup,
    /// How far back missed fires are still worth running (default: one period).
    pub catchup_window: Option<Duration>,
    /// `jitter`: the most a fire may come after its slot.
    pub jitter: Duration,
    /// How long after each slot this workflow's fire starts (within `jitter`; see
    /// [`Schedule::for_workflow`]). The slot itself is what the run and the ledger record.
    pub delay: Duration,
}

/// What to do with fires missed while the daemon was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Catchup {
    /// One run for the newest missed slot (like systemd's `Persistent=true`).
    Latest,
    /// A run for every missed slot in the window, staggered.
    All,
    /// Record them as missed; run nothing.
    None,
}

impl Catchup {
    pub fn name(self) -> &'static str {
        match self {
            Catchup::Latest => "latest",
            Catchup::All => "all",
            Catchup::None => "none",
        }
    }
}

/// How much earlier than the slot the scheduler is asked to wake a schedule's worker.
const EARLY: Duration = Duration::from_secs(1);

/// Longest span searched when listing missed fires (a year of minutely fires is too many).
pub const MAX_MISSED: usize = 10_000;

impl Schedule {
    pub fn parse(spec: &ScheduleTrigger) -> Result<Schedule, ScheduleError> {
        let tz = match &spec.timezone {
            None => Tz::UTC,
            Some(name) => parse_zone(name).map_err(ScheduleError::Timezone)?,
        };
        let calendar = Calendar::parse(&spec.cron, tz).map_err(ScheduleError::Cron)?;
        let catchup = match spec.catchup.as_deref() {
            None | Some("latest") => Catchup::Latest,
            Some("all") => Catchup::All,
            Some("none") => Catchup::None,
            Some(other) => {
                return Err(ScheduleError::Catchup(format!(
                    "schedule.catchup `{other}` must be latest, all or none"
                )))
            }
        };
        let jitter = match &spec.jitter {
            None => Duration::ZERO,
            Some(j) => {
                humantime::parse_duration(j).map_err(|_| ScheduleError::Jitter(j.clone()))?
            }
        };
        let s = Schedule {
            calendar,
            tz,
            catchup,
            catchup_window: spec.catchup_window_s.map(Duration::from_secs),
            jitter,
            delay: Duration::ZERO,
        };
        if s.next_after(Utc::now()).is_none() {
            return Err(ScheduleError::NeverFires(spec.cron.clone()));
        }
        Ok(s)
    }

    /// The schedule as `workflow` fires it: its delay after each slot is a hash of its
    /// name within the jitter, so the same workflow always fires at the same time (and
    /// `steward next` can say when) while different ones spread out.
    pub fn for_workflow(mut self, workflow: &str) -> Schedule {
        use sha2::{Digest, Sha256};
        let ms = self.jitter.as_millis() as u64;
        if ms > 0 {
            let h = Sha256::digest(workflow.as_bytes());
            let n = u64::from_be_bytes(h[..8].try_into().unwrap_or_default());
            self.delay = Duration::from_millis(n % (ms + 1));
        }
        self
    }

    /// When the fire for `slot` starts: the slot plus this workflow's jitter delay.
    pub fn fire_at(&self, slot: DateTime<Utc>) -> DateTime<Utc> {
        slot + self.delay
    }

    /// The first slot strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.next_fire(after).map(|f| f.at)
    }

    /// The first fire strictly after `after`, with how a DST change shaped it.
    pub fn next_fire(&self, after: DateTime<Utc>) -> Option<Fire> {
        self.calendar.next_after(after)
    }

    /// Slots in `(after, until]`, oldest first, at most [`MAX_MISSED`].
    pub fn fires_between(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = after;
        while let Some(next) = self.next_after(t) {
            if next > until || out.len() >= MAX_MISSED {
                break;
            }
            out.push(next);
            t = next;
        }
        out
    }

    /// The newest slot at or before `t`, looking back up to 400 days.
    pub fn last_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        for hours in [1, 24, 24 * 8, 24 * 32, 24 * 400] {
            let fires = self.fires_between(t - chrono::Duration::hours(hours), t);
            if fires.len() >= MAX_MISSED {
                // A span this wide holds more slots than are listed: take a narrower one.
                return self
                    .fires_between(t - chrono::Duration::minutes(1), t)
                    .last()
                    .copied();
            }
            if let Some(last) = fires.last() {
                return Some(*last);
            }
        }
        None
    }

    /// The catch-up window: configured, or the gap between the two slots after `at`.
    pub fn window(&self, at: DateTime<Utc>) -> Duration {
        self.catchup_window.unwrap_or_else(|| {
            let a = self.next_after(at);
            let b = a.and_then(|a| self.next_after(a));
            match (a, b) {
                (Some(a), Some(b)) => (b - a).to_std().unwrap_or(Duration::from_secs(60)),
                _ => Duration::from_secs(24 * 3600),
            }
        })
    }

    pub fn local(&self, t: DateTime<Utc>) -> String {
        self.tz
            .from_utc_datetime(&t.naive_utc())
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string()
    }
}

/// A time zone name that is not an IANA one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schedule.timezone `{0}` is not an IANA time zone (e.g. Europe/Berlin, UTC)")]
pub struct BadZone(String);

/// An IANA zone name, or an error saying what was expected.
pub fn parse_zone(name: &str) -> Result<Tz, BadZone> {
    Tz::from_str(name).map_err(|_| BadZone(name.to_string()))
}

/// Called with each slot as it comes due.
pub type OnFire = Arc<dyn Fn(DateTime<Utc>) + Send + Sync>;

/// Fires `on_fire` at every slot after `last` until `cancel`. `persist` records a slot as
/// fired before it is handed on. The record is not flushed on its own: a crash before the
/// next flush may fire the slot again at start-up, but its run had reached no commit (a
/// commit's flush carries the slot's record with it).
pub async fn run(
    scheduler: JobScheduler,
    schedule: Schedule,
    mut last: Option<DateTime<Utc>>,
    persist: Arc<dyn Fn(DateTime<Utc>) -> bool + Send + Sync>,
    on_fire: OnFire,
    cancel: CancellationToken,
) {
    let (tx, mut rx) = mpsc::channel::<()>(4);
    loop {
        let now = Utc::now();
        let from = match last {
            Some(l) if l > now => l, // the clock went backwards: wait for time to pass the last slot
            _ => now,
        };
        // A slot already passed whose jittered fire is still ahead (the daemon started,
        // or the clock stands, inside its delay) fires at that time, once.
        let inside_delay = (!schedule.delay.is_zero())
            .then(|| schedule.last_at_or_before(now))
            .flatten()
            .filter(|s| schedule.fire_at(*s) > now && last.is_none_or(|l| *s > l));
        let Some(slot) = inside_delay.or_else(|| schedule.next_after(from)) else {
            tracing::warn!("schedule has no further fires; its trigger stops");
            return;
        };
        // Ask the scheduler to wake us a second early (it keeps whole seconds and ticks
        // every 500 ms), then sleep the rest ourselves: the run starts on the slot.
        let wait = (schedule.fire_at(slot) - Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO)
            .saturating_sub(EARLY);
        let tx = tx.clone();
        // A slot less than a second away is waited for here alone: the scheduler would
        // wake us at its next tick, up to half a second after the slot.
        let job = (!wait.is_zero()).then(|| {
            Job::new_one_shot_async(wait, move |_, _| {
                let tx = tx.clone();
                Box::pin(async move {
                    let _ = tx.send(()).await;
                })
            })
        });
        let id = match job {
            None => None,
            Some(Ok(job)) => match scheduler.add(job).await {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::error!(
                        "cannot register the next fire with the scheduler: {e}; using a timer"
                    );
                    None
                }
            },
            Some(Err(e)) => {
                tracing::error!("cannot build the next fire: {e}; using a timer");
                None
            }
        };
        let fallback = async {
            match id {
                Some(_) => std::future::pending::<()>().await,
                None => tokio::time::sleep(wait).await,
            }
        };
        tokio::select! {
            _ = rx.recv() => {}
            _ = fallback => {}
            _ = cancel.cancelled() => {
                if let Some(id) = id {
                    let _ = scheduler.remove(&id).await;
                }
                return;
            }
        }
        // The scheduler keeps one-shot times in whole seconds and may wake us up to a
        // second early: never start a run before its slot.
        if let Ok(early) = (schedule.fire_at(slot) - Utc::now()).to_std() {
            tokio::select! {
                _ = tokio::time::sleep(early) => {}
                _ = cancel.cancelled() => return,
            }
        }
        if last.is_some_and(|l| slot <= l) {
            continue; // never a slot at or before the last one fired
        }
        if !persist(slot) {
            continue; // could not record it: firing now could fire it twice after a crash
        }
        last = Some(slot);
        on_fire(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(cron: &str, tz: &str) -> Schedule {
        Schedule::parse(&ScheduleTrigger {
            cron: cron.into(),
            timezone: Some(tz.into()),
            catchup: None,
            catchup_window_s: None,
            jitter: None,
        })
        .unwrap()
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn locals(s: &Schedule, from: &str, n: usize) -> Vec<String> {
        let mut t = utc(from);
        (0..n)
            .map(|_| {
                t = s.next_after(t).unwrap();
                format!("{} = {}", s.local(t), t.format("%H:%MZ"))
            })
            .collect()
    }

    #[test]
    fn nine_oclock_berlin_stays_at_nine_across_spring_forward() {
        let s = sched("0 9 * * *", "Europe/Berlin");
        assert_eq!(
            locals(&s, "2027-03-26T12:00:00Z", 4),
            [
                "2027-03-27 09:00:00 CET = 08:00Z",
                "2027-03-28 09:00:00 CEST = 07:00Z",
                "2027-03-29 09:00:00 CEST = 07:00Z",
                "2027-03-30 09:00:00 CEST = 07:00Z",
            ]
        );
    }

    #[test]
    fn nine_oclock_berlin_stays_at_nine_across_fall_back() {
        let s = sched("0 9 * * *", "Europe/Berlin");
        assert_eq!(
            locals(&s, "2027-10-29T12:00:00Z", 3),
            [
                "2027-10-30 09:00:00 CEST = 07:00Z",
                "2027-10-31 09:00:00 CET = 08:00Z",
                "2027-11-01 09:00:00 CET = 08:00Z",
            ]
        );
    }

    #[test]
    fn skipped_hour_fires_once_right_after_the_jump() {
        // 2027-03-28 02:00 CET jumps to 03:00 CEST: 02:30 does not exist that night.
        let s = sched("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            locals(&s, "2027-03-27T12:00:00Z", 2),
            [
                "2027-03-28 03:00:00 CEST = 01:00Z",
                "2027-03-29 02:30:00 CEST = 00:30Z"
            ]
        );
    }

    #[test]
    fn repeated_hour_fires_once() {
        // 2027-10-31 03:00 CEST falls back to 02:00 CET: 02:30 happens twice that night.
        let s = sched("30 2 * * *", "Europe/Berlin");
        let fires = s.fires_between(utc("2027-10-30T12:00:00Z"), utc("2027-11-01T12:00:00Z"));
        let shown: Vec<String> = fires.iter().map(|t| s.local(*t)).collect();
        assert_eq!(
            shown,
            ["2027-10-31 02:30:00 CEST", "2027-11-01 02:30:00 CET"]
        );
        // Asking again from inside the repeated hour does not find the second 02:30.
        assert_eq!(
            s.next_after(utc("2027-10-31T01:10:00Z")),
            Some(utc("2027-11-01T01:30:00Z"))
        );
    }

    #[test]
    fn five_field_six_field_and_macros_parse() {
        let t = utc("2026-01-01T00:00:30Z");
        assert_eq!(
            sched("*/5 * * * *", "UTC").next_after(t),
            Some(utc("2026-01-01T00:05:00Z"))
        );
        assert_eq!(
            sched("*/10 * * * * *", "UTC").next_after(t),
            Some(utc("2026-01-01T00:00:40Z"))
        );
        assert_eq!(
            sched("@hourly", "UTC").next_after(t),
            Some(utc("2026-01-01T01:00:00Z"))
        );
        assert_eq!(
            sched("@daily", "UTC").next_after(t),
            Some(utc("2026-01-02T00:00:00Z"))
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused() {
        let bad = |cron: &str, tz: &str| {
            Schedule::parse(&ScheduleTrigger {
                cron: cron.into(),
                timezone: Some(tz.into()),
                catchup: None,
                catchup_window_s: None,
                jitter: None,
            })
            .is_err()
        };
        assert!(bad("61 * * * *", "UTC"));
        assert!(bad("* * *", "UTC"));
        assert!(bad("0 9 * * *", "Mars/Olympus"));
    }

    #[test]
    fn slots_are_whole_seconds_whatever_the_start() {
        let s = sched("*/2 * * * * *", "UTC");
        assert_eq!(
            s.next_after(utc("2026-01-01T00:00:00.811Z")),
            Some(utc("2026-01-01T00:00:02Z"))
        );
        assert_eq!(
            s.next_after(utc("2026-01-01T00:00:01.999Z")),
            Some(utc("2026-01-01T00:00:02Z"))
        );
        assert_eq!(
            s.next_after(utc("2026-01-01T00:00:02Z")),
            Some(utc("2026-01-01T00:00:04Z"))
        );
    }

    #[test]
    fn default_window_is_one_period() {
        let s = sched("0 9 * * *", "UTC");
        assert_eq!(
            s.window(utc("2026-01-01T00:00:00Z")),
            Duration::from_secs(86_400)
        );
    }
}

#[cfg(test)]
mod run_tests {
    use super::*;
    use chrono::SubsecRound;
    use std::sync::Mutex;

    /// A clock stepped backwards: the last fired slot lies ahead of "now". Nothing at or
    /// before it may fire again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clock_stepped_back_fires_nothing_twice() {
        let sched = Schedule::parse(&ScheduleTrigger {
            cron: "* * * * * *".into(),
            timezone: None,
            catchup: None,
            catchup_window_s: None,
            jitter: None,
        })
        .unwrap();
        let scheduler = JobScheduler::new().await.unwrap();
        scheduler.start().await.unwrap();
        let last = Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(2);
        let fired = Arc::new(Mutex::new(Vec::new()));
        let on_fire: OnFire = {
            let fired = fired.clone();
            Arc::new(move |slot| fired.lock().unwrap().push(slot))
        };
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(
            scheduler.clone(),
            sched,
            Some(last),
            Arc::new(|_| true),
            on_fire,
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(4200)).await;
        cancel.cancel();
        let _ = task.await;
        let fired = fired.lock().unwrap().clone();
        assert!(!fired.is_empty(), "nothing fired after the last slot");
        assert!(
            fired.iter().all(|s| *s > last),
            "fired at or before the last slot {last}: {fired:?}"
        );
        let mut dedup = fired.clone();
        dedup.dedup();
        assert_eq!(dedup, fired, "a slot fired twice");
    }
}
