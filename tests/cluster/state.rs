//! What the cluster keeps for all its daemons: catch-up, takeovers, review, dead letters, pauses, alerts, shared folders.

use super::*;

#[test]
fn the_catch_up_of_a_whole_cluster_outage_is_planned_once() {
    let server = NatsServer::start();
    let mut tick = util::Spec::new("tick", "cat >/dev/null\necho '{}'\n")
        .trigger(
            "schedule = { cron = \"* * * * * *\", catchup = \"latest\", catchup_window_s = 3600 }",
        )
        .key("{{ trigger.scheduled_for }}");
    tick.commit = Some(KEEP_CONTEXT.into());
    let mut three = three(&server, &[tick]);
    util::wait_for("a few slots run", Duration::from_secs(30), || {
        three.commits().len() >= 3
    });
    // The whole cluster stops, and stays down for a few slots.
    for d in &mut three.daemons {
        d.stop(Duration::from_secs(20));
    }
    std::thread::sleep(Duration::from_secs(4));
    three.daemons = three.views.iter().map(|v| v.daemon(&[])).collect();
    let catch_ups = |three: &Three| -> usize {
        three
            .commits()
            .iter()
            .filter(|c| c["trigger"]["catchup"] == true)
            .count()
    };
    util::wait_for("the catch-up run", Duration::from_secs(30), || {
        catch_ups(&three) >= 1
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(catch_ups(&three), 1, "{}", three.logs());
    // Each slot of the outage was told missed by one daemon, not by each (every daemon
    // lists the cluster's runs: one list holds them all).
    let out = three.views[2].steward(&[
        "runs", "-w", "tick", "--status", "missed", "-n", "1000", "--json",
    ]);
    let runs: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
    let missed: Vec<String> = runs
        .iter()
        .map(|r| {
            r["trigger"]["scheduled_for"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert!(missed.len() >= 2, "the outage missed no slot? {missed:?}");
    let told = counts(missed.into_iter());
    let twice: Vec<_> = told.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "missed slots told by more than one daemon: {twice:?}"
    );
}

#[test]
fn a_slot_whose_daemon_dies_mid_run_is_taken_over_and_committed_once() {
    let server = NatsServer::start();
    let mut tick = util::Spec::new("tick", "cat >/dev/null\nsleep 6\necho '{}'\n")
        .trigger("schedule = { cron = \"*/10 * * * * *\" }")
        .key("{{ trigger.scheduled_for }}");
    tick.commit = Some(KEEP_CONTEXT.into());
    let mut three = three(&server, &[tick]);
    let victim = holder_of(&three, "tick");
    let name = three.views[victim].steward(&["status", "--json"]).json()["cluster"]["daemon"]
        .as_str()
        .unwrap()
        .to_string();
    let running =
        three.views[victim].steward(&["runs", "-w", "tick", "--status", "running", "--json"]);
    let runs: Vec<serde_json::Value> = serde_json::from_str(&running.stdout).unwrap();
    let slot = runs[0]["trigger"]["scheduled_for"]
        .as_str()
        .unwrap()
        .to_string();
    three.daemons[victim].signal(nix::sys::signal::Signal::SIGKILL);
    let of_slot = |three: &Three| -> Vec<serde_json::Value> {
        three
            .commits()
            .into_iter()
            .filter(|c| c["trigger"]["scheduled_for"] == slot.as_str())
            .collect()
    };
    util::wait_for(
        "the slot's run, taken over",
        Duration::from_secs(40),
        || !of_slot(&three).is_empty(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let commits = of_slot(&three);
    assert_eq!(commits.len(), 1, "{commits:#?}\n{}", three.logs());
    assert_eq!(
        commits[0]["trigger"]["taken_over_from"],
        name.as_str(),
        "{commits:#?}"
    );
    let _ = three.daemons.remove(victim);
}

/// Workflow `wf`'s `paused` as `steward list` on `view` shows it.
pub(crate) fn paused(view: &util::Env, wf: &str) -> serde_json::Value {
    view.steward(&["list", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == wf)
        .map(|w| w["paused"].clone())
        .unwrap_or_default()
}

#[test]
fn review_dead_letters_and_pauses_are_the_clusters() {
    let server = NatsServer::start();
    // Escalated by its checker: waits for review.
    let mut asks = util::Spec::new("asks", "cat >/dev/null\necho '{}'\n")
        .trigger("queue = \"asks\"")
        .verify("cat >/dev/null\necho escalate\necho 'needs a human'\n")
        .key("{{ trigger.payload.n }}");
    asks.commit = Some(KEEP_CONTEXT.into());
    // Fails, once: dead-lettered.
    let fails = util::Spec::new("fails", "cat >/dev/null\nexit 1\n")
        .trigger("queue = \"fails\"")
        .tables("[retry]\nattempts = 1\n");
    let three = three(&server, &[asks, queue_work(), fails]);

    // A run waiting for review on one daemon is listed by every daemon, approved through
    // another, and committed once.
    let out = three.views[0].steward(&["enqueue", "asks", "--payload", "{\"n\": 1}"]);
    assert_eq!(out.code, 0, "{out}");
    let mut waiting = String::new();
    for view in &three.views {
        util::wait_for(
            "the run in every daemon's review",
            Duration::from_secs(30),
            || {
                let review = view.steward(&["review", "--json"]).json();
                waiting = review[0]["run_id"].as_str().unwrap_or_default().to_string();
                !waiting.is_empty()
            },
        );
    }
    let ran_by = three.views[0].steward(&["show", &waiting, "--json"]).json()["daemon"].clone();
    let approver = three
        .views
        .iter()
        .find(|v| v.steward(&["status", "--json"]).json()["cluster"]["daemon"] != ran_by)
        .unwrap();
    let approve = approver.steward(&["approve", &waiting]);
    assert_eq!(approve.code, 0, "{approve}\n{}", three.logs());
    let again = three.views[2].steward(&["approve", &waiting]);
    assert_ne!(
        again.code, 0,
        "a second approve, through another daemon\n{again}"
    );
    assert_eq!(three.commits().len(), 1, "{:#?}", three.commits());
    for view in &three.views {
        util::wait_for(
            "every daemon to see it committed",
            Duration::from_secs(20),
            || {
                let shown = view.steward(&["show", &waiting, "--json"]).json();
                shown["state"] == "success" && shown["committed"] == true
            },
        );
        assert_eq!(
            view.steward(&["review", "--json"]).json(),
            serde_json::json!([])
        );
    }

    // `list` and the dashboard show the cluster: each daemon alive, and whose run it was.
    let name_of = |v: &util::Env| -> String {
        v.steward(&["status", "--json"]).json()["cluster"]["daemon"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let names: Vec<String> = three.views.iter().map(name_of).collect();
    let list = three.views[1].steward(&["list"]).stdout;
    for name in &names {
        assert!(list.contains(name.as_str()), "{list}");
    }
    let board = util::http::board(&three.views[2]);
    let cookie = board.sign_in();
    let page = board.get(&cookie, "/").body;
    assert!(page.contains("<h2>Cluster</h2>"), "{page}");
    for name in &names {
        assert!(
            page.contains(name.as_str()),
            "{name} missing from the overview:\n{page}"
        );
    }
    // The approval's record is the approver's.
    let run_page = board.get(&cookie, &format!("/runs/{waiting}")).body;
    assert!(
        run_page.contains(&format!("<dd id=\"daemon\">{}</dd>", name_of(approver))),
        "the run page names the daemon of its record:\n{run_page}"
    );

    // A dead letter of any daemon is every daemon's.
    let out = three.views[1].steward(&["enqueue", "fails", "--payload", "{}"]);
    assert_eq!(out.code, 0, "{out}");
    for view in &three.views {
        util::wait_for(
            "the dead letter on every daemon",
            Duration::from_secs(30),
            || {
                let dead = view.steward(&["dead-letter", "list", "--json"]).json();
                dead.as_array()
                    .is_some_and(|d| d.len() == 1 && d[0]["run"]["workflow"] == "fails")
            },
        );
    }

    // One pause holds every daemon, and one resume lifts it.
    let out = three.views[1].steward(&["pause", "work", "--reason", "maintenance"]);
    assert_eq!(out.code, 0, "{out}");
    // Each daemon follows the cluster's pauses: seen everywhere within moments.
    for view in &three.views {
        util::wait_for("the pause on every daemon", Duration::from_secs(10), || {
            paused(view, "work")["reason"] == "maintenance"
        });
    }
    let before = three.commits().len();
    for n in 0..6 {
        let payload = format!("{{\"n\": {n}}}");
        let out = three.views[n % 3].steward(&["enqueue", "jobs", "--payload", &payload]);
        assert_eq!(out.code, 0, "{out}");
    }
    // Time for a daemon that did not see the pause to run one.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(three.commits().len(), before, "a paused workflow ran");
    let out = three.views[2].steward(&["resume", "work"]);
    assert_eq!(out.code, 0, "{out}");
    for view in &three.views {
        util::wait_for(
            "the resume on every daemon",
            Duration::from_secs(10),
            || paused(view, "work").is_null(),
        );
    }
    util::wait_for(
        "the items held back to commit",
        Duration::from_secs(60),
        || three.commits().len() == before + 6,
    );
}

#[test]
fn an_overdue_slot_is_told_once_by_the_cluster() {
    let server = NatsServer::start();
    let received = util::Env::new();
    let sink = util::sink::sink(&received, "alerts.jsonl", None);
    // Fails every 5 s; overdue a second after each slot. Each daemon looks every second;
    // the channel's rate window is short, so only the cluster's memory of what was told
    // keeps the others from telling a slot again.
    let late = util::Spec::new("late", "cat >/dev/null\nexit 1\n")
        .trigger("schedule = { cron = \"*/5 * * * * *\", catchup = \"none\" }")
        .tables("[expect]\nwithin = \"1s\"\n[retry]\nattempts = 1\n");
    let three = three_with(&server, &[late], |env| {
        let path = env.config.join("steward.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!(
            "\n[[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/\"\nevents = [\"overdue\"]\nevery = \"1s\"\n",
            sink.http
        ));
        std::fs::write(path, text).unwrap();
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while util::sink::hooks(&sink, "overdue").len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for two overdue slots told\n{}",
            three.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Long enough for the other two daemons' looks, were they to tell it too.
    std::thread::sleep(Duration::from_secs(3));
    let told = util::sink::hooks(&sink, "overdue");
    let slots = counts(
        told.iter()
            .map(|h| h["message"].as_str().unwrap().to_string()),
    );
    let twice: Vec<_> = slots.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "a slot told more than once: {twice:#?}\n{}",
        three.logs()
    );
}

#[test]
fn a_file_in_a_folder_shared_between_daemons_runs_once() {
    let server = NatsServer::start();
    // On another filesystem than the state folders, as a folder on NFS is.
    let shared = tempfile::Builder::new()
        .prefix("steward-shared-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let mut files = util::Spec::new("files", "cat >/dev/null\necho '{}'\n").trigger(&format!(
        "file = {{ path = \"{}\", pattern = \"*.item\", debounce_ms = 50 }}",
        shared.path().display()
    ));
    files.commit = Some(KEEP_CONTEXT.into());
    let three = three(&server, &[files]);
    let drop_file = |name: &str, body: &str| -> std::path::PathBuf {
        let tmp = shared.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, body).unwrap();
        tmp
    };

    // A file another member claimed in the store first (it beats, but has not moved the
    // file yet) is left alone by the three; once that member is gone, one takes it over.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let holder = rt.block_on(daemon(&server, "holder", "2s"));
    let held = drop_file("held.item", "held");
    let id =
        steward::trigger::file::claim_id(&held)
            .unwrap()
            .replacen(".held.item.tmp", "held.item", 1);
    rt.block_on(beat(&holder));
    assert!(rt.block_on(holder.claim_file("files", &id)).unwrap());
    std::fs::rename(&held, shared.path().join("held.item")).unwrap();

    let total = 20;
    for n in 0..total {
        let tmp = drop_file(&n.to_string(), &format!("file {n}"));
        std::fs::rename(&tmp, shared.path().join(format!("{n}.item"))).unwrap();
    }
    util::wait_for(
        "every other file committed",
        Duration::from_secs(60),
        || three.commits().len() >= total,
    );
    for _ in 0..6 {
        rt.block_on(beat(&holder));
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        shared.path().join("held.item").exists(),
        "a file claimed by a live member was taken\n{}",
        three.logs()
    );
    // The holder stops beating: gone after its heartbeat (2 s), its file taken over at the
    // next look (a folder's rescan, or the next file's event).
    std::thread::sleep(Duration::from_secs(3));
    let nudge = drop_file("nudge", "nudge");
    std::fs::rename(&nudge, shared.path().join("nudge.item")).unwrap();
    util::wait_for("the held file committed", Duration::from_secs(60), || {
        three.commits().len() >= total + 2
    });
    // Long enough for a second run of a file, were there one.
    std::thread::sleep(Duration::from_secs(2));
    let commits = three.commits();
    let names = counts(
        commits
            .iter()
            .map(|c| c["trigger"]["name"].as_str().unwrap_or("?").to_string()),
    );
    assert_eq!(names.len(), total + 2, "{names:?}");
    assert!(names.values().all(|n| *n == 1), "{names:?}");
    assert_eq!(names.get("held.item"), Some(&1), "{names:?}");
    // Each file made one run in the whole cluster.
    let runs = three.views[0]
        .steward(&["runs", "-w", "files", "-n", "1000", "--json"])
        .json();
    assert_eq!(runs.as_array().unwrap().len(), total + 2, "{runs:#?}");
}

#[test]
fn an_alerts_rate_window_holds_for_the_whole_cluster() {
    let server = NatsServer::start();
    let received = util::Env::new();
    let sink = util::sink::sink(&received, "alerts.jsonl", None);
    // Each failing item is dead-lettered: one alert each, but one an hour per channel.
    let fails = util::Spec::new("fails", "cat >/dev/null\nsleep 0.2\nexit 1\n")
        .trigger("queue = \"fails\"")
        .tables("[retry]\nattempts = 1\n");
    let three = three_with(&server, &[fails], |env| {
        let path = env.config.join("steward.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!(
            "\n[[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/\"\nevents = [\"dead_letter\"]\nevery = \"1h\"\n",
            sink.http
        ));
        std::fs::write(path, text).unwrap();
    });
    let total = 9;
    for n in 0..total {
        let out = three.views[n % 3].steward(&["enqueue", "fails", "--payload", "{}"]);
        assert_eq!(out.code, 0, "{out}");
    }
    let dead = |view: &util::Env| -> Vec<serde_json::Value> {
        let out = view.steward(&["dead-letter", "list", "--json"]);
        out.json().as_array().cloned().unwrap_or_default()
    };
    util::wait_for("every item dead-lettered", Duration::from_secs(60), || {
        dead(&three.views[0]).len() == total
    });
    let ran_on: std::collections::BTreeSet<String> = dead(&three.views[0])
        .iter()
        .filter_map(|e| e["run"]["daemon"].as_str().map(String::from))
        .collect();
    assert!(ran_on.len() >= 2, "one daemon ran every item: {ran_on:?}");
    // The first is sent; the rest, on whichever daemon, are held back behind it.
    util::wait_for("the first alert", Duration::from_secs(30), || {
        !util::sink::hooks(&sink, "dead_letter").is_empty()
    });
    let held = || -> usize {
        three
            .views
            .iter()
            .flat_map(|v| v.runlog())
            .filter(|l| l["step"] == "alert" && l["status"] == "held")
            .count()
    };
    util::wait_for("the others held back", Duration::from_secs(30), || {
        held() == total - 1
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        util::sink::hooks(&sink, "dead_letter").len(),
        1,
        "{:#?}\n{}",
        util::sink::hooks(&sink, "dead_letter"),
        three.logs()
    );
}

#[test]
fn a_queue_item_given_up_on_is_a_dead_letter_of_the_cluster() {
    let server = NatsServer::start();
    // Two items with one key: the second is delivered again and again while the first
    // holds the key, until it is past its attempts.
    let mut slow = util::Spec::new("slow", "cat >/dev/null\nsleep 8\necho '{}'\n")
        .trigger("queue = \"jobs\"")
        .key("{{ trigger.payload.n }}");
    slow.commit = Some(KEEP_CONTEXT.into());
    let three = three(&server, &[slow]);
    let enqueue = |view: &util::Env| -> String {
        let out = view.steward(&["enqueue", "jobs", "--payload", "{\"n\": 1}"]);
        assert_eq!(out.code, 0, "{out}");
        out.stdout.split_whitespace().nth(2).unwrap().to_string()
    };
    enqueue(&three.views[0]);
    util::wait_for("the first item's run", Duration::from_secs(30), || {
        three.views.iter().any(|v| {
            v.steward(&["status", "--json"]).json()["in_flight"]
                .as_array()
                .is_some_and(|l| !l.is_empty())
        })
    });
    let second = enqueue(&three.views[1]);
    let mut entry = serde_json::Value::Null;
    util::wait_for(
        "the second item dead-lettered",
        Duration::from_secs(60),
        || {
            let dead = three.views[2]
                .steward(&["dead-letter", "list", "--json"])
                .json();
            entry = dead
                .as_array()
                .and_then(|d| {
                    d.iter()
                        .find(|e| e["run"]["trigger"]["item_id"] == second.as_str())
                })
                .cloned()
                .unwrap_or_default();
            !entry.is_null()
        },
    );
    let run = &entry["run"];
    assert_eq!(run["state"], "failed", "{entry:#}");
    assert!(
        run["reason"].as_str().unwrap().contains("given up"),
        "{entry:#}"
    );
    assert_eq!(run["trigger"]["payload"]["n"], 1, "{entry:#}");
    // The first commits, once; the second, given up, not at all.
    util::wait_for("the first item's commit", Duration::from_secs(30), || {
        three.commits().len() == 1
    });
}
