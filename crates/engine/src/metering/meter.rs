//! What a model call really spent, read from the provider's response as it passes: the
//! tokens from its `usage`, the tool calls from its content, the cost from a price table.
//!
//! The shapes are the providers' documented ones:
//! - OpenAI chat completions: `usage.prompt_tokens` (cached ones included, counted in
//!   `prompt_tokens_details.cached_tokens`), `usage.completion_tokens`, and
//!   `choices[].message.tool_calls`. Streamed, usage comes in one last chunk (when the
//!   request asked for `stream_options.include_usage`) and tool calls as
//!   `choices[].delta.tool_calls[]` pieces, each call once with its `id`.
//! - OpenAI responses: `usage.input_tokens` (`input_tokens_details.cached_tokens`),
//!   `usage.output_tokens`, and `output[]` items of type `function_call` and the like;
//!   streamed, the `response.completed` event carries the whole response.
//! - OpenAI embeddings: `usage.prompt_tokens`.
//! - Anthropic messages: `usage.input_tokens` (uncached), `cache_read_input_tokens`,
//!   `cache_creation_input_tokens`, `output_tokens`, and `tool_use` content blocks.
//!   Streamed, `message_start` carries the usage so far and each `message_delta` the
//!   usage *so far* again: the latest figure of each field is the total, never the sum.
//!
//! Usage read twice is taken once: a stream's usage replaces, never adds (a final chunk
//! carrying both choices and usage is one chunk, not four).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Whose API a call speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    Openai,
    Anthropic,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// Tokens of one call. `input` counts the uncached input only; `cached_input` what the
/// provider served from its prompt cache (priced apart); `output` what it generated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input: u64,
    pub cached_input: u64,
    pub output: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input + self.cached_input + self.output
    }
}

/// What one call spent, as far as its response said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metered {
    /// None when the response carried no usage (a stream cut short, a provider that
    /// does not report it): the call is then charged what was reserved for it.
    pub usage: Option<Usage>,
    pub tool_calls: u64,
    pub model: Option<String>,
}

/// USD per million tokens, for one model (`[gateway.pricing]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Cached input; the input price when not given.
    #[serde(default)]
    pub cached_input: Option<f64>,
}

