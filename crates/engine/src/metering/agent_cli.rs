//! A second meter for agent CLIs that bring their own transport to the model (they do
//! not go through the gateway) and print their own usage on stdout. A workflow names the
//! format on its step: `[run] usage_from = "claude-json"` or `"codex-jsonl"`.
//!
//! - `claude -p --output-format json` prints one `result` object; `stream-json` prints one
//!   object per line and ends with the same `result`. Its `usage` has `input_tokens`
//!   (uncached), `cache_creation_input_tokens`, `cache_read_input_tokens`,
//!   `output_tokens`, and `total_cost_usd` the CLI's own price. Tool calls are counted
//!   from the `tool_use` blocks of `assistant` lines (stream-json only; the one-object
//!   format does not list them).
//! - `codex exec --json` prints one event per line; each `turn.completed` carries that
//!   turn's `usage` with `input_tokens` (cached ones included), `cached_input_tokens` and
//!   `output_tokens`. Tool calls are the `item.completed` items that ran a command or
//!   called a tool. It prints no cost: the model's `[gateway.pricing]` is not applied
//!   either, as the lines do not name the model.
//!
//! A line that does not parse is skipped; output without usage meters nothing.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::meter::Usage;

/// Which CLI's output a step's stdout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UsageFrom {
    #[serde(rename = "claude-json")]
    ClaudeJson,
    #[serde(rename = "codex-jsonl")]
    CodexJsonl,
}

impl UsageFrom {
    pub fn parse(s: &str) -> Option<UsageFrom> {
        match s {
            "claude-json" => Some(UsageFrom::ClaudeJson),
            "codex-jsonl" => Some(UsageFrom::CodexJsonl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            UsageFrom::ClaudeJson => "claude-json",
            UsageFrom::CodexJsonl => "codex-jsonl",
        }
    }
}

/// What a CLI said it spent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CliSpend {
    pub usage: Usage,
    pub tool_calls: u64,
    pub cost_usd: Option<f64>,
}

/// Reads `stdout` as `format`; None when it told no usage.
pub fn read(format: UsageFrom, stdout: &str) -> Option<CliSpend> {
    // The one-object format may be pretty-printed over many lines: try it whole first.
    let whole = serde_json::from_str::<Value>(stdout.trim()).ok();
    let values: Vec<Value> = match whole {
        Some(v) => vec![v],
        None => stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l.trim()).ok())
            .collect(),
    };
    match format {
        UsageFrom::ClaudeJson => claude(&values),
        UsageFrom::CodexJsonl => codex(&values),
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn claude(values: &[Value]) -> Option<CliSpend> {
    let result = values.iter().rev().find(|v| v["type"] == "result")?;
    let u = &result["usage"];
    if !u.is_object() {
        return None;
    }
    let tool_calls = values
        .iter()
        .filter(|v| v["type"] == "assistant")
        .flat_map(|v| {
            v["message"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|block| block["type"] == "tool_use")
        .count() as u64;
    Some(CliSpend {
        usage: Usage {
            input: n(&u["input_tokens"]) + n(&u["cache_creation_input_tokens"]),
            cached_input: n(&u["cache_read_input_tokens"]),
            output: n(&u["output_tokens"]),
        },
        tool_calls,
        cost_usd: result["total_cost_usd"]
            .as_f64()
            .filter(|c| c.is_finite() && *c >= 0.0),
    })
}

fn codex(values: &[Value]) -> Option<CliSpend> {
    let mut spend = CliSpend::default();
    let mut told = false;
    for v in values {
        match v["type"].as_str() {
            Some("turn.completed") if v["usage"].is_object() => {
                let u = &v["usage"];
                let cached = n(&u["cached_input_tokens"]);
                spend.usage.input += n(&u["input_tokens"]).saturating_sub(cached);
                spend.usage.cached_input += cached;
                spend.usage.output += n(&u["output_tokens"]);
                told = true;
            }
            Some("item.completed") => {
                let kind = v["item"]["type"].as_str().unwrap_or_default();
                if matches!(kind, "command_execution" | "mcp_tool_call" | "web_search") {
                    spend.tool_calls += 1;
                }
            }
            _ => {}
        }
    }
    told.then_some(spend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_json_result_and_stream_json_lines() {
        let one = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"done","total_cost_usd":0.0421,"usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":9000,"output_tokens":450}}"#;
        let got = read(UsageFrom::ClaudeJson, one).unwrap();
        assert_eq!(
            got.usage,
            Usage {
                input: 312,
                cached_input: 9000,
                output: 450
            }
        );
        assert_eq!((got.tool_calls, got.cost_usd), (0, Some(0.0421)));
        let stream = format!(
            "{}\n{}\nnot json\n{}\n",
            r#"{"type":"system","subtype":"init"}"#,
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"x"},{"type":"tool_use","id":"t1","name":"Bash","input":{}}]}}"#,
            one
        );
        let got = read(UsageFrom::ClaudeJson, &stream).unwrap();
        assert_eq!((got.usage.output, got.tool_calls), (450, 1));
        assert_eq!(read(UsageFrom::ClaudeJson, "plain text"), None);
    }

    #[test]
    fn codex_jsonl_turns_are_summed_and_cached_input_taken_out_of_input() {
        let lines = [
            r#"{"type":"thread.started","thread_id":"t"}"#,
            r#"{"type":"item.completed","item":{"id":"i0","type":"command_execution","command":"ls"}}"#,
            r#"{"type":"item.completed","item":{"id":"i1","type":"agent_message","text":"ok"}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":26549,"cached_input_tokens":22272,"output_tokens":1590}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":1000,"cached_input_tokens":0,"output_tokens":10}}"#,
        ]
        .join("\n");
        let got = read(UsageFrom::CodexJsonl, &lines).unwrap();
        assert_eq!(
            got.usage,
            Usage {
                input: 4277 + 1000,
                cached_input: 22272,
                output: 1600
            }
        );
        assert_eq!((got.tool_calls, got.cost_usd), (1, None));
    }
}
