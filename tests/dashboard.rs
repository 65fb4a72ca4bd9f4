//! The dashboard and `/metrics`, against a real daemon: its guard spoken to over raw
//! HTTP (so a test can send what a browser never would), its pages in headless Chromium
//! driven by Selenium (`tests/browser/dashboard.py`), and `/metrics` scraped by a real
//! Prometheus server and linted by `promtool`. Debian's `chromium`, `chromium-driver`
//! and `prometheus` packages are needed; `.ci/run` installs them.

mod util;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use util::http::{board, request, Headers};
use util::{Daemon, Env, Spec, COMMIT};

/// What the tests' maker prints, and the secret the daemon holds; no page may show it.
const SECRET: &str = "s3cr3t-dashboard-value-7781";

/// A store with something on every page: three committed runs (whose maker sees a
/// secret), a dead letter, a run waiting for review, and an agency case.
struct Populated {
    daemon: Daemon,
    tidy_runs: Vec<String>,
    dead_run: String,
    review_run: String,
    case_id: String,
}

fn populate(env: &Env) -> Populated {
    env.live_workflow(
        &Spec::new(
            "tidy",
            "cat >/dev/null\necho 'charge tokens 120' >&3\necho \"the token is $API_TOKEN\" >&2\necho \"{\\\"note\\\": \\\"$API_TOKEN\\\"}\"\n",
        )
        .env("API_TOKEN = { from_env = \"DASH_SECRET\" }"),
    );
    env.workflow(
        &Spec::new("broken", "cat >/dev/null\necho 'no luck' >&2\nexit 1\n")
            .tables("[retry]\nattempts = 1\n"),
    );
    env.live_workflow(
        &Spec::new("gate", "cat >/dev/null\necho '{}'\n")
            .verify("cat >/dev/null\necho escalate\necho 'a person should look'\n"),
    );
    let planner = env.script(
        "planner.sh",
        "cat >/dev/null\necho '{\"action\":\"dispatch\",\"member\":\"m\",\"task\":\"t\",\"needed_scope\":[]}'\n",
    );
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    std::fs::write(
        env.config.join("agencies/ag.toml"),
        format!(
            "id = \"ag\"\nmandate = \"tidy up\"\nplanner = [\"{planner}\"]\nescalation_contact = \"ops@example.org\"\n\
             [limits]\nmax_turns = 10\nmax_acts = 1\nmax_spend_usd = 5.0\n\
             [[roster]]\nname = \"m\"\nworkflow = \"tidy\"\nscopes = []\n"
        ),
    )
    .unwrap();
    let daemon = env.daemon_env(&[], &[("DASH_SECRET", SECRET)]);
    let tidy_runs: Vec<String> = (0..3)
        .map(|_| {
            let out = env.run("tidy", true);
            assert_eq!(out.state(), "success", "{out}");
            out.run_id()
        })
        .collect();
    let out = env.run("broken", false);
    assert_eq!(out.state(), "failed", "{out}");
    let dead_run = out.run_id();
    let out = env.run("gate", true);
    assert_eq!(out.state(), "approval-required", "{out}");
    let review_run = out.run_id();
    let out = env.steward(&["case", "open", "--agency", "ag", "--case", "c1"]);
    assert_eq!(out.code, 0, "{out}");
    Populated {
        daemon,
        tidy_runs,
        dead_run,
        review_run,
        case_id: "c1".into(),
    }
}

