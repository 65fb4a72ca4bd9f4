//! Webhooks from real senders, exactly once, against a real daemon on loopback. The
//! deliveries are signed by `tests/fixtures/webhook_send.py` as each provider documents
//! it (GitHub and Stripe by hand with Python's hmac, Standard Webhooks by the
//! `standardwebhooks` package from PyPI), not by steward: a signature steward accepts is
//! one the real sender makes. Each workflow is live, so a run that should not happen
//! would commit, and the ledger would show it.

mod util;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use util::{runs_of, wait_for, Env, Spec};

/// (format, secret env var, secret)
const SENDERS: &[(&str, &str, &str)] = &[
    ("steward", "HOOK_STEWARD", "steward-hook-secret"),
    ("github", "HOOK_GITHUB", "github-hook-secret"),
    ("stripe", "HOOK_STRIPE", "whsec_stripe-test-secret"),
    (
        "standard",
        "HOOK_STANDARD",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ),
];

/// One delivery: (HTTP status, the answer's JSON or text).
fn send(addr: &str, format: &str, secret: &str, id: &str, ts: i64, body: &str) -> (u16, Value) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/webhook_send.py"
    );
    let out = Command::new(util::python())
        .arg(script)
        .args([addr, &format!("/hooks/{format}"), format, secret, id])
        .arg(ts.to_string())
        .arg(body)
        .output()
        .expect("run webhook_send.py");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "webhook_send.py: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, answer) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
    let answer = serde_json::from_str(answer).unwrap_or(Value::String(answer.to_string()));
    (status.parse().unwrap(), answer)
}

/// A live workflow per format whose commit appends the run id to the ledger.
fn setup(env: &Env) {
    std::fs::write(
        env.config.join("steward.toml"),
        "webhook_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    for (format, var, _) in SENDERS {
        env.live_workflow(
            &Spec::new(format, "cat >/dev/null\necho '{\"ok\":1}'\n").trigger(&format!(
                "webhook = {{ path = \"/hooks/{format}\", secret_env = \"{var}\", format = \"{format}\" }}"
            )),
        );
    }
}

fn committed(env: &Env, workflow: &str) -> usize {
    let ids: Vec<String> = runs_of(env, workflow)
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    env.ledger_lines()
        .iter()
        .filter(|l| ids.contains(l))
        .count()
}

#[test]
fn each_senders_delivery_runs_once_and_a_replay_or_redelivery_runs_nothing() {
    let env = Env::new();
    setup(&env);
    let vars: Vec<(&str, &str)> = SENDERS.iter().map(|(_, v, s)| (*v, *s)).collect();
    let _d = env.daemon_env(&[], &vars);
    let addr = env.webhook_addr();
    let now = chrono::Utc::now().timestamp();
    for (format, _, secret) in SENDERS {
        let body = format!(r#"{{"id":"evt_{format}_1","type":"paid"}}"#);
        let (status, first) = send(&addr, format, secret, "delivery-1", now, &body);
        assert_eq!(status, 202, "{format}: {first}");
        let run_id = first["run_id"].as_str().unwrap().to_string();
        // The ledger line is written by the commit step, before the run's record ends.
        wait_for(
            &format!("{format}'s commit and the end of its run"),
            Duration::from_secs(30),
            || {
                committed(&env, format) == 1
                    && runs_of(&env, format)
                        .first()
                        .is_some_and(|r| r["state"] != "running")
            },
        );
        let run = &runs_of(&env, format)[0];
        assert_eq!(run["state"], "success", "{run:#}");
        assert_eq!(run["trigger"]["format"], *format, "{run:#}");
        assert_eq!(run["trigger"]["body"]["type"], "paid", "{run:#}");
        let key = run["idempotency_key"].as_str().unwrap();
        assert_eq!(key, run["trigger"]["delivery_id"], "{run:#}");
        let headers = run["trigger"]["headers"].as_object().unwrap();
        for name in headers.keys() {
            assert!(
                !name.contains("signature"),
                "{format}: the run sees {name}: {run:#}"
            );
        }

        // The same request twice more, as an attacker's replay or a sender's retry would.
        for _ in 0..2 {
            let (status, again) = send(&addr, format, secret, "delivery-1", now, &body);
            assert_eq!(status, 200, "{format}: {again}");
            assert_eq!(again["duplicate"], true, "{format}: {again}");
            assert_eq!(again["run_id"], run_id.as_str(), "{format}: {again}");
        }
        // A redelivery: the sender's id again, signed anew a second later. steward's own
        // format has no id of its own: there a new timestamp is a new delivery.
        if *format != "steward" {
            let (status, again) = send(&addr, format, secret, "delivery-1", now + 1, &body);
            assert_eq!(status, 200, "{format} redelivery: {again}");
            assert_eq!(again["run_id"], run_id.as_str(), "{format}: {again}");
        }
        // A wrong secret and (where the format signs a time) a stale timestamp: 401.
        let (status, why) = send(&addr, format, "whsec_d3JvbmctdmFsdWU=", "d-2", now, &body);
        assert_eq!(status, 401, "{format} wrong secret: {why}");
        if *format != "github" {
            let (status, why) = send(&addr, format, secret, "d-3", now - 3600, &body);
            assert_eq!(status, 401, "{format} stale: {why}");
        }
    }
    // A second, new delivery each: it runs. Then each workflow has run exactly twice and
    // committed twice, so no replay, redelivery or refused request started a run.
    for (format, _, secret) in SENDERS {
        let body = format!(r#"{{"id":"evt_{format}_2","type":"paid"}}"#);
        let (status, answer) = send(&addr, format, secret, "delivery-2", now + 2, &body);
        assert_eq!(status, 202, "{format}: {answer}");
    }
    for (format, _, _) in SENDERS {
        wait_for(
            &format!("{format}'s second commit"),
            Duration::from_secs(30),
            || committed(&env, format) == 2,
        );
        let runs = runs_of(&env, format);
        assert_eq!(runs.len(), 2, "{format}: {runs:#?}");
    }
}

#[test]
fn a_delivery_is_remembered_across_a_restart() {
    let env = Env::new();
    setup(&env);
    let vars: Vec<(&str, &str)> = SENDERS.iter().map(|(_, v, s)| (*v, *s)).collect();
    let (format, _, secret) = SENDERS[1];
    let now = chrono::Utc::now().timestamp();
    let body = r#"{"action":"opened"}"#;
    let mut d = env.daemon_env(&[], &vars);
    let (status, first) = send(&env.webhook_addr(), format, secret, "gh-1", now, body);
    assert_eq!(status, 202, "{first}");
    wait_for("the commit", Duration::from_secs(30), || {
        committed(&env, format) == 1
    });
    d.stop(Duration::from_secs(10));
    let _d = env.daemon_env(&[], &vars);
    let (status, again) = send(&env.webhook_addr(), format, secret, "gh-1", now, body);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["run_id"], first["run_id"], "{again}");
    assert_eq!(runs_of(&env, format).len(), 1);
}
