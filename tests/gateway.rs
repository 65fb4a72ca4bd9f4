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
    stand_in_logging(keys_seen, None)
}

/// [`stand_in`], noting each request's model and output limits in `log` (JSON lines).
fn stand_in_logging(keys_seen: Option<&std::path::Path>, log: Option<&std::path::Path>) -> StandIn {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/provider_standin.py"
    );
    let mut cmd = Command::new(util::python());
    if let Some(log) = log {
        cmd.env("STANDIN_LOG", log);
    }
    let mut child = util::dies_with_test(&mut cmd)
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

// ---------------------------------------------------------------------------------------
// Runs through a real daemon: the maker is `tests/fixtures/gateway_maker.py`, the official
// SDKs unchanged, confined by the sandbox with no network but the gateway's port. It
// reports nothing on fd 3.

const UPSTREAM_OPENAI: &str = "sk-upstream-openai-4f9d2c7a1b";
const UPSTREAM_ANTHROPIC: &str = "sk-ant-upstream-8e1c5b3f0d";

/// Prices (USD per million tokens) the tests' steward.toml gives, as (input, output,
/// cached input).
const MINI: (f64, f64, f64) = (0.15, 0.60, 0.075);
const SONNET: (f64, f64, f64) = (3.0, 15.0, 0.30);

/// A config folder whose workflow `id` runs `gateway_maker.py MODE` through the gateway,
/// and a daemon holding the real keys, in front of `standin`.
fn gateway_env(
    id: &str,
    mode: &str,
    budget: &str,
    standin: &StandIn,
    mini: (f64, f64, f64),
) -> util::Env {
    gateway_env_checked(id, mode, None, budget, standin, mini)
}

/// [`gateway_env`] whose checker, with `verify_mode`, is `gateway_maker.py` too.
fn gateway_env_checked(
    id: &str,
    mode: &str,
    verify_mode: Option<&str>,
    budget: &str,
    standin: &StandIn,
    mini: (f64, f64, f64),
) -> util::Env {
    let env = util::Env::new();
    let python = util::python();
    let venv = python.parent().unwrap().parent().unwrap();
    // The interpreter the venv links to lives where its Python was installed.
    let base = Command::new(&python)
        .args(["-c", "import sys; print(sys.base_prefix)"])
        .output()
        .unwrap();
    let base = String::from_utf8_lossy(&base.stdout).trim().to_string();
    let maker = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gateway_maker.py"
    );
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    std::fs::write(
        env.config.join("steward.toml"),
        format!(
            r#"[gateway.upstream.openai]
base_url = "http://127.0.0.1:{port}/v1"
key_env = "UPSTREAM_OPENAI"

[gateway.upstream.anthropic]
base_url = "http://127.0.0.1:{port}"
key_env = "UPSTREAM_ANTHROPIC"

[gateway.pricing."gpt-4o-mini"]
input = {}
output = {}
cached_input = {}

[gateway.pricing."claude-sonnet-4-5"]
input = {}
output = {}
cached_input = {}

[gateway.pricing."standin-runaway"]
input = 1.0
output = 1.0
"#,
            mini.0,
            mini.1,
            mini.2,
            SONNET.0,
            SONNET.1,
            SONNET.2,
            port = standin.port
        ),
    )
    .unwrap();
    let mut spec =
        util::Spec::new(id, &format!("exec {} {maker} {mode}\n", python.display())).budget(budget);
    if let Some(check) = verify_mode {
        spec = spec.verify(&format!("exec {} {maker} {check}\n", python.display()));
    }
    let spec = spec.tables(&format!(
        r#"
[gateway]
providers = ["openai", "anthropic"]
models = ["gpt-4o-mini", "claude-sonnet-4-5", "standin-runaway"]

[sandbox]
read = [{venv:?}, {base:?}, {fixtures:?}]
write = [{dir:?}]
"#,
        venv = venv.display().to_string(),
        dir = env.dir.path().display().to_string(),
    ));
    env.live_workflow(&spec);
    env
}

fn start_daemon(env: &util::Env) -> util::Daemon {
    env.daemon_env(
        &[],
        &[
            ("UPSTREAM_OPENAI", UPSTREAM_OPENAI),
            ("UPSTREAM_ANTHROPIC", UPSTREAM_ANTHROPIC),
        ],
    )
}

