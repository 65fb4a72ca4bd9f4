//! The official openai and anthropic SDKs as makers, calling through the gateway.

use super::*;

pub(crate) const REAL_OPENAI: &str = "sk-real-openai-key-never-shown";
pub(crate) const REAL_ANTHROPIC: &str = "sk-ant-real-key-never-shown";

/// The stand-in's figures (`provider_standin.py`): what an SDK must read through the
/// gateway, exactly as directly.
pub(crate) const PROMPT: u64 = 1200;
pub(crate) const CACHED: u64 = 1024;
pub(crate) const OUTPUT: u64 = 80;

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

// ---------------------------------------------------------------------------------------
// Runs through a real daemon: the maker is `tests/fixtures/gateway_maker.py`, the official
// SDKs unchanged, confined by the sandbox with no network but the gateway's port. It
// reports nothing on fd 3.
