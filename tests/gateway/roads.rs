//! The other roads of a model call: a checker's, an agent CLI's printed usage, a provider's error, a run without a daemon.

use super::*;

/// The HTTP status of a chat completion posted to `base` (`http://ADDR/openai/v1`) with
/// `key`.
pub(crate) fn status_of_call(base: &str, key: &str) -> u16 {
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
pub(crate) fn http_get(addr: &str, path: &str) -> String {
    http_get_with(addr, path, "")
}

pub(crate) fn http_get_with(addr: &str, path: &str, headers: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or(raw)
}

/// A dashboard page, signed in the way a browser is: the token URL sets the cookie.
pub(crate) fn http_get_signed_in(addr: &str, token: &str, path: &str) -> String {
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
pub(crate) fn post_raw(addr: &str, path: &str, key: &str, body: &Value) -> (u16, String, String) {
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
