//! Workflows that follow workflows (`[trigger] after = …`), against a real daemon: a
//! sequence and a fan-out, a follower on failure, a fan-in, a dry upstream rehearsing
//! the chain, an upstream run while no daemon ran, forced dry-run, and `validate`
//! refusing a cycle and an unknown upstream.

mod util;

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use util::cluster::KEEP_CONTEXT;
use util::{wait_for, Env, Spec};

/// A maker whose output names its run, so a follower can show it was handed on.
const FETCH: &str = "cat >/dev/null\necho \"{\\\"fetched\\\": \\\"$STEWARD_RUN_ID\\\"}\"\n";

/// A follower of `after` (the TOML inline table's body) whose commit keeps its context.
fn follower(id: &str, after: &str) -> Spec {
    let mut s =
        Spec::new(id, "cat >/dev/null\necho '{}'\n").trigger(&format!("after = {{ {after} }}"));
    s.commit = Some(KEEP_CONTEXT.into());
    s
}

/// What each follower's commit saw, by follower.
fn commits(env: &Env, workflow: &str) -> Vec<Value> {
    std::fs::read_dir(env.path("commits"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read(e.path()).ok())
                .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
                .filter(|c| c["workflow"] == workflow)
                .collect()
        })
        .unwrap_or_default()
}

fn runs(env: &Env, workflow: &str) -> Vec<Value> {
    let out = env.steward(&["runs", "-w", workflow, "--json"]);
    out.json().as_array().cloned().unwrap_or_default()
}

/// Long enough for a second fire of a follower, were there one.
fn settle() {
    std::thread::sleep(Duration::from_millis(1500));
}

#[test]
fn a_sequence_and_a_fan_out_each_run_once_with_the_upstream_run() {
    let env = Env::new();
    env.live_workflow(&Spec::new("fetch", FETCH));
    env.live_workflow(&follower("summarise", "workflow = \"fetch\""));
    env.live_workflow(&follower(
        "archive",
        "workflow = \"fetch\", on = [\"success\"]",
    ));
    // A sequence goes on: a follower of a follower.
    env.live_workflow(&follower("publish", "workflow = \"summarise\""));
    let mut d = env.daemon(&[]);
    let out = env.run("fetch", true);
    assert_eq!(out.state(), "success", "{out}");
    let upstream = out.run_id();
    for f in ["summarise", "archive", "publish"] {
        wait_for(&format!("{f}'s commit"), Duration::from_secs(20), || {
            commits(&env, f).len() == 1
        });
    }
    settle();
    for f in ["summarise", "archive"] {
        let c = commits(&env, f);
        assert_eq!(c.len(), 1, "{f}: {c:#?}");
        let t = &c[0]["trigger"];
        assert_eq!(t["kind"], "after");
        assert_eq!(t["upstream"]["run_id"], upstream.as_str(), "{t:#}");
        assert_eq!(t["upstream"]["workflow"], "fetch");
        assert_eq!(t["upstream"]["state"], "success");
        assert_eq!(
            t["upstream"]["output"]["fetched"],
            upstream.as_str(),
            "{t:#}"
        );
        // The default key is the upstream run: a re-delivery never fires twice.
        let run = &runs(&env, f)[0];
        assert_eq!(run["idempotency_key"], upstream.as_str(), "{run:#}");
    }
    let summarised = &runs(&env, "summarise")[0]["run_id"];
    let published = commits(&env, "publish");
    assert_eq!(published[0]["trigger"]["upstream"]["run_id"], *summarised);
    // `why` names the upstream run that fired a follower.
    let why = env.steward(&["why", "summarise"]).stdout;
    assert!(why.contains(&upstream), "{why}");
    // `list` says who follows whom; the dashboard links the runs both ways.
    let list = env.steward(&["list"]).stdout;
    assert!(list.contains("follows fetch (success)"), "{list}");
    assert!(list.contains("followed by archive, summarise"), "{list}");
    let board = util::http::board(&env);
    let cookie = board.sign_in();
    let page = board.get(&cookie, &format!("/runs/{upstream}")).body;
    let fired = page.split("id=\"followers\"").nth(1).unwrap_or("");
    assert!(
        fired.contains("summarise") && fired.contains("archive"),
        "the upstream's page links its followers' runs:\n{page}"
    );
    let page = board
        .get(&cookie, &format!("/runs/{}", summarised.as_str().unwrap()))
        .body;
    let by = page.split("id=\"upstream\"").nth(1).unwrap_or("");
    assert!(
        by.contains(&upstream),
        "the follower's page links its upstream:\n{page}"
    );
    d.stop(Duration::from_secs(10));
}

