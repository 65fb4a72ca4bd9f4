//! `cargo bench [-- --full]`: steward against the limits that bound it, in one run.
//!
//! Prints a table (figure, steward, baseline, ratio) and writes `target/bench/steward.json`.
//! `--quick` (the default) fits in about a minute; `--full` uses the sizes the targets are
//! stated for (about ten minutes). `--smoke` is the tiny run `.ci/run` makes so this never rots.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "support/gateway.rs"]
mod gateway;
#[path = "support/latency.rs"]
mod latency;
#[allow(unused_imports)]
use latency::*;
#[path = "support/daemon_scale.rs"]
mod daemon_scale;
#[allow(unused_imports)]
use daemon_scale::*;
#[path = "support/rows.rs"]
mod rows;
#[allow(unused_imports)]
use rows::*;
#[path = "support/board.rs"]
mod board;
#[path = "support/limits.rs"]
mod limits;
#[allow(unused_imports)]
use board::*;
#[allow(unused_imports)]
use limits::*;

struct Sizes {
    runs: usize,
    events: usize,
    cron_events: usize,
    breaches: usize,
    workflows: usize,
    idle_s: u64,
    markers: usize,
    seen: usize,
    candidates: usize,
    growth: (usize, usize),
    feed_items: usize,
    /// Runs in the store the dashboard's pages are timed on, and requests per page.
    board: (usize, usize),
    /// Model calls timed each way (direct, through the gateway), whole and streamed.
    model_calls: usize,
}

fn sizes(mode: &str) -> Sizes {
    match mode {
        "full" => Sizes {
            runs: 1000,
            events: 200,
            cron_events: 200,
            breaches: 200,
            workflows: 1000,
            idle_s: 10,
            markers: 10_000,
            seen: 1_000_000,
            candidates: 100_000,
            growth: (1_000, 100_000),
            feed_items: 2_000,
            board: (100_000, 500),
            model_calls: 5_000,
        },
        "smoke" => Sizes {
            runs: 20,
            events: 5,
            cron_events: 2,
            breaches: 5,
            workflows: 50,
            idle_s: 1,
            markers: 500,
            seen: 10_000,
            candidates: 1_000,
            growth: (50, 200),
            feed_items: 50,
            board: (2_000, 20),
            model_calls: 50,
        },
        _ => Sizes {
            runs: 200,
            events: 40,
            cron_events: 8,
            breaches: 30,
            workflows: 1000,
            idle_s: 3,
            markers: 10_000,
            seen: 1_000_000,
            candidates: 100_000,
            growth: (1_000, 10_000),
            feed_items: 2_000,
            board: (100_000, 200),
            model_calls: 1_000,
        },
    }
}

struct Report {
    rows: Vec<(String, String, String, String)>,
    json: serde_json::Map<String, Value>,
    /// /proc/stat (steal, total) when the current figure started.
    since: (u64, u64),
}

/// CPU time stolen by the hypervisor and all CPU time so far, in ticks: on a shared VM
/// the figures swing with the first, so each row says how much there was while it ran.
fn host_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    (cpu.get(7).copied().unwrap_or(0), cpu.iter().sum())
}

impl Report {
    /// A figure starts: host steal is counted from here.
    fn mark(&mut self) {
        self.since = host_ticks();
    }