/// The model-call lines of a run's runlog.
fn model_calls(env: &util::Env, run_id: &str) -> Vec<Value> {
    env.runlog_for(run_id)
        .into_iter()
        .filter(|e| e["step"] == "model_call")
        .collect()
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(p);
                }
            }
        }
    }
    found
}

/// Cost in USD of `usage` (uncached input, cached input, output) at `price`.
fn cost(price: (f64, f64, f64), uncached: u64, cached: u64, output: u64) -> f64 {
    (uncached as f64 * price.0 + output as f64 * price.1 + cached as f64 * price.2) / 1e6
}

#[test]
fn a_maker_that_reports_nothing_is_charged_what_the_provider_reported_and_never_sees_the_real_key()
{
    let standin = stand_in(None);
    let env = gateway_env(
        "quiet",
        "calls",
        "max_tokens = 100000\nmax_tool_calls = 10\nmax_runtime_s = 60\nmax_cost_usd = 1.0\n",
        &standin,
        MINI,
    );
    let mut daemon = start_daemon(&env);
    let run = env.run("quiet", true);
    assert_eq!(run.state(), "success", "{run}\n{}", daemon.log_text());
    let rec = run.json();
    let output = &rec["output"];

    // Confined with no network but the gateway's port (where the kernel has TCP rules).
    let port = output["base"]
        .as_str()
        .unwrap()
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let confined = rec["sandbox"].as_str().unwrap_or_default();
    assert!(
        confined.contains(&format!("TCP to port {port} only")) || confined.contains("no TCP rules"),
        "{confined}"
    );

    // The SDKs got their answers intact through the gateway.
    assert_eq!(output["chat_tokens"], PROMPT + OUTPUT, "{output}");
    assert_eq!(output["message_output"], OUTPUT, "{output}");

    // Charged exactly what the stand-in reported, though the maker said nothing on fd 3.
    assert_eq!(rec["figures"]["tokens"], 2 * (PROMPT + OUTPUT), "{rec:#}");
    assert_eq!(
        rec["figures"]["tool_calls"], 2,
        "one tool call in each answer: {rec:#}"
    );
    let want =
        cost(MINI, PROMPT - CACHED, CACHED, OUTPUT) + cost(SONNET, PROMPT - CACHED, CACHED, OUTPUT);
    let got = rec["figures"]["cost_usd"].as_f64().unwrap();
    assert!(
        (got - want).abs() < 1e-9,
        "cost {got}, the price table says {want}"
    );
    let note = rec["misreported"].as_str().unwrap_or_default();
    assert!(
        note.starts_with(&format!(
            "reported tokens 0 of {} metered, tool_calls 0 of 2 metered, cost_usd 0 of 0.",
            2 * (PROMPT + OUTPUT)
        )),
        "{rec:#}"
    );
    let spend = &rec["model_spend"];
    assert_eq!(
        (
            spend["calls"].clone(),
            spend["cached_input_tokens"].clone(),
            spend["output_tokens"].clone()
        ),
        (json!(2), json!(2 * CACHED), json!(2 * OUTPUT)),
        "{spend}"
    );

    // One runlog line per call, without the prompt or the answer.
    let calls = model_calls(&env, &run.run_id());
    assert_eq!(calls.len(), 2, "{calls:#?}");
    for c in &calls {
        assert_eq!(c["status"], "ok", "{c}");
        assert_eq!(
            c["data"]["input_tokens"].as_u64().unwrap()
                + c["data"]["cached_input_tokens"].as_u64().unwrap(),
            PROMPT,
            "{c}"
        );
        assert!(c["data"].get("request").is_none(), "a body was logged: {c}");
        assert!(c["data"]["latency_ms"].is_u64(), "{c}");
    }
    assert_eq!(
        calls
            .iter()
            .map(|c| c["data"]["model"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["gpt-4o-mini", "claude-sonnet-4-5"]
    );
    let show = env.steward(&["show", &run.run_id()]);
    assert!(show.stdout.contains("model calls: 2"), "{show}");

    // The step held a run key, never the real one.
    let step_env = output["environment"].as_object().unwrap();
    let key = output["openai_key"].as_str().unwrap().to_string();
    assert!(key.starts_with("stw-"), "{key}");
    for (name, value) in step_env {
        let v = value.as_str().unwrap_or_default();
        assert!(
            !v.contains(UPSTREAM_OPENAI) && !v.contains(UPSTREAM_ANTHROPIC),
            "the step's {name} holds a real key"
        );
    }
    // Nor is it anywhere steward writes.
    for real in [UPSTREAM_OPENAI, UPSTREAM_ANTHROPIC] {
        assert!(
            !env.runlog_text().contains(real),
            "the runlog holds a real key"
        );
        assert!(
            !daemon.log_text().contains(real),
            "the daemon log holds a real key"
        );
        let holding = files_holding(&env.state, real);
        assert!(
            holding.is_empty(),
            "the state folder holds a real key: {holding:?}"
        );
    }

    // The step has ended: its key is refused now.
    let base = output["base"].as_str().unwrap();
    assert_eq!(status_of_call(base, &key), 401);

    // Spend per workflow and model in /metrics, as a real Prometheus scrapes it.
    let board = env.steward(&["dashboard", "--json"]).json();
    let board_addr = board["listen"].as_str().unwrap().to_string();
    let metrics = http_get(&board_addr, "/metrics");
    if let Err(said) = util::promtool_check(&metrics) {
        panic!("promtool check metrics:\n{said}\n{metrics}");
    }
    let prometheus = util::Prometheus::scraping(&env.path("prometheus"), &board_addr);
    let series = |q: &str| {
        prometheus
            .value(q)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{q} is not in Prometheus:\n{metrics}"))
    };
    let mini = series(r#"steward_model_cost_usd_total{workflow="quiet",model="gpt-4o-mini"}"#);
    assert!(
        (mini - cost(MINI, PROMPT - CACHED, CACHED, OUTPUT)).abs() < 1e-9,
        "{mini}"
    );
    assert_eq!(
        series(
            r#"steward_model_tokens_total{workflow="quiet",model="claude-sonnet-4-5",kind="cached_input"}"#
        ),
        CACHED as f64
    );
    assert_eq!(
        series(r#"steward_model_calls_total{workflow="quiet",model="gpt-4o-mini",status="ok"}"#),
        1.0
    );

    // The overview shows the workflow's spend today and over the week.
    let url = board["url"].as_str().unwrap();
    let token = url.split("token=").nth(1).unwrap();
    let page = http_get_signed_in(&board_addr, token, "/");
    let shown = format!("${want:.4}");
    let row = page
        .split("<tr>")
        .find(|r| r.contains("runs?workflow=quiet"))
        .unwrap_or_else(|| panic!("no row for quiet:\n{page}"));
    assert!(
        row.contains(&format!("<span class=\"usd today\">{shown}</span>"))
            && row.contains(&format!("<span class=\"usd week\">{shown}</span>")),
        "{row}"
    );
    assert_eq!(row.matches("<rect ").count(), 7, "a bar per day: {row}");
    daemon.stop(Duration::from_secs(20));
}

#[test]
fn a_maker_looping_on_calls_is_stopped_at_the_token_cap_and_nothing_commits() {
    let standin = stand_in(None);
    let env = gateway_env(
        "looper",
        "loop",
        "max_tokens = 5000\nmax_tool_calls = 100\nmax_runtime_s = 60\nmax_cost_usd = 100.0\n",
        &standin,
        MINI,
    );
    let _daemon = start_daemon(&env);
    let run = env.run("looper", true);
    let rec = run.json();
    assert_eq!(run.state(), "exhausted", "{run}");
    assert!(
        rec["breach"].as_str().unwrap().starts_with("tokens "),
        "{rec:#}"
    );
    assert!(env.ledger_lines().is_empty(), "an exhausted run committed");
    // Three calls fit in 5000 tokens at 1280 each; the fourth took it over.
    let calls = model_calls(&env, &run.run_id());
    assert!(calls.len() >= 4, "{calls:#?}");
    assert!(rec["figures"]["tokens"].as_u64().unwrap() > 5000, "{rec:#}");
}

#[test]
fn a_maker_looping_on_calls_is_stopped_at_the_cost_cap_and_nothing_commits() {
    let standin = stand_in(None);
    // $100 per million tokens: 1280 tokens a call cost $0.128; the cap is $0.5.
    let dear = (100.0, 100.0, 100.0);
    let env = gateway_env(
        "spender",
        "loop",
        "max_tokens = 1000000\nmax_tool_calls = 100\nmax_runtime_s = 60\nmax_cost_usd = 0.5\n",
        &standin,
        dear,
    );
    let _daemon = start_daemon(&env);
    let run = env.run("spender", true);
    let rec = run.json();
    assert_eq!(run.state(), "exhausted", "{run}");
    assert!(
        rec["breach"].as_str().unwrap().starts_with("cost_usd "),
        "{rec:#}"
    );
    assert!(env.ledger_lines().is_empty(), "an exhausted run committed");
    assert!(
        rec["figures"]["tokens"].as_u64().unwrap() < 1_000_000,
        "{rec:#}"
    );
}

#[test]
fn a_stream_past_the_cap_is_cut_and_the_next_call_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests");
    let standin = stand_in_logging(None, Some(&log));
    let env = gateway_env(
        "runaway",
        "runaway",
        "max_tokens = 1000\nmax_tool_calls = 10\nmax_runtime_s = 60\nmax_cost_usd = 1.0\n",
        &standin,
        MINI,
    );
    let _daemon = start_daemon(&env);
    let run = env.run("runaway", true);
    let rec = run.json();
    let calls = model_calls(&env, &run.run_id());
    // The request's output limit was lowered to what the budget left...
    let asked: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        asked.len(),
        1,
        "the refused call reached the provider: {asked:?}"
    );
    let limit = asked[0]["max_completion_tokens"]
        .as_u64()
        .expect("an output limit was set");
    assert!(limit < 1000, "{asked:?}");
    // ...the provider ignored it, and the stream was cut at it.
    let cut = &calls[0];
    assert_eq!(cut["status"], "cut", "{calls:#?}");
    assert_eq!(cut["data"]["usage"], "reservation", "{cut}");
    let charged = cut["data"]["charged_tokens"].as_u64().unwrap();
    assert!(charged <= 1000, "{cut}");
    assert_eq!(rec["model_spend"]["cut"], 1, "{rec:#}");
    // The next call did not fit: refused in the provider's shape, and the run exhausted.
    assert_eq!(calls[1]["status"], "refused", "{calls:#?}");
    assert_eq!(run.state(), "exhausted", "{run}");
    assert!(
        rec["breach"].as_str().unwrap().starts_with("tokens "),
        "{rec:#}"
    );
    assert!(env.ledger_lines().is_empty());
}

/// The HTTP status of a chat completion posted to `base` (`http://ADDR/openai/v1`) with
/// `key`.
fn status_of_call(base: &str, key: &str) -> u16 {
    let rest = base.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let body = json!({"model": "gpt-4o-mini", "messages": []}).to_string();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "POST /{path}/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP: {answer:?}"))
}