impl Price {
    /// The cost of `usage` in USD.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let per = |tokens: u64, usd_per_million: f64| tokens as f64 * usd_per_million / 1e6;
        per(usage.input, self.input)
            + per(usage.cached_input, self.cached_input.unwrap_or(self.input))
            + per(usage.output, self.output)
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Usage from a `usage` object of either provider (chat, responses, embeddings,
/// messages); None when `v` is not one.
fn usage_of(provider: Provider, v: &Value) -> Option<Usage> {
    let u = v.as_object()?;
    Some(match provider {
        Provider::Openai => {
            let (input, output, details) = if u.contains_key("prompt_tokens") {
                (
                    &u["prompt_tokens"],
                    u.get("completion_tokens"),
                    u.get("prompt_tokens_details"),
                )
            } else if u.contains_key("input_tokens") {
                (
                    &u["input_tokens"],
                    u.get("output_tokens"),
                    u.get("input_tokens_details"),
                )
            } else {
                return None;
            };
            let cached = details.map(|d| n(&d["cached_tokens"])).unwrap_or(0);
            let input = n(input);
            Usage {
                input: input.saturating_sub(cached),
                cached_input: cached.min(input),
                output: output.map(n).unwrap_or(0),
            }
        }
        Provider::Anthropic => {
            if !u.contains_key("input_tokens") && !u.contains_key("output_tokens") {
                return None;
            }
            Usage {
                // Writing the cache is billed as input too (at its own rate, which the
                // price table does not split out: charged as input).
                input: n(&v["input_tokens"]) + n(&v["cache_creation_input_tokens"]),
                cached_input: n(&v["cache_read_input_tokens"]),
                output: n(&v["output_tokens"]),
            }
        }
    })
}

/// Tool calls in a whole (not streamed) response.
fn tool_calls_of(provider: Provider, body: &Value) -> u64 {
    let count = |items: &Value, is_call: &dyn Fn(&Value) -> bool| {
        items
            .as_array()
            .map(|a| a.iter().filter(|i| is_call(i)).count() as u64)
            .unwrap_or(0)
    };
    match provider {
        Provider::Openai => {
            let chat: u64 = body["choices"]
                .as_array()
                .map(|choices| {
                    choices
                        .iter()
                        .map(|c| count(&c["message"]["tool_calls"], &|_| true))
                        .sum()
                })
                .unwrap_or(0);
            chat + count(&body["output"], &is_responses_call)
        }
        Provider::Anthropic => count(&body["content"], &|b| b["type"] == "tool_use"),
    }
}

/// A responses-API output item that is a tool call (`function_call`, `web_search_call`,
/// `file_search_call`, …).
fn is_responses_call(item: &Value) -> bool {
    item["type"].as_str().is_some_and(|t| t.ends_with("_call"))
}

/// Reads a whole JSON response body.
pub fn from_response(provider: Provider, body: &Value) -> Metered {
    Metered {
        usage: usage_of(provider, &body["usage"]),
        tool_calls: tool_calls_of(provider, body),
        model: body["model"].as_str().map(str::to_string),
    }
}

/// The meter of one streamed response, fed the bytes as they pass (split anywhere); it
/// never holds more than one event line.
#[derive(Debug)]
pub struct StreamMeter {
    provider: Provider,
    line: Vec<u8>,
    metered: Metered,
    /// Anthropic: the latest figure of each usage field.
    anthropic: Option<Usage>,
    /// Lines dropped for being longer than [`MAX_EVENT_LINE`].
    pub oversized: u64,
    /// Events that carried generated output (a text or tool-call piece).
    pieces: u64,
}

/// The longest event line read; a longer one is skipped (and counted).
pub const MAX_EVENT_LINE: usize = 4 << 20;

impl StreamMeter {
    pub fn new(provider: Provider) -> StreamMeter {
        StreamMeter {
            provider,
            line: Vec::new(),
            metered: Metered::default(),
            anthropic: None,
            oversized: 0,
            pieces: 0,
        }
    }

    /// The output generated so far, at least: the usage's figure when the stream has
    /// told it, else one token per piece of output streamed (providers stream a token or
    /// more a piece). What the gateway holds a stream to, to cut it at the cap.
    pub fn output_so_far(&self) -> u64 {
        let told = self.metered.usage.map_or(0, |u| u.output);
        told.max(self.pieces)
    }

    /// Reads what passed; returns what the stream has spent so far (to charge it live).
    pub fn feed(&mut self, bytes: &[u8]) -> &Metered {
        for &b in bytes {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.line_done(&line);
            } else if self.line.len() < MAX_EVENT_LINE {
                self.line.push(b);
            } else if self.line.len() == MAX_EVENT_LINE {
                self.oversized += 1;
                self.line.push(b); // one past the limit marks the line as skipped
            }
        }
        &self.metered
    }

    /// The stream ended: what it spent in all.
    pub fn finish(mut self) -> Metered {
        let line = std::mem::take(&mut self.line);
        self.line_done(&line);
        self.metered
    }

    fn line_done(&mut self, line: &[u8]) {
        if line.len() > MAX_EVENT_LINE {
            return;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" {
            return;
        }
        if let Ok(event) = serde_json::from_slice::<Value>(data) {
            self.event(&event);
        }
    }

    fn event(&mut self, e: &Value) {
        if let Some(model) = e["model"].as_str().or(e["message"]["model"].as_str()) {
            self.metered.model.get_or_insert_with(|| model.to_string());
        }
        match self.provider {
            Provider::Openai => self.openai_event(e),
            Provider::Anthropic => self.anthropic_event(e),
        }
    }

    fn openai_event(&mut self, e: &Value) {
        // Responses: `response.output_text.delta`, `….function_call_arguments.delta`, …
        if e["type"].as_str().is_some_and(|t| t.ends_with(".delta")) {
            self.pieces += 1;
        }
        // Chat: a tool call's first piece carries its id; later pieces only arguments.
        for choice in e["choices"].as_array().into_iter().flatten() {
            let delta = &choice["delta"];
            if delta["content"].as_str().is_some_and(|c| !c.is_empty())
                || delta["tool_calls"].is_array()
            {
                self.pieces += 1;
            }
            for call in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if call["id"].as_str().is_some_and(|id| !id.is_empty()) {
                    self.metered.tool_calls += 1;
                }
            }
        }
        if let Some(u) = usage_of(Provider::Openai, &e["usage"]) {
            self.metered.usage = Some(u); // replaces: a usage chunk is the total
        }
        // Responses: the completed response carries everything.
        if e["type"] == "response.completed" {
            let whole = from_response(Provider::Openai, &e["response"]);
            self.metered.tool_calls = whole.tool_calls;
            if whole.usage.is_some() {
                self.metered.usage = whole.usage;
            }
        }
    }

