//! A digest agent's run end to end, on real feeds: new items, updates, sources that fail or hang.

use super::*;

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