/// A GET's body (HTTP/1.0: whole, never chunked).
fn http_get(addr: &str, path: &str) -> String {
    http_get_with(addr, path, "")
}

fn http_get_with(addr: &str, path: &str, headers: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or(raw)
}

/// A dashboard page, signed in the way a browser is: the token URL sets the cookie.
fn http_get_signed_in(addr: &str, token: &str, path: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(conn, "GET /?token={token} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let cookie = raw
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie:\n{raw}"))
        .to_string();
    http_get_with(addr, path, &format!("Cookie: {cookie}\r\n"))
}

#[test]
fn a_checker_calls_through_the_gateway_too_and_its_spend_counts_in_the_same_budget() {
    let standin = stand_in(None);
    let env = gateway_env_checked(
        "checked",
        "calls",
        Some("check"),
        "max_tokens = 100000\nmax_tool_calls = 10\nmax_runtime_s = 60\nmax_cost_usd = 1.0\n",
        &standin,
        MINI,
    );
    let _daemon = start_daemon(&env);
    let run = env.run("checked", true);
    assert_eq!(run.state(), "success", "{run}");
    let rec = run.json();
    // The maker's two calls and the checker's one, each 1280 tokens.
    assert_eq!(rec["model_spend"]["calls"], 3, "{rec:#}");
    assert_eq!(rec["figures"]["tokens"], 3 * (PROMPT + OUTPUT), "{rec:#}");
    let calls = model_calls(&env, &run.run_id());
    assert_eq!(calls.len(), 3, "{calls:#?}");
    assert_eq!(
        env.ledger_lines().len(),
        1,
        "a passing live run commits once"
    );
}

/// An agent CLI that prints its own usage (`usage_from`). The real `claude` and `codex`
/// CLIs cannot run here (no internet, no account): the maker prints the output they
/// document, and reports nothing on fd 3.
#[test]
fn an_agent_cli_s_printed_usage_is_a_second_meter() {
    let env = util::Env::new();
    let claude = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":3,"result":"done","total_cost_usd":0.0421,"usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":4000,"output_tokens":900}}"#;
    // `usage_from` sits in [run], which the harness writes: the key is added after it.
    let usage_from = |id: &str, format: &str| {
        let file = env.config.join(format!("workflows/{id}.toml"));
        let toml = std::fs::read_to_string(&file).unwrap().replacen(
            "[verify]",
            &format!("usage_from = \"{format}\"\n[verify]"),
            1,
        );
        std::fs::write(&file, toml).unwrap();
        let live = env.steward(&["go-live", id]);
        assert_eq!(live.code, 0, "{live}");
        file
    };
    env.workflow(
        &util::Spec::new("claude", &format!("cat >/dev/null\necho '{claude}'\n")).budget(
            "max_tokens = 5000\nmax_tool_calls = 5\nmax_runtime_s = 20\nmax_cost_usd = 1.0\n",
        ),
    );
    usage_from("claude", "claude-json");
    let run = env.run("claude", true);
    let rec = run.json();
    assert_eq!(run.state(), "exhausted", "{run}");
    assert_eq!(rec["breach"], "tokens 5212/5000", "{rec:#}");
    assert!(env.ledger_lines().is_empty());

    let codex = [
        r#"{"type":"thread.started","thread_id":"t"}"#,
        r#"{"type":"item.completed","item":{"id":"i0","type":"command_execution","command":"ls"}}"#,
        r#"{"type":"turn.completed","usage":{"input_tokens":2000,"cached_input_tokens":1500,"output_tokens":300}}"#,
    ]
    .map(|l| format!("echo '{l}'"))
    .join("\n");
    env.workflow(
        &util::Spec::new("codex", &format!("cat >/dev/null\n{codex}\n")).budget(
            "max_tokens = 10000\nmax_tool_calls = 5\nmax_runtime_s = 20\nmax_cost_usd = 1.0\n",
        ),
    );
    let file = usage_from("codex", "codex-jsonl");
    let run = env.run("codex", true);
    let rec = run.json();
    assert_eq!(run.state(), "success", "{run}");
    assert_eq!(
        (
            rec["figures"]["tokens"].clone(),
            rec["figures"]["tool_calls"].clone()
        ),
        (json!(2300), json!(1)),
        "{rec:#}"
    );
    assert!(
        rec["misreported"]
            .as_str()
            .unwrap_or_default()
            .starts_with("reported tokens 0 of 2300"),
        "{rec:#}"
    );

    // A format steward does not read is a config error naming file, line and field.
    let toml = std::fs::read_to_string(&file)
        .unwrap()
        .replace("codex-jsonl", "gemini");
    std::fs::write(&file, toml).unwrap();
    let check = env.steward(&["validate"]);
    assert_ne!(check.code, 0, "{check}");
    assert!(
        check.stderr.contains("codex.toml:") && check.stderr.contains("run.usage_from: `gemini`"),
        "{check}"
    );
}

/// One POST as raw HTTP/1.0: (status, lower-cased head, body).
fn post_raw(addr: &str, path: &str, key: &str, body: &Value) -> (u16, String, String) {
    let body = body.to_string();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_error_is_passed_on_uncharged_and_log_bodies_keeps_prompt_and_answer() {
    use steward::budget::{Headroom, Left};
    use steward::gateway::keys::{Call, Event, Grant, Upstream};
    use steward::gateway::Gateway;

    let s = stand_in(None);
    let cancel = tokio_util::sync::CancellationToken::new();
    let gateway = Gateway::start("127.0.0.1:0", cancel.clone()).await.unwrap();
    let calls: std::sync::Arc<std::sync::Mutex<Vec<Call>>> = Default::default();
    let sink = {
        let calls = calls.clone();
        std::sync::Arc::new(move |e: Event<'_>| {
            if let Event::Call(c) = e {
                calls.lock().unwrap().push(c.clone())
            }
        })
    };
    let headroom = Headroom::new(Left {
        tokens: 100_000,
        cost_usd: 10.0,
    });
    let issued = gateway
        .registry
        .issue(Grant {
            run_id: "r".into(),
            workflow: "w".into(),
            step: "run".into(),
            upstreams: vec![(
                Provider::Openai,
                Upstream {
                    base_url: format!("http://127.0.0.1:{}/v1", s.port),
                    key: REAL_OPENAI.into(),
                },
            )],
            models: vec!["gpt-4o-mini".into(), "standin-overloaded".into()],
            pricing: Default::default(),
            budget: Some(headroom.clone()),
            log_bodies: true,
            sink,
        })
        .unwrap();
    let addr = gateway.addr.to_string();
    let key = issued.key.clone();
    let (ok, overloaded) = tokio::task::spawn_blocking(move || {
        let ask = |model: &str| {
            post_raw(
                &addr,
                "/openai/v1/chat/completions",
                &key,
                &json!({"model": model, "messages": [{"role": "user", "content": "the prompt"}]}),
            )
        };
        (ask("gpt-4o-mini"), ask("standin-overloaded"))
    })
    .await
    .unwrap();
    assert_eq!(ok.0, 200, "{ok:?}");
    // The provider's 429 reaches the client as the provider sent it, with its retry hints.
    assert_eq!(overloaded.0, 429, "{overloaded:?}");
    assert!(overloaded.1.contains("retry-after: 7"), "{}", overloaded.1);
    assert!(
        overloaded.1.contains("x-ratelimit-remaining-requests: 0"),
        "{}",
        overloaded.1
    );
    assert!(
        overloaded.2.contains("rate_limit_exceeded"),
        "{}",
        overloaded.2
    );

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while calls.lock().unwrap().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            calls.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = calls.lock().unwrap().clone();
    let (billed, refused) = (&calls[0], &calls[1]);
    assert_eq!(billed.charges[0].1, (PROMPT + OUTPUT) as f64, "{billed:?}");
    // Not billed by the provider, not charged by steward (an SDK retrying it drains nothing).
    assert!(refused.charges.is_empty(), "{refused:?}");
    // Both reservations were freed: what is left is the budget less the one billed call.
    let (free, _) = headroom.reserve(|free| Ok::<_, ()>((free, free))).unwrap();
    assert_eq!(free.tokens, 100_000 - (PROMPT + OUTPUT));
    // log_bodies: the prompt and the answer, as they passed.
    let (request, answer) = billed.bodies.clone().expect("bodies under log_bodies");
    assert_eq!(request["messages"][0]["content"], "the prompt");
    assert!(answer.contains("chatcmpl-standin"), "{answer}");
    cancel.cancel();
}

/// With no daemon, `steward run` answers itself: its runs call models through a gateway
/// of the CLI's own process, metered the same way.
#[test]
fn without_a_daemon_steward_run_meters_through_a_gateway_of_its_own() {
    let standin = stand_in(None);
    let env = gateway_env(
        "local",
        "calls",
        "max_tokens = 100000\nmax_tool_calls = 10\nmax_runtime_s = 60\nmax_cost_usd = 1.0\n",
        &standin,
        MINI,
    );
    let run = env.steward_env(
        &["run", "local", "--json", "--live"],
        &[
            ("UPSTREAM_OPENAI", UPSTREAM_OPENAI),
            ("UPSTREAM_ANTHROPIC", UPSTREAM_ANTHROPIC),
        ],
    );
    assert_eq!(run.state(), "success", "{run}");
    let rec = run.json();
    assert_eq!(rec["figures"]["tokens"], 2 * (PROMPT + OUTPUT), "{rec:#}");
    assert_eq!(rec["model_spend"]["calls"], 2, "{rec:#}");
    assert_eq!(env.ledger_lines().len(), 1, "a live run commits once");
}
