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

use super::meter::{Metered, Price, Provider};
use crate::budget::{Cap, Left};
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

/// Why a request's worst case cannot be reserved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreservable {
    #[error(
        "the run's token budget has {left} left, and this request's input alone may take up to {input}"
    )]
    InputPastBudget { left: u64, input: u64 },
    #[error("the request is not a JSON object")]
    NotAnObject,
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
) -> Result<Reservation, Unreservable> {
    let input = (request_bytes as u64).div_ceil(2);
    if input >= tokens_left {
        return Err(Unreservable::InputPastBudget {
            left: tokens_left,
            input,
        });
    }
    let room = tokens_left - input;
    let fields = limit_fields(provider, endpoint);
    let Some(obj) = request.as_object_mut() else {
        return Err(Unreservable::NotAnObject);
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

/// A call refused before it was forwarded, because the budget could not cover it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub provider: Provider,
    pub model: String,
    /// The cap that could not cover it, and what of that cap the call asked at least.
    pub cap: Cap,
    pub asked: f64,
    pub why: String,
}

/// The dearest rate of `price`, USD per token: what a token of unknown kind may cost.
fn dearest(price: &Price) -> f64 {
    price
        .input
        .max(price.output)
        .max(price.cached_input.unwrap_or(0.0))
        / 1e6
}

/// Reserves `request`'s worst case out of what the budget has `free`: its tokens, and —
/// at the model's dearest rate — its cost. Returns the reservation and what it takes of
/// the headroom, or the refusal when even the input may not fit.
pub fn within(
    provider: Provider,
    endpoint: &str,
    model: &str,
    request: &mut Value,
    request_bytes: usize,
    free: Left,
    price: Option<&Price>,
) -> Result<(Reservation, Left), Refusal> {
    let per_token = price.map(dearest).filter(|r| *r > 0.0);
    let by_cost = per_token.map_or(u64::MAX, |r| (free.cost_usd / r).floor() as u64);
    let tokens_left = free.tokens.min(by_cost);
    match prepare(provider, endpoint, request, request_bytes, tokens_left) {
        Ok(r) => Ok((
            r,
            Left {
                tokens: r.tokens(),
                cost_usd: per_token.map_or(0.0, |rate| r.tokens() as f64 * rate),
            },
        )),
        Err(why) => {
            let input = (request_bytes as u64).div_ceil(2);
            let (cap, asked, why) = if by_cost < free.tokens {
                let cost = input as f64 * per_token.unwrap_or(0.0);
                (
                    Cap::CostUsd,
                    cost,
                    format!(
                        "the run's cost budget has ${:.6} left, and this request's input alone may cost ${cost:.6}",
                        free.cost_usd
                    ),
                )
            } else {
                (Cap::Tokens, input as f64, why.to_string())
            };
            Err(Refusal {
                provider,
                model: model.to_string(),
                cap,
                asked,
                why,
            })
        }
    }
}

/// What a finished call charges the run: its tokens (or, when it reported no usage, its
/// whole reservation), its tool calls, and its cost at `price` (the reservation priced
/// as output, the dearer side, when there was no usage).
pub fn charges(
    metered: &Metered,
    reserved: Option<Reservation>,
    price: Option<&Price>,
) -> Vec<(Resource, f64)> {
    let (tokens, cost) = match (metered.usage, reserved) {
        (Some(u), _) => (u.total(), price.map(|p| p.cost(&u))),
        (None, Some(r)) => (r.tokens(), price.map(|p| r.tokens() as f64 * dearest(p))),
        (None, None) => (0, None),
    };
    let mut out = vec![(Resource::Tokens, tokens as f64)];
    if metered.tool_calls > 0 {
        out.push((Resource::ToolCalls, metered.tool_calls as f64));
    }
    if let Some(cost) = cost {
        out.push((Resource::CostUsd, cost));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metering::meter::Usage;
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
        assert_eq!(
            e,
            Unreservable::InputPastBudget {
                left: 1000,
                input: 1000
            }
        );
        assert!(e.to_string().contains("1000 left"), "{e}");
    }

    fn call(usage: Option<Usage>, tool_calls: u64) -> Metered {
        Metered {
            usage,
            tool_calls,
            model: None,
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
        let got = charges(&call(Some(used), 2), Some(reserved), Some(&price));
        assert_eq!(got[0], (Resource::Tokens, 1500.0));
        assert_eq!(got[1], (Resource::ToolCalls, 2.0));
        assert!((got[2].1 - (200.0 + 500.0 + 1200.0) / 1e6).abs() < 1e-12);
        // No usage reported: the reservation, priced at the dearer rate.
        let got = charges(&call(None, 0), Some(reserved), Some(&price));
        assert_eq!(got[0], (Resource::Tokens, 1000.0));
        assert!((got[1].1 - 1000.0 * 4.0 / 1e6).abs() < 1e-12);
        // No price: tokens and tool calls only.
        assert_eq!(charges(&call(Some(used), 0), Some(reserved), None).len(), 1);
    }

    #[test]
    fn the_cost_left_bounds_the_reservation_at_the_dearest_rate() {
        let price = Price {
            input: 1.0,
            output: 4.0,
            cached_input: None,
        };
        // $0.004 at $4/Mtok is 1000 tokens, fewer than the 5000 the token cap leaves.
        let free = Left {
            tokens: 5000,
            cost_usd: 0.004,
        };
        let mut req = json!({"model": "m", "max_tokens": 4096});
        let (r, take) = within(
            Provider::Anthropic,
            "messages",
            "m",
            &mut req,
            200,
            free,
            Some(&price),
        )
        .unwrap();
        assert_eq!(
            (r.input, r.output, req["max_tokens"].clone()),
            (100, 900, json!(900))
        );
        assert!((take.cost_usd - 0.004).abs() < 1e-12, "{take:?}");
        // Less than the input can cost: refused, on the cost cap.
        let free = Left {
            tokens: 5000,
            cost_usd: 0.0003,
        };
        let refusal = within(
            Provider::Anthropic,
            "messages",
            "m",
            &mut req,
            200,
            free,
            Some(&price),
        )
        .unwrap_err();
        assert_eq!(refusal.cap, Cap::CostUsd);
        assert!(refusal.why.contains("cost budget"), "{}", refusal.why);
        // A free model is held by its tokens only.
        let free_model = Price::default();
        let free = Left {
            tokens: 50,
            cost_usd: 0.0,
        };
        let refusal = within(
            Provider::Anthropic,
            "messages",
            "m",
            &mut req,
            200,
            free,
            Some(&free_model),
        )
        .unwrap_err();
        assert_eq!(refusal.cap, Cap::Tokens);
    }
}
