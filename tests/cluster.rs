//! The cluster's rules against a real `nats-server -js` (see `util::nats`), with several
//! daemons' connections in one test process: a slot claimed once of three racing, a
//! claim taken over only from a gone daemon and fencing the first, keys reserved once,
//! and a gone daemon's keys freed or put in doubt once its heartbeat expires on the
//! server. The real daemons' tests build on these.

mod util;

use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use steward::cluster::Cluster;
use steward::config::cluster::ClusterSettings;
use steward::store::KeyPhase;
use util::cluster::{three, three_with, Three, KEEP_CONTEXT};
use util::nats::NatsServer;

async fn daemon(server: &NatsServer, name: &str, heartbeat: &str) -> Cluster {
    daemon_with(server, name, heartbeat, "30s").await
}

async fn daemon_with(server: &NatsServer, name: &str, heartbeat: &str, ack_wait: &str) -> Cluster {
    let settings = ClusterSettings {
        nats: server.url(),
        heartbeat: Some(heartbeat.into()),
        ack_wait: Some(ack_wait.into()),
        ..Default::default()
    }
    .check()
    .unwrap();
    Cluster::connect(&settings, name.to_string())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()))
}

async fn beat(c: &Cluster) {
    let now = Utc::now();
    c.beat(&steward::cluster::heartbeat::Beat {
        daemon: c.daemon.clone(),
        host: "test".into(),
        pid: 1,
        started_at: now,
        at: now,
        runs_in_flight: 0,
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_slot_is_claimed_by_exactly_one_of_three_daemons() {
    let server = NatsServer::start();
    let mut daemons = Vec::new();
    for name in ["a", "b", "c"] {
        daemons.push(daemon(&server, name, "5s").await);
    }
    let first = Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, 0).unwrap();
    let mut won = [0usize; 3];
    for s in 0..60 {
        let slot = first + chrono::Duration::seconds(s);
        let claims =
            futures_util::future::join_all(daemons.iter().map(|d| d.claim_slot("tick", slot)))
                .await;
        let winners: Vec<usize> = claims
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| c.unwrap().map(|_| i))
            .collect();
        assert_eq!(winners.len(), 1, "slot {slot}: {winners:?}");
        won[winners[0]] += 1;
        // A later try (a restart, a catch-up) finds it claimed.
        for d in &daemons {
            assert_eq!(d.claim_slot("tick", slot).await.unwrap(), None);
        }
    }
    assert_eq!(won.iter().sum::<usize>(), 60);
    // Another workflow's slot at the same time is its own.
    assert!(daemons[0]
        .claim_slot("tock", first)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_over_from_a_gone_daemon_fences_the_first() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    let c = daemon(&server, "c", "5s").await;
    let slot = Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, 0).unwrap();
    let claim_a = a.claim_slot("tick", slot).await.unwrap().unwrap();
    assert!(a.holds(&claim_a).await.unwrap());
    let (holder, revision) = b.slot_holder("tick", slot).await.unwrap().unwrap();
    assert_eq!(holder.daemon, "a");
    assert_eq!(revision, claim_a.revision);
    // a never beat: it is gone, and b takes the slot over at a's revision.
    assert!(!b.is_alive("a").await.unwrap());
    let claim_b = b
        .take_over_slot("tick", slot, revision)
        .await
        .unwrap()
        .unwrap();
    assert!(!a.holds(&claim_a).await.unwrap(), "a's claim still stands");
    assert!(b.holds(&claim_b).await.unwrap());
    // c, too late with the same revision, does not get it.
    assert_eq!(
        c.take_over_slot("tick", slot, revision).await.unwrap(),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_reserved_once_and_moves_only_at_its_revision() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    beat(&a).await;
    beat(&b).await;
    let lease = a
        .reserve_key("fetch", "item/1 ü", "run-a")
        .await
        .unwrap()
        .unwrap();
    let taken = b
        .reserve_key("fetch", "item/1 ü", "run-b")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (taken.daemon.as_str(), taken.record.run_id.as_str()),
        ("a", "run-a")
    );
    let committing = a
        .advance_key(&lease, "run-a", KeyPhase::Committing)
        .await
        .unwrap()
        .unwrap();
    // The old lease is stale now: its revision moved on.
    let stale = a
        .advance_key(&lease, "run-a", KeyPhase::Committed)
        .await
        .unwrap();
    assert_eq!(
        stale.unwrap_err().now.unwrap().record.phase,
        KeyPhase::Committing
    );
    a.advance_key(&committing, "run-a", KeyPhase::Committed)
        .await
        .unwrap()
        .unwrap();
    let (held, _) = b.held_key("fetch", "item/1 ü").await.unwrap().unwrap();
    assert_eq!(held.record.phase, KeyPhase::Committed);
    assert_eq!(held.record.key, "item/1 ü");
    // A released key may be reserved again.
    let other = a
        .reserve_key("fetch", "item/2", "run-a2")
        .await
        .unwrap()
        .unwrap();
    a.release_key(&other).await.unwrap().unwrap();
    assert!(b
        .reserve_key("fetch", "item/2", "run-b2")
        .await
        .unwrap()
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_daemons_unstarted_commits_are_released_and_started_ones_left_in_doubt() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "1s").await;
    let b = daemon(&server, "b", "1s").await;
    beat(&a).await;
    beat(&b).await;
    let reserved = a
        .reserve_key("fetch", "k1", "run-1")
        .await
        .unwrap()
        .unwrap();
    let started = a
        .reserve_key("fetch", "k2", "run-2")
        .await
        .unwrap()
        .unwrap();
    a.advance_key(&started, "run-2", KeyPhase::Committing)
        .await
        .unwrap()
        .unwrap();
    // While a beats, b frees nothing of a's.
    assert_eq!(b.reap_gone().await.unwrap(), Default::default());

    // a stops beating: the server drops its entry after the heartbeat (1 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    while a_alive(&b).await {
        assert!(Instant::now() < deadline, "a's heartbeat never expired");
        beat(&b).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    beat(&b).await;
    let reaped = b.reap_gone().await.unwrap();
    let keys = |list: &[steward::store::KeyRecord]| -> Vec<String> {
        list.iter().map(|r| r.key.clone()).collect()
    };
    assert_eq!(keys(&reaped.released), ["k1"]);
    assert_eq!(keys(&reaped.in_doubt), ["k2"]);
    assert_eq!(keys(&b.keys_in_doubt().await.unwrap()), ["k2"]);
    let doubt = &reaped.in_doubt[0];
    assert_eq!(doubt.found_in, Some(KeyPhase::Committing));
    // Reaping again changes nothing.
    assert_eq!(b.reap_gone().await.unwrap(), Default::default());
    // a, back, is fenced from both keys; the freed one runs again elsewhere.
    assert!(a
        .advance_key(&reserved, "run-1", KeyPhase::Committing)
        .await
        .unwrap()
        .is_err());
    assert!(b
        .reserve_key("fetch", "k1", "run-1b")
        .await
        .unwrap()
        .is_ok());
}

/// An item redelivered before the reaper came round: the gone daemon's reservation is
/// freed on the spot; a live daemon's, or a commit begun, is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reserved_by_a_gone_daemon_is_taken_over_at_once_unless_its_commit_began() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    beat(&b).await;
    // a never beat: gone.
    let stale = a.reserve_key("fetch", "k", "run-a").await.unwrap().unwrap();
    let begun = a
        .reserve_key("fetch", "k2", "run-a2")
        .await
        .unwrap()
        .unwrap();
    a.advance_key(&begun, "run-a2", KeyPhase::Committing)
        .await
        .unwrap()
        .unwrap();
    let lease = b.reserve_key("fetch", "k", "run-b").await.unwrap().unwrap();
    assert_eq!(
        b.held_key("fetch", "k").await.unwrap().unwrap().0.daemon,
        "b"
    );
    assert!(a
        .advance_key(&stale, "run-a", KeyPhase::Committing)
        .await
        .unwrap()
        .is_err());
    let held = b
        .reserve_key("fetch", "k2", "run-b2")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(held.record.phase, KeyPhase::Committing);
    // b is alive: a third daemon does not take b's key.
    let c = daemon(&server, "c", "5s").await;
    assert!(c.reserve_key("fetch", "k", "run-c").await.unwrap().is_err());
    b.release_key(&lease).await.unwrap().unwrap();
}