#[test]
fn the_guard_refuses_no_cookie_a_wrong_host_a_wrong_token_and_a_post_without_csrf() {
    let env = Env::new();
    let p = populate(&env);
    let b = board(&env);
    let mode = std::fs::metadata(env.state.join("dashboard.token")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);

    let r = request(&b.addr, "GET", "/", &[], "");
    assert_eq!(r.status, 401, "no cookie: {}", r.body);
    let r = request(
        &b.addr,
        "GET",
        "/?token=0123456789abcdef0123456789abcdef",
        &[],
        "",
    );
    assert_eq!(r.status, 403, "a wrong token: {}", r.body);
    assert!(r.header("set-cookie").is_none());

    let r = request(
        &b.addr,
        "GET",
        &format!("/runs?token={}&state=success", b.token),
        &[],
        "",
    );
    assert_eq!(r.status, 303);
    assert_eq!(
        r.header("location"),
        Some("/runs?state=success"),
        "the token leaves the URL"
    );
    let set = r.header("set-cookie").unwrap();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attr), "{attr} missing from {set}");
    }
    let cookie = b.sign_in();
    let r = b.get(&cookie, "/");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(&b.token), "the page shows the token");

    // A DNS name rebound to 127.0.0.1 sends its own Host: refused, even with the cookie.
    let port = b.addr.rsplit(':').next().unwrap();
    for host in [
        format!("attacker.example:{port}"),
        "127.0.0.1:1".into(),
        String::new(),
    ] {
        let r = request(
            &b.addr,
            "GET",
            "/",
            &[("Host", &host), ("Cookie", &cookie)],
            "",
        );
        assert_eq!(r.status, 421, "Host {host:?}: {}", r.body);
    }
    let r = request(
        &b.addr,
        "GET",
        "/",
        &[("Host", &format!("localhost:{port}")), ("Cookie", &cookie)],
        "",
    );
    assert_eq!(
        r.status, 200,
        "localhost:PORT is the same loopback listener"
    );

    // POSTs: without the CSRF token, with a wrong one, from another origin — all refused
    // and the run still waits; without the cookie refused before the form is read.
    let approve = format!("/review/{}/approve", p.review_run);
    let csrf = b.csrf(&cookie);
    let other_origin = [
        ("Cookie", cookie.as_str()),
        ("Origin", "http://attacker.example"),
    ];
    let refused: [(&Headers, String, u16); 4] = [
        (&[("Cookie", &cookie)], String::new(), 403),
        (
            &[("Cookie", &cookie)],
            format!("csrf={}", "0".repeat(64)),
            403,
        ),
        (&other_origin, format!("csrf={csrf}"), 403),
        (&[], format!("csrf={csrf}"), 401),
    ];
    for (headers, body, status) in refused {
        let r = request(&b.addr, "POST", &approve, headers, &body);
        assert_eq!(
            r.status, status,
            "POST {body:?} with {headers:?}: {}",
            r.body
        );
    }
    let review = env.steward(&["review", "--json"]).json();
    assert_eq!(review.as_array().unwrap().len(), 1, "{review:#}");
    assert!(
        !env.ledger_lines().contains(&p.review_run),
        "a refused POST committed"
    );
    // With all of it, the same POST is the CLI's approve.
    let r = request(
        &b.addr,
        "POST",
        &approve,
        &[("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(env.ledger_lines().contains(&p.review_run));
}

/// The Selenium driver, a line in and a line out per command.
struct Browser {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Browser {
    fn open(url: &str) -> Browser {
        for binary in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                std::path::Path::new(binary).exists(),
                "{binary} is missing: apt-get install chromium chromium-driver (.ci/run does)"
            );
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/dashboard.py");
        let mut child = Command::new(util::python())
            .arg(script)
            .arg(url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the Selenium driver");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Browser {
            child,
            stdin,
            stdout,
        }
    }

    fn ask(&mut self, command: Value) -> Value {
        writeln!(self.stdin, "{command}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "the browser driver died on {command}");
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert!(
            answer.get("error").is_none(),
            "the browser refused {command}: {} {}",
            answer["error"],
            answer["message"]
        );
        answer
    }

    fn visit(&mut self, path: &str, width: u32) -> Value {
        self.ask(json!({ "visit": path, "width": width }))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(page: &Value) -> &str {
    page["text"].as_str().unwrap_or("")
}

#[test]
fn chromium_shows_every_page_with_real_runs_and_approves_through_the_daemon() {
    let env = Env::new();
    let p = populate(&env);
    let b = board(&env);
    let mut browser = Browser::open(&b.url);
    let tidy = &p.tidy_runs[0];
    let pages = [
        ("/", "Overview", vec!["tidy", "gate", "broken", "live"]),
        (
            "/runs",
            "Runs",
            vec![tidy.as_str(), p.dead_run.as_str(), p.review_run.as_str()],
        ),
        ("/runs?workflow=gate", "Runs", vec![p.review_run.as_str()]),
        (
            &format!("/runs/{tidy}"),
            "Run",
            vec![
                "success",
                "tokens",
                "tool calls",
                "commit",
                "[REDACTED:API_TOKEN]",
            ],
        ),
        (
            "/dead-letter",
            "Dead-letter",
            vec![p.dead_run.as_str(), "broken"],
        ),
        (
            "/review",
            "Review",
            vec![p.review_run.as_str(), "a person should look"],
        ),
        ("/cases", "Agency cases", vec![p.case_id.as_str()]),
        (&format!("/cases/{}", p.case_id), "Case", vec!["intact"]),
    ];
    for (path, title, shows) in &pages {
        for width in [1200, 360] {
            let page = browser.visit(path, width);
            assert!(
                page["title"].as_str().unwrap().contains(title),
                "{path}: title {}",
                page["title"]
            );
            for s in shows {
                assert!(
                    text(&page).contains(s),
                    "{path} does not show {s}:\n{}",
                    text(&page)
                );
            }
            assert_eq!(page["fits"], true, "{path} scrolls sideways at {width} px");
            let html = page["html"].as_str().unwrap();
            assert!(!html.contains(SECRET), "{path} shows the secret");
            assert!(!html.contains(&b.token), "{path} shows the dashboard token");
        }
    }
    let filtered = browser.visit("/runs?workflow=gate", 1200);
    assert!(
        !text(&filtered).contains(tidy.as_str()),
        "the filter let tidy through"
    );
    let live = browser.ask(json!({ "visit": "/live", "wait_for": &p.review_run }));
    assert!(text(&live).contains("tidy"), "{}", text(&live));

    // Approving from the page while SIGUSR1 forces dry-run: refused, still waiting.
    p.daemon.signal(Signal::SIGUSR1);
    util::wait_for("forced dry-run", Duration::from_secs(5), || {
        env.steward(&["status", "--json"]).json()["forced_dry_run"] == true
    });
    let button = format!("#review-{} button[name=approve]", p.review_run);
    let page = browser.ask(json!({ "click": &button, "on": "/review" }));
    assert!(text(&page).contains("forced dry-run"), "{}", text(&page));
    assert!(
        !env.ledger_lines().contains(&p.review_run),
        "committed under SIGUSR1"
    );
    let review = env.steward(&["review", "--json"]).json();
    assert_eq!(review[0]["run_id"], p.review_run.as_str(), "{review:#}");

    p.daemon.signal(Signal::SIGUSR2);
    util::wait_for("forced dry-run lifted", Duration::from_secs(5), || {
        env.steward(&["status", "--json"]).json()["forced_dry_run"] == false
    });
    let page = browser.ask(json!({ "click": &button, "on": "/review" }));
    assert!(text(&page).contains("success"), "{}", text(&page));
    let committed: Vec<_> = env
        .ledger_lines()
        .into_iter()
        .filter(|l| *l == p.review_run)
        .collect();
    assert_eq!(committed.len(), 1, "the approval commits once");
    let rec = env.steward(&["show", &p.review_run, "--json"]).json();
    assert_eq!(rec["state"], "success", "{rec:#}");
    let review = browser.visit("/review", 1200);
    assert!(
        text(&review).contains("Nothing waits for review"),
        "{}",
        text(&review)
    );

    // Screenshots: the README's come from here (STEWARD_SCREENSHOTS=docs).
    let dir = std::env::var("STEWARD_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| env.path("shots"));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, path, width) in [
        ("dashboard-overview.png", "/".to_string(), 1200),
        ("dashboard-run.png", format!("/runs/{tidy}"), 1200),
        ("dashboard-overview-narrow.png", "/".to_string(), 360),
    ] {
        let file = dir.join(name);
        browser.ask(json!({ "screenshot": path, "file": &file, "width": width, "height": 900 }));
        let png = std::fs::read(&file).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{} is no PNG", file.display());
    }
}

#[test]
fn prometheus_scrapes_the_metrics_and_promtool_accepts_them() {
    for binary in ["/usr/bin/prometheus", "/usr/bin/promtool"] {
        assert!(
            std::path::Path::new(binary).exists(),
            "{binary} is missing: apt-get install prometheus (.ci/run does)"
        );
    }
    let env = Env::new();
    let p = populate(&env);
    let b = board(&env);
    let paused = env.steward(&["pause", "broken", "--reason", "looking into it"]);
    assert_eq!(paused.code, 0, "{paused}");

    // The classic text, as a plain request gets it, passes promtool's lint.
    let r = request(&b.addr, "GET", "/metrics", &[], "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    if let Some(said) = util::promtool_objection(&r.body) {
        panic!("promtool check metrics:\n{said}\n--- the text\n{}", r.body);
    }
    assert!(!r.body.contains(SECRET));
    let with_host = request(
        &b.addr,
        "GET",
        "/metrics",
        &[("Host", "attacker.example")],
        "",
    );
    assert_eq!(with_host.status, 421, "/metrics keeps the Host check");

    let prometheus = util::Prometheus::scraping(&env.path("prometheus"), &b.addr);
    let expect = [
        (
            "steward_runs_total{workflow=\"tidy\",state=\"success\"}",
            "3",
        ),
        (
            "steward_runs_total{workflow=\"broken\",state=\"failed\"}",
            "1",
        ),
        (
            "steward_runs_total{workflow=\"gate\",state=\"approval-required\"}",
            "1",
        ),
        ("steward_dead_letters", "1"),
        ("steward_review_waiting", "1"),
        ("steward_forced_dry_run", "0"),
        (
            "steward_paused{workflow=\"broken\",cause=\"operator\"}",
            "1",
        ),
        ("steward_run_duration_seconds_count{workflow=\"tidy\"}", "3"),
    ];
    for (query, want) in expect {
        let got = prometheus.value(query);
        assert_eq!(got.as_deref(), Some(want), "{query} in Prometheus");
    }
    let success = prometheus
        .value("steward_last_success_timestamp_seconds{workflow=\"tidy\"}")
        .and_then(|v| v.parse::<f64>().ok())
        .expect("a last success time for tidy");
    let rec = env.steward(&["show", &p.tidy_runs[2], "--json"]).json();
    let ended = chrono::DateTime::parse_from_rfc3339(rec["ended_at"].as_str().unwrap()).unwrap();
    assert!(
        (success - ended.timestamp() as f64).abs() <= 1.0,
        "last success {success} vs the newest run's end {ended}"
    );
}

#[test]
fn the_dashboard_can_be_turned_off_and_refuses_a_remote_address_unless_meant() {
    let env = Env::new();
    env.workflow(&Spec::new("w", "cat >/dev/null\necho '{}'\n").commit(COMMIT));
    std::fs::write(
        env.config.join("steward.toml"),
        "[dashboard]\nlisten = \"0.0.0.0:0\"\n",
    )
    .unwrap();
    let out = env.steward(&["validate"]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("steward.toml"), "{out}");
    assert!(out.stderr.contains("[dashboard] listen"), "{out}");
    assert!(out.stderr.contains("allow_remote"), "{out}");
    std::fs::write(
        env.config.join("steward.toml"),
        "[dashboard]\nlisten = \"0.0.0.0:0\"\nallow_remote = true\n",
    )
    .unwrap();
    let out = env.steward(&["validate"]);
    assert_eq!(out.code, 0, "{out}");

    let _d = env.daemon(&["--dashboard", "off"]);
    let out = env.steward(&["dashboard"]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("serves no dashboard"), "{out}");
    assert!(!env.state.join("dashboard.token").exists());
}
