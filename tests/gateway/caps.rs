//! A workflow's model calls through a daemon's gateway: charged what the provider reported, held to the token and cost caps, streams cut.

use super::*;

pub(crate) const UPSTREAM_OPENAI: &str = "sk-upstream-openai-4f9d2c7a1b";
pub(crate) const UPSTREAM_ANTHROPIC: &str = "sk-ant-upstream-8e1c5b3f0d";

/// Prices (USD per million tokens) the tests' steward.toml gives, as (input, output,
/// cached input).
pub(crate) const MINI: (f64, f64, f64) = (0.15, 0.60, 0.075);
pub(crate) const SONNET: (f64, f64, f64) = (3.0, 15.0, 0.30);

/// A config folder whose workflow `id` runs `gateway_maker.py MODE` through the gateway,
/// and a daemon holding the real keys, in front of `standin`.
pub(crate) fn gateway_env(
    id: &str,
    mode: &str,
    budget: &str,
    standin: &StandIn,
    mini: (f64, f64, f64),
) -> util::Env {
    gateway_env_checked(id, mode, None, budget, standin, mini)
}

/// [`gateway_env`] whose checker, with `verify_mode`, is `gateway_maker.py` too.
pub(crate) fn gateway_env_checked(
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

pub(crate) fn start_daemon(env: &util::Env) -> util::Daemon {
    env.daemon_env(
        &[],
        &[
            ("UPSTREAM_OPENAI", UPSTREAM_OPENAI),
            ("UPSTREAM_ANTHROPIC", UPSTREAM_ANTHROPIC),
        ],
    )
}

/// The model-call lines of a run's runlog.
pub(crate) fn model_calls(env: &util::Env, run_id: &str) -> Vec<Value> {
    env.runlog_for(run_id)
        .into_iter()
        .filter(|e| e["step"] == "model_call")
        .collect()
}

/// Every file under `dir` that holds `needle`.
pub(crate) fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
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
pub(crate) fn cost(price: (f64, f64, f64), uncached: u64, cached: u64, output: u64) -> f64 {
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

    let key = output["openai_key"].as_str().unwrap().to_string();
    no_real_key_anywhere(&env, &daemon, output);
    // The step has ended: its key is refused now.
    let base = output["base"].as_str().unwrap();
    assert_eq!(status_of_call(base, &key), 401);

    spend_is_in_metrics_and_the_overview(&env, want);
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

/// The step held a run key, never the real one; nor is a real key anywhere steward writes.
fn no_real_key_anywhere(env: &util::Env, daemon: &util::Daemon, output: &Value) {
    // The step held a run key, never the real one.
    let step_env = output["environment"].as_object().unwrap();
    let key = output["openai_key"].as_str().unwrap();
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
}

/// Spend per workflow and model in /metrics, as a real Prometheus scrapes it, and the
/// overview's spend today and over the week (`want` USD for workflow `quiet`).
fn spend_is_in_metrics_and_the_overview(env: &util::Env, want: f64) {
    // Spend per workflow and model in /metrics, as a real Prometheus scrapes it.
    let board = env.steward(&["dashboard", "--json"]).json();
    let board_addr = board["listen"].as_str().unwrap().to_string();
    let metrics = http_get(&board_addr, "/metrics");
    if let Some(said) = util::promtool_objection(&metrics) {
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
}