#[test]
fn a_follower_on_failure_fires_only_after_a_failure() {
    let env = Env::new();
    // Fails while $MARKS/fail exists.
    env.live_workflow(&Spec::new(
        "fetch",
        "cat >/dev/null\nif [ -e \"$MARKS/fail\" ]; then exit 1; fi\necho '{}'\n",
    ));
    env.live_workflow(&follower(
        "cleanup",
        "workflow = \"fetch\", on = [\"failure\"]",
    ));
    env.live_workflow(&follower("report", "workflow = \"fetch\""));
    let mut d = env.daemon(&[]);
    let ok = env.run("fetch", true);
    assert_eq!(ok.state(), "success", "{ok}");
    settle();
    assert!(commits(&env, "cleanup").is_empty(), "fired after a success");
    // The follower that did not fire is visible in `why`.
    let why = env.steward(&["why", "cleanup"]).stdout;
    assert!(
        why.contains(&ok.run_id()) && why.contains("not fired"),
        "{why}"
    );
    std::fs::write(env.path("fail"), "").unwrap();
    let failed = env.run("fetch", true);
    assert_eq!(failed.state(), "failed", "{failed}");
    wait_for("cleanup's commit", Duration::from_secs(20), || {
        commits(&env, "cleanup").len() == 1
    });
    settle();
    let c = commits(&env, "cleanup");
    assert_eq!(c.len(), 1);
    assert_eq!(
        c[0]["trigger"]["upstream"]["run_id"],
        failed.run_id().as_str()
    );
    assert_eq!(c[0]["trigger"]["upstream"]["state"], "failed");
    // The follower on success did not fire for the failure, and `why` says so.
    assert_eq!(
        commits(&env, "report").len(),
        1,
        "only the success fired it"
    );
    let why = env.steward(&["why", "report"]).stdout;
    let line = why
        .lines()
        .find(|l| l.contains(&failed.run_id()))
        .unwrap_or_else(|| panic!("{why}"));
    assert!(line.contains("not fired: it ended failed"), "{why}");
    d.stop(Duration::from_secs(10));
}

