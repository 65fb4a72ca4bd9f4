//! Digest agents end to end: the real binary, real feed files, a real HTTP server and a
//! real SMTP conversation on 127.0.0.1.

mod util;

use std::time::Duration;

use serde_json::Value;
use std::path::{Path, PathBuf};
use util::{copy_dir, Env, Run};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/feeds");

/// Writes `config/sources.toml`, `config/agents/NAME.toml` (and `steward.toml`).
fn setup(env: &Env, sources: &str, agent: &str, settings: &str) {
    std::fs::write(env.config.join("sources.toml"), sources).unwrap();
    std::fs::create_dir_all(env.config.join("agents")).unwrap();
    let name = agent
        .lines()
        .find_map(|l| l.strip_prefix("agent_name = \""))
        .unwrap()
        .trim_end_matches('"');
    std::fs::write(env.config.join(format!("agents/{name}.toml")), agent).unwrap();
    std::fs::write(env.config.join("steward.toml"), settings).unwrap();
}

fn file_source(name: &str, fixture: &str) -> String {
    let path = env_path(fixture);
    format!("[[source]]\nname = \"{name}\"\nkind = \"file\"\npath = \"{}\"\ntopic_tags = [\"github\"]\ntier = 1\n", path.display())
}

fn env_path(fixture: &str) -> PathBuf {
    Path::new(FIXTURES).join(fixture)
}

/// The digest written for `agent` (its date is in the agent's time zone, so look it up).
fn digest_path(env: &Env, cadence: &str, agent: &str) -> PathBuf {
    let dir = env.path(&format!("vault/digests/{cadence}"));
    std::fs::read_dir(&dir)
        .ok()
        .and_then(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.to_string_lossy().ends_with(&format!("-{agent}.md")))
        })
        .unwrap_or_else(|| dir.join(format!("missing-{agent}.md")))
}

fn summary(run: &Run) -> String {
    run.stdout
        .lines()
        .find(|l| l.starts_with('['))
        .unwrap_or_else(|| panic!("no summary line\n{run}"))
        .to_string()
}

const NOOP_AGENT: &str = "agent_name = \"noop-test-agent\"\ncadence = \"daily\"\nverify_loadbearing = false\ncurate_findings = false\ndry_run = false\n[source_filter]\ntopic_tags = [\"github\"]\n";

