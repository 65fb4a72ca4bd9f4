//! The digest by mail through a real SMTP server: each recipient, headers a real parser reads, a rejection, a relay down, dry runs.

use super::*;

#[test]
fn a_real_smtp_server_receives_the_digest_for_each_recipient() {
    let env = Env::new();
    let smtp = util::smtp_server(&[]);
    setup(
        &env,
        &file_source("gh", "rss.xml"),
        NOOP_AGENT,
        &util::smtp_settings(smtp.port),
    );
    env.distribution(
        "# Readers\n- Ada <ada@example.org>\n- bob@example.org\n- carol@example.org\n",
    );
    env.steward(&["go-live", "noop-test-agent"]);
    let run = env.steward(&["digest", "noop-test-agent"]);
    let line = summary(&run);
    assert!(
        line.contains("emailed=3/3") && line.contains("failures=0"),
        "{line}"
    );
    let msgs = smtp.messages.lock().unwrap().clone();
    assert_eq!(msgs.len(), 3);
    let mut to: Vec<String> = msgs.iter().flat_map(|(r, _)| r.clone()).collect();
    to.sort();
    assert_eq!(
        to,
        ["ada@example.org", "bob@example.org", "carol@example.org"]
    );
    let mail = read_mail(&msgs[0].1);
    assert!(
        mail["headers"]["subject"][0]
            .as_str()
            .unwrap()
            .starts_with("noop-test-agent digest"),
        "{mail:#}"
    );
    assert!(
        mail["parts"][0]["text"]
            .as_str()
            .unwrap()
            .contains("## Sources"),
        "the digest is the body: {mail:#}"
    );
}

