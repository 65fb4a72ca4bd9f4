//! Where a cron pattern fires in a time zone, by ISC cron's daylight-saving rules.
//!
//! croner matches a pattern against wall-clock times; what a wall-clock time means on a
//! night the clocks change is decided here, the way ISC (Vixie, Debian) cron decides it:
//!
//! - a **wildcard** job — its minute or its hour field starts with `*`, so `*/15 * * * *`
//!   and `@hourly` — runs by elapsed time: in both passes of a repeated hour, and not at all
//!   for the wall-clock times a skipped hour removes;
//! - a **fixed-time** job — `30 2 * * *`, `@daily` — runs by the wall clock: once in a
//!   repeated hour, at its first pass, and a slot that a skipped hour removes runs once,
//!   right after the jump.
//!
//! The search never walks second by second: it asks croner for the next wall-clock match
//! once per stretch of constant UTC offset, and finds the offset changes themselves by
//! probing the zone every few hours and bisecting, so an answer from inside a repeated
//! hour costs a handful of croner searches.

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

/// How a pattern treats a daylight-saving change (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Wildcard,
    FixedTime,
}

/// A fire that a daylight-saving change shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dst {
    /// In the first pass of a repeated local hour.
    RepeatedFirstPass,
    /// In the second pass of a repeated local hour (wildcard jobs only).
    RepeatedSecondPass,
    /// A fixed-time slot whose wall-clock time a skipped hour removed, run right after the
    /// jump.
    AfterSkipped { wanted: NaiveDateTime },
}

impl std::fmt::Display for Dst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dst::RepeatedFirstPass => write!(f, "repeated hour, first pass"),
            Dst::RepeatedSecondPass => write!(f, "repeated hour, second pass"),
            Dst::AfterSkipped { wanted } => write!(
                f,
                "skipped hour: {} does not exist that night, run right after the jump",
                wanted.format("%H:%M")
            ),
        }
    }
}

/// One fire: the instant, and how a daylight-saving change shaped it, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fire {
    pub at: DateTime<Utc>,
    pub dst: Option<Dst>,
}

/// A parsed cron pattern read in one time zone.
#[derive(Debug, Clone)]
pub struct Calendar {
    cron: Cron,
    pub tz: Tz,
    pub kind: Kind,
}

/// How often the zone is probed for an offset change. Real zones never change their
/// offset twice within this span, so no change between two probes goes unseen.
const PROBE: i64 = 6 * 3600;

/// Most stretches of constant offset one search may cross (a pattern that fires once in
/// four years crosses about eight).
const MAX_STRETCHES: usize = 256;

/// The fields of a cron line, by count (seconds first when there are six or seven, a
/// year last when there are seven), with the values each takes.
fn field_names(count: usize) -> Option<Vec<(&'static str, &'static str)>> {
    const STANDARD: [(&str, &str); 5] = [
        ("minute", "0-59"),
        ("hour", "0-23"),
        ("day-of-month", "1-31"),
        ("month", "1-12 or JAN-DEC"),
        ("day-of-week", "0-7 or SUN-SAT"),
    ];
    let mut names = STANDARD.to_vec();
    match count {
        5 => {}
        6 => names.insert(0, ("second", "0-59")),
        7 => {
            names.insert(0, ("second", "0-59"));
            names.push(("year", "1-9999"));
        }
        _ => return None,
    }
    Some(names)
}

fn parser() -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).build()
}

/// What is wrong with `expr`, naming the field when one field is to blame.
fn explain(expr: &str, err: croner::errors::CronError) -> String {
    const FORMS: &str = "5 fields `minute hour day-of-month month day-of-week`, 6 with seconds first, or @hourly/@daily/@weekly/@monthly/@yearly";
    let fields: Vec<&str> = expr.split_whitespace().collect();
    if expr.trim_start().starts_with('@') {
        return format!("`{expr}` is not a cron expression: {err} (expected {FORMS})");
    }
    let Some(names) = field_names(fields.len()) else {
        return format!("`{expr}` has {} field(s); expected {FORMS}", fields.len());
    };
    for (i, (name, range)) in names.iter().enumerate() {
        let alone: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { fields[j] } else { "*" })
            .collect();
        if let Err(e) = parser().parse(&alone.join(" ")) {
            return format!(
                "the {name} field `{}` of `{expr}` is not valid: {e} (expected {range}, `*`, a list, range or step)",
                fields[i]
            );
        }
    }
    format!("`{expr}` is not a cron expression: {err} (expected {FORMS})")
}

/// ISC cron's test: a job is a wildcard job when its minute or hour field starts with `*`.
fn kind_of(expr: &str) -> Kind {
    let expr = expr.trim().to_ascii_lowercase();
    if let Some(nickname) = expr.strip_prefix('@') {
        return if nickname == "hourly" {
            Kind::Wildcard
        } else {
            Kind::FixedTime
        };
    }
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let (minute, hour) = if fields.len() >= 6 { (1, 2) } else { (0, 1) };
    let star = |i: usize| fields.get(i).is_some_and(|f| f.starts_with('*'));
    if star(minute) || star(hour) {
        Kind::Wildcard
    } else {
        Kind::FixedTime
    }
}