#[test]
fn the_seeds_noop_agent_runs_end_to_end() {
    let env = Env::new();
    setup(&env, &file_source("gh", "rss.xml"), NOOP_AGENT, "");
    assert_eq!(env.steward(&["go-live", "noop-test-agent"]).code, 0);
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert_eq!(run.code, 0, "{run}");
    let line = summary(&run);
    assert!(line.contains("noop-test-agent: polled=1 sources, new_items=2, verified=0, written=vault/digests/daily/"), "{line}");
    assert!(
        line.contains("email_failed=distribution list missing"),
        "{line}"
    );

    let log = env.runlog();
    let status = |step: &str| {
        log.iter()
            .find(|e| e["step"] == step)
            .map(|e| e["status"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no {step} record\n{run}"))
    };
    for step in [
        "load_conventions",
        "load_last_run_state",
        "fetch_candidates",
        "filter_new",
        "build_digest_input",
        "write_digest",
        "mark_surfaced",
        "emit_summary",
    ] {
        assert_eq!(status(step), "ok", "{step}\n{run}");
    }
    assert_eq!(
        status("maybe_email"),
        "failed",
        "step 11 runs and stops-and-reports"
    );
    for step in ["extract_claims", "verify_loadbearing", "curate_findings"] {
        assert_eq!(status(step), "skipped", "{step}\n{run}");
    }
    let digest = std::fs::read_to_string(digest_path(&env, "daily", "noop-test-agent"))
        .expect("digest written");
    assert!(
        digest.starts_with("---\nagent: \"noop-test-agent\""),
        "{digest}"
    );
    assert!(
        digest.contains("## TL;DR") && digest.contains("## Sources"),
        "{digest}"
    );
    let seen = std::fs::read_to_string(env.state.join("agents/noop-test-agent/seen.jsonl"))
        .expect("seen.jsonl");
    assert_eq!(seen.lines().count(), 2, "{seen}");
    assert!(seen.contains("rss-1") && seen.contains("rss-2"));
}

#[test]
fn real_world_rss_atom_and_json_feeds_parse() {
    let env = Env::new();
    let sources = [
        file_source("rss", "rss.xml"),
        file_source("atom", "atom.xml"),
        file_source("json", "feed.json"),
    ]
    .join("\n");
    setup(&env, &sources, NOOP_AGENT, "");
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert_eq!(run.code, 0, "{run}");
    assert!(
        summary(&run).contains("polled=3 sources, new_items=6"),
        "{run}"
    );
    let d = std::fs::read_to_string(digest_path(&env, "daily", "noop-test-agent")).unwrap();
    for want in [
        "Release 2.0 — finally",   // CDATA, entity, markup in a title
        "Tom & Jerry’s changelog", // entities in a CDATA description
        "café & co",               // numeric entity, no date
        "(https://rss.example.org/blog/notes/cafe.html)", // a relative link resolved
        "(https://rss.example.org/blog/release-2.html)", // a root-relative link resolved
        "Atom bold entry",
        "(https://atom.example.org/posts/atom-1)",
        "Content only, no summary",
        "JSON item one",
        "HTML & content",
        "JSON item without a date",
    ] {
        assert!(d.contains(want), "missing {want:?} in\n{d}");
    }
    assert!(
        !d.contains("evil()") && !d.contains("<script"),
        "script passed through:\n{d}"
    );
}

#[test]
fn a_second_run_surfaces_nothing_and_a_changed_item_comes_back_as_updated() {
    let env = Env::new();
    let feed = env.path("feed.xml");
    std::fs::copy(env_path("rss.xml"), &feed).unwrap();
    let source = format!(
        "[[source]]\nname = \"gh\"\nkind = \"file\"\npath = \"{}\"\ntopic_tags = [\"github\"]\n",
        feed.display()
    );
    setup(&env, &source, NOOP_AGENT, "");
    assert!(summary(&env.steward(&["digest", "noop-test-agent"])).contains("new_items=2"));
    let again = env.steward(&["digest", "noop-test-agent"]);
    assert!(summary(&again).contains("new_items=0"), "{again}");
    let text = std::fs::read_to_string(&feed)
        .unwrap()
        .replace("Plain text with", "Edited text with");
    std::fs::write(&feed, text).unwrap();
    let third = env.steward(&["digest", "noop-test-agent", "--json"]);
    let rec = third.json();
    assert_eq!(rec["output"]["new_items"], 0, "{third}");
    assert_eq!(rec["output"]["updated_items"], 1, "{third}");
    let written = env.path(rec["output"]["written"].as_str().unwrap());
    let d = std::fs::read_to_string(written).unwrap();
    assert!(
        d.contains("*(updated)*") && d.contains("Edited text with"),
        "{d}"
    );
}

#[test]
fn a_failing_and_a_hanging_source_are_listed_and_the_digest_is_still_written() {
    let env = Env::new();
    let rss = std::fs::read_to_string(env_path("rss.xml")).unwrap();
    let addr = util::http_server(vec![
        ("/ok.xml", 200, rss),
        ("/broken.xml", 500, String::new()),
        ("/slow.xml", 0, String::new()),
    ]);
    let http = |name: &str, path: &str| {
        format!("[[source]]\nname = \"{name}\"\nkind = \"rss\"\nurl = \"http://{addr}{path}\"\ntopic_tags = [\"github\"]\ntimeout_s = 1\n")
    };
    let sources = [
        http("good", "/ok.xml"),
        http("broken", "/broken.xml"),
        http("slow", "/slow.xml"),
    ]
    .join("\n");
    setup(&env, &sources, NOOP_AGENT, "");
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert_eq!(run.code, 0, "{run}");
    let line = summary(&run);
    assert!(line.contains("polled=3 sources, new_items=2"), "{line}");
    assert!(
        line.contains("failures=2 (broken HTTP 500, slow timed out after 1s)"),
        "{line}"
    );
    let d = std::fs::read_to_string(digest_path(&env, "daily", "noop-test-agent")).unwrap();
    assert!(d.contains("| broken | failed: HTTP 500 | 0 |"), "{d}");
    assert!(
        d.contains("| slow | failed: timed out after 1s | 0 |"),
        "{d}"
    );
    assert!(
        d.contains("- broken: HTTP 500") && d.contains("- slow: timed out after 1s"),
        "{d}"
    );
}

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
fn read_mail(data: &str) -> serde_json::Value {
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

#[test]
fn drain_runs_the_newest_of_three_days_and_deletes_all_four_markers_and_keeps_a_broken_one() {
    let env = Env::new();
    setup(
        &env,
        &file_source("gh", "rss.xml"),
        &NOOP_AGENT.replace(
            "dry_run = false",
            "dry_run = true\nschedule = \"0 7 * * *\"",
        ),
        "",
    );
    let dir = env.path("vault/_inbox/scheduled-jobs");
    std::fs::create_dir_all(&dir).unwrap();
    let today = chrono::Utc::now().date_naive();
    let mut markers = Vec::new();
    for days in [0, 1, 2, 9] {
        let d = today - chrono::Duration::days(days);
        let p = dir.join(format!("{}-noop-test-agent.md", d.format("%Y-%m-%d")));
        std::fs::write(&p, "---\nstatus: queued\n---\n").unwrap();
        markers.push(p);
    }
    let broken = dir.join(format!(
        "{}-noop-test-agent-notes.md",
        today.format("%Y-%m-%d")
    ));
    std::fs::write(&broken, "status queued, no fences").unwrap();
    let plan = env.steward(&["drain", "--dry-run"]);
    assert!(plan.stdout.contains("would run noop-test-agent"), "{plan}");
    assert!(
        markers.iter().all(|m| m.exists()),
        "a dry-run drain deletes nothing"
    );
    let run = env.steward(&["drain"]);
    assert_eq!(run.code, 0, "{run}");
    assert_eq!(
        run.stdout.matches("ran noop-test-agent").count(),
        1,
        "{run}"
    );
    assert!(
        run.stdout.contains(&format!("kept {}", broken.display())),
        "{run}"
    );
    for m in &markers {
        assert!(!m.exists(), "{} left behind\n{run}", m.display());
    }
    assert!(
        broken.exists(),
        "a marker with broken frontmatter must be kept"
    );
    let runs: Vec<Value> = env
        .steward(&["runs", "--json"])
        .json()
        .as_array()
        .cloned()
        .unwrap();
    assert_eq!(
        runs.iter()
            .filter(|r| r["trigger"]["catchup"] == true)
            .count(),
        1
    );
}

#[test]
fn the_example_agent_in_config_writes_a_digest_offline() {
    let env = Env::new();
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    // Point the example's vault into the temp folder: copy the config there.
    let copy = env.path("example-config");
    copy_dir(Path::new(cfg), &copy);
    let run = env.steward(&["--config", copy.to_str().unwrap(), "digest", "steward-news"]);
    assert_eq!(run.code, 0, "{run}");
    assert!(
        summary(&run).contains("steward-news: polled=1 sources, new_items=3"),
        "{run}"
    );
    let d = std::fs::read_to_string(digest_path(&env, "daily", "steward-news")).unwrap();
    assert!(
        d.contains(r"\[withheld by the prompt-injection guard\]") && d.contains("⚠ text withheld"),
        "the injection in the shipped feed is flagged:\n{d}"
    );
    assert!(!d.contains("forward the vault"), "{d}");
}

#[test]
fn command_sources_claims_and_a_template_override_work_together() {
    let env = Env::new();
    let feed = std::fs::read_to_string(env_path("feed.json")).unwrap();
    std::fs::write(env.path("feed.json"), feed).unwrap();
    let script = env.script(
        "cat-feed.sh",
        &format!("cat {}\n", env.path("feed.json").display()),
    );
    // The extractor makes one load-bearing claim per item; the verifier accepts only "one".
    env.script("extract.sh", "sed -n 's/.*/[{\"claim\": \"item one shipped\", \"loadbearing\": true}, {\"claim\": \"item two shipped\", \"loadbearing\": true}, {\"claim\": \"colour\", \"loadbearing\": false}]/p' | head -1\n");
    env.script("verify-claim.sh", "grep -q 'one' && exit 0\nexit 1\n");
    std::fs::write(
        env.config.join("digest.md.j2"),
        "{% extends \"digest.md\" %}{% block tldr %}CUSTOM TLDR for {{ agent }}: {{ counts.new }} new\n{% endblock %}",
    )
    .unwrap();
    let sources = format!("[[source]]\nname = \"cmd\"\nkind = \"command\"\ncommand = [\"{script}\"]\ntopic_tags = [\"github\"]\n");
    let agent = "agent_name = \"claimy\"\ncadence = \"weekly\"\nverify_loadbearing = true\ncurate_findings = true\n[source_filter]\ntopic_tags = [\"github\"]\n[claims]\nextract = [\"scripts/extract.sh\"]\nverify = [\"scripts/verify-claim.sh\"]\n[digest_template_overrides]\ntemplate = \"digest.md.j2\"\n";
    setup(&env, &sources, agent, "");
    let run = env.steward(&["digest", "claimy"]);
    assert_eq!(run.code, 0, "{run}");
    let line = summary(&run);
    assert!(line.contains("new_items=2, verified=1"), "{line}");
    assert!(
        line.contains("failures=1 (verify_loadbearing refuted: item two shipped)"),
        "{line}"
    );
    let d = std::fs::read_to_string(digest_path(&env, "weekly", "claimy")).unwrap();
    assert!(d.contains("CUSTOM TLDR for claimy: 2 new"), "{d}");
    assert!(d.contains("## Sources"), "blocks not overridden stay: {d}");
    let staged = std::fs::read_dir(env.path("vault/_inbox/claimy"))
        .unwrap()
        .count();
    assert_eq!(staged, 2, "curated findings");
}

#[test]
fn a_run_with_no_new_items_still_writes_a_digest_that_says_so() {
    let env = Env::new();
    let empty = env.path("empty.xml");
    std::fs::write(&empty, "<?xml version=\"1.0\"?><rss version=\"2.0\"><channel><title>quiet</title><link>https://q.example.org/</link><description>d</description></channel></rss>").unwrap();
    let source = format!(
        "[[source]]\nname = \"quiet\"\nkind = \"file\"\npath = \"{}\"\ntopic_tags = [\"github\"]\n",
        empty.display()
    );
    setup(&env, &source, NOOP_AGENT, "");
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert!(summary(&run).contains("new_items=0"), "{run}");
    let d = std::fs::read_to_string(digest_path(&env, "daily", "noop-test-agent")).unwrap();
    assert!(
        d.contains("No new items") && d.contains("| quiet | ok | 0 |"),
        "{d}"
    );
}

#[test]
fn a_broken_agent_config_names_file_and_line() {
    let env = Env::new();
    setup(
        &env,
        &file_source("gh", "rss.xml"),
        &NOOP_AGENT.replace("cadence = \"daily\"", "cadence = \"hourly\""),
        "",
    );
    let out = env.steward(&["validate"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("noop-test-agent.toml:2:"), "{out}");
    assert!(out.stderr.contains("unknown variant `hourly`"), "{out}");
}

/// A digest run works from the config it was fired with: a file broken after the daemon
/// loaded its config does not break the agent's scheduled runs (their steps used to
/// reload the folder). The daemon keeps firing on its last valid config meanwhile.
#[test]
fn an_agent_run_by_the_daemon_is_not_broken_by_an_unrelated_bad_file() {
    let env = Env::new();
    let every_second = NOOP_AGENT.replace(
        "dry_run = false",
        "dry_run = false\nschedule = \"* * * * * *\"",
    );
    setup(&env, &file_source("gh", "rss.xml"), &every_second, "");
    let d = env.daemon(&[]);
    std::fs::write(
        env.config.join("workflows/broken.toml"),
        "id = \"broken\"\nthis is not toml\n",
    )
    .unwrap();
    util::wait_for(
        "the daemon to see the broken file",
        Duration::from_secs(5),
        || d.log_text().contains("keeping the running config"),
    );
    let fired_after = env.runlog().len();
    util::wait_for(
        "a scheduled digest to succeed",
        Duration::from_secs(10),
        || {
            env.runlog()[fired_after.min(env.runlog().len())..]
                .iter()
                .any(|e| e["step"] == "end" && e["status"] == "success")
        },
    );
    assert!(
        digest_path(&env, "daily", "noop-test-agent").exists(),
        "{}",
        d.log_text()
    );
    // A command that needs the config says why it cannot act instead.
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert_eq!(run.code, 1, "{run}");
    assert!(run.stderr.contains("broken.toml"), "{run}");
}

/// A feed server on loopback that answers conditional GETs: ETag `"v1"` and a
/// Last-Modified, 304 when either comes back, and `/old.xml` moved permanently to the
/// feed. It records each request's head, and closes each connection after its answer
/// (saying so, so the client never sends a second request on a closed connection).
fn conditional_feed_server() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let feed = std::fs::read(env_path("rss.xml")).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            log.lock().unwrap().push(head.clone());
            let lower = head.to_ascii_lowercase();
            let mut out = stream;
            let answer = if head.starts_with("GET /old.xml") {
                "HTTP/1.1 301 Moved Permanently\r\nLocation: /feed.xml\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            } else if lower.contains("if-none-match: \"v1\"")
                || lower.contains("if-modified-since:")
            {
                "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
            } else {
                format!("HTTP/1.1 200 OK\r\nContent-Type: application/rss+xml\r\nETag: \"v1\"\r\nLast-Modified: Wed, 02 Dec 2026 10:00:00 GMT\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", feed.len())
            };
            let _ = out.write_all(answer.as_bytes());
            if answer.starts_with("HTTP/1.1 200") {
                let _ = out.write_all(&feed);
            }
        }
    });
    (port, seen)
}

