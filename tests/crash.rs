//! The crash harness: a real daemon SIGKILLed again and again while live queue and
//! file-drop workflows commit, restarted each time. At the end every item must be committed
//! exactly once, or be listed by the operator commands as in doubt or dead-lettered.
//!
//! `cargo test` runs it small (40 items, 8 kills). The full size (200 items, 40 kills):
//! `STEWARD_CRASH_FULL=1 cargo test --release --test crash -- --nocapture`.
//!
//! The same harness runs against a cluster: three daemons on one `nats-server`, one of
//! them SIGKILLed at a time and started again, the items in the cluster's queue.

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use sha2::{Digest, Sha256};
use util::nats::NatsServer;
use util::{process_gone, wait_for, Env, Spec};

/// The maker names its item from the context on stdin: the queue payload's `n`, or the
/// dropped file's content. It takes a little time, so kills land in every step. A step
/// whose steward was killed before it wrote stdin sees no context and fails, as any real
/// script handed nothing would.
const MAKER: &str = r#"ctx=$(cat)
id=$(printf '%s' "$ctx" | grep -o '"n":"[^"]*"' | head -1 | cut -d'"' -f4)
if [ -z "$id" ]; then
  path=$(printf '%s' "$ctx" | grep -o '"path":"[^"]*"' | head -1 | cut -d'"' -f4)
  id=$(cat "$path")
fi
# No context (steward was killed before it wrote stdin): nothing to name, so fail.
[ -n "$id" ] || exit 1
sleep 0.03
echo "{\"item\": \"$id\"}"
"#;
const CHECKER: &str = "cat >/dev/null\nsleep 0.01\necho '{\"verdict\": \"pass\"}'\n";
/// The only side effect: one ledger line per commit.
const COMMIT: &str = r#"ctx=$(cat)
id=$(printf '%s' "$ctx" | grep -o '"item":"[^"]*"' | head -1 | cut -d'"' -f4)
# An orphaned commit whose stdin was never written must not append an empty line.
[ -n "$id" ] || exit 1
sleep 0.01
echo "$id" >> "$LEDGER"
"#;

/// A small xorshift: reproducible kill moments from a printed seed.
struct Rng(u64);

