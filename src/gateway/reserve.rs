//! Before a call: reserve its worst case, and lower its output limit to what the budget has
//! left. After it: what to charge. Together these make the gateway fail closed — a call
//! the budget cannot cover is refused before it reaches the provider, and a call that
//! says nothing of its usage is charged all it could have spent.
//!
//! The input is bounded by half the request's bytes: provider tokenizers average three to
//! four bytes of text a token, dense text (hex, base64, CJK) comes closer to two, and the
//! JSON around a prompt is not counted by the provider at all. The output is bounded by
//! the request's own limit (`max_completion_tokens` or `max_tokens` for OpenAI chat,
//! `max_output_tokens` for responses, `max_tokens` for Anthropic), lowered — or set, where
//! the request leaves it open — to what the budget leaves after the input.

use serde_json::Value;

use super::keys::Call;
use super::meter::{Price, Provider};
use crate::control::Resource;

/// What a call may spend at most, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub input: u64,
    pub output: u64,
}

impl Reservation {
    pub fn tokens(&self) -> u64 {
        self.input + self.output
    }
}

/// The output-limit fields a request of `endpoint` may carry, the first the one steward
/// sets when the request has none.
fn limit_fields(provider: Provider, endpoint: &str) -> &'static [&'static str] {
    match (provider, endpoint) {
        (Provider::Openai, "chat/completions") => &["max_completion_tokens", "max_tokens"],
        (Provider::Openai, "responses") => &["max_output_tokens"],
        (Provider::Anthropic, "messages") => &["max_tokens"],
        _ => &[],
    }
}

/// Reserves `request`'s worst case within `tokens_left`, lowering (or setting) its output
/// limit so the provider cannot generate past the budget. Err says why the budget cannot
/// cover even the input.
pub fn prepare(
    provider: Provider,
    endpoint: &str,
    request: &mut Value,
    request_bytes: usize,
    tokens_left: u64,
) -> Result<Reservation, String> {
    let input = (request_bytes as u64).div_ceil(2);
    if input >= tokens_left {
        return Err(format!(
            "the run's token budget has {tokens_left} left, and this request's input alone may take up to {input}"
        ));
    }
    let room = tokens_left - input;
    let fields = limit_fields(provider, endpoint);
    let Some(obj) = request.as_object_mut() else {
        return Err("the request is not a JSON object".into());
    };
    let asked = fields.iter().filter_map(|f| obj.get(*f)?.as_u64()).min();
    let output = asked.map_or(room, |a| a.min(room));
    for field in fields {
        if obj.contains_key(*field) {
            obj.insert(field.to_string(), output.into());
        }
    }
    if asked.is_none() {
        if let Some(first) = fields.first() {
            obj.insert(first.to_string(), output.into());
        }
    }
    Ok(Reservation { input, output })
}

/// What a finished call charges the run: its tokens (or, when it reported no usage, its
/// whole reservation), its tool calls, and its cost at `price` (the reservation priced
/// as output, the dearer side, when there was no usage).
pub fn charges(call: &Call, reserved: Reservation, price: Option<&Price>) -> Vec<(Resource, f64)> {
    let (tokens, cost) = match call.metered.usage {
        Some(u) => (u.total(), price.map(|p| p.cost(&u))),
        None => (
            reserved.tokens(),
            price.map(|p| reserved.tokens() as f64 * p.input.max(p.output) / 1e6),
        ),
    };
    let mut out = vec![(Resource::Tokens, tokens as f64)];
    if call.metered.tool_calls > 0 {
        out.push((Resource::ToolCalls, call.metered.tool_calls as f64));
    }
    if let Some(cost) = cost {
        out.push((Resource::CostUsd, cost));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::meter::{Metered, Usage};
    use serde_json::json;

    #[test]
    fn an_output_limit_is_lowered_to_what_the_budget_leaves() {
        let mut req = json!({"model": "m", "max_tokens": 4096, "messages": []});
        let r = prepare(Provider::Anthropic, "messages", &mut req, 200, 1100).unwrap();
        assert_eq!(
            r,
            Reservation {
                input: 100,
                output: 1000
            }
        );
        assert_eq!(req["max_tokens"], 1000);
        // Within the budget, the request's own limit stands.
        let mut req = json!({"model": "m", "max_tokens": 50});
        let r = prepare(Provider::Anthropic, "messages", &mut req, 200, 1100).unwrap();
        assert_eq!((r.output, req["max_tokens"].clone()), (50, json!(50)));
    }

    #[test]
    fn an_open_output_limit_is_set_and_every_limit_field_present_is_lowered() {
        let mut req = json!({"model": "m", "messages": []});
        prepare(Provider::Openai, "chat/completions", &mut req, 100, 550).unwrap();
        assert_eq!(req["max_completion_tokens"], 500);
        let mut req = json!({"model": "m", "max_tokens": 9000, "max_completion_tokens": 8000});
        prepare(Provider::Openai, "chat/completions", &mut req, 100, 550).unwrap();
        assert_eq!(
            (
                req["max_tokens"].clone(),
                req["max_completion_tokens"].clone()
            ),
            (json!(500), json!(500))
        );
        let mut req = json!({"model": "m", "input": "x"});
        prepare(Provider::Openai, "responses", &mut req, 100, 550).unwrap();
        assert_eq!(req["max_output_tokens"], 500);
        // Embeddings have no output: only the input is reserved.
        let mut req = json!({"model": "m", "input": "x"});
        let r = prepare(Provider::Openai, "embeddings", &mut req, 100, 550).unwrap();
        assert_eq!(req.get("max_tokens"), None);
        assert_eq!(r.input, 50);
    }

    #[test]
    fn a_budget_that_cannot_cover_the_input_refuses_the_call() {
        let mut req = json!({"model": "m"});
        let e = prepare(Provider::Openai, "chat/completions", &mut req, 2000, 1000).unwrap_err();
        assert!(e.contains("1000 left"), "{e}");
    }

    fn call(usage: Option<Usage>, tool_calls: u64) -> Call {
        Call {
            provider: Provider::Openai,
            model: "m".into(),
            metered: Metered {
                usage,
                tool_calls,
                model: None,
            },
            status: 200,
            latency_ms: 1,
        }
    }

    #[test]
    fn a_call_is_charged_its_usage_or_else_its_whole_reservation() {
        let price = Price {
            input: 1.0,
            output: 4.0,
            cached_input: Some(0.5),
        };
        let reserved = Reservation {
            input: 100,
            output: 900,
        };
        let used = Usage {
            input: 200,
            cached_input: 1000,
            output: 300,
        };
        let got = charges(&call(Some(used), 2), reserved, Some(&price));
        assert_eq!(got[0], (Resource::Tokens, 1500.0));
        assert_eq!(got[1], (Resource::ToolCalls, 2.0));
        assert!((got[2].1 - (200.0 + 500.0 + 1200.0) / 1e6).abs() < 1e-12);
        // No usage reported: the reservation, priced at the dearer rate.
        let got = charges(&call(None, 0), reserved, Some(&price));
        assert_eq!(got[0], (Resource::Tokens, 1000.0));
        assert!((got[1].1 - 1000.0 * 4.0 / 1e6).abs() < 1e-12);
        // No price: tokens and tool calls only.
        assert_eq!(charges(&call(Some(used), 0), reserved, None).len(), 1);
    }
}