fn offset_at(tz: Tz, t: DateTime<Utc>) -> i32 {
    tz.offset_from_utc_datetime(&t.naive_utc())
        .fix()
        .local_minus_utc()
}

fn wall_clock(tz: Tz, t: DateTime<Utc>) -> NaiveDateTime {
    t.naive_utc() + Duration::seconds(offset_at(tz, t).into())
}

/// The first instant in `(from, until]` whose UTC offset differs from `from`'s.
fn first_change(tz: Tz, from: DateTime<Utc>, until: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if tz == Tz::UTC || until <= from {
        return None;
    }
    let offset = offset_at(tz, from);
    let mut lo = from.timestamp();
    let end = until.timestamp();
    while lo < end {
        let hi = (lo + PROBE).min(end);
        let at = |s: i64| DateTime::from_timestamp(s, 0).map(|t| offset_at(tz, t));
        if at(hi)? != offset {
            // Bisect (lo, hi]: the offset is `offset` at lo and differs at hi.
            let (mut a, mut b) = (lo, hi);
            while b - a > 1 {
                let mid = a + (b - a) / 2;
                if at(mid)? == offset {
                    a = mid;
                } else {
                    b = mid;
                }
            }
            return DateTime::from_timestamp(b, 0);
        }
        lo = hi;
    }
    None
}

/// A cron expression steward cannot read: the field at fault and what it takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadCron(String);

impl Calendar {
    /// Parses `expr` (5 fields, 6 with seconds first, 7 with a year last, or a nickname).
    /// The error names the field at fault and what it takes.
    pub fn parse(expr: &str, tz: Tz) -> Result<Calendar, BadCron> {
        let cron = parser()
            .parse(expr.trim())
            .map_err(|e| BadCron(explain(expr.trim(), e)))?;
        Ok(Calendar {
            cron,
            tz,
            kind: kind_of(expr),
        })
    }

