//! BudgetGuard: the four hard caps of one attempt (tokens, tool calls, runtime, cost),
//! counted across its run and verify steps.
//!
//! A cap is breached the moment usage goes *over* it (20 000 of 20 000 tokens is still
//! within budget); the runtime cap is breached when the monotonic clock reaches it. The
//! guard only decides; the step supervisor does the killing.
//!
//! Spend comes two ways: what the maker *reports* on fd 3 ([`BudgetGuard::charge`]) and
//! what a meter steward runs itself *measures* ([`BudgetGuard::meter`], the model
//! gateway's). The budget counts the larger of the two for each resource, so a maker that
//! forgets or under-reports is still held to its caps, and one that reports what the
//! meter also saw is not charged twice; [`BudgetGuard::misreported`] says when the
//! reports fell short.

use std::fmt;
use std::time::Duration;

// tokio's clock (the system's, but for a runtime whose time a test has paused): the
// runtime cap and the runtime figure go by the same clock as the step's timers.
use tokio::time::Instant;

use serde::Serialize;

use crate::control::Resource;

/// A workflow's caps, as validated from `[budget]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Caps {
    pub max_tokens: u64,
    pub max_tool_calls: u64,
    pub max_runtime: Duration,
    pub max_cost_usd: f64,
    /// No tick, charge or output for this long ends the run stagnated.
    pub stall_timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
}

impl Caps {
    /// The caps as `STEWARD_BUDGET_<CAP>` env entries, so an agent can wind down in time.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("STEWARD_BUDGET_TOKENS".into(), self.max_tokens.to_string()),
            (
                "STEWARD_BUDGET_TOOL_CALLS".into(),
                self.max_tool_calls.to_string(),
            ),
            (
                "STEWARD_BUDGET_RUNTIME_S".into(),
                fmt_secs(self.max_runtime),
            ),
            (
                "STEWARD_BUDGET_COST_USD".into(),
                self.max_cost_usd.to_string(),
            ),
        ]
    }
}

/// Which cap was crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cap {
    Tokens,
    ToolCalls,
    Runtime,
    CostUsd,
    /// `memory_max`, held by the step's memory cgroup (the kernel killed a process).
    Memory,
}

impl Cap {
    pub fn name(self) -> &'static str {
        match self {
            Cap::Tokens => "tokens",
            Cap::ToolCalls => "tool_calls",
            Cap::Runtime => "runtime_s",
            Cap::CostUsd => "cost_usd",
            Cap::Memory => "memory",
        }
    }
}

/// A breach: the cap and the figures, e.g. `tokens 20412/20000`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Breach {
    pub cap: Cap,
    pub used: String,
    pub limit: String,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.cap.name(), self.used, self.limit)
    }
}

/// What an attempt consumed so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Figures {
    pub tokens: u64,
    pub tool_calls: u64,
    pub cost_usd: f64,
    pub runtime_ms: u64,
}

#[derive(Debug)]
pub struct BudgetGuard {
    caps: Caps,
    started: Instant,
    /// What the maker reported on fd 3.
    reported: Tally,
    /// What steward measured itself.
    metered: Tally,
}

/// Running sums of one source of spend.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    tokens: u64,
    tool_calls: u64,
    cost_usd: f64,
}

impl Tally {
    fn add(&mut self, resource: Resource, amount: f64) {
        match resource {
            Resource::Tokens => self.tokens = self.tokens.saturating_add(amount as u64),
            Resource::ToolCalls => self.tool_calls = self.tool_calls.saturating_add(amount as u64),
            // Saturate like the counters: two huge charges must not make +inf, which
            // JSON cannot hold (the run record would not read back).
            Resource::CostUsd => self.cost_usd = (self.cost_usd + amount).min(f64::MAX),
        }
    }

    /// The larger of each figure.
    fn max(self, other: Tally) -> Tally {
        Tally {
            tokens: self.tokens.max(other.tokens),
            tool_calls: self.tool_calls.max(other.tool_calls),
            cost_usd: self.cost_usd.max(other.cost_usd),
        }
    }
}

/// What an attempt may still spend of its token and cost caps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Left {
    pub tokens: u64,
    pub cost_usd: f64,
}

/// An attempt's headroom, shared between its step (which publishes what its guard leaves
/// after every charge) and a meter that must decide *before* spending — the model
/// gateway, which reserves each call's worst case out of it.
#[derive(Debug, Clone)]
pub struct Headroom(std::sync::Arc<std::sync::Mutex<Room>>);

#[derive(Debug)]
struct Room {
    /// What the guard leaves, as the step last published it (less charges sent since).
    left: Left,
    /// Reserved by calls in flight.
    reserved: Left,
}

impl Headroom {
    pub fn new(left: Left) -> Headroom {
        let none = Left {
            tokens: 0,
            cost_usd: 0.0,
        };
        Headroom(std::sync::Arc::new(std::sync::Mutex::new(Room {
            left,
            reserved: none,
        })))
    }

