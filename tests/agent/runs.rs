//! Digest agents as operators run them: the drain of queue markers, the example config, claims and templates, broken configs.

use super::*;

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
