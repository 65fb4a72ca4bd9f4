//! Each workflow's spend on the overview: today, the last 7 days, and a bar per day. Read
//! from the run records (what each run's budget counted: the larger of reported and
//! metered), by UTC day.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::store::{RunQuery, RunRecord, RunState, Store};

/// Days in the chart, today included.
pub const DAYS: usize = 7;
/// Runs read per page, and at most this many pages per workflow (the overview must stay
/// quick: a workflow with more runs in a week than this shows what it read, marked so).
const PAGE: usize = 500;
const MAX_PAGES: usize = 20;

/// One workflow's spend over the last [`DAYS`] days.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Week {
    pub today_usd: f64,
    pub week_usd: f64,
    /// `$0.0123`, as shown.
    pub today: String,
    pub this_week: String,
    pub week_tokens: u64,
    /// Oldest first: (`MM-DD`, USD, bar height in % of the week's largest day).
    pub days: Vec<Day>,
    /// More runs than were read: the sums are at least these.
    pub partial: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Day {
    pub label: String,
    pub usd: f64,
    pub shown: String,
    pub height: u32,
}

/// `workflow`'s week up to `now`.
pub fn week(store: &Store, workflow: &str, now: DateTime<Utc>) -> Week {
    let today = now.date_naive();
    let first = today - Duration::days(DAYS as i64 - 1);
    let since = first.and_hms_opt(0, 0, 0).map(|t| t.and_utc());
    let mut by_day = [0.0f64; DAYS];
    let mut week = Week::default();
    let mut before = None;
    for _ in 0..MAX_PAGES {
        let page = store
            .run_page(&RunQuery {
                workflow: Some(workflow.to_string()),
                since,
                before: before.take(),
                limit: PAGE,
                ..Default::default()
            })
            .unwrap_or_default();
        for rec in &page {
            add(&mut by_day, &mut week, rec, first);
        }
        match page.last() {
            Some(last) if page.len() == PAGE => before = Some(last.run_id.clone()),
            _ => break,
        }
    }
    week.partial = before.is_some();
    week.today_usd = by_day[DAYS - 1];
    week.week_usd = by_day.iter().sum();
    week.today = dollars(week.today_usd);
    week.this_week = dollars(week.week_usd);
    let top = by_day.iter().cloned().fold(0.0, f64::max);
    week.days = by_day
        .iter()
        .enumerate()
        .map(|(i, usd)| Day {
            label: (first + Duration::days(i as i64))
                .format("%m-%d")
                .to_string(),
            usd: *usd,
            shown: dollars(*usd),
            height: if top > 0.0 {
                ((usd / top) * 100.0).round() as u32
            } else {
                0
            },
        })
        .collect();
    week
}

fn add(by_day: &mut [f64; DAYS], week: &mut Week, rec: &RunRecord, first: chrono::NaiveDate) {
    if matches!(rec.state, RunState::Skipped | RunState::Missed) {
        return;
    }
    let day = (rec.started_at.date_naive() - first).num_days();
    if let Ok(i) = usize::try_from(day) {
        if i < DAYS {
            by_day[i] += rec.figures.cost_usd;
            week.week_tokens += rec.figures.tokens;
        }
    }
}

/// USD as the overview shows it: four decimals (model calls cost fractions of a cent).
fn dollars(usd: f64) -> String {
    format!("${usd:.4}")
}
