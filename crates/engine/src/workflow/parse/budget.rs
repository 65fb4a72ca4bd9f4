//! A workflow's `[budget]`, its spend `[budget.window]`, its resource limits and its
//! `[expect]` switch: every cap a concrete, non-negative number in its unit.

use super::*;

impl Validator<'_> {
    pub(super) fn budget(&mut self, raw: Option<Spanned<RawBudget>>) -> Option<Caps> {
        let Some(raw) = raw else {
            self.missing("missing [budget]: every workflow states max_tokens, max_tool_calls, max_runtime_s and max_cost_usd (use 0 for a resource it never uses)");
            return None;
        };
        let span = raw.span();
        let b = raw.into_inner();
        let before = self.errors.len();
        let tokens = self.count(&span, "max_tokens", b.max_tokens);
        let tool_calls = self.count(&span, "max_tool_calls", b.max_tool_calls);
        let runtime = self.seconds(&span, "max_runtime_s", b.max_runtime_s, true);
        let cost = self.amount(&span, "max_cost_usd", b.max_cost_usd);
        let stall = b
            .stall_timeout_s
            .map(|s| self.seconds(&span, "stall_timeout_s", Some(s), true));
        let grace = b
            .kill_grace_s
            .map(|s| self.seconds(&span, "kill_grace_s", Some(s), false));
        if self.errors.len() != before {
            return None;
        }
        Some(Caps {
            max_tokens: tokens?,
            max_tool_calls: tool_calls?,
            max_runtime: runtime?,
            max_cost_usd: cost?,
            stall_timeout: stall.flatten(),
            kill_grace: grace
                .flatten()
                .unwrap_or(Duration::from_secs_f64(DEFAULT_KILL_GRACE_S)),
        })
    }

    /// `[budget.window]`: a period and at least one sum to hold it to.
    pub(super) fn window(&mut self, raw: &Spanned<RawWindow>) -> Option<SpendWindow> {
        let w = raw.get_ref();
        let period = match humantime::parse_duration(w.period.get_ref()) {
            Ok(p) if !p.is_zero() => Some(p),
            _ => {
                self.err(
                    w.period.span(),
                    format!(
                        "budget.window.period: `{}` is not a duration (e.g. \"24h\", \"7days\")",
                        w.period.get_ref()
                    ),
                );
                None
            }
        };
        let cost_usd = w.cost_usd.as_ref().map(|c| *c.get_ref());
        if let Some(c) = &w.cost_usd {
            if !(c.get_ref().is_finite() && *c.get_ref() >= 0.0) {
                self.err(
                    c.span(),
                    "budget.window.cost_usd must be a number zero or more",
                );
            }
        }
        if cost_usd.is_none() && w.tokens.is_none() && w.runs.is_none() {
            self.err(
                raw.span(),
                "[budget.window] needs at least one of cost_usd, tokens, runs (the sums it holds the workflow to)",
            );
            return None;
        }
        Some(SpendWindow {
            period: period?,
            cost_usd,
            tokens: w.tokens,
            runs: w.runs,
        })
    }

    /// `[expect] within` (a schedule's) and `at_least` (a file's or queue's).
    pub(super) fn expect(
        &mut self,
        raw: Spanned<RawExpect>,
        trigger: Option<&Trigger>,
    ) -> Option<Expect> {
        let span = raw.span();
        let e = raw.into_inner();
        let within_at = e.within.as_ref().map_or(span.clone(), |w| w.span());
        let within = e
            .within
            .and_then(|w| match humantime::parse_duration(w.get_ref()) {
                Ok(d) if !d.is_zero() => Some(d),
                _ => {
                    self.err(
                        w.span(),
                        format!(
                            "expect.within: `{}` is not a duration (e.g. \"15m\", \"2h\")",
                            w.get_ref()
                        ),
                    );
                    None
                }
            });
        let at_least = e.at_least.and_then(|a| match parse_rate(a.get_ref()) {
            Some(r) => Some(r),
            None => {
                self.err(
                    a.span(),
                    format!("expect.at_least: `{}` is not a rate: expected COUNT/PERIOD, e.g. \"1/day\", \"4/hour\", \"2/12h\"", a.get_ref()),
                );
                None
            }
        });
        if within.is_some() && !matches!(trigger, Some(Trigger::Schedule(_))) {
            self.err(within_at, "expect.within is for a schedule (it counts from each slot); a file, queue or webhook workflow takes expect.at_least = \"1/day\"");
        }
        if within.is_none() && at_least.is_none() {
            self.err(
                span,
                "[expect] needs within = \"15m\" (a schedule) or at_least = \"1/day\"",
            );
            return None;
        }
        Some(Expect { within, at_least })
    }

    /// `memory_max`, `pids_max` and `cpu_weight` of `[budget]`: held by cgroups.
    pub(super) fn limits(&mut self, raw: &Spanned<RawBudget>) -> crate::limits::Limits {
        let b = raw.get_ref();
        let mut limits = crate::limits::Limits::default();
        if let Some(v) = &b.memory_max {
            match memory_bytes(v.get_ref()) {
                Some(bytes) => limits.memory_max = Some(bytes),
                None => self.err(
                    v.span(),
                    "budget.memory_max: expected bytes (an integer) or a size like \"512M\" or \"2G\" (K, M, G: powers of 1024), at least 1M",
                ),
            }
        }
        if let Some(v) = &b.pids_max {
            match u64::try_from(*v.get_ref()) {
                Ok(n) if n >= 1 => limits.pids_max = Some(n),
                _ => self.err(
                    v.span(),
                    "budget.pids_max: expected a whole number of processes, at least 1",
                ),
            }
        }
        if let Some(v) = &b.cpu_weight {
            match u32::try_from(*v.get_ref()) {
                Ok(n) if (1..=10_000).contains(&n) => limits.cpu_weight = Some(n),
                _ => self.err(
                    v.span(),
                    "budget.cpu_weight: expected 1 to 10000 (100 is an ordinary share)",
                ),
            }
        }
        limits
    }

    fn count(&mut self, table: &Range<usize>, name: &str, v: Option<Spanned<i64>>) -> Option<u64> {
        let Some(v) = v else {
            self.err(
                table.clone(),
                format!(
                    "budget.{name} is missing: every cap is a concrete number (0 if never used)"
                ),
            );
            return None;
        };
        match u64::try_from(*v.get_ref()) {
            Ok(n) => Some(n),
            Err(_) => {
                self.err(
                    v.span(),
                    format!("budget.{name} must be zero or more, got {}", v.get_ref()),
                );
                None
            }
        }
    }

    fn amount(&mut self, table: &Range<usize>, name: &str, v: Option<Spanned<f64>>) -> Option<f64> {
        let Some(v) = v else {
            self.err(
                table.clone(),
                format!(
                    "budget.{name} is missing: every cap is a concrete number (0 if never used)"
                ),
            );
            return None;
        };
        let x = *v.get_ref();
        if x.is_finite() && x >= 0.0 {
            Some(x)
        } else {
            self.err(
                v.span(),
                format!("budget.{name} must be a number zero or more, got {x}"),
            );
            None
        }
    }

    pub(super) fn seconds(
        &mut self,
        table: &Range<usize>,
        name: &str,
        v: Option<Spanned<f64>>,
        positive: bool,
    ) -> Option<Duration> {
        let Some(v) = v else {
            self.err(
                table.clone(),
                format!("budget.{name} is missing: every run is bounded in time"),
            );
            return None;
        };
        let x = *v.get_ref();
        // A year is far beyond any sane unattended step, and keeps Duration arithmetic safe.
        if x.is_finite() && (if positive { x > 0.0 } else { x >= 0.0 }) && x <= 31_536_000.0 {
            Some(Duration::from_secs_f64(x))
        } else {
            let want = if positive {
                "more than zero"
            } else {
                "zero or more"
            };
            self.err(
                v.span(),
                format!("{name} must be a number of seconds {want} (at most a year), got {x}"),
            );
            None
        }
    }
}