    fn anthropic_event(&mut self, e: &Value) {
        let usage = match e["type"].as_str() {
            Some("message_start") => &e["message"]["usage"],
            Some("message_delta") => &e["usage"],
            Some("content_block_delta") => {
                self.pieces += 1;
                return;
            }
            Some("content_block_start") => {
                if e["content_block"]["type"] == "tool_use" {
                    self.metered.tool_calls += 1;
                }
                return;
            }
            _ => return,
        };
        let Some(fields) = usage.as_object() else {
            return;
        };
        // Cumulative: each field's latest figure stands; a field a delta leaves out keeps
        // the figure it had.
        let mut total = self.anthropic.unwrap_or_default();
        if let Some(v) = fields.get("input_tokens").and_then(Value::as_u64) {
            total.input = v + n(&usage["cache_creation_input_tokens"]);
        }
        if let Some(v) = fields
            .get("cache_read_input_tokens")
            .and_then(Value::as_u64)
        {
            total.cached_input = v;
        }
        if let Some(v) = fields.get("output_tokens").and_then(Value::as_u64) {
            total.output = v;
        }
        self.anthropic = Some(total);
        self.metered.usage = Some(total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An SSE stream of `events` (each `data: …` and a blank line).
    fn sse(events: &[Value]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in events {
            out.extend_from_slice(format!("data: {e}\n\n").as_bytes());
        }
        out
    }

    fn stream(provider: Provider, bytes: &[u8], chunk: usize) -> Metered {
        let mut m = StreamMeter::new(provider);
        for piece in bytes.chunks(chunk) {
            m.feed(piece);
        }
        m.finish()
    }

    #[test]
    fn an_openai_chat_completion_with_cached_input_and_tool_calls() {
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": "{}"}}
                ]}}],
            "usage": {"prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280,
                      "prompt_tokens_details": {"cached_tokens": 1024}}
        });
        let m = from_response(Provider::Openai, &body);
        assert_eq!(
            m.usage,
            Some(Usage {
                input: 176,
                cached_input: 1024,
                output: 80
            })
        );
        assert_eq!(m.tool_calls, 2);
        assert_eq!(m.model.as_deref(), Some("gpt-4o-mini"));
    }

    #[test]
    fn an_openai_stream_counts_its_final_usage_once_and_each_tool_call_once() {
        let events = [
            json!({"model": "gpt-4o-mini", "choices": [{"index": 0, "delta": {"role": "assistant",
                "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]}),
            // The last chunk carries both a choice and the usage: one chunk, counted once.
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                   "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70}}),
        ];
        let mut bytes = sse(&events);
        bytes.extend_from_slice(b"data: [DONE]\n\n");
        for chunk in [1, 7, 64, bytes.len()] {
            let m = stream(Provider::Openai, &bytes, chunk);
            assert_eq!(
                m.usage,
                Some(Usage {
                    input: 50,
                    cached_input: 0,
                    output: 20
                }),
                "chunks of {chunk}"
            );
            assert_eq!(m.tool_calls, 1, "chunks of {chunk}");
            assert_eq!(m.model.as_deref(), Some("gpt-4o-mini"));
        }
    }

    #[test]
    fn an_openai_stream_without_usage_says_so() {
        let bytes = sse(&[json!({"choices": [{"index": 0, "delta": {"content": "hi"}}]})]);
        assert_eq!(stream(Provider::Openai, &bytes, 3).usage, None);
    }

    #[test]
    fn an_openai_response_and_its_stream() {
        let response = json!({
            "id": "resp_1", "object": "response", "model": "gpt-4.1",
            "output": [
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
            ],
            "usage": {"input_tokens": 300, "input_tokens_details": {"cached_tokens": 100},
                      "output_tokens": 40, "total_tokens": 340}
        });
        let want = Some(Usage {
            input: 200,
            cached_input: 100,
            output: 40,
        });
        let m = from_response(Provider::Openai, &response);
        assert_eq!((m.usage, m.tool_calls), (want, 1));
        let bytes = sse(&[
            json!({"type": "response.created", "response": {"id": "resp_1", "model": "gpt-4.1"}}),
            json!({"type": "response.output_text.delta", "delta": "ok"}),
            json!({"type": "response.completed", "response": response}),
        ]);
        let m = stream(Provider::Openai, &bytes, 5);
        assert_eq!((m.usage, m.tool_calls), (want, 1));
    }

    #[test]
    fn an_openai_embedding() {
        let body = json!({"object": "list", "data": [], "model": "text-embedding-3-small",
                          "usage": {"prompt_tokens": 8, "total_tokens": 8}});
        let m = from_response(Provider::Openai, &body);
        assert_eq!(
            m.usage,
            Some(Usage {
                input: 8,
                cached_input: 0,
                output: 0
            })
        );
    }

    #[test]
    fn an_anthropic_message_with_cache_and_a_tool_use() {
        let body = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Let me check."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 20, "cache_creation_input_tokens": 5,
                      "cache_read_input_tokens": 1000, "output_tokens": 30}
        });
        let m = from_response(Provider::Anthropic, &body);
        assert_eq!(
            m.usage,
            Some(Usage {
                input: 25,
                cached_input: 1000,
                output: 30
            })
        );
        assert_eq!(m.tool_calls, 1);
    }

    #[test]
    fn an_anthropic_stream_takes_the_latest_usage_never_the_sum() {
        let bytes = sse(&[
            json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude-sonnet-4-5",
                   "usage": {"input_tokens": 472, "cache_read_input_tokens": 0, "output_tokens": 2}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "content_block_start", "index": 1,
                   "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 40}}),
            json!({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 89}}),
            json!({"type": "message_stop"}),
        ]);
        // Anthropic names its events too; the meter reads the data lines.
        let named: Vec<u8> = String::from_utf8(bytes.clone())
            .unwrap()
            .replace("data: ", "event: x\ndata: ")
            .into_bytes();
        for (bytes, chunk) in [(&bytes, 1), (&named, 9), (&named, 4096)] {
            let m = stream(Provider::Anthropic, bytes, chunk);
            assert_eq!(
                m.usage,
                Some(Usage {
                    input: 472,
                    cached_input: 0,
                    output: 89
                }),
                "chunks of {chunk}"
            );
            assert_eq!(m.tool_calls, 1);
            assert_eq!(m.model.as_deref(), Some("claude-sonnet-4-5"));
        }
    }

    #[test]
    fn a_price_counts_cached_input_at_its_own_rate() {
        let price = Price {
            input: 2.5,
            output: 10.0,
            cached_input: Some(1.25),
        };
        let usage = Usage {
            input: 1_000_000,
            cached_input: 2_000_000,
            output: 500_000,
        };
        assert!((price.cost(&usage) - (2.5 + 2.5 + 5.0)).abs() < 1e-9);
        let plain = Price {
            cached_input: None,
            ..price
        };
        assert!((plain.cost(&usage) - (2.5 + 5.0 + 5.0)).abs() < 1e-9);
    }

    #[test]
    fn garbage_and_oversized_lines_are_skipped_without_losing_the_rest() {
        let mut m = StreamMeter::new(Provider::Openai);
        m.feed(b"data: {not json\n\n: a comment\n\nevent: ping\n\n");
        m.feed(&vec![b'x'; MAX_EVENT_LINE + 10]);
        m.feed(b"\n\n");
        m.feed(&sse(&[
            json!({"usage": {"prompt_tokens": 1, "completion_tokens": 2}}),
        ]));
        assert_eq!(m.oversized, 1);
        let got = m.finish();
        assert_eq!(
            got.usage,
            Some(Usage {
                input: 1,
                cached_input: 0,
                output: 2
            })
        );
    }
}