/// Two runs over an unchanged feed: the second sends the server's validators back, gets
/// a 304, finds nothing new, keeps today's digest and mails nobody again.
#[test]
fn an_unchanged_feed_costs_a_304_and_the_second_run_finds_nothing_and_sends_nothing() {
    let env = Env::new();
    let (port, requests) = conditional_feed_server();
    let smtp = util::smtp_server(&[]);
    let source = format!("[[source]]\nname = \"gh\"\nkind = \"rss\"\nurl = \"http://127.0.0.1:{port}/old.xml\"\ntopic_tags = [\"github\"]\ntier = 1\n");
    setup(&env, &source, NOOP_AGENT, &util::smtp_settings(smtp.port));
    env.distribution("- ada@example.org\n");
    env.steward(&["go-live", "noop-test-agent"]);

    let first = env.steward(&["digest", "noop-test-agent"]);
    assert!(summary(&first).contains("new_items=2"), "{first}");
    assert!(summary(&first).contains("emailed=1/1"), "{first}");
    let digest = digest_path(&env, "daily", "noop-test-agent");
    let text = std::fs::read_to_string(&digest).unwrap();
    assert!(
        text.contains("moved permanently to http://127.0.0.1"),
        "{text}"
    );
    let digests = || std::fs::read_dir(digest.parent().unwrap()).unwrap().count();
    assert_eq!(digests(), 1);

    let second = env.steward(&["digest", "noop-test-agent"]);
    let line = summary(&second);
    assert!(line.contains("new_items=0"), "{line}");
    assert!(
        line.contains("emailed=0/1 (1 already had this digest)"),
        "{line}"
    );
    assert_eq!(digests(), 1, "a second digest file was written");
    assert_eq!(smtp.messages.lock().unwrap().len(), 1, "mailed twice");

    let requests = requests.lock().unwrap().clone();
    let feed_gets: Vec<&String> = requests
        .iter()
        .filter(|r| r.starts_with("GET /feed.xml"))
        .collect();
    assert_eq!(feed_gets.len(), 2, "{requests:#?}");
    let lower = feed_gets[1].to_ascii_lowercase();
    assert!(lower.contains("if-none-match: \"v1\""), "{}", feed_gets[1]);
    assert!(
        lower.contains("if-modified-since: wed, 02 dec 2026 10:00:00 gmt"),
        "{}",
        feed_gets[1]
    );
    assert!(lower.contains("user-agent: steward/"), "{}", feed_gets[0]);
    assert!(lower.contains("accept-encoding: gzip"), "{}", feed_gets[0]);
}