#[test]
fn a_fan_in_waits_for_every_upstream_then_fires_once() {
    let env = Env::new();
    env.live_workflow(&Spec::new("fetch-a", FETCH));
    env.live_workflow(&Spec::new("fetch-b", FETCH));
    env.live_workflow(&follower("merge", "all = [\"fetch-a\", \"fetch-b\"]"));
    let mut d = env.daemon(&[]);
    let a = env.run("fetch-a", true);
    assert_eq!(a.state(), "success", "{a}");
    settle();
    assert!(
        commits(&env, "merge").is_empty(),
        "fired with one upstream of two"
    );
    let b = env.run("fetch-b", true);
    assert_eq!(b.state(), "success", "{b}");
    wait_for("merge's commit", Duration::from_secs(20), || {
        commits(&env, "merge").len() == 1
    });
    // Another run of one upstream alone does not fire it again.
    let a2 = env.run("fetch-a", true);
    assert_eq!(a2.state(), "success", "{a2}");
    settle();
    let c = commits(&env, "merge");
    assert_eq!(c.len(), 1, "{c:#?}");
    let mut fired_by: Vec<String> = c[0]["trigger"]["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["run_id"].as_str().unwrap().to_string())
        .collect();
    fired_by.sort();
    let mut want = vec![a.run_id(), b.run_id()];
    want.sort();
    assert_eq!(fired_by, want);
    d.stop(Duration::from_secs(10));
}

#[test]
fn a_dry_upstream_runs_its_live_follower_dry() {
    let env = Env::new();
    // Not approved for go-live: its runs are dry.
    env.workflow(&Spec::new("fetch", FETCH));
    env.live_workflow(&follower("summarise", "workflow = \"fetch\""));
    let mut d = env.daemon(&[]);
    let out = env.run("fetch", false);
    assert_eq!(out.state(), "success", "{out}");
    wait_for("the follower's run to end", Duration::from_secs(20), || {
        runs(&env, "summarise")
            .first()
            .is_some_and(|r| r["state"] == "success")
    });
    let run = &runs(&env, "summarise")[0];
    assert_eq!(run["dry_run"], true, "{run:#}");
    assert!(
        run["dry_run_reason"]
            .as_str()
            .unwrap_or("")
            .contains("upstream"),
        "{run:#}"
    );
    assert!(
        commits(&env, "summarise").is_empty(),
        "a dry follower committed"
    );
    d.stop(Duration::from_secs(10));
}

#[test]
fn forced_dry_run_runs_a_follower_dry() {
    let env = Env::new();
    env.live_workflow(&Spec::new("fetch", FETCH).trigger("queue = \"q\""));
    env.live_workflow(&follower("summarise", "workflow = \"fetch\""));
    let mut d = env.daemon(&[]);
    d.signal(Signal::SIGUSR1);
    wait_for("forced dry-run", Duration::from_secs(10), || {
        env.steward(&["status", "--json"]).json()["forced_dry_run"] == true
    });
    assert_eq!(env.steward(&["enqueue", "q", "--payload", "{}"]).code, 0);
    wait_for("the follower's run to end", Duration::from_secs(20), || {
        runs(&env, "summarise")
            .first()
            .is_some_and(|r| r["state"] == "success")
    });
    let run = &runs(&env, "summarise")[0];
    assert_eq!(run["dry_run"], true, "{run:#}");
    assert!(commits(&env, "summarise").is_empty());
    d.stop(Duration::from_secs(10));
}

#[test]
fn an_upstream_run_while_no_daemon_ran_fires_its_follower_once_at_the_start() {
    let env = Env::new();
    env.live_workflow(&Spec::new("fetch", FETCH));
    env.live_workflow(&follower("summarise", "workflow = \"fetch\""));
    // A daemon has known the follower; then none runs.
    let mut d = env.daemon(&[]);
    d.stop(Duration::from_secs(10));
    let out = env.run("fetch", true);
    assert_eq!(out.state(), "success", "{out}");
    assert!(commits(&env, "summarise").is_empty());
    let mut d = env.daemon(&[]);
    wait_for("the follower at the start", Duration::from_secs(20), || {
        commits(&env, "summarise").len() == 1
    });
    assert_eq!(
        commits(&env, "summarise")[0]["trigger"]["upstream"]["run_id"],
        out.run_id().as_str()
    );
    d.stop(Duration::from_secs(10));
    // And not again at the start after that.
    let mut d = env.daemon(&[]);
    settle();
    assert_eq!(commits(&env, "summarise").len(), 1);
    assert_eq!(runs(&env, "summarise").len(), 1);
    d.stop(Duration::from_secs(10));
}

#[test]
fn validate_refuses_a_cycle_and_an_unknown_upstream_naming_them() {
    let env = Env::new();
    env.workflow(&follower("alpha", "workflow = \"gamma\""));
    env.workflow(&follower("beta", "workflow = \"alpha\""));
    env.workflow(&follower("gamma", "workflow = \"beta\""));
    env.workflow(&follower("lost", "workflow = \"nowhere\""));
    let out = env.steward(&["validate"]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("alpha → beta → gamma → alpha"), "{out}");
    assert!(out.stderr.contains("no workflow named `nowhere`"), "{out}");
    assert!(out.stderr.contains("lost.toml"), "{out}");
}
