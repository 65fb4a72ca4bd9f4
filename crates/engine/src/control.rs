//! The fd-3 control channel: one line per message from a running step.
//!
//! `charge tokens 1200` · `charge tool_calls 1` · `charge cost_usd 0.013` · `tick` ·
//! `noop` · `block <reason>` · `note <text>` · `confidence high|medium|low`.
//! A line that does not parse is reported by the caller and ignored, never fatal.

use std::fmt;

/// A countable resource a step charges against its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Tokens,
    ToolCalls,
    CostUsd,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Tokens => "tokens",
            Resource::ToolCalls => "tool_calls",
            Resource::CostUsd => "cost_usd",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Whole units for tokens and tool calls; dollars for cost.
    Charge(Resource, f64),
    Tick,
    Noop,
    Block(String),
    Note(String),
    Confidence(String),
    /// A named sub-step of a step, logged as its own runlog record: `step NAME STATUS DETAIL`.
    Step {
        name: String,
        status: String,
        detail: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest control line kept; longer ones are reported as malformed.
pub const MAX_LINE: usize = 4096;

pub fn parse(line: &str) -> Result<Message, ParseError> {
    let line = line.trim();
    let (word, rest) = match line.split_once(char::is_whitespace) {
        Some((w, r)) => (w, r.trim()),
        None => (line, ""),
    };
    let bad = |why: &str| Err(ParseError(format!("{why}: `{}`", shorten(line))));
    match word {
        "tick" if rest.is_empty() => Ok(Message::Tick),
        "noop" if rest.is_empty() => Ok(Message::Noop),
        "block" => Ok(Message::Block(if rest.is_empty() {
            "blocked (no reason given)".to_string()
        } else {
            rest.to_string()
        })),
        "note" => Ok(Message::Note(rest.to_string())),
        "confidence" => match rest {
            "high" | "medium" | "low" => Ok(Message::Confidence(rest.to_string())),
            _ => bad("confidence must be high, medium or low"),
        },
        "step" => {
            let mut parts = rest.splitn(3, char::is_whitespace);
            let (Some(name), Some(status)) = (parts.next(), parts.next()) else {
                return bad("expected `step NAME STATUS [DETAIL]`");
            };
            let word_ok = |w: &str| {
                !w.is_empty()
                    && w.len() <= 64
                    && w.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            };
            if !word_ok(name) || !word_ok(status) {
                return bad("step NAME and STATUS are words of a-z, 0-9, `_`, `-`");
            }
            Ok(Message::Step {
                name: name.to_string(),
                status: status.to_string(),
                detail: parts.next().unwrap_or("").trim().to_string(),
            })
        }
        "charge" => {
            let mut parts = rest.split_whitespace();
            let (Some(what), Some(amount), None) = (parts.next(), parts.next(), parts.next())
            else {
                return bad("expected `charge tokens|tool_calls|cost_usd AMOUNT`");
            };
            let resource = match what {
                "tokens" => Resource::Tokens,
                "tool_calls" => Resource::ToolCalls,
                "cost_usd" => Resource::CostUsd,
                _ => return bad("unknown resource (tokens, tool_calls or cost_usd)"),
            };
            let value = if resource == Resource::CostUsd {
                amount
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
            } else {
                amount.parse::<u64>().ok().map(|v| v as f64)
            };
            match value {
                Some(v) => Ok(Message::Charge(resource, v)),
                None => {
                    bad("amount must be a non-negative number (whole for tokens and tool_calls)")
                }
            }
        }
        _ => bad("unknown control message"),
    }
}

fn shorten(s: &str) -> String {
    if s.chars().count() > 80 {
        let head: String = s.chars().take(80).collect();
        format!("{head}…")
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_message() {
        assert_eq!(
            parse("charge tokens 1200"),
            Ok(Message::Charge(Resource::Tokens, 1200.0))
        );
        assert_eq!(
            parse("charge tool_calls 1"),
            Ok(Message::Charge(Resource::ToolCalls, 1.0))
        );
        assert_eq!(
            parse("charge cost_usd 0.013"),
            Ok(Message::Charge(Resource::CostUsd, 0.013))
        );
        assert_eq!(parse("tick"), Ok(Message::Tick));
        assert_eq!(parse("noop"), Ok(Message::Noop));
        assert_eq!(
            parse("block no input today"),
            Ok(Message::Block("no input today".into()))
        );
        assert_eq!(parse("note hello"), Ok(Message::Note("hello".into())));
        assert_eq!(
            parse("confidence low"),
            Ok(Message::Confidence("low".into()))
        );
    }

    #[test]
    fn rejects_malformed_lines() {
        for line in [
            "",
            "charge",
            "charge tokens",
            "charge tokens -5",
            "charge tokens 1.5",
            "charge cost_usd NaN",
            "charge cost_usd -0.1",
            "charge gold 3",
            "charge tokens 1 2",
            "tickle",
            "tick now",
            "confidence very",
            "\u{0}",
        ] {
            assert!(parse(line).is_err(), "{line:?} should be rejected");
        }
    }
}