/// `memory_max` as bytes: an integer, or a number with K, M or G (powers of 1024).
fn memory_bytes(v: &toml::Value) -> Option<u64> {
    let bytes = match v {
        toml::Value::Integer(n) => u64::try_from(*n).ok()?,
        toml::Value::String(s) => {
            let s = s.trim();
            let (number, unit) = match s.char_indices().last()? {
                (i, c) if c.is_ascii_alphabetic() => (&s[..i], c.to_ascii_uppercase()),
                _ => (s, 'B'),
            };
            let scale: u64 = match unit {
                'B' => 1,
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return None,
            };
            number.trim().parse::<u64>().ok()?.checked_mul(scale)?
        }
        _ => return None,
    };
    (bytes >= 1 << 20).then_some(bytes)
}

/// `"1/day"`, `"4/hour"`, `"2/12h"`: (count, period).
fn parse_rate(text: &str) -> Option<(u32, Duration)> {
    let (n, per) = text.split_once('/')?;
    let n: u32 = n.trim().parse().ok().filter(|n| *n > 0)?;
    let per = per.trim();
    let period = match per {
        "minute" => Duration::from_secs(60),
        "hour" => Duration::from_secs(3600),
        "day" => Duration::from_secs(86_400),
        "week" => Duration::from_secs(7 * 86_400),
        _ => humantime::parse_duration(per)
            .ok()
            .filter(|d| !d.is_zero())?,
    };
    Some((n, period))
}