async fn a_alive(b: &Cluster) -> bool {
    b.is_alive("a").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_queue_item_goes_to_one_of_three_daemons_and_is_acked_once() {
    let server = NatsServer::start();
    let mut pullers = Vec::new();
    let mut daemons = Vec::new();
    for name in ["a", "b", "c"] {
        let d = daemon(&server, name, "5s").await;
        pullers.push(d.puller("inbox", 3).await.unwrap());
        daemons.push(d);
    }
    for i in 0..100 {
        daemons[i % 3]
            .enqueue(
                "inbox",
                &format!("item-{i}"),
                format!("{{\"n\": {i}}}").into_bytes(),
            )
            .await
            .unwrap();
    }
    // Another queue's items are not pulled here.
    daemons[0]
        .enqueue("other", "x", b"{}".to_vec())
        .await
        .unwrap();
    let pulls = pullers.into_iter().map(|mut p| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(d) = p.next(Duration::from_millis(500)).await.unwrap() {
                assert_eq!(d.attempt, 1);
                got.push(d.item_id.clone());
                assert!(d.ack().await.unwrap(), "a first delivery's ack was fenced");
            }
            got
        })
    });
    let mut all: Vec<String> = Vec::new();
    for got in futures_util::future::join_all(pulls).await {
        all.extend(got.unwrap());
    }
    all.sort();
    let mut want: Vec<String> = (0..100).map(|i| format!("item-{i}")).collect();
    want.sort();
    assert_eq!(all, want, "each item once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_held_past_its_ack_wait_goes_to_another_daemon_and_the_late_ack_is_fenced() {
    let server = NatsServer::start();
    let a = daemon_with(&server, "a", "5s", "1s").await;
    let b = daemon_with(&server, "b", "5s", "1s").await;
    let mut pa = a.puller("inbox", 5).await.unwrap();
    let mut pb = b.puller("inbox", 5).await.unwrap();
    a.enqueue("inbox", "only", b"{}".to_vec()).await.unwrap();
    let first = pa.next(Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(first.attempt, 1);
    // a stalls past the ack wait; the server hands the item to b.
    let second = pb
        .next(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("no redelivery");
    assert_eq!((second.item_id.as_str(), second.attempt), ("only", 2));
    assert!(!first.current().await.unwrap());
    assert!(!first.ack().await.unwrap(), "a's late ack went through");
    assert!(second.ack().await.unwrap());
    // Acknowledged by b: it never comes again.
    assert!(pa.next(Duration::from_secs(2)).await.unwrap().is_none());
    assert!(pb.next(Duration::from_millis(200)).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_progress_keeps_its_item_past_the_ack_wait() {
    let server = NatsServer::start();
    let a = daemon_with(&server, "a", "5s", "1s").await;
    let b = daemon_with(&server, "b", "5s", "1s").await;
    let mut pa = a.puller("inbox", 5).await.unwrap();
    let mut pb = b.puller("inbox", 5).await.unwrap();
    a.enqueue("inbox", "long", b"{}".to_vec()).await.unwrap();
    let held = pa.next(Duration::from_secs(5)).await.unwrap().unwrap();
    // Three ack waits long, with +WPI a third of one apart: b never gets it.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        held.in_progress().await.unwrap();
        assert!(pb.next(Duration::from_millis(300)).await.unwrap().is_none());
    }
    assert!(held.ack().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_past_its_attempts_goes_to_the_dead_letter_stream_with_its_context() {
    let server = NatsServer::start();
    let a = daemon_with(&server, "a", "5s", "1s").await;
    let mut pa = a.puller("inbox", 2).await.unwrap();
    a.enqueue("inbox", "poison", b"{\"bad\": true}".to_vec())
        .await
        .unwrap();
    for attempt in 1..=2 {
        let d = pa.next(Duration::from_secs(5)).await.unwrap().unwrap();
        assert_eq!(d.attempt, attempt);
        d.retry(Duration::ZERO).await.unwrap();
    }
    // The third delivery is past max_attempts: dead-lettered, not handed out.
    assert!(pa.next(Duration::from_secs(2)).await.unwrap().is_none());
    let dead = a.dead_items("inbox").await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].item_id, "poison");
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(dead[0].last_daemon, "a");
    assert_eq!(dead[0].payload, b"{\"bad\": true}");
    // And handed to the daemon, to be recorded as a dead-lettered run, once.
    let given_up = pa.given_up();
    assert_eq!(given_up.len(), 1);
    assert_eq!(
        (given_up[0].item_id.as_str(), given_up[0].attempts),
        ("poison", 2)
    );
    assert!(pa.given_up().is_empty());
    assert!(pa.next(Duration::from_secs(2)).await.unwrap().is_none());
}

// ---- real daemons -------------------------------------------------------------------

fn counts(values: impl Iterator<Item = String>) -> std::collections::BTreeMap<String, usize> {
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
fn queue_work() -> util::Spec {
    let mut work = util::Spec::new("work", "cat >/dev/null\necho '{}'\n")
        .trigger("queue = \"jobs\"")
        .key("{{ trigger.payload.n }}");
    work.commit = Some(KEEP_CONTEXT.into());
    work
}

/// Items `{"n": 0..total}` on `jobs`, through the three daemons' sockets in turn, `lanes`
/// commands at a time.
fn enqueue_all(three: &Three, total: usize, lanes: usize) {
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
fn holder_of(three: &Three, workflow: &str) -> usize {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_appends_at_one_version_the_server_takes_one() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    for version in 1..=5u64 {
        let (ea, eb) = (format!("a{version}"), format!("b{version}"));
        let (x, y) = tokio::join!(
            a.append_case_event("case/1", version, ea.as_bytes()),
            b.append_case_event("case/1", version, eb.as_bytes()),
        );
        let won = [x.unwrap(), y.unwrap()];
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "version {version}: {won:?}"
        );
    }
    // A version out of turn is refused; a new case starts at 1.
    assert!(!a.append_case_event("case/1", 9, b"late").await.unwrap());
    assert!(!a.append_case_event("other", 2, b"x").await.unwrap());
    assert!(b.append_case_event("other", 1, b"x").await.unwrap());
    let events = b.case_events("case/1").await.unwrap();
    assert_eq!(
        events.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(a.case_ids().await.unwrap(), ["case/1", "other"]);
}

/// The docs agency of tests/agency.rs: a planner that dispatches three members in turn.
const DOCS_PLANNER: &str = r#"sleep 0.2
case=$(cat)
has() { printf '%s' "$case" | grep -q "\"done_members\":\[[^]]*\"$1\""; }
if ! has researcher; then echo '{"action":"dispatch","member":"researcher","task":"collect","needed_scope":["read:repo"]}'
elif ! has writer; then echo '{"action":"dispatch","member":"writer","task":"draft","needed_scope":["write:draft"]}'
elif ! has reviewer; then echo '{"action":"dispatch","member":"reviewer","task":"review","needed_scope":["read:draft"]}'
else echo '{"action":"resolve","resolution":"docs are current"}'
fi
"#;

fn docs_agency(env: &util::Env) {
    for (id, out) in [
        ("research", "notes"),
        ("write", "draft"),
        ("review", "approved"),
    ] {
        env.workflow(
            &util::Spec::new(id, &format!("cat >/dev/null\necho '{{\"{out}\": 1}}'\n")).dry(),
        );
    }
    let planner = env.script("planner.sh", DOCS_PLANNER);
    let text = format!(
        "id = \"docs\"\nmandate = \"Keep the docs current\"\nplanner = [\"{planner}\"]\nescalation_contact = \"docs-lead@example.org\"\n[limits]\nmax_turns = 50\nmax_acts = 20\nmax_spend_usd = 5.0\n\
         [[roster]]\nname = \"researcher\"\nworkflow = \"research\"\nscopes = [\"read:repo\"]\n\
         [[roster]]\nname = \"writer\"\nworkflow = \"write\"\nscopes = [\"write:draft\"]\n\
         [[roster]]\nname = \"reviewer\"\nworkflow = \"review\"\nscopes = [\"read:draft\"]\n"
    );
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    std::fs::write(env.config.join("agencies/docs.toml"), text).unwrap();
}

#[test]
fn two_drivers_racing_one_case_on_two_daemons_win_one_append_each_turn() {
    let server = NatsServer::start();
    let three = three_with(&server, &[], docs_agency);
    let out = three.views[0].steward(&["case", "open", "--agency", "docs", "--case", "r1"]);
    assert_eq!(out.code, 0, "{out}");
    let result = three.env.path("result.json");
    std::fs::write(
        &result,
        r#"{"run_id": "by-hand", "state": "elsewhere", "output": null}"#,
    )
    .unwrap();
    for round in 1..=3u64 {
        let res = result.to_str().unwrap().to_string();
        // alpha through the first daemon, beta through the second: one case, two daemons.
        let spawn = |view: &util::Env, driver: &str| {
            let mut args = vec!["case", "advance", "r1", "--driver", driver, "--json"];
            if round > 1 {
                args.extend(["--member-result", res.as_str()]);
            }
            view.command(&args)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let racing = [
            spawn(&three.views[0], "alpha"),
            spawn(&three.views[1], "beta"),
        ];
        let outs: Vec<(i32, String)> = racing
            .into_iter()
            .map(|c| {
                let o = c.wait_with_output().unwrap();
                (
                    o.status.code().unwrap_or(-1),
                    String::from_utf8_lossy(&o.stdout).into_owned(),
                )
            })
            .collect();
        let winners = outs
            .iter()
            .filter(|(c, s)| *c == 0 && s.contains("\"advanced\""))
            .count();
        let losers = outs
            .iter()
            .filter(|(c, s)| *c == 10 && s.contains("version_conflict"))
            .count();
        assert_eq!(
            (winners, losers),
            (1, 1),
            "round {round}: {outs:?}\n{}",
            three.logs()
        );
        // Either daemon reads the same case.
        for view in &three.views[..2] {
            let status = view.steward(&["case", "status", "r1", "--json"]).json();
            assert_eq!(
                status["acts"], round,
                "exactly one dispatch per turn: {status:#}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_delivery_is_remembered_once_for_the_whole_cluster() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    let now = Utc::now();
    let seen = |run: &str, secs: i64| steward::store::SeenDelivery {
        run_id: run.into(),
        until: now + chrono::Duration::seconds(secs),
    };
    let (sa, sb) = (seen("run-a", 300), seen("run-b", 300));
    let (x, y) = tokio::join!(
        a.remember_delivery("hook", "evt/1", &sa, now),
        b.remember_delivery("hook", "evt/1", &sb, now),
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    // One remembered it; the other was told of that sighting.
    assert_eq!(
        [x.is_none(), y.is_none()].iter().filter(|f| **f).count(),
        1,
        "{x:?} {y:?}"
    );
    let first = x.or(y).unwrap();
    assert!(first == sa || first == sb);
    // Past its time, a sighting is replaced; forgetting drops only the expired.
    let short = seen("run-c", 1);
    assert!(a
        .remember_delivery("hook", "evt/2", &short, now)
        .await
        .unwrap()
        .is_none());
    let later = now + chrono::Duration::seconds(5);
    assert!(b
        .remember_delivery("hook", "evt/2", &seen("run-d", 300), later)
        .await
        .unwrap()
        .is_none());
    assert!(a
        .remember_delivery("hook", "evt/3", &short, now)
        .await
        .unwrap()
        .is_none());
    assert_eq!(b.forget_deliveries(later).await.unwrap(), 1);
    assert!(a
        .remember_delivery("hook", "evt/1", &seen("run-e", 300), later)
        .await
        .unwrap()
        .is_some());
}

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
fn paused(view: &util::Env, wf: &str) -> serde_json::Value {
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