impl Rng {
    /// Seeded from the clock, the seed printed under `name` so a run can be replayed.
    fn seeded(name: &str) -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        println!("{name}: seed {seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Which step of a run the daemon is in, judged by its children at the moment of the kill.
fn phase(daemon: i32) -> &'static str {
    let mut phase = "between steps (store writes)";
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command name: state, ppid, ...
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let ppid: i32 = rest
            .split(' ')
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid != daemon {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        for (needle, name) in [
            ("-run.sh", "run"),
            ("-verify.sh", "verify"),
            ("-commit.sh", "commit"),
        ] {
            if cmdline.contains(needle) {
                phase = name;
            }
        }
    }
    phase
}

/// Each store flush of the harness's daemons takes this much longer (half before the
/// disk has the writes, half after, its waiters not yet told), so kills land inside
/// flushes that runs wait for, batched or not.
const SLOW_FLUSH: (&str, &str) = ("STEWARD_FLUSH_DELAY_MS", "20");

/// Whether one of the daemon's threads is inside a store flush: in fsync, fdatasync or
/// sync_file_range, or asleep in the slow-disk delay (the daemon sleeps nowhere else
/// with nanosleep while it runs).
fn in_flush(daemon: i32) -> bool {
    let inside = [
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_sync_file_range,
        libc::SYS_nanosleep,
        libc::SYS_clock_nanosleep,
    ];
    std::fs::read_dir(format!("/proc/{daemon}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|task| {
            let call = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
            let nr = call
                .split(' ')
                .next()
                .and_then(|n| n.parse::<libc::c_long>().ok());
            nr.is_some_and(|nr| inside.contains(&nr))
        })
}

fn json_list(env: &Env, args: &[&str]) -> Vec<Value> {
    let out = env.steward(args);
    assert_eq!(out.code, 0, "{out}");
    out.json().as_array().cloned().unwrap_or_default()
}

#[test]
fn sigkilled_daemon_commits_every_item_once_or_lists_it() {
    let full = std::env::var_os("STEWARD_CRASH_FULL").is_some();
    let (per_kind, kills) = if full { (100, 40) } else { (20, 8) };
    let mut rng = Rng::seeded("crash harness");

    let env = Env::new();
    let drop = env.path("drop");
    std::fs::create_dir_all(&drop).unwrap();
    env.live_workflow(
        &Spec::new("crashq", MAKER)
            .trigger("queue = \"items\"")
            .verify(CHECKER)
            .commit(COMMIT),
    );
    env.live_workflow(
        &Spec::new("crashf", MAKER)
            .trigger(&format!(
                "file = {{ path = \"{}\", pattern = \"*.item\", debounce_ms = 50 }}",
                drop.display()
            ))
            .verify(CHECKER)
            .commit(COMMIT),
    );

    // Items by idempotency key: a queue item's id, a file's sha256.
    let mut items: BTreeMap<String, String> = BTreeMap::new();
    for n in 0..per_kind {
        let id = format!("q-{n}");
        let out = env.steward(&[
            "enqueue",
            "items",
            "--payload",
            &format!("{{\"n\": \"{id}\"}}"),
        ]);
        assert_eq!(out.code, 0, "{out}");
        let key = out
            .stdout
            .split_whitespace()
            .nth(2)
            .expect("enqueue names the item")
            .to_string();
        items.insert(key, id);
    }
    let drop_file = |n: usize| {
        let id = format!("f-{n}");
        let tmp = drop.join(format!(".{id}.tmp"));
        std::fs::write(&tmp, &id).unwrap();
        std::fs::rename(&tmp, drop.join(format!("{id}.item"))).unwrap();
        (hex::encode(Sha256::digest(id.as_bytes())), id)
    };

    let mut phases: BTreeMap<&str, usize> = BTreeMap::new();
    let mut in_flushes = 0;
    let mut dropped = 0;
    let started = Instant::now();
    for _ in 0..kills {
        let d = env.daemon_env(&[], &[SLOW_FLUSH]);
        // Files arrive while the daemon runs, a few per life.
        for _ in 0..(per_kind / kills + 1) {
            if dropped < per_kind {
                items.extend([drop_file(dropped)]);
                dropped += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20 + rng.below(400)));
        let pid = d.pid();
        *phases.entry(phase(pid)).or_default() += 1;
        in_flushes += usize::from(in_flush(pid));
        d.signal(Signal::SIGKILL);
        wait_for(
            "the killed daemon to be gone",
            Duration::from_secs(10),
            || process_gone(pid),
        );
        drop_daemon(d);
    }
    while dropped < per_kind {
        items.extend([drop_file(dropped)]);
        dropped += 1;
    }

    // A last life without kills: everything still pending runs to its end.
    let mut d = env.daemon(&[]);
    let spool = env.state.join("queues").join("items");
    let claimed = env.state.join("claimed").join("crashf");
    let pending = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .map(|rd| rd.flatten().filter(|e| e.path().is_file()).count())
            .unwrap_or(0)
    };
    wait_for("every item to be taken", Duration::from_secs(120), || {
        pending(&spool) == 0 && pending(&drop) == 0 && pending(&claimed) == 0
    });
    d.stop(Duration::from_secs(15));

