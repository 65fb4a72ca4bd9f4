//! BudgetGuard: the four hard caps of one attempt (tokens, tool calls, runtime, cost),
//! counted across its run and verify steps.
//!
//! A cap is breached the moment usage goes *over* it (20 000 of 20 000 tokens is still
//! within budget); the runtime cap is breached when the monotonic clock reaches it. The
//! guard only decides; the step supervisor does the killing.

use std::fmt;
use std::time::{Duration, Instant};

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
    tokens: u64,
    tool_calls: u64,
    cost_usd: f64,
}

/// Float sums of cents drift (0.1 + 0.2 > 0.3); a charge this close to the cap is at it.
const COST_EPSILON: f64 = 1e-9;

impl BudgetGuard {
    pub fn new(caps: Caps) -> Self {
        BudgetGuard {
            caps,
            started: Instant::now(),
            tokens: 0,
            tool_calls: 0,
            cost_usd: 0.0,
        }
    }

    /// Adds a charge and reports a breach if it took usage over the cap.
    pub fn charge(&mut self, resource: Resource, amount: f64) -> Option<Breach> {
        match resource {
            Resource::Tokens => {
                self.tokens = self.tokens.saturating_add(amount as u64);
                (self.tokens > self.caps.max_tokens).then(|| Breach {
                    cap: Cap::Tokens,
                    used: self.tokens.to_string(),
                    limit: self.caps.max_tokens.to_string(),
                })
            }
            Resource::ToolCalls => {
                self.tool_calls = self.tool_calls.saturating_add(amount as u64);
                (self.tool_calls > self.caps.max_tool_calls).then(|| Breach {
                    cap: Cap::ToolCalls,
                    used: self.tool_calls.to_string(),
                    limit: self.caps.max_tool_calls.to_string(),
                })
            }
            Resource::CostUsd => {
                // Saturate like the counters: two huge charges must not make +inf, which
                // JSON cannot hold (the run record would not read back).
                self.cost_usd = (self.cost_usd + amount).min(f64::MAX);
                (self.cost_usd > self.caps.max_cost_usd + COST_EPSILON).then(|| Breach {
                    cap: Cap::CostUsd,
                    used: fmt_usd(self.cost_usd),
                    limit: fmt_usd(self.caps.max_cost_usd),
                })
            }
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

    pub fn figures(&self) -> Figures {
        Figures {
            tokens: self.tokens,
            tool_calls: self.tool_calls,
            cost_usd: self.cost_usd,
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
}