    fn room(&self) -> std::sync::MutexGuard<'_, Room> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The step's guard was charged: this is what it leaves now.
    pub fn publish(&self, left: Left) {
        self.room().left = left;
    }

    /// Reserves what `decide` asks of what is free (left less reserved), atomically, so
    /// two calls in flight cannot both take the last of the budget. Returns `decide`'s
    /// answer and what it took, to [`Headroom::settle`] later.
    pub fn reserve<T, E>(
        &self,
        decide: impl FnOnce(Left) -> Result<(T, Left), E>,
    ) -> Result<(T, Left), E> {
        let mut room = self.room();
        let free = Left {
            tokens: room.left.tokens.saturating_sub(room.reserved.tokens),
            cost_usd: (room.left.cost_usd - room.reserved.cost_usd).max(0.0),
        };
        let (out, take) = decide(free)?;
        room.reserved.tokens += take.tokens;
        room.reserved.cost_usd += take.cost_usd;
        Ok((out, take))
    }

    /// A call ended: its reservation is freed, and what it spent is taken off at once
    /// (the step's guard will publish the same figure when it has counted the charge).
    pub fn settle(&self, reserved: Left, spent: Left) {
        let mut room = self.room();
        room.reserved.tokens = room.reserved.tokens.saturating_sub(reserved.tokens);
        room.reserved.cost_usd = (room.reserved.cost_usd - reserved.cost_usd).max(0.0);
        room.left.tokens = room.left.tokens.saturating_sub(spent.tokens);
        room.left.cost_usd = (room.left.cost_usd - spent.cost_usd).max(0.0);
    }
}

/// Float sums of cents drift (0.1 + 0.2 > 0.3); a charge this close to the cap is at it.
const COST_EPSILON: f64 = 1e-9;

impl BudgetGuard {
    pub fn new(caps: Caps) -> Self {
        BudgetGuard {
            caps,
            started: Instant::now(),
            reported: Tally::default(),
            metered: Tally::default(),
        }
    }

    /// Adds a charge the maker reported and reports a breach if it took usage over the cap.
    pub fn charge(&mut self, resource: Resource, amount: f64) -> Option<Breach> {
        self.reported.add(resource, amount);
        self.breach(resource)
    }

    /// Adds spend steward measured itself (a model call through the gateway) and reports
    /// a breach if it took usage over the cap.
    pub fn meter(&mut self, resource: Resource, amount: f64) -> Option<Breach> {
        self.metered.add(resource, amount);
        self.breach(resource)
    }

    /// What counts: the larger of reported and metered, per resource.
    fn counted(&self) -> Tally {
        self.reported.max(self.metered)
    }

    fn breach(&self, resource: Resource) -> Option<Breach> {
        let used = self.counted();
        match resource {
            Resource::Tokens => (used.tokens > self.caps.max_tokens).then(|| Breach {
                cap: Cap::Tokens,
                used: used.tokens.to_string(),
                limit: self.caps.max_tokens.to_string(),
            }),
            Resource::ToolCalls => (used.tool_calls > self.caps.max_tool_calls).then(|| Breach {
                cap: Cap::ToolCalls,
                used: used.tool_calls.to_string(),
                limit: self.caps.max_tool_calls.to_string(),
            }),
            Resource::CostUsd => {
                (used.cost_usd > self.caps.max_cost_usd + COST_EPSILON).then(|| Breach {
                    cap: Cap::CostUsd,
                    used: fmt_usd(used.cost_usd),
                    limit: fmt_usd(self.caps.max_cost_usd),
                })
            }
        }
    }

    /// Where the maker's reports fell short of what steward measured: e.g.
    /// `reported tokens 0 of 1500 metered`; None when they did not (or nothing was
    /// metered).
    pub fn misreported(&self) -> Option<String> {
        let (r, m) = (self.reported, self.metered);
        let mut short = Vec::new();
        if r.tokens < m.tokens {
            short.push(format!("tokens {} of {} metered", r.tokens, m.tokens));
        }
        if r.tool_calls < m.tool_calls {
            short.push(format!(
                "tool_calls {} of {} metered",
                r.tool_calls, m.tool_calls
            ));
        }
        if r.cost_usd + COST_EPSILON < m.cost_usd {
            short.push(format!(
                "cost_usd {} of {} metered",
                fmt_usd(r.cost_usd),
                fmt_usd(m.cost_usd)
            ));
        }
        (!short.is_empty()).then(|| format!("reported {}", short.join(", ")))
    }

    /// What the token and cost caps leave (nothing once a cap is passed).
    pub fn left(&self) -> Left {
        let used = self.counted();
        Left {
            tokens: self.caps.max_tokens.saturating_sub(used.tokens),
            cost_usd: (self.caps.max_cost_usd - used.cost_usd).max(0.0),
        }
    }