    /// The first fire strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<Fire> {
        let fire = match self.kind {
            Kind::Wildcard => self.next_by_elapsed_time(after),
            Kind::FixedTime => self.next_by_wall_clock(after),
        }?;
        Some(Fire {
            at: fire.at,
            dst: fire.dst.or_else(|| self.repeated_pass(fire.at)),
        })
    }

    /// The next `count` fires after `after`.
    pub fn fires(&self, after: DateTime<Utc>, count: usize) -> Vec<Fire> {
        let mut out = Vec::with_capacity(count.min(1024));
        let mut t = after;
        while out.len() < count {
            let Some(fire) = self.next_after(t) else {
                break;
            };
            t = fire.at;
            out.push(fire);
        }
        out
    }

    /// The first wall-clock time after `from` (or at it, with `inclusive`) that matches.
    fn next_wall_clock(&self, from: NaiveDateTime, inclusive: bool) -> Option<NaiveDateTime> {
        // croner carries the start's fraction of a second into its answer: start from the
        // whole second so fires land on whole seconds.
        let from = from.with_nanosecond(0)?;
        #[cfg(test)]
        tests::SEARCHES.with(|n| n.set(n.get() + 1));
        self.cron
            .find_next_occurrence(&Utc.from_utc_datetime(&from), inclusive)
            .ok()
            .map(|t| t.naive_utc())
    }

    /// Wildcard jobs: each stretch of constant offset in turn, the first wall-clock match
    /// that really lies inside it.
    fn next_by_elapsed_time(&self, after: DateTime<Utc>) -> Option<Fire> {
        let mut start = after;
        let mut inclusive = false;
        for _ in 0..MAX_STRETCHES {
            let offset = Duration::seconds(offset_at(self.tz, start).into());
            let wall = self.next_wall_clock(start.naive_utc() + offset, inclusive)?;
            let at = Utc.from_utc_datetime(&(wall - offset));
            match first_change(self.tz, start, at) {
                None if at > after => return Some(Fire { at, dst: None }),
                None => return None,
                Some(change) => {
                    start = change;
                    inclusive = true;
                }
            }
        }
        None
    }

    /// Fixed-time jobs: the next matching wall-clock time; in a repeated hour its first
    /// pass, in a skipped hour the instant right after the jump.
    fn next_by_wall_clock(&self, after: DateTime<Utc>) -> Option<Fire> {
        let (mut from, mut inclusive) = match self.fold_end_if_second_pass(after) {
            // Every wall-clock time of the repeated hour already ran in its first pass.
            Some(end) => (end, true),
            None => (wall_clock(self.tz, after), false),
        };
        for _ in 0..8 {
            let wall = self.next_wall_clock(from, inclusive)?;
            let fire = match self.tz.from_local_datetime(&wall) {
                LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Fire {
                    at: t.with_timezone(&Utc),
                    dst: None,
                },
                LocalResult::None => Fire {
                    at: self.first_instant_after_gap(wall)?,
                    dst: Some(Dst::AfterSkipped { wanted: wall }),
                },
            };
            if fire.at > after {
                return Some(fire);
            }
            from = wall;
            inclusive = false;
        }
        None
    }

    /// When `t` lies in the second pass of a repeated hour: the wall-clock time at which
    /// that hour ends (the first pass's offset reached it just as the clocks went back).
    fn fold_end_if_second_pass(&self, t: DateTime<Utc>) -> Option<NaiveDateTime> {
        let wall = wall_clock(self.tz, t);
        let LocalResult::Ambiguous(first, _) = self.tz.from_local_datetime(&wall) else {
            return None;
        };
        let first = first.with_timezone(&Utc);
        if first.timestamp() >= t.timestamp() {
            return None;
        }
        let change = first_change(self.tz, first, t)?;
        Some(change.naive_utc() + Duration::seconds(offset_at(self.tz, first).into()))
    }

    /// The first instant after a skipped wall-clock time: the jump itself (found minute by
    /// minute, as ISC cron counts; a skipped span is at most a few hours).
    fn first_instant_after_gap(&self, wanted: NaiveDateTime) -> Option<DateTime<Utc>> {
        let mut wall = wanted.with_second(0)?.with_nanosecond(0)?;
        for _ in 0..(26 * 60) {
            wall += Duration::minutes(1);
            if let Some(t) = self.tz.from_local_datetime(&wall).earliest() {
                return Some(t.with_timezone(&Utc));
            }
        }
        None
    }

    /// Whether `t` falls in a repeated local hour, and in which pass.
    fn repeated_pass(&self, t: DateTime<Utc>) -> Option<Dst> {
        match self.tz.from_local_datetime(&wall_clock(self.tz, t)) {
            LocalResult::Ambiguous(first, _) if first.with_timezone(&Utc) == t => {
                Some(Dst::RepeatedFirstPass)
            }
            LocalResult::Ambiguous(..) => Some(Dst::RepeatedSecondPass),
            _ => None,
        }
    }

    /// `t` as an RFC 3339 time with the zone's UTC offset: `2027-10-31T02:00:00+01:00`.
    /// `t` in the calendar's zone; fractions of a second only when there are some (a
    /// workflow's jitter delay).
    pub fn local_rfc3339(&self, t: DateTime<Utc>) -> String {
        t.with_timezone(&self.tz)
            .fixed_offset()
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// croner searches made on this thread.
        pub(super) static SEARCHES: Cell<usize> = const { Cell::new(0) };
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn searches_for(expr: &str, zone: &str, from: &str) -> (String, usize) {
        let cal = Calendar::parse(expr, zone.parse().unwrap()).unwrap();
        SEARCHES.with(|n| n.set(0));
        let fire = cal.next_after(at(from)).unwrap();
        (cal.local_rfc3339(fire.at), SEARCHES.with(Cell::get))
    }

    #[test]
    fn asking_from_inside_a_repeated_hour_takes_a_few_searches() {
        // Second pass of Berlin's 2027 fall-back; every-second and fixed-time patterns.
        for (expr, want) in [
            ("* * * * * *", "2027-10-31T02:10:01+01:00"),
            ("*/15 * * * *", "2027-10-31T02:15:00+01:00"),
            ("* 0-59 2 * * *", "2027-11-01T02:00:00+01:00"),
            ("30 2 * * *", "2027-11-01T02:30:00+01:00"),
            ("0 0 29 2 *", "2028-02-29T00:00:00+01:00"),
        ] {
            let (got, searches) = searches_for(expr, "Europe/Berlin", "2027-10-31T02:10:00+01:00");
            assert_eq!(got, want, "{expr}");
            assert!(searches <= 4, "{expr}: {searches} croner searches");
        }
    }

    #[test]
    fn kinds_follow_isc_crons_star_test() {
        for (expr, kind) in [
            ("*/15 * * * *", Kind::Wildcard),
            ("0 * * * *", Kind::Wildcard),
            ("@hourly", Kind::Wildcard),
            ("*/10 2 * * *", Kind::Wildcard),
            ("30 2 * * *", Kind::FixedTime),
            ("0,30 1-3 * * *", Kind::FixedTime),
            ("@daily", Kind::FixedTime),
            ("0 30 2 * * *", Kind::FixedTime),
            ("0 */5 * * * *", Kind::Wildcard),
        ] {
            assert_eq!(kind_of(expr), kind, "{expr}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let err = |e: &str| Calendar::parse(e, Tz::UTC).unwrap_err().to_string();
        assert!(err("0 25 * * *").contains("the hour field `25`"));
        assert!(err("61 * * * *").contains("the minute field `61`"));
        assert!(err("0 0 32 * *").contains("the day-of-month field `32`"));
        assert!(err("0 0 * 13 *").contains("the month field `13`"));
        assert!(err("0 0 * * 9").contains("the day-of-week field `9`"));
        assert!(err("0 0 * *").contains("has 4 field(s)"));
    }
}