/// A message as Python's `email` package reads it (tests/fixtures/mime_read.py).
pub(crate) fn read_mail(data: &str) -> serde_json::Value {
    use std::io::Write;
    let mut child = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/mime_read.py"
        ))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(data.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the MIME parser failed on:\n{data}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What large providers expect of a sender: Message-ID, Date, MIME-Version, a text and
/// an HTML part of the same digest, the reader's display name, List-Id and
/// List-Unsubscribe; and the same digest is never mailed to the same reader twice.
#[test]
fn the_mail_reads_like_a_real_senders_and_one_digest_goes_out_once() {
    let env = Env::new();
    let smtp = util::smtp_server(&[]);
    let settings = format!(
        "{}list_unsubscribe = \"<mailto:digest-off@example.org>\"\n",
        util::smtp_settings(smtp.port)
    );
    setup(&env, &file_source("gh", "rss.xml"), NOOP_AGENT, &settings);
    env.distribution("# Readers\n- Ada Lovelace <ada@example.org>\n");
    env.steward(&["go-live", "noop-test-agent"]);
    let run = env.steward(&["digest", "noop-test-agent", "--json"]);
    assert_eq!(run.code, 0, "{run}");
    let msgs = smtp.messages.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{run}");
    let mail = read_mail(&msgs[0].1);
    let header = |name: &str| -> String {
        mail["headers"][name][0]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} header: {mail:#}"))
            .to_string()
    };
    assert_eq!(mail["defects"], serde_json::json!([]), "{mail:#}");
    let id = header("message-id");
    assert!(id.starts_with('<') && id.ends_with("@example.org>"), "{id}");
    assert!(!header("date").is_empty());
    assert_eq!(header("mime-version"), "1.0");
    assert_eq!(header("to"), "Ada Lovelace <ada@example.org>");
    assert_eq!(header("list-id"), "<noop-test-agent.steward.example.org>");
    assert_eq!(
        header("list-unsubscribe"),
        "<mailto:digest-off@example.org>"
    );
    assert_eq!(mail["type"], "multipart/alternative", "{mail:#}");
    let parts = mail["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{mail:#}");
    assert_eq!(parts[0]["type"], "text/plain");
    assert_eq!(parts[1]["type"], "text/html");
    let text = parts[0]["text"].as_str().unwrap();
    let html = parts[1]["text"].as_str().unwrap();
    assert!(
        text.contains("## TL;DR") && !text.starts_with("---"),
        "{text}"
    );
    assert!(
        html.contains("<h2>TL;DR</h2>") && html.contains("<table>"),
        "{html}"
    );

    // The commit step again with the same digest (a retry, a re-run of the same day):
    // nobody gets it twice.
    let record = run.json();
    let ctx = serde_json::json!({ "output": record["output"] });
    let mut again = env
        .command(&["agent-step", "email", "noop-test-agent"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        again
            .stdin
            .take()
            .unwrap()
            .write_all(ctx.to_string().as_bytes())
            .unwrap();
    }
    let out = again.wait_with_output().unwrap();
    let delivery: serde_json::Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap();
    assert_eq!(delivery["already_sent"], 1, "{delivery}");
    assert_eq!(delivery["sent"], 0, "{delivery}");
    assert_eq!(smtp.messages.lock().unwrap().len(), 1, "mailed twice");
}

#[test]
fn a_rejected_recipient_gives_two_of_three_and_is_listed() {
    let env = Env::new();
    let smtp = util::smtp_server(&["bob@example.org"]);
    setup(
        &env,
        &file_source("gh", "rss.xml"),
        NOOP_AGENT,
        &util::smtp_settings(smtp.port),
    );
    env.distribution("- ada@example.org\n- bob@example.org\n- carol@example.org\n");
    env.steward(&["go-live", "noop-test-agent"]);
    let run = env.steward(&["digest", "noop-test-agent"]);
    let line = summary(&run);
    assert!(line.contains("emailed=2/3"), "{line}");
    assert!(line.contains("failures=1 (bob@example.org:"), "{line}");
    assert_eq!(smtp.messages.lock().unwrap().len(), 2);
    assert!(
        digest_path(&env, "daily", "noop-test-agent").exists(),
        "the digest stays written"
    );
}

#[test]
fn smtp_down_does_not_roll_back_the_digest() {
    let env = Env::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // closed again at once
    setup(
        &env,
        &file_source("gh", "rss.xml"),
        NOOP_AGENT,
        &util::smtp_settings(port),
    );
    env.distribution("- ada@example.org\n");
    env.steward(&["go-live", "noop-test-agent"]);
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert!(summary(&run).contains("email_failed=smtp:"), "{run}");
    assert!(digest_path(&env, "daily", "noop-test-agent").exists());
}

#[test]
fn digest_dry_run_writes_nothing_and_sends_nothing() {
    let env = Env::new();
    let smtp = util::smtp_server(&[]);
    setup(
        &env,
        &file_source("gh", "rss.xml"),
        NOOP_AGENT,
        &util::smtp_settings(smtp.port),
    );
    env.distribution("- ada@example.org\n");
    env.steward(&["go-live", "noop-test-agent"]);
    let run = env.steward(&["digest", "noop-test-agent", "--dry-run"]);
    assert_eq!(run.code, 0, "{run}");
    assert!(
        run.stdout.contains("## TL;DR"),
        "the would-be digest is shown\n{run}"
    );
    assert!(summary(&run).contains("written=none (dry-run)"), "{run}");
    assert!(!env.path("vault/digests").exists());
    assert!(!env.state.join("agents/noop-test-agent/seen.jsonl").exists());
    assert!(smtp.messages.lock().unwrap().is_empty());
}

/// A dry-run agent sends nothing by design: its summary says so, not `email_failed`
/// (which, with no distribution list, it used to log on every scheduled run).
#[test]
fn a_dry_run_digest_without_a_distribution_list_reports_email_skipped_not_failed() {
    let env = Env::new();
    setup(
        &env,
        &file_source("gh", "rss.xml"),
        &NOOP_AGENT.replace("dry_run = false", "dry_run = true"),
        "",
    );
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert_eq!(run.code, 0, "{run}");
    let line = summary(&run);
    assert!(line.contains("email_skipped=dry-run"), "{line}");
    assert!(!line.contains("email_failed"), "{line}");
    let log = env.runlog();
    let email = log.iter().find(|e| e["step"] == "maybe_email");
    assert!(
        email.is_none_or(|e| !e.to_string().contains("distribution list missing")),
        "{email:?}"
    );
}
