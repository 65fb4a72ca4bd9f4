//! The gateway's meter (issue 26, its first step) against implementations steward did not
//! write: the official `openai` and `anthropic` Python SDKs. A provider stand-in on
//! loopback (`tests/fixtures/provider_standin.py`; there is no internet here, so no real
//! provider) answers in the documented JSON and stream shapes; the SDKs parse its answers
//! (`tests/fixtures/sdk_usage.py`, streams accumulated by their own helpers), and steward's
//! meter reads the very same bytes. Both must find the same tokens and tool calls.

mod util;

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use steward::gateway::meter::{self, Metered, Provider, StreamMeter};

/// The stand-in, killed on drop.
struct StandIn {
    child: Child,
    port: u16,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stand_in() -> StandIn {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/provider_standin.py"
    );
    let mut child = Command::new(util::python())
        .arg(script)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start provider_standin.py");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .strip_prefix("port ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("provider_standin.py said {line:?}"));
    StandIn { child, port }
}

/// One POST to the stand-in; the response body's bytes.
fn post(port: u16, path: &str, body: &Value) -> Vec<u8> {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let body = body.to_string();
    write!(
        conn,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    raw[split + 4..].to_vec()
}

/// What steward's meter reads from a response: whole JSON, or a stream fed in small,
/// uneven pieces as a proxy would see it.
fn metered(provider: Provider, body: &[u8], streamed: bool) -> Metered {
    if !streamed {
        return meter::from_response(provider, &serde_json::from_slice(body).unwrap());
    }
    let mut m = StreamMeter::new(provider);
    for piece in body.chunks(7) {
        m.feed(piece);
    }
    m.finish()
}

#[test]
fn the_meter_reads_what_the_official_sdks_read_from_each_response_shape() {
    let s = stand_in();
    let out = Command::new(util::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/sdk_usage.py"
        ))
        .arg(format!("http://127.0.0.1:{}", s.port))
        .output()
        .expect("run sdk_usage.py");
    assert!(
        out.status.success(),
        "the SDKs failed against the stand-in:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sdk: HashMap<String, Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["call"].as_str().unwrap().to_string(), v)
        })
        .collect();
    let ask = json!([{"role": "user", "content": "look it up"}]);
    let calls = [
        (
            "chat",
            Provider::Openai,
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": ask}),
            false,
        ),
        (
            "chat_stream",
            Provider::Openai,
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": ask, "stream": true, "stream_options": {"include_usage": true}}),
            true,
        ),
        (
            "responses",
            Provider::Openai,
            "/v1/responses",
            json!({"model": "gpt-4.1", "input": "x"}),
            false,
        ),
        (
            "responses_stream",
            Provider::Openai,
            "/v1/responses",
            json!({"model": "gpt-4.1", "input": "x", "stream": true}),
            true,
        ),
        (
            "embeddings",
            Provider::Openai,
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": "x"}),
            false,
        ),
        (
            "messages",
            Provider::Anthropic,
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": ask}),
            false,
        ),
        (
            "messages_stream",
            Provider::Anthropic,
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": ask, "stream": true}),
            true,
        ),
    ];
    for (call, provider, path, request, streamed) in calls {
        let read = &sdk[call];
        let m = metered(provider, &post(s.port, path, &request), streamed);
        let usage = m
            .usage
            .unwrap_or_else(|| panic!("{call}: the meter found no usage"));
        let n = |k: &str| read[k].as_u64().unwrap();
        assert_eq!(
            usage.input + usage.cached_input,
            n("input"),
            "{call}: input {m:?} vs {read}"
        );
        assert_eq!(
            usage.cached_input,
            n("cached"),
            "{call}: cached {m:?} vs {read}"
        );
        assert_eq!(usage.output, n("output"), "{call}: output {m:?} vs {read}");
        assert_eq!(
            m.tool_calls,
            n("tool_calls"),
            "{call}: tool calls {m:?} vs {read}"
        );
    }

    // An OpenAI stream not asked for its usage carries none: the meter says so (the
    // gateway asks for it itself, and charges the reservation when none comes).
    let bare = post(
        s.port,
        "/v1/chat/completions",
        &json!({"model": "gpt-4o-mini", "messages": ask, "stream": true}),
    );
    let m = metered(Provider::Openai, &bare, true);
    assert_eq!((m.usage, m.tool_calls), (None, 1));
}