    let in_doubt: BTreeSet<String> = json_list(&env, &["in-doubt", "list", "--json"])
        .iter()
        .filter_map(|k| k["key"].as_str().map(str::to_string))
        .collect();
    let dead: BTreeSet<String> = json_list(&env, &["dead-letter", "list", "--json"])
        .iter()
        .filter_map(|e| e["run"]["idempotency_key"].as_str().map(str::to_string))
        .collect();
    let tally = Tally::of(&env.ledger_lines(), &items, &in_doubt, &dead);
    println!(
        "items={} kills={} (inside a store flush: {in_flushes}) {tally} ({:.0} s; kills by phase: {phases:?})",
        items.len(),
        kills,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(items.len(), 2 * per_kind);
    tally.holds(items.len(), "");
}

#[test]
fn sigkilled_cluster_daemons_commit_every_item_once_or_list_it() {
    let full = std::env::var_os("STEWARD_CRASH_FULL").is_some();
    let (total, kills) = if full { (400, 40) } else { (120, 10) };
    let mut rng = Rng::seeded("cluster crash harness");

    let server = NatsServer::start();
    let queue = Spec::new("crashq", MAKER)
        .trigger("queue = \"items\"")
        .verify(CHECKER)
        .commit(COMMIT);
    let mut three = util::cluster::three(&server, &[queue]);

    // Items by idempotency key (the queue item's id), enqueued through the three in turn.
    let mut items: BTreeMap<String, String> = BTreeMap::new();
    let enqueue = |three: &util::cluster::Three, n: usize| {
        let id = format!("q-{n}");
        let out = three.views[n % 3].steward(&[
            "enqueue",
            "items",
            "--payload",
            &format!("{{\"n\": \"{id}\"}}"),
        ]);
        assert_eq!(out.code, 0, "{out}");
        let key = out
            .stdout
            .split_whitespace()
            .nth(2)
            .expect("enqueue names the item");
        (key.to_string(), id)
    };
    // Half before the first kill, so the daemons are busy when it lands.
    let mut enqueued = 0;
    while enqueued < total / 2 {
        items.extend([enqueue(&three, enqueued)]);
        enqueued += 1;
    }
    let mut phases: BTreeMap<&str, usize> = BTreeMap::new();
    let started = Instant::now();
    for _ in 0..kills {
        // Items arrive while the daemons run, a few between kills.
        for _ in 0..(total / 2 / kills) {
            items.extend([enqueue(&three, enqueued)]);
            enqueued += 1;
        }
        std::thread::sleep(Duration::from_millis(50 + rng.below(400)));
        let victim = rng.below(3) as usize;
        let pid = three.daemons[victim].pid();
        *phases.entry(phase(pid)).or_default() += 1;
        three.daemons[victim].signal(Signal::SIGKILL);
        wait_for(
            "the killed daemon to be gone",
            Duration::from_secs(10),
            || process_gone(pid),
        );
        let fresh = three.views[victim].daemon(&[]);
        drop_daemon(std::mem::replace(&mut three.daemons[victim], fresh));
    }
    while enqueued < total {
        items.extend([enqueue(&three, enqueued)]);
        enqueued += 1;
    }

    // No more kills: every item runs to its end (a killed daemon's items come back after
    // the ack wait, its keys freed once its heartbeat is gone) or is listed.
    let listed = |three: &util::cluster::Three| -> (BTreeSet<String>, BTreeSet<String>) {
        let in_doubt = json_list(&three.views[0], &["in-doubt", "list", "--json"])
            .iter()
            .filter_map(|k| k["key"].as_str().map(str::to_string))
            .collect();
        // Dead letters are the cluster's: a run's, or a queue item given up on (its item id).
        let dead = json_list(&three.views[1], &["dead-letter", "list", "--json"])
            .iter()
            .filter_map(|e| {
                let run = &e["run"];
                run["idempotency_key"]
                    .as_str()
                    .or(run["trigger"]["item_id"].as_str())
                    .map(str::to_string)
            })
            .collect();
        (in_doubt, dead)
    };
    let committed = |env: &Env| -> BTreeSet<String> { env.ledger_lines().into_iter().collect() };
    wait_for(
        "every item committed or listed",
        Duration::from_secs(240),
        || {
            let done = committed(&three.env);
            let (in_doubt, dead) = listed(&three);
            items
                .iter()
                .all(|(key, id)| done.contains(id) || in_doubt.contains(key) || dead.contains(key))
        },
    );
    for d in &mut three.daemons {
        d.stop(Duration::from_secs(15));
    }
    // The cluster's record of the runs is whole: a daemon's last records, kept from the
    // bucket by a kill, were written by its next start, and the runs of a killed daemon
    // that never came back were recorded interrupted; none is left `running`.
    let cluster_runs = json_list(
        &three.views[0],
        &["runs", "-w", "crashq", "-n", "100000", "--json"],
    );
    let running: Vec<&Value> = cluster_runs
        .iter()
        .filter(|r| r["state"] == "running")
        .collect();
    assert!(
        running.is_empty(),
        "runs left running in the cluster: {running:#?}"
    );
    // A run that committed ended a success, or was killed after its commit: interrupted.
    let ended: BTreeSet<&str> = cluster_runs
        .iter()
        .filter(|r| r["state"] == "success" || r["state"] == "interrupted")
        .filter_map(|r| r["idempotency_key"].as_str())
        .collect();

    let (in_doubt, dead) = listed(&three);
    let tally = Tally::of(&three.env.ledger_lines(), &items, &in_doubt, &dead);
    println!(
        "cluster: items={} kills={} {tally} ({:.0} s; kills by phase: {phases:?})",
        items.len(),
        kills,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(items.len(), total);
    // Every item committed (and not left in doubt) has its run in the cluster's runs.
    let missing: Vec<&String> = items
        .iter()
        .filter(|(key, id)| {
            tally.commits.contains_key(id.as_str())
                && !in_doubt.contains(*key)
                && !ended.contains(key.as_str())
        })
        .map(|(_, id)| id)
        .collect();
    assert!(
        missing.is_empty(),
        "committed, but its run is not in the cluster's runs: {missing:?}"
    );
    tally.holds(items.len(), &three.logs());
}

/// What a harness found at its end: commits per item id, those committed twice, ledger
/// lines for no item, and items neither committed nor listed (in doubt or dead-lettered).
struct Tally {
    commits: BTreeMap<String, usize>,
    in_doubt: usize,
    dead: usize,
    duplicates: Vec<String>,
    unknown: Vec<String>,
    lost: Vec<String>,
}

impl Tally {
    /// The tally of `ledger` for `items` (key → id), with the keys listed in doubt or dead.
    fn of(
        ledger: &[String],
        items: &BTreeMap<String, String>,
        in_doubt: &BTreeSet<String>,
        dead: &BTreeSet<String>,
    ) -> Tally {
        let mut commits: BTreeMap<String, usize> = BTreeMap::new();
        for line in ledger {
            *commits.entry(line.clone()).or_default() += 1;
        }
        let duplicates = commits
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(k, _)| k.clone())
            .collect();
        let unknown = commits
            .keys()
            .filter(|id| !items.values().any(|v| v == *id))
            .cloned()
            .collect();
        let lost = items
            .iter()
            .filter(|(key, id)| {
                !commits.contains_key(id.as_str())
                    && !in_doubt.contains(*key)
                    && !dead.contains(*key)
            })
            .map(|(_, id)| id.clone())
            .collect();
        Tally {
            commits,
            in_doubt: in_doubt.len(),
            dead: dead.len(),
            duplicates,
            unknown,
            lost,
        }
    }

    /// No item committed twice, no ledger line for no item, none lost, and most of the
    /// `items` committed outright; `context` (the daemons' logs) goes with a duplicate.
    fn holds(&self, items: usize, context: &str) {
        assert!(
            self.duplicates.is_empty(),
            "committed twice: {:?}\n{context}",
            self.duplicates
        );
        assert!(
            self.unknown.is_empty(),
            "ledger lines for no item: {:?}",
            self.unknown
        );
        assert!(
            self.lost.is_empty(),
            "neither committed nor listed: {:?}",
            self.lost
        );
        assert!(
            self.commits.len() >= items / 2,
            "most items should commit outright ({} of {items})",
            self.commits.len()
        );
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "committed={} in_doubt={} dead={} duplicates={} lost={}",
            self.commits.len(),
            self.in_doubt,
            self.dead,
            self.duplicates.len(),
            self.lost.len()
        )
    }
}

/// Reaps the killed daemon's process handle.
fn drop_daemon(mut d: util::Daemon) {
    if let Some(mut c) = d.child.take() {
        let _ = c.wait();
    }
}