    fn row(
        &mut self,
        figure: &str,
        steward: String,
        baseline: String,
        ratio: String,
        mut data: Value,
    ) {
        let (steal, total) = host_ticks();
        let share = (steal - self.since.0) as f64 / (total - self.since.1).max(1) as f64 * 100.0;
        println!("{figure:<44} {steward:>22} {baseline:>22} {ratio:>10} {share:>6.1}");
        let _ = std::io::stdout().flush();
        self.rows.push((figure.into(), steward, baseline, ratio));
        if let Some(obj) = data.as_object_mut() {
            obj.insert("host_steal_pct".into(), json!(share));
        }
        self.json.insert(figure.into(), data);
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn dist(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (
        pct(&v, 0.5),
        pct(&v, 0.99),
        v.last().copied().unwrap_or(f64::NAN),
    )
}

fn write_exe(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A config folder with one workflow per (id, toml body after the id line).
fn config(dir: &Path, workflows: &[(String, String)]) -> PathBuf {
    let cfg = dir.join("config");
    std::fs::create_dir_all(cfg.join("workflows")).unwrap();
    for (id, body) in workflows {
        std::fs::write(
            cfg.join("workflows").join(format!("{id}.toml")),
            format!("id = \"{id}\"\n{body}"),
        )
        .unwrap();
    }
    cfg
}

const BUDGET: &str =
    "[budget]\nmax_tokens = 100000\nmax_tool_calls = 100\nmax_runtime_s = 60\nmax_cost_usd = 10\n";

fn true_workflow() -> String {
    // allow_all: the parallel figure runs two of it at once through the runner.
    format!("dry_run = false\noverlap = \"allow_all\"\n[trigger]\nmanual = true\n{BUDGET}[run]\ncommand = [\"/bin/true\"]\n[verify]\ncommand = [\"/bin/true\"]\n[commit]\ncommand = [\"/bin/true\"]\n")
}

/// One governed run through the runner, the road every run takes in steward.
async fn governed_run(
    runner: &steward::runner::Runner,
    wf: &std::sync::Arc<steward::config::Workflow>,
    ask: steward::live::Ask,
) -> steward::store::RunRecord {
    let fire = steward::governed::Fire::manual(None);
    runner
        .run(steward::runner::Job::fire(wf.clone(), fire, ask))
        .await
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Governed runs of /bin/true (run, verify, commit), live, durable, on one engine.
struct Governed {
    runner: steward::runner::Runner,
    wf: std::sync::Arc<steward::config::Workflow>,
    rt: tokio::runtime::Runtime,
}

impl Governed {
    fn new(dir: &Path) -> Governed {
        Governed::with(dir, true_workflow())
    }

    /// The same on a workflow file of its own.
    fn with(dir: &Path, workflow: String) -> Governed {
        let cfg = config(dir, &[("bench".into(), workflow)]);
        let config = steward::config::load_dir(&cfg).unwrap();
        let (engine, _) = steward::governed::open(&dir.join("state")).unwrap();
        let wf = config.workflows["bench"].clone();
        engine.go_live(&wf).unwrap();
        Governed {
            runner: steward::runner::Runner::new(engine, 8),
            wf: std::sync::Arc::new(wf),
            rt: runtime(),
        }
    }

    /// The same, raising alerts to `channels` (the daemon's dispatcher, started here).
    fn alerting(dir: &Path, workflow: String, channels: steward::alert::Channels) -> Governed {
        let mut g = Governed::with(dir, workflow);
        let mut engine = g.runner.engine().clone();
        engine.alerts = {
            let _rt = g.rt.enter(); // the dispatcher is a task on the bench's runtime
            steward::alert::start(channels, engine.runlog.clone(), None).0
        };
        g.runner = steward::runner::Runner::new(engine, 8);
        g
    }

    /// `n` runs, `parallel` at a time; returns runs/s and store flushes per run.
    fn runs(&self, n: usize, parallel: usize) -> (f64, f64) {
        let flushes0 = steward::store::flush_count();
        let t = Instant::now();
        self.rt.block_on(async {
            let per = n / parallel;
            let mut tasks = Vec::new();
            for _ in 0..parallel {
                let (runner, wf) = (self.runner.clone(), self.wf.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..per {
                        let rec = governed_run(&runner, &wf, steward::live::Ask::Live).await;
                        let failing = wf.run.argv[0] == "/bin/false";
                        assert!(rec.committed || failing, "{}", rec.reason);
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        let secs = t.elapsed().as_secs_f64();
        let flushes = (steward::store::flush_count() - flushes0) as f64 / n as f64;
        (n as f64 / secs, flushes)
    }
}

/// steward, the bare limit and the bash wrapper, `n` runs each, measured in five
/// alternating rounds: on a shared machine (steal time, neighbours) the noise then falls
/// on all three alike. Medians of runs/s, and store flushes per governed run.
fn throughput(dir: &Path, n: usize, parallel: usize) -> Throughput {
    const ROUNDS: usize = 5;
    let governed = Governed::new(&dir.join("governed"));
    std::fs::create_dir_all(dir.join("bash")).unwrap();
    let batch = (n / ROUNDS).max(parallel);
    let (mut st, mut bare, mut tokio, mut bash, mut flushes) =
        (vec![], vec![], vec![], vec![], 0.0);
    for _ in 0..ROUNDS {
        let (rate, f) = governed.runs(batch, parallel);
        st.push(rate);
        flushes = f;
        bare.push(bare_limit(batch, parallel));
        tokio.push(async_limit(&governed.rt, batch, parallel));
        bash.push(bash_wrapper(&dir.join("bash"), batch, parallel));
    }
    Throughput {
        steward: median(st),
        bare: median(bare),
        tokio: median(tokio),
        bash: median(bash),
        flushes,
    }
}

/// Runs/s of steward and its baselines (medians), and store flushes per run.
struct Throughput {
    steward: f64,
    bare: f64,
    tokio: f64,
    bash: f64,
    flushes: f64,
}

/// The middle value (of an odd count; the upper middle of an even one).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `n` sequential runs each of `on` and `off` in five alternating rounds, so host noise
/// falls on both alike; medians of runs/s.
fn on_vs_off(on: &Governed, off: &Governed, n: usize) -> (f64, f64) {
    const ROUNDS: usize = 5;
    let batch = (n / ROUNDS).max(1);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        a.push(on.runs(batch, 1).0);
        b.push(off.runs(batch, 1).0);
    }
    (median(a), median(b))
}

/// Sequential governed runs with the maker and checker confined (the default) and with
/// `[sandbox] enabled = false`, in five alternating rounds; medians of runs/s.
fn sandbox_cost(dir: &Path, n: usize) -> (f64, f64) {
    let on = Governed::with(&dir.join("on"), true_workflow());
    let off = Governed::with(
        &dir.join("off"),
        format!("{}[sandbox]\nenabled = false\n", true_workflow()),
    );
    on_vs_off(&on, &off, n)
}

/// Sequential governed runs with every alert event wanted by a webhook channel (one that
/// refuses connections: each delivery fails and is retried off the run's path) and with
/// no channel, in five alternating rounds; medians of runs/s for a passing workflow (each
/// run asks whether it recovered) and a failing one (each run raises a dead_letter alert,
/// held back by the rate limit). The ledger `steward why` reads costs a run nothing: it
/// is the run records themselves.
fn alerts_cost(dir: &Path, n: usize) -> [(f64, f64); 2] {
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // dropped: nothing listens there
    let channels = steward::alert::Channels {
        list: vec![toml::from_str(&format!(
            "kind = \"webhook\"\nurl = \"http://127.0.0.1:{refused}/\"\nevents = [{}]\n",
            steward::alert::Event::ALL
                .map(|e| format!("\"{e}\""))
                .join(", ")
        ))
        .unwrap()],
        smtp: None,
    };
    let failing =
        true_workflow().replacen("command = [\"/bin/true\"]", "command = [\"/bin/false\"]", 1)
            + "[retry]\nattempts = 1\n";
    let mut out = [(0.0, 0.0); 2];
    for (i, workflow) in [true_workflow(), failing].into_iter().enumerate() {
        let on = Governed::alerting(
            &dir.join(format!("on{i}")),
            workflow.clone(),
            channels.clone(),
        );
        let off = Governed::with(&dir.join(format!("off{i}")), workflow);
        out[i] = on_vs_off(&on, &off, n);
    }
    out
}

/// Breach → whole process group gone, in ms per run.
fn breach_to_dead_tree(dir: &Path, n: usize) -> Vec<f64> {
    let maker = dir.join("breach.sh");
    let mark = dir.join("breach-at");
    write_exe(
        &maker,
        &format!(
            "cat >/dev/null\nsleep 300 &\ndate +%s%N > {}\necho 'charge tokens 999999' >&3\nwait\n",
            mark.display()
        ),
    );
    let body = format!("dry_run = true\n[trigger]\nmanual = true\n{BUDGET}kill_grace_s = 1\n[run]\ncommand = [\"{}\"]\n[verify]\ncommand = [\"/bin/true\"]\n[sandbox]\nwrite = [\"{}\"]\n", maker.display(), dir.display());
    let cfg = config(dir, &[("breach".into(), body)]);
    let config = steward::config::load_dir(&cfg).unwrap();
    let (engine, _) = steward::governed::open(&dir.join("state-breach")).unwrap();
    let wf = std::sync::Arc::new(config.workflows["breach"].clone());
    let runner = steward::runner::Runner::new(engine, 1);
    let rt = runtime();
    (0..n)
        .map(|_| {
            let rec = rt.block_on(governed_run(&runner, &wf, steward::live::Ask::Dry));
            let done = now_ns();
            assert_eq!(rec.state.name(), "exhausted");
            let at: u128 = std::fs::read_to_string(&mark)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            (done - at) as f64 / 1e6
        })
        .collect()
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child-mark") {
        child_mark(Path::new(&args[2]));
        return;
    }
    // As the steward binary does: keep fd 3 so steps start with posix_spawn.
    steward::step::reserve_control_fd();
    if args.get(1).map(String::as_str) == Some("--child-seen") {
        child_seen(
            Path::new(&args[2]),
            args[3].parse().unwrap(),
            args[4].parse().unwrap(),
        );
        return;
    }
    let mode = if args.iter().any(|a| a == "--full") {
        "full"
    } else if args.iter().any(|a| a == "--smoke") {
        "smoke"
    } else {
        "quick"
    };
    let s = sizes(mode);
    // `--only seen` (or throughput, sandbox, alerts, latency, breach, scale, drain,
    // reading, growth, dashboard) runs one figure.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let want = |k: &str| only.as_deref().is_none_or(|o| o == k);
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = |name: &str| {
        let d = tmp.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    let mut r = Report {
        rows: Vec::new(),
        json: serde_json::Map::new(),
        since: host_ticks(),
    };
    println!(
        "steward benchmarks ({mode}) on {} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!(
        "{:<44} {:>22} {:>22} {:>10} {:>6}",
        "figure", "steward", "baseline", "ratio", "steal%"
    );

    if want("throughput") {
        throughput_rows(&mut r, &s, &dir, &args);
    }
    if want("sandbox") {
        sandbox_rows(&mut r, &s, &dir);
    }
    if want("alerts") {
        alerts_rows(&mut r, &s, &dir);
    }
    if want("latency") {
        latency_rows(&mut r, &s, &dir);
    }
    if want("breach") {
        breach_rows(&mut r, &s, &dir);
    }
    if want("scale") {
        scale_rows(&mut r, &s, &dir);
    }
    if want("drain") {
        drain_rows(&mut r, &s, &dir);
    }
    if want("seen") {
        seen_rows(&mut r, &s, &dir);
    }
    if want("reading") {
        reading_rows(&mut r, &s);
    }
    if want("growth") {
        growth_rows(&mut r, &s, &dir);
    }
    if want("gateway") {
        gateway_rows(&mut r, &s);
    }
    if want("dashboard") {
        dashboard_rows(&mut r, &s, &dir);
    }

    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap_or(Path::new("target"))
        .join("bench");
    std::fs::create_dir_all(&out).unwrap();
    let file = out.join("steward.json");
    std::fs::write(
        &file,
        serde_json::to_string_pretty(&json!({ "mode": mode, "figures": r.json })).unwrap(),
    )
    .unwrap();
    println!("wrote {}", file.display());
}
