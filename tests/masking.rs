//! Secret masking that keeps the structure and catches encodings, against a real daemon:
//! a secret too short to mask is refused, a short one that looks like JSON syntax leaves
//! every runlog line valid JSON, and a secret's base64, hex, URL-encoded and JSON forms —
//! made by the maker with Python's own encoders — reach neither the runlog, `show`, the
//! dead letter nor the dashboard.

mod util;

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;
use util::{wait_for, Env, Spec};

/// A maker that prints the secret in every form it travels in, on stdout, stderr and fd 3,
/// writes those forms to `$MARKS/forms.json` for the test (outside anything steward
/// keeps), and fails, so the run is dead-lettered.
const ENCODER: &str = r#"
import base64, binascii, json, os, sys, urllib.parse
t = os.environ["API_TOKEN"].encode()
forms = {
    "base64": base64.b64encode(t).decode(),
    "base64_offset_1": base64.b64encode(b"a" + t).decode(),
    "base64_offset_2": base64.b64encode(b"ab" + t).decode(),
    "base64url": base64.urlsafe_b64encode(b"user:" + t).decode(),
    "hex": binascii.hexlify(t).decode(),
    "HEX": binascii.hexlify(t).decode().upper(),
    "url": urllib.parse.quote(t, safe=""),
    "form": urllib.parse.quote_plus(t),
    "raw": t.decode(),
}
json.dump(forms, open(os.path.join(os.environ["MARKS"], "forms.json"), "w"))
sys.stdin.read()
text = " ".join(forms.values())
os.write(3, ("note " + text + "\n").encode())
print(text, file=sys.stderr)
print(json.dumps({"forms": forms, "line": "Authorization: Basic " + forms["base64url"]}))
sys.exit(1)
"#;

fn sign_in(addr: &str, token: &str) -> String {
    let r = http(addr, &format!("/?token={token}"), "");
    let cookie = r
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or(l.strip_prefix("Set-Cookie: "))
        })
        .unwrap_or_else(|| panic!("no cookie: {r}"));
    cookie.split(';').next().unwrap().to_string()
}

/// One GET on its own connection; the whole response as text.
fn http(addr: &str, path: &str, cookie: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

#[test]
fn a_secrets_encoded_forms_reach_no_runlog_show_dead_letter_or_page() {
    let env = Env::new();
    let secret = "p@ss/w0rd+x=Z";
    std::fs::write(env.path("encoder.py"), ENCODER).unwrap();
    let py = util::python();
    env.live_workflow(
        &Spec::new(
            "w",
            &format!(
                "exec {} {}\n",
                py.display(),
                env.path("encoder.py").display()
            ),
        )
        .env("API_TOKEN = { from_env = \"TEST_API_TOKEN\" }")
        // Python's encoders live outside what a confined maker may read; confinement is
        // tested in tests/sandbox.rs.
        .tables("[sandbox]\nenabled = false\n"),
    );
    let _d = env.daemon_env(&[], &[("TEST_API_TOKEN", secret)]);
    let run = env.run("w", true);
    assert_eq!(run.state(), "failed", "{run}");
    let id = run.run_id();
    let forms: Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("forms.json")).unwrap()).unwrap();
    let forms: Vec<(String, String)> = forms
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();

    let status = env.steward(&["status", "--json"]).json();
    let addr = status["dashboard_listen"].as_str().unwrap().to_string();
    let token = std::fs::read_to_string(env.state.join("dashboard.token")).unwrap();
    let cookie = sign_in(&addr, token.trim());
    let run_page = http(&addr, &format!("/runs/{id}"), &cookie);
    assert!(run_page.contains("REDACTED:API_TOKEN"), "{run_page}");
    let places = [
        ("the runlog", env.runlog_text()),
        ("show", env.steward(&["show", &id, "--json"]).stdout),
        ("show (text)", env.steward(&["show", &id]).stdout),
        (
            "the dead letter",
            env.steward(&["dead-letter", "show", &id, "--json"]).stdout,
        ),
        ("the run page", run_page),
        ("the dead-letter page", http(&addr, "/dead-letter", &cookie)),
    ];
    for (place, text) in &places {
        for (form, value) in &forms {
            assert!(
                !text.contains(value.as_str()),
                "the secret's {form} form `{value}` is in {place}:\n{text}"
            );
        }
    }
    for line in env.runlog_text().lines() {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("a runlog line is not JSON ({e}): {line}"));
    }
}

#[test]
fn a_one_character_secret_is_refused_with_the_reason() {
    let env = Env::new();
    env.live_workflow(
        &Spec::new("w", "cat >/dev/null\necho '{}'\n")
            .env("API_TOKEN = { from_env = \"TEST_API_TOKEN\" }"),
    );
    let out = env.steward_env(
        &["run", "w", "--live", "--json"],
        &[("TEST_API_TOKEN", "a")],
    );
    assert_eq!(out.state(), "failed", "{out}");
    assert!(out.reason().contains("shorter than 6"), "{out}");
    assert!(env.ledger_lines().is_empty(), "{out}");

    // A literal secret in the file is refused when the config is read.
    let file = env.workflow(
        &Spec::new("lit", "cat >/dev/null\n").env("API_TOKEN = { value = \"a\", secret = true }"),
    );
    let out = env.steward(&["validate"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("env.API_TOKEN"), "{out}");
    assert!(out.stderr.contains("shorter than 6"), "{out}");
    assert!(
        out.stderr
            .contains(&file.file_name().unwrap().to_string_lossy().to_string()),
        "{out}"
    );
}

#[test]
fn a_six_character_secret_like_json_syntax_leaves_every_runlog_line_json() {
    let env = Env::new();
    // `false,` is in nearly every runlog line: masked as text, the lines would break.
    let secret = "false,";
    let run = "cat >/dev/null\necho \"note saw $API_TOKEN here\" >&3\nprintf '{\"said\": \"%s\"}\\n' \"$API_TOKEN\"\n";
    env.live_workflow(&Spec::new("w", run).env("API_TOKEN = { from_env = \"TEST_API_TOKEN\" }"));
    let _d = env.daemon_env(&[], &[("TEST_API_TOKEN", secret)]);
    for _ in 0..2 {
        let out = env.run("w", false);
        assert_eq!(out.state(), "success", "{out}");
    }
    wait_for("the runlog", Duration::from_secs(10), || {
        env.runlog_text().contains("REDACTED:API_TOKEN")
    });
    let text = env.runlog_text();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a runlog line is not JSON ({e}): {line}"));
        assert!(v["ts"].is_string(), "{line}");
    }
    let logs = env.steward(&["logs"]);
    assert!(!logs.stdout.contains("unreadable"), "{logs}");
}
