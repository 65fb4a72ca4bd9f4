//! Each workflow's spend on the overview: today, the last 7 days, and a bar per day. Read
//! from the store's spend per workflow and day (what each ended run's budget counted: the
//! larger of reported and metered), seven small reads a workflow, whatever the store holds.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::store::Store;

/// Days in the chart, today included.
pub const DAYS: usize = 7;

/// One workflow's spend over the last [`DAYS`] days.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Week {
    pub today_usd: f64,
    pub week_usd: f64,
    /// `$0.0123`, as shown.
    pub today: String,
    pub this_week: String,
    pub week_tokens: u64,
    /// Oldest first.
    pub days: Vec<Day>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Day {
    /// `MM-DD`
    pub label: String,
    pub usd: f64,
    pub shown: String,
    /// The bar's height in % of the week's largest day.
    pub height: u32,
}

/// `workflow`'s week up to `now`.
pub fn week(store: &Store, workflow: &str, now: DateTime<Utc>) -> Week {
    let first = now.date_naive() - Duration::days(DAYS as i64 - 1);
    let spent: Vec<_> = (0..DAYS)
        .map(|i| {
            let day = first + Duration::days(i as i64);
            (day, store.day_spend(workflow, day).unwrap_or_default())
        })
        .collect();
    let top = spent.iter().map(|(_, s)| s.cost_usd).fold(0.0, f64::max);
    let today_usd = spent[DAYS - 1].1.cost_usd;
    let week_usd = spent.iter().map(|(_, s)| s.cost_usd).sum();
    Week {
        today_usd,
        week_usd,
        today: dollars(today_usd),
        this_week: dollars(week_usd),
        week_tokens: spent.iter().map(|(_, s)| s.tokens).sum(),
        days: spent
            .iter()
            .map(|(day, s)| Day {
                label: day.format("%m-%d").to_string(),
                usd: s.cost_usd,
                shown: dollars(s.cost_usd),
                height: if top > 0.0 {
                    ((s.cost_usd / top) * 100.0).round() as u32
                } else {
                    0
                },
            })
            .collect(),
    }
}

/// USD as the overview shows it: four decimals (model calls cost fractions of a cent).
fn dollars(usd: f64) -> String {
    format!("${usd:.4}")
}
