//! Real daemons sharing slots and queues: each runs once, through kills and a server outage.

use super::*;

pub(crate) fn counts(
    values: impl Iterator<Item = String>,
) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for v in values {
        *out.entry(v).or_insert(0) += 1;
    }
    out
}

#[test]
fn sixty_one_second_slots_run_once_each_across_three_daemons() {
    let server = NatsServer::start();
    let mut tick = util::Spec::new("tick", "cat >/dev/null\necho '{}'\n")
        .trigger("schedule = { cron = \"* * * * * *\" }")
        .key("{{ trigger.scheduled_for }}");
    tick.commit = Some(KEEP_CONTEXT.into());
    let three = three(&server, &[tick]);
    let first = std::time::Instant::now();
    util::wait_for("60 committed slots", Duration::from_secs(120), || {
        three.commits().len() >= 60
    });
    let elapsed = first.elapsed();
    // Past the 60th: let a slot that fired twice show itself.
    std::thread::sleep(Duration::from_secs(2));
    let slots = counts(three.commits().iter().map(|c| {
        c["trigger"]["scheduled_for"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    }));
    let twice: Vec<_> = slots.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "slots committed twice: {twice:?}\n{}",
        three.logs()
    );
    assert!(!slots.contains_key("none"), "{slots:?}");
    // Every second had its run: no gaps between the first and the last slot.
    let times: Vec<chrono::DateTime<chrono::Utc>> =
        slots.keys().map(|s| s.parse().unwrap()).collect();
    let span = (*times.last().unwrap() - times[0]).num_seconds() + 1;
    assert_eq!(
        span as usize,
        times.len(),
        "a slot was skipped in {times:?} ({elapsed:?})"
    );
    // Each slot was run by one daemon, once: the others never started a run for it (the
    // claim, not only the key, kept them off). More than one daemon did the work. Every
    // daemon lists the cluster's runs, each with the daemon that ran it.
    let listed = |view: &util::Env| -> Vec<serde_json::Value> {
        let out = view.steward(&["runs", "-w", "tick", "-n", "1000", "--json"]);
        serde_json::from_str(&out.stdout).unwrap_or_default()
    };
    let ids = |runs: &[serde_json::Value]| -> std::collections::BTreeSet<String> {
        runs.iter()
            .filter(|r| r["state"] == "success")
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let committed: std::collections::BTreeSet<String> = three
        .commits()
        .iter()
        .map(|c| c["run_id"].as_str().unwrap().to_string())
        .collect();
    for view in &three.views {
        util::wait_for(
            "each daemon to list every run",
            Duration::from_secs(20),
            || ids(&listed(view)).is_superset(&committed),
        );
    }
    let runs = listed(&three.views[0]);
    let ran = counts(runs.iter().map(|r| {
        r["trigger"]["scheduled_for"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    }));
    let again: Vec<_> = ran.iter().filter(|(_, n)| **n > 1).collect();
    assert!(again.is_empty(), "slots run more than once: {again:?}");
    let runners: std::collections::BTreeSet<&str> =
        runs.iter().filter_map(|r| r["daemon"].as_str()).collect();
    assert_eq!(
        runs.iter().filter(|r| r["daemon"].is_null()).count(),
        0,
        "a run without its daemon"
    );
    assert!(
        runners.len() >= 2,
        "one daemon ran every slot\n{}",
        three.logs()
    );
}

/// A live queue workflow `work` on `jobs`, keyed by the payload's `n`, whose commit
/// keeps its context.
pub(crate) fn queue_work() -> util::Spec {
    let mut work = util::Spec::new("work", "cat >/dev/null\necho '{}'\n")
        .trigger("queue = \"jobs\"")
        .key("{{ trigger.payload.n }}");
    work.commit = Some(KEEP_CONTEXT.into());
    work
}

/// Items `{"n": 0..total}` on `jobs`, through the three daemons' sockets in turn, `lanes`
/// commands at a time.
pub(crate) fn enqueue_all(three: &Three, total: usize, lanes: usize) {
    std::thread::scope(|s| {
        for lane in 0..lanes {
            let views = &three.views;
            s.spawn(move || {
                for n in (lane..total).step_by(lanes) {
                    let payload = format!("{{\"n\": {n}}}");
                    let out = views[n % 3].steward(&["enqueue", "jobs", "--payload", &payload]);
                    assert_eq!(out.code, 0, "{out}");
                }
            });
        }
    });
}

#[test]
fn a_thousand_queue_items_each_commit_once_across_three_daemons() {
    let server = NatsServer::start();
    let three = three(&server, &[queue_work()]);
    let total = 1000;
    enqueue_all(&three, total, 8);
    util::wait_for("1,000 commits", Duration::from_secs(240), || {
        three.commits().len() >= total
    });
    std::thread::sleep(Duration::from_secs(1));
    let items = counts(
        three
            .commits()
            .iter()
            .map(|c| c["trigger"]["payload"]["n"].to_string()),
    );
    assert_eq!(items.len(), total, "{}", three.logs());
    let twice: Vec<_> = items.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "items committed twice: {twice:?}");
    // The cluster's runlog holds every daemon's lines: each run's end once.
    let out =
        three.views[2].steward(&["logs", "--cluster", "--json", "-n", "100000", "-w", "work"]);
    assert_eq!(out.code, 0, "{out}");
    let ends: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["step"] == "end" && e["status"] == "success")
        .collect();
    assert_eq!(
        ends.len(),
        total,
        "{}",
        &out.stdout[..out.stdout.len().min(2000)]
    );
    let daemons = counts(
        ends.iter()
            .map(|e| e["daemon"].as_str().unwrap_or("").to_string()),
    );
    assert!(
        daemons.len() >= 2 && !daemons.contains_key(""),
        "{daemons:?}"
    );
    let text = three.views[0].steward(&["logs", "--cluster", "-n", "5"]);
    assert_eq!(text.stdout.lines().count(), 5, "{text}");
    // Approved once through the first daemon; withdrawn through the second, it is dry
    // on the third.
    let live = |view: &util::Env| {
        view.steward(&["status", "--json"]).json()["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["id"] == "work")
            .unwrap()["live"]
            .clone()
    };
    assert_eq!(live(&three.views[2]), true);
    let out = three.views[1].steward(&["dry-run", "work"]);
    assert_eq!(out.code, 0, "{out}");
    // Each daemon follows the cluster's approvals: withdrawn everywhere within moments.
    util::wait_for(
        "the third daemon to run it dry",
        Duration::from_secs(10),
        || live(&three.views[2]) == false,
    );
}

/// Which of the three daemons has a run of `workflow` in flight, waited for.
pub(crate) fn holder_of(three: &Three, workflow: &str) -> usize {
    let mut found = None;
    util::wait_for("a daemon running the item", Duration::from_secs(30), || {
        found = three.views.iter().position(|v| {
            let out = v.steward(&["status", "--json"]);
            out.code == 0
                && out.json()["in_flight"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|r| r["workflow"] == workflow))
        });
        found.is_some()
    });
    found.unwrap()
}

