//! The model gateway (issue 26, in progress) against implementations steward did not
//! write: the official `openai` and `anthropic` Python SDKs. A provider stand-in on
//! loopback (`tests/fixtures/provider_standin.py`; there is no internet here, so no real
//! provider) answers in the documented JSON and stream shapes.
//!
//! - The meter reads the same tokens and tool calls from its answers as the SDKs parse
//!   (`tests/fixtures/sdk_usage.py`, streams accumulated by their own helpers).
//! - Through the gateway, the SDKs, unchanged and holding only a run's key, get their
//!   answers intact; each call is metered once; the provider sees only the real key; a
//!   model outside the grant, an unknown path, a revoked or a stranger's key is refused
//!   in the provider's error shape before anything reaches the provider.

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

/// The stand-in; with `keys_seen`, it notes the key of every request it gets there.
fn stand_in(keys_seen: Option<&std::path::Path>) -> StandIn {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/provider_standin.py"
    );
    let mut child = Command::new(util::python())
        .arg(script)
        .args(keys_seen)
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

/// What the official SDKs read from each call kind (`tests/fixtures/sdk_usage.py`), by
/// call name.
fn sdk_usage(openai: &str, anthropic: &str, env: &[(&str, &str)]) -> HashMap<String, Value> {
    let out = Command::new(util::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/sdk_usage.py"
        ))
        .args([openai, anthropic])
        .envs(env.iter().copied())
        .output()
        .expect("run sdk_usage.py");
    assert!(
        out.status.success(),
        "the SDKs failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["call"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

#[test]
fn the_meter_reads_what_the_official_sdks_read_from_each_response_shape() {
    let s = stand_in(None);
    let base = format!("http://127.0.0.1:{}", s.port);
    let sdk = sdk_usage(&format!("{base}/v1"), &base, &[]);
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

const REAL_OPENAI: &str = "sk-real-openai-key-never-shown";
const REAL_ANTHROPIC: &str = "sk-ant-real-key-never-shown";

/// The stand-in's figures (`provider_standin.py`): what an SDK must read through the
/// gateway, exactly as directly.
const PROMPT: u64 = 1200;
const CACHED: u64 = 1024;
const OUTPUT: u64 = 80;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_call_through_the_gateway_and_each_call_is_metered() {
    use steward::gateway::forward::{self, Upstream};
    use steward::gateway::keys::{Call, Event, Grant, Registry};

    let dir = tempfile::tempdir().unwrap();
    let keys_seen = dir.path().join("keys-seen");
    let s = stand_in(Some(&keys_seen));
    let upstream = |key: &str| Upstream {
        base_url: format!("http://127.0.0.1:{}/v1", s.port),
        key: key.to_string(),
    };
    let upstreams = vec![
        (Provider::Openai, upstream(REAL_OPENAI)),
        (Provider::Anthropic, upstream(REAL_ANTHROPIC)),
    ];
    let registry = Registry::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn(forward::serve(listener, registry.clone(), cancel.clone()));
    let calls: std::sync::Arc<std::sync::Mutex<Vec<Call>>> = Default::default();
    let sink = {
        let calls = calls.clone();
        std::sync::Arc::new(move |e: Event<'_>| {
            if let Event::Call(c) = e {
                calls.lock().unwrap().push(c.clone())
            }
        })
    };
    let models = [
        "gpt-4o-mini",
        "gpt-4.1",
        "text-embedding-3-small",
        "claude-sonnet-4-5",
    ];
    let issued = registry
        .issue(Grant {
            run_id: "run-1".into(),
            workflow: "w".into(),
            step: "run".into(),
            upstreams,
            models: models.iter().map(|m| m.to_string()).collect(),
            pricing: Default::default(),
            budget: None,
            log_bodies: false,
            sink,
        })
        .unwrap();

    // The SDKs, unchanged, pointed at the gateway with the run's key.
    let key = issued.key.clone();
    let sdk = tokio::task::spawn_blocking(move || {
        sdk_usage(
            &format!("http://{addr}/openai/v1"),
            &format!("http://{addr}/anthropic"),
            &[("OPENAI_API_KEY", &key), ("ANTHROPIC_API_KEY", &key)],
        )
    })
    .await
    .unwrap();
    assert_eq!(sdk.len(), 7, "{sdk:?}");
    for (call, read) in &sdk {
        let want = if call == "embeddings" {
            json!([PROMPT, 0, 0, 0])
        } else {
            json!([PROMPT, CACHED, OUTPUT, 1])
        };
        let got = json!([
            read["input"],
            read["cached"],
            read["output"],
            read["tool_calls"]
        ]);
        assert_eq!(got, want, "{call}: the answer did not arrive intact");
    }

    // Each call was metered once, as its SDK read it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while calls.lock().unwrap().len() < 7 {
        assert!(
            std::time::Instant::now() < deadline,
            "metered: {:?}",
            calls.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 7, "{calls:?}");
    for c in &calls {
        let u = c.metered.usage.unwrap_or_else(|| panic!("no usage: {c:?}"));
        assert_eq!(u.input + u.cached_input, PROMPT, "{c:?}");
        assert_eq!(c.status, 200, "{c:?}");
        assert!(models.contains(&c.model.as_str()), "{c:?}");
    }
    let tool_calls: u64 = calls.iter().map(|c| c.metered.tool_calls).sum();
    assert_eq!(tool_calls, 6, "one per call but the embedding: {calls:?}");

    // The provider saw only the real keys; the run's key never left the gateway.
    let seen = std::fs::read_to_string(&keys_seen).unwrap();
    assert_eq!(seen.lines().count(), 7, "{seen}");
    for line in seen.lines() {
        assert!(
            line == format!("Bearer {REAL_OPENAI}") || line == REAL_ANTHROPIC,
            "the provider was sent {line:?}"
        );
    }

    // Refusals, in the provider's own shape.
    let client = reqwest::Client::new();
    let ask = |model: &'static str, path: &'static str, key: String| {
        let client = client.clone();
        async move {
            client
                .post(format!("http://{addr}{path}"))
                .bearer_auth(key)
                .header("content-type", "application/json")
                .body(json!({"model": model, "messages": []}).to_string())
                .send()
                .await
                .unwrap()
        }
    };
    let other_model = ask("gpt-5", "/openai/v1/chat/completions", issued.key.clone()).await;
    assert_eq!(other_model.status(), 403);
    let body: Value = other_model.json_body().await;
    assert!(
        body["error"]["message"].as_str().unwrap().contains("gpt-5"),
        "{body}"
    );
    let unknown = ask("gpt-4o-mini", "/openai/v1/files", issued.key.clone()).await;
    assert_eq!(unknown.status(), 404);
    // The step ended: its key is revoked, and refused.
    let key = issued.key.clone();
    drop(issued);
    let stale = ask("gpt-4o-mini", "/openai/v1/chat/completions", key).await;
    assert_eq!(stale.status(), 401);
    let stranger = ask(
        "gpt-4o-mini",
        "/openai/v1/chat/completions",
        "stw-00".into(),
    )
    .await;
    assert_eq!(stranger.status(), 401);
    assert_eq!(
        std::fs::read_to_string(&keys_seen).unwrap().lines().count(),
        7,
        "a refused call reached the provider"
    );
    cancel.cancel();
}

/// A response body as JSON (reqwest's `json` feature is not in the tree).
trait JsonBody {
    async fn json_body(self) -> Value;
}

impl JsonBody for reqwest::Response {
    async fn json_body(self) -> Value {
        serde_json::from_slice(&self.bytes().await.unwrap()).unwrap()
    }
}