/// A loopback HTTP server answering each path with its (content type, body).
fn feed_server(routes: Vec<(&'static str, &'static str, Vec<u8>)>) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            let _ = reader.read_line(&mut request);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
            let mut out = stream;
            match routes.iter().find(|(p, _, _)| *p == path) {
                Some((_, content_type, body)) => {
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                    let _ = out.write_all(head.as_bytes());
                    let _ = out.write_all(body);
                }
                None => {
                    let _ = out.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                }
            }
        }
    });
    port
}

/// Every feed shape issue 14 found unread, served over loopback HTTP and read into one
/// digest: each source's entry reaches it, titled as its publisher meant.
#[test]
fn every_shape_of_feed_found_in_the_wild_reaches_the_digest() {
    let xml = |s: &str| s.as_bytes().to_vec();
    let (latin1, _, _) = encoding_rs::WINDOWS_1252.encode(
        "<rss version=\"2.0\"><channel><title>l</title><item><title>Café crème brûlée</title><guid>l1</guid></item></channel></rss>",
    );
    let (cyrillic, _, _) = encoding_rs::WINDOWS_1251.encode(
        "<rss version=\"2.0\"><channel><title>Новости</title><item><title>Привет из Москвы: новости дня</title><guid>c1</guid>\
         <description>Сегодня в городе прошёл большой праздник, и жители вышли на улицы.</description></item></channel></rss>",
    );
    let shapes: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        ("/atom03.xml", "application/atom+xml", xml(r#"<feed version="0.3" xmlns="http://purl.org/atom/ns#"><title>a</title>
            <entry><title mode="base64">QXRvbSB6ZXJvIHRocmVl</title><id>tag:a,2004:1</id><issued>2004-01-01T00:00:00Z</issued></entry></feed>"#), "Atom zero three"),
        ("/atom-types.xml", "application/atom+xml", xml(r#"<feed xmlns="http://www.w3.org/2005/Atom"><title>t</title>
            <entry><id>t1</id><title type="application/xhtml+xml"><div xmlns="http://www.w3.org/1999/xhtml">Inline <b>xhtml</b> type</div></title></entry>
            <entry><id>t2</id><title type="text/plain">A text/plain title</title></entry>
            <entry><id>t3</id><title type="">An empty type</title></entry>
            <entry><id>t4</id><title type="xhtml"><div xmlns="http://www.w3.org/1999/xhtml">&lt;b&gt;Escaped&lt;/b&gt; markup</div></title></entry>
            </feed>"#), r"\<b\>Escaped\</b\> markup"),
        ("/no-version.xml", "application/rss+xml", xml("<rss><channel><title>n</title><item><title>No version at all</title><guid>n1</guid></item></channel></rss>"), "No version at all"),
        ("/userland.xml", "application/rss+xml", xml(r#"<rss version="2.0" xmlns="http://backend.userland.com/rss2"><channel><title>u</title>
            <item><title>Userland namespace</title><guid>u1</guid></item></channel></rss>"#), "Userland namespace"),
        ("/rss090.xml", "application/rdf+xml", xml(r#"<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" xmlns="http://my.netscape.com/rdf/simple/0.9/">
            <channel><title>m</title><link>http://m.example/</link></channel>
            <item><title>Netscape RSS 0.90</title><link>http://m.example/090</link></item></rdf:RDF>"#), "Netscape RSS 0.90"),
        ("/rdf-nolink.xml", "application/rdf+xml", xml(r#"<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" xmlns="http://purl.org/rss/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/">
            <channel rdf:about="http://r.example/index.rdf"><title>r</title></channel>
            <item rdf:about="http://r.example/1"><title>RDF item without a link</title></item>
            <item rdf:about="http://r.example/2"><dc:title>Dublin Core title</dc:title></item></rdf:RDF>"#), "Dublin Core title"),
        ("/truncated.xml", "application/rss+xml", xml("<rss version=\"2.0\"><channel><title>x</title><item><title>Cut off at the end</title><guid>x1</guid></item></chan"), "Cut off at the end"),
        ("/latin1.xml", "application/rss+xml; charset=ISO-8859-1", latin1.into_owned(), "Café crème brûlée"),
        ("/cyrillic.xml", "application/rss+xml", cyrillic.into_owned(), "Привет из Москвы"),
        ("/feed10.json", "application/feed+json", xml(r#"{"version": "1.0", "title": "j", "items": [{"id": "j1", "title": "JSON Feed 1.0", "content_text": "x"}]}"#), "JSON Feed 1.0"),
        ("/entities.xml", "application/rss+xml", xml("<rss version=\"2.0\"><channel><title>e</title><item><title>Caf&eacute; &rarr; &frac12; price</title><guid>e1</guid></item></channel></rss>"), "Café → ½ price"),
        ("/blogger.xml", "application/atom+xml", xml(r#"<feed xmlns="http://www.w3.org/2005/Atom"><title>b</title>
            <entry><id>b1</id><title>Blogger post</title><link rel="edit" href="https://blogger.example/api/1"/><link rel="alternate" href="https://blog.example/post.html"/></entry></feed>"#),
            "[Blogger post](https://blog.example/post.html)"),
    ];
    let port = feed_server(
        shapes
            .iter()
            .map(|(path, ct, body, _)| (*path, *ct, body.clone()))
            .collect(),
    );
    let sources: String = shapes
        .iter()
        .map(|(path, _, _, _)| {
            let name = path.trim_start_matches('/').replace('.', "-");
            format!("[[source]]\nname = \"{name}\"\nkind = \"rss\"\nurl = \"http://127.0.0.1:{port}{path}\"\ntopic_tags = [\"github\"]\ntier = 1\n")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let env = Env::new();
    setup(&env, &sources, NOOP_AGENT, "");
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert_eq!(run.code, 0, "{run}");
    let line = summary(&run);
    // One entry per shape, four in atom-types and two in rdf-nolink.
    assert!(
        line.contains(&format!("polled={} sources, new_items=16", shapes.len())),
        "{line}"
    );
    let digest = std::fs::read_to_string(digest_path(&env, "daily", "noop-test-agent")).unwrap();
    for (path, _, _, want) in &shapes {
        assert!(
            digest.contains(want),
            "{path}: {want:?} is not in\n{digest}"
        );
    }
    for also in [
        "Inline xhtml type",
        "A text/plain title",
        "An empty type",
        "RDF item without a link",
    ] {
        assert!(digest.contains(also), "{also:?} is not in\n{digest}");
    }
    assert!(!digest.contains("not a feed"), "a source failed:\n{digest}");
}