    /// The breach of a spend that was refused before it happened (the gateway would not
    /// forward a call the budget cannot cover): the cap, and what it would have reached.
    pub fn refused(&self, cap: Cap, asked: f64) -> Breach {
        let used = self.counted();
        match cap {
            Cap::CostUsd => Breach {
                cap,
                used: fmt_usd(used.cost_usd + asked),
                limit: fmt_usd(self.caps.max_cost_usd),
            },
            _ => Breach {
                cap: Cap::Tokens,
                used: (used.tokens + asked as u64).to_string(),
                limit: self.caps.max_tokens.to_string(),
            },
        }
    }

    /// The monotonic instant at which the runtime cap is reached.
    pub fn deadline(&self) -> Instant {
        self.started + self.caps.max_runtime
    }

    pub fn runtime_breach(&self) -> Breach {
        Breach {
            cap: Cap::Runtime,
            used: fmt_secs(self.started.elapsed()),
            limit: fmt_secs(self.caps.max_runtime),
        }
    }

    /// What the attempt consumed, as the budget counts it.
    pub fn figures(&self) -> Figures {
        let used = self.counted();
        Figures {
            tokens: used.tokens,
            tool_calls: used.tool_calls,
            cost_usd: used.cost_usd,
            runtime_ms: self.started.elapsed().as_millis() as u64,
        }
    }
}

fn fmt_usd(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

fn fmt_secs(d: Duration) -> String {
    let s = format!("{:.3}", d.as_secs_f64());
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps {
            max_tokens: 100,
            max_tool_calls: 2,
            max_runtime: Duration::from_secs(5),
            max_cost_usd: 0.3,
            stall_timeout: None,
            kill_grace: Duration::from_secs(1),
        }
    }

    #[test]
    fn at_the_cap_is_within_budget_and_over_it_is_a_breach() {
        let mut g = BudgetGuard::new(caps());
        assert_eq!(g.charge(Resource::Tokens, 100.0), None);
        let b = g.charge(Resource::Tokens, 1.0).expect("breach");
        assert_eq!(b.to_string(), "tokens 101/100");
    }

    #[test]
    fn cents_that_sum_to_the_cap_do_not_breach() {
        let mut g = BudgetGuard::new(caps());
        assert_eq!(g.charge(Resource::CostUsd, 0.1), None);
        assert_eq!(g.charge(Resource::CostUsd, 0.2), None);
        assert_eq!(
            g.charge(Resource::CostUsd, 0.01).map(|b| b.to_string()),
            Some("cost_usd 0.31/0.3".into())
        );
    }

    #[test]
    fn tool_calls_breach_on_the_third_of_two() {
        let mut g = BudgetGuard::new(caps());
        assert!(g.charge(Resource::ToolCalls, 1.0).is_none());
        assert!(g.charge(Resource::ToolCalls, 1.0).is_none());
        assert_eq!(
            g.charge(Resource::ToolCalls, 1.0).map(|b| b.cap),
            Some(Cap::ToolCalls)
        );
    }

    /// Found by the control-line fuzz target: 1e308 twice made the figure +inf.
    #[test]
    fn huge_cost_charges_saturate_and_stay_finite() {
        let mut g = BudgetGuard::new(caps());
        assert!(g.charge(Resource::CostUsd, 1e308).is_some());
        assert!(g.charge(Resource::CostUsd, 1e308).is_some());
        let figures = g.figures();
        assert!(figures.cost_usd.is_finite());
        let json = serde_json::to_string(&figures).unwrap();
        let back: Figures = serde_json::from_str(&json).expect("figures read back");
        assert_eq!(back.cost_usd, f64::MAX);
    }

    #[test]
    fn the_budget_counts_the_larger_of_metered_and_reported_spend() {
        let mut g = BudgetGuard::new(caps());
        // A maker that reports nothing is still held to its caps by the meter.
        assert!(g.meter(Resource::Tokens, 60.0).is_none());
        assert_eq!(g.figures().tokens, 60);
        assert_eq!(
            g.misreported().as_deref(),
            Some("reported tokens 0 of 60 metered")
        );
        // Reporting what the meter saw is not charged twice.
        assert!(g.charge(Resource::Tokens, 60.0).is_none());
        assert_eq!(g.figures().tokens, 60);
        assert_eq!(g.misreported(), None);
        // The meter alone takes it over the cap.
        let breach = g.meter(Resource::Tokens, 41.0).expect("over 100");
        assert_eq!((breach.cap, breach.used.as_str()), (Cap::Tokens, "101"));
        // Reports above the meter count too (work the meter cannot see).
        let mut g = BudgetGuard::new(caps());
        g.meter(Resource::CostUsd, 0.1);
        assert!(g.charge(Resource::CostUsd, 0.35).is_some());
        assert_eq!(g.misreported(), None);
    }
}