#[test]
fn a_daemon_killed_mid_run_loses_its_item_to_another_which_commits_it_once() {
    let server = NatsServer::start();
    // The maker takes a while, so the kill lands inside it.
    // Long enough for a busy machine to find it in flight, see it in a heartbeat, and kill.
    let mut slow = util::Spec::new("slow", "cat >/dev/null\nsleep 8\necho '{}'\n")
        .trigger("queue = \"jobs\"")
        .key("{{ trigger.payload.n }}");
    slow.commit = Some(KEEP_CONTEXT.into());
    let mut three = three(&server, &[slow]);
    let out = three.views[0].steward(&["enqueue", "jobs", "--payload", "{\"n\": 7}"]);
    assert_eq!(out.code, 0, "{out}");
    let victim = holder_of(&three, "slow");
    // Each daemon's status names the three alive, the victim with its run in flight.
    let names: Vec<String> = three
        .views
        .iter()
        .map(|v| {
            v.steward(&["status", "--json"]).json()["cluster"]["daemon"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let alive = |view: &util::Env| -> Vec<(String, u64)> {
        let status = view.steward(&["status", "--json"]).json();
        status["cluster"]["alive"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                (
                    b["daemon"].as_str().unwrap().to_string(),
                    b["runs_in_flight"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let other = (victim + 1) % 3;
    util::wait_for(
        "three daemons alive, the victim busy",
        Duration::from_secs(10),
        || {
            let now = alive(&three.views[other]);
            now.len() == 3 && now.contains(&(names[victim].clone(), 1))
        },
    );
    three.daemons[victim].signal(nix::sys::signal::Signal::SIGKILL);
    util::wait_for(
        "the victim gone from the status",
        Duration::from_secs(15),
        || {
            let now = alive(&three.views[other]);
            now.len() == 2 && !now.iter().any(|(d, _)| *d == names[victim])
        },
    );
    let text = three.views[other].steward(&["status"]).stdout;
    assert!(
        text.contains(&format!("cluster: this daemon is {}", names[other])),
        "{text}"
    );
    // Redelivered after the ack wait (5 s) to another daemon, whose run commits.
    util::wait_for("the item's commit", Duration::from_secs(60), || {
        !three.commits().is_empty()
    });
    let committer = three.commits()[0]["run_id"].clone();
    // Long enough for a second delivery, were there one.
    std::thread::sleep(Duration::from_secs(7));
    let commits = three.commits();
    assert_eq!(commits.len(), 1, "{commits:#?}\n{}", three.logs());
    assert_eq!(commits[0]["trigger"]["payload"]["n"], 7);
    assert_eq!(commits[0]["trigger"]["attempt"], 2, "{commits:#?}");
    assert_eq!(commits[0]["run_id"], committer);
    // The killed daemon's run is recorded interrupted in the cluster, not left running.
    util::wait_for(
        "the victim's run interrupted in the others' views",
        Duration::from_secs(20),
        || {
            let runs = three.views[other]
                .steward(&["runs", "-w", "slow", "--json"])
                .json();
            let runs = runs.as_array().cloned().unwrap_or_default();
            runs.iter().any(|r| {
                r["daemon"] == names[victim].as_str()
                    && r["state"] == "interrupted"
                    && r["reason"].as_str().unwrap_or("").contains("was gone")
            }) && !runs.iter().any(|r| r["state"] == "running")
        },
    );
    let _ = three.daemons.remove(victim);
}

#[test]
fn a_daemon_killed_during_its_commit_leaves_the_key_in_doubt_listed_by_the_others() {
    let server = NatsServer::start();
    let mut careful = util::Spec::new("careful", "cat >/dev/null\necho '{}'\n")
        .trigger("queue = \"jobs\"")
        .key("{{ trigger.payload.n }}");
    careful.commit = Some(format!(
        "touch \"$MARKS/committing\"\nsleep 8\n{KEEP_CONTEXT}"
    ));
    let mut three = three(&server, &[careful]);
    let out = three.views[1].steward(&["enqueue", "jobs", "--payload", "{\"n\": 9}"]);
    assert_eq!(out.code, 0, "{out}");
    util::wait_for("the commit to begin", Duration::from_secs(30), || {
        three.env.path("committing").exists()
    });
    let victim = holder_of(&three, "careful");
    three.daemons[victim].signal(nix::sys::signal::Signal::SIGKILL);
    let other = (victim + 1) % 3;
    // Once the victim's heartbeat (2 s) is gone, a survivor puts the key in doubt.
    let mut listed = serde_json::Value::Null;
    util::wait_for("the key in doubt", Duration::from_secs(30), || {
        let out = three.views[other].steward(&["in-doubt", "list", "--json"]);
        listed = serde_json::from_str(&out.stdout).unwrap_or_default();
        listed
            .as_array()
            .is_some_and(|l| l.iter().any(|k| k["key"] == "9"))
    });
    let key = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == "9")
        .unwrap()
        .clone();
    assert_eq!(key["workflow"], "careful");
    assert_eq!(key["phase"], "in-doubt", "{key}");
    assert_eq!(key["found_in"], "committing", "{key}");
    // The item comes back after the ack wait; its key in doubt keeps it from a second
    // commit (the first may yet finish: the killed daemon's commit step runs on).
    std::thread::sleep(Duration::from_secs(10));
    assert!(three.commits().len() <= 1, "{:#?}", three.commits());
    let _ = three.daemons.remove(victim);
}

#[test]
fn the_server_stopped_for_ten_seconds_mid_load_loses_and_doubles_nothing() {
    let mut server = NatsServer::start();
    let three = three(&server, &[queue_work()]);
    let total = 300;
    enqueue_all(&three, total, 6);
    util::wait_for("the load under way", Duration::from_secs(60), || {
        three.commits().len() >= 30
    });
    server.stop();
    let during = three.commits().len();
    std::thread::sleep(Duration::from_secs(10));
    server.restart();
    // Every item ends committed once, or with its key in doubt (a commit the outage cut
    // short, which only an operator can settle); none twice, none lost.
    let doubt = |three: &Three| -> Vec<String> {
        let out = three.views[0].steward(&["in-doubt", "list", "--json"]);
        serde_json::from_str::<Vec<serde_json::Value>>(&out.stdout)
            .unwrap_or_default()
            .iter()
            .map(|k| k["key"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    util::wait_for("every item settled", Duration::from_secs(240), || {
        three.commits().len() + doubt(&three).len() >= total
    });
    std::thread::sleep(Duration::from_secs(2));
    let items = counts(
        three
            .commits()
            .iter()
            .map(|c| c["trigger"]["payload"]["n"].to_string()),
    );
    let twice: Vec<_> = items.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "items committed twice: {twice:?}");
    let in_doubt = doubt(&three);
    let missing: Vec<usize> = (0..total)
        .filter(|n| !items.contains_key(&n.to_string()) && !in_doubt.contains(&n.to_string()))
        .collect();
    assert!(
        missing.is_empty(),
        "items lost: {missing:?}\n{}",
        three.logs()
    );
    eprintln!(
        "{} committed ({during} before the outage), {} in doubt",
        items.len(),
        in_doubt.len()
    );
}
