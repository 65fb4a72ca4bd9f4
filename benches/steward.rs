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

/// The bare limit: the same 3×N processes, spawned with no bookkeeping at all.
fn bare_limit(n: usize, parallel: usize) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..parallel {
            s.spawn(|| {
                for _ in 0..(n / parallel) * 3 {
                    Command::new("/bin/true").status().unwrap();
                }
            });
        }
    });
    n as f64 / t.elapsed().as_secs_f64()
}

/// The async spawn limit: the same 3×N processes spawned by tokio on a 2-thread runtime,
/// stdin, stdout and stderr piped and read to the end, as any async supervisor starts a
/// step: what steward's process handling is up against before it adds anything.
fn async_limit(rt: &tokio::runtime::Runtime, n: usize, parallel: usize) -> f64 {
    let t = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..parallel)
            .map(|_| {
                tokio::spawn(async move {
                    for _ in 0..(n / parallel) * 3 {
                        let out = tokio::process::Command::new("/bin/true")
                            .stdin(Stdio::piped())
                            .stdout(Stdio::piped())
                            .stderr(Stdio::piped())
                            .spawn()
                            .unwrap()
                            .wait_with_output()
                            .await
                            .unwrap();
                        assert!(out.status.success());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    n as f64 / t.elapsed().as_secs_f64()
}

/// What users write by hand: bash with flock, the three commands, one JSON log line.
fn bash_wrapper(dir: &Path, n: usize, parallel: usize) -> f64 {
    let script = dir.join("wrapper.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nset -e\nexec 9>{lock}\nflock 9\n/bin/true\n/bin/true\n/bin/true\nprintf '{{\"ts\":\"%s\",\"run\":\"%s\",\"status\":\"success\"}}\\n' \"$(date +%s%N)\" \"$$\" >> {log}\n",
            lock = dir.join("lock").display(),
            log = dir.join("log.jsonl").display()
        ),
    )
    .unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..parallel {
            s.spawn(|| {
                for _ in 0..n / parallel {
                    Command::new("bash").arg(&script).status().unwrap();
                }
            });
        }
    });
    n as f64 / t.elapsed().as_secs_f64()
}

/// fsyncs per second on the state folder's disk.
fn fsync_rate(dir: &Path, dur: Duration) -> f64 {
    let mut f = std::fs::File::create(dir.join("fsync-probe")).unwrap();
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < dur {
        f.write_all(&[0u8; 4096]).unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    n as f64 / t.elapsed().as_secs_f64()
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

struct Daemon {
    child: std::process::Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn steward_cmd(cfg: &Path, state: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_steward"));
    c.env("STEWARD_CONFIG", cfg)
        .env("STEWARD_STATE", state)
        .env("STEWARD_DASHBOARD_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// Starts a daemon; returns it and the seconds until it answered `status`.
fn start_daemon(cfg: &Path, state: &Path) -> (Daemon, f64) {
    start_daemon_env(cfg, state, &[])
}

/// [`start_daemon`] with variables set in the daemon's environment.
fn start_daemon_env(cfg: &Path, state: &Path, vars: &[(&str, &str)]) -> (Daemon, f64) {
    let t = Instant::now();
    let child = steward_cmd(cfg, state)
        .envs(vars.iter().copied())
        .arg("daemon")
        .spawn()
        .unwrap();
    let d = Daemon { child };
    let sock = state.join("steward.sock");
    loop {
        if sock.exists() && std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    (d, t.elapsed().as_secs_f64())
}

fn wait_lines(path: &Path, n: usize, limit: Duration) -> Vec<String> {
    let t = Instant::now();
    loop {
        let lines: Vec<String> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            t.elapsed() < limit,
            "waited {limit:?} for {n} lines in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The slow-disk stand-in: every store flush of the daemon takes this much longer.
const SLOW_FLUSH_MS: &str = "20";

/// A live workflow on queue `busy` (maker, checker and commit `/bin/true`: two flushes a
/// run the run waits for), which keeps the store flushing while latencies are taken.
fn busy_workflow() -> (String, String) {
    let steps = "[run]\ncommand = [\"/bin/true\"]\n[verify]\ncommand = [\"/bin/true\"]\n[commit]\ncommand = [\"/bin/true\"]\n";
    (
        "busy".into(),
        format!("dry_run = false\n[trigger]\nqueue = \"busy\"\n{BUDGET}{steps}"),
    )
}

/// Keeps a few items waiting on queue `busy` until dropped; says how many it wrote.
struct Feeder {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Feeder {
    /// Approves `busy` (no daemon runs yet), then feeds its queue.
    fn start(cfg: &Path, state: &Path) -> Feeder {
        let live = steward_cmd(cfg, state)
            .args(["go-live", "busy"])
            .status()
            .unwrap();
        assert!(live.success(), "go-live busy");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, state) = (stop.clone(), state.to_path_buf());
        let thread = std::thread::spawn(move || {
            let spool = steward::trigger::queue::spool_dir(&state, "busy");
            let mut written = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let waiting = std::fs::read_dir(&spool)
                    .map(|d| {
                        d.flatten()
                            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                            .count()
                    })
                    .unwrap_or(0);
                if waiting < 4 {
                    steward::trigger::queue::write_item(&state, "busy", &json!(written)).unwrap();
                    written += 1;
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            written
        });
        Feeder {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops feeding; the items written.
    fn stop(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap())
    }
}

/// Trigger latencies in ms, each to maker start: file drop, enqueue, an upstream run's
/// end (an `after` trigger's follower), cron. `slow`: every flush of the daemon's store
/// takes [`SLOW_FLUSH_MS`] longer, and a live workflow keeps it flushing meanwhile.
fn trigger_latency(dir: &Path, events: usize, cron_events: usize, slow: bool) -> [Vec<f64>; 4] {
    let vars: &[(&str, &str)] = if slow {
        &[("STEWARD_FLUSH_DELAY_MS", SLOW_FLUSH_MS)]
    } else {
        &[]
    };
    let busy = |mut wfs: Vec<(String, String)>| {
        if slow {
            wfs.push(busy_workflow());
        }
        wfs
    };
    let starts = dir.join("starts.log");
    let chain_starts = dir.join("chain").join("starts.log");
    std::fs::create_dir_all(chain_starts.parent().unwrap()).unwrap();
    // The maker is this program (`--child-mark`): it notes the time as its first act, so
    // the figure is trigger → maker running, not the maker's own start-up of a shell and
    // the children it forks.
    // Its sandbox lets it write the log it marks (the table follows [verify]).
    let maker = |log: &Path| {
        format!(
            "command = [\"{}\", \"--child-mark\", \"{}\"]",
            std::env::current_exe().unwrap().display(),
            log.display()
        )
    };
    let sandbox = |log: &Path| {
        format!(
            "[sandbox]\nwrite = [\"{}\"]\n",
            log.parent().unwrap_or(log).display()
        )
    };
    let wf = |trigger: &str| {
        format!("dry_run = true\noverlap = \"buffer_all\"\n[trigger]\n{trigger}\n{BUDGET}[run]\n{}\n[verify]\ncommand = [\"/bin/true\"]\n{}", maker(&starts), sandbox(&starts))
    };
    let inbox = dir.join("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let debounce_ms = 50.0;
    let cfg = config(
        dir,
        &busy(vec![
            ("drop".into(), wf(&format!("file = {{ path = \"inbox\", pattern = \"*.txt\", debounce_ms = {debounce_ms} }}"))),
            ("q".into(), wf("queue = \"jobs\"")),
            // An upstream that ends at once, and its follower, which marks its start.
            ("up".into(), format!("dry_run = true\n[trigger]\nqueue = \"chain\"\n{BUDGET}[run]\ncommand = [\"/bin/true\"]\n[verify]\ncommand = [\"/bin/true\"]\n")),
            ("down".into(), format!("dry_run = true\noverlap = \"buffer_all\"\n[trigger]\nafter = {{ workflow = \"up\" }}\n{BUDGET}[run]\n{}\n[verify]\ncommand = [\"/bin/true\"]\n{}", maker(&chain_starts), sandbox(&chain_starts))),
        ]),
    );
    let state = dir.join("state");
    let feeder = slow.then(|| Feeder::start(&cfg, &state));
    let (_d, _) = start_daemon_env(&cfg, &state, vars);
    let mut file_lat = Vec::new();
    for i in 0..events {
        let tmp = dir.join(format!("tmp-{i}"));
        std::fs::write(&tmp, format!("event {i}")).unwrap();
        let t0 = now_ns();
        std::fs::rename(&tmp, inbox.join(format!("e{i}.txt"))).unwrap();
        let lines = wait_lines(&starts, file_lat.len() + 1, Duration::from_secs(10));
        let started: u128 = lines
            .last()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        file_lat.push((started - t0) as f64 / 1e6 - debounce_ms);
    }
    let mut queue_lat = Vec::new();
    let jobs = steward::trigger::queue::spool_dir(&state, "jobs");
    for i in 0..events {
        // A queue runs its items one at a time: the figure is the trigger's road, so each
        // item goes in once the one before has ended (its item file is removed then).
        let t = Instant::now();
        while std::fs::read_dir(&jobs).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "json"))
        }) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "a queue item never ended"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let t0 = now_ns();
        let ok = steward_cmd(&cfg, &state)
            .args(["enqueue", "jobs", "--payload", &i.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let lines = wait_lines(
            &starts,
            events + queue_lat.len() + 1,
            Duration::from_secs(10),
        );
        let started: u128 = lines
            .last()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        queue_lat.push((started - t0) as f64 / 1e6);
    }
    // An upstream's end → its follower's maker: the end as the run record has it.
    let mut chain_lat = Vec::new();
    for i in 0..events {
        let ok = steward_cmd(&cfg, &state)
            .args(["enqueue", "chain", "--payload", &i.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let lines = wait_lines(&chain_starts, i + 1, Duration::from_secs(10));
        let mut p = lines.last().unwrap().split_whitespace();
        let started: f64 = p.next().unwrap().parse().unwrap();
        let ended = chrono::DateTime::parse_from_rfc3339(p.next().unwrap()).unwrap();
        chain_lat.push((started - ended.timestamp_nanos_opt().unwrap() as f64) / 1e6);
    }
    if let Some(f) = feeder {
        assert!(f.stop() > 0, "the busy workflow was never fed");
    }
    drop(_d);
    // Cron: a 1-second schedule, measured from the scheduled instant.
    let cron_dir = dir.join("cron");
    std::fs::create_dir_all(&cron_dir).unwrap();
    let starts_cron = cron_dir.join("starts.log");
    let cfg2 = config(&cron_dir, &busy(vec![("tick".into(), format!("dry_run = true\n[trigger]\nschedule = {{ cron = \"* * * * * *\" }}\n{BUDGET}[run]\n{}\n[verify]\ncommand = [\"/bin/true\"]\n{}", maker(&starts_cron), sandbox(&starts_cron)))]));
    let state2 = cron_dir.join("state");
    let feeder = slow.then(|| Feeder::start(&cfg2, &state2));
    let (_d2, _) = start_daemon_env(&cfg2, &state2, vars);
    let lines = wait_lines(
        &starts_cron,
        cron_events,
        Duration::from_secs(cron_events as u64 + 10),
    );
    let cron_lat = lines
        .iter()
        .take(cron_events)
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            let started: u128 = p.next()?.parse().ok()?;
            let slot = chrono::DateTime::parse_from_rfc3339(p.next()?).ok()?;
            Some((started as f64 - slot.timestamp_nanos_opt()? as f64) / 1e6)
        })
        .collect();
    if let Some(f) = feeder {
        assert!(f.stop() > 0, "the busy workflow was never fed");
    }
    [file_lat, queue_lat, chain_lat, cron_lat]
}

fn proc_status(pid: u32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn cpu_ticks(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0)
}

/// Start-up time, idle RSS (KiB) and idle CPU (% of a core) with `n` scheduled workflows.
fn scale(dir: &Path, n: usize, idle: Duration) -> (f64, f64, f64) {
    // The trigger kinds that wait on something: half cron schedules, a quarter queues, a
    // quarter watched folders (an idle watch must not poll its folder).
    let wfs: Vec<(String, String)> = (0..n)
        .map(|i| {
            let trigger = match i % 4 {
                0 | 1 => format!(
                    "schedule = {{ cron = \"{} {} * * *\", timezone = \"Europe/Berlin\" }}",
                    i % 60,
                    (i / 60) % 24
                ),
                2 => format!("queue = \"q{i}\""),
                _ => {
                    std::fs::create_dir_all(dir.join(format!("in{i}"))).unwrap();
                    format!("file = {{ path = \"{}\", pattern = \"*.txt\" }}", dir.join(format!("in{i}")).display())
                }
            };
            (format!("wf{i:04}"), format!("dry_run = true\n[trigger]\n{trigger}\n{BUDGET}[run]\ncommand = [\"/bin/true\"]\n[verify]\ncommand = [\"/bin/true\"]\n"))
        })
        .collect();
    let cfg = config(dir, &wfs);
    let (d, startup) = start_daemon(&cfg, &dir.join("state"));
    std::thread::sleep(Duration::from_millis(500));
    let pid = d.child.id();
    let ticks0 = cpu_ticks(pid);
    let t = Instant::now();
    std::thread::sleep(idle);
    let hz = 100.0; // USER_HZ on Linux
    let cpu = (cpu_ticks(pid) - ticks0) / hz / t.elapsed().as_secs_f64() * 100.0;
    let rss = proc_status(pid, "VmRSS:");
    (startup, rss, cpu)
}

/// Drain planning of `n` markers over 500 jobs, in seconds.
fn drain_planning(dir: &Path, n: usize) -> f64 {
    let markers = dir.join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    let today = chrono::Utc::now().date_naive();
    for i in 0..n {
        let d = today - chrono::Duration::days((i / 500) as i64);
        let job = format!("job{:03}", i % 500);
        std::fs::write(
            markers.join(format!("{}-{job}.md", d.format("%Y-%m-%d"))),
            "---\nstatus: queued\n---\n",
        )
        .unwrap();
    }
    let t = Instant::now();
    let (found, bad) = steward::drain::scan(&markers);
    let plan = steward::drain::plan(
        found,
        |_| Some(Duration::from_secs(2 * 86_400)),
        chrono::Utc::now(),
    );
    let secs = t.elapsed().as_secs_f64();
    assert!(
        bad.is_empty() && plan.run.len() == 500,
        "{} jobs planned",
        plan.run.len()
    );
    secs
}

/// Seen filtering in a child process (so its peak memory is its own): (seconds, peak KiB).
fn seen_filtering(dir: &Path, seen: usize, candidates: usize) -> (f64, f64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--child-seen",
            &dir.display().to_string(),
            &seen.to_string(),
            &candidates.to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut p = text.split_whitespace();
    (
        p.next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN),
        p.next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN),
    )
}

fn child_seen(dir: &Path, seen: usize, candidates: usize) {
    let agent = dir.join("agents/bench");
    std::fs::create_dir_all(&agent).unwrap();
    {
        let mut f =
            std::io::BufWriter::new(std::fs::File::create(agent.join("seen.jsonl")).unwrap());
        for i in 0..seen {
            writeln!(f, "{{\"id\":\"item-{i}\",\"hash\":\"{:064x}\",\"source\":\"s\",\"surfaced_at\":\"2026-01-01T00:00:00Z\"}}", i).unwrap();
        }
    }
    let items: Vec<steward::agent::feed::Item> = (0..candidates)
        .map(|i| {
            let id = if i % 2 == 0 {
                format!("item-{}", i * 7)
            } else {
                format!("new-{i}")
            };
            steward::agent::feed::Item {
                id,
                source: "s".into(),
                title: "t".into(),
                link: None,
                summary: String::new(),
                published: None,
                hash: format!("{:064x}", i * 7),
                flags: vec![],
            }
        })
        .collect();
    let t = Instant::now();
    let tracker = steward::agent::seen::Seen::load(&agent).unwrap();
    let fresh = items
        .iter()
        .filter(|i| tracker.novelty(i).is_some())
        .count();
    let secs = t.elapsed().as_secs_f64();
    assert!(fresh > 0);
    println!("{secs} {}", proc_status(std::process::id(), "VmHWM:"));
}

/// Reading one large RSS feed whose items carry HTML (entities, inline markup, a script)
/// as a digest agent reads it — decode, parse, markup to text, ids — against feed-rs's
/// parse of the same bytes alone: the median of 5 of each, in alternating rounds.
fn feed_reading(items: usize) -> (f64, f64, usize) {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?><rss version=\"2.0\"><channel><title>bench</title><link>https://bench.example/</link>",
    );
    for i in 0..items {
        xml.push_str(&format!(
            "<item><title>Item {i}: caf&amp;eacute; &amp;amp; cr&amp;egrave;me</title><link>https://bench.example/p/{i}</link>\
             <pubDate>Wed, 02 Dec 2026 10:00:00 GMT</pubDate><description><![CDATA[<p>Paragraph <b>one</b> of item {i}, with &eacute;t&eacute; and a <a href=\"https://x.example/{i}\">link</a>.</p>\
             <script>alert(1)</script><p>{}</p>]]></description></item>",
            "Some longer text that makes the summary realistic. ".repeat(12)
        ));
    }
    xml.push_str("</channel></rss>");
    let source: steward::config::agent::Source = toml::from_str(
        "name = \"bench\"\nkind = \"rss\"\nurl = \"https://bench.example/feed.xml\"\ntopic_tags = []\n",
    )
    .unwrap();
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        let read = steward::agent::feed::parse(&source, xml.as_bytes(), None, items).unwrap();
        ours.push(t.elapsed().as_secs_f64());
        assert_eq!(read.len(), items);
        let t = Instant::now();
        let feed = feed_rs::parser::parse(xml.as_bytes()).unwrap();
        bare.push(t.elapsed().as_secs_f64());
        assert_eq!(feed.entries.len(), items);
    }
    (median(ours), median(bare), xml.len())
}

/// State size (bytes) under a folder.
fn du(path: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(path) {
        for e in rd.flatten() {
            let m = e.metadata().unwrap();
            total += if m.is_dir() { du(&e.path()) } else { m.len() };
        }
    }
    total
}

/// Throughput and state size of a store that has recorded `a` runs and of one that has
/// recorded `b`. The two are measured in alternating rounds (median of each), so the
/// machine's noise falls on both alike instead of on whichever phase came second.
/// Bytes of the store, and of the whole state folder.
type StateBytes = (u64, u64);

fn growth(dir: &Path, a: usize, b: usize) -> ((f64, StateBytes), (f64, StateBytes)) {
    let cfg = config(dir, &[("bench".into(), true_workflow())]);
    let config = steward::config::load_dir(&cfg).unwrap();
    let wf = config.workflows["bench"].clone();
    let rt = runtime();
    let open = |name: &str| {
        let state = dir.join(name);
        let (engine, _) = steward::governed::open(&state).unwrap();
        engine.go_live(&wf).unwrap();
        (engine, state)
    };
    let shared_wf = std::sync::Arc::new(wf.clone());
    let runs = |engine: &steward::governed::Engine, n: usize| {
        let runner = steward::runner::Runner::new(engine.clone(), 1);
        for _ in 0..n {
            rt.block_on(governed_run(&runner, &shared_wf, steward::live::Ask::Live));
        }
    };
    let (small, small_state) = open("small");
    let (big, big_state) = open("big");
    runs(&small, a);
    runs(&big, b);
    let sample = 100.min(a);
    let (mut t_small, mut t_big) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        for (engine, out) in [(&small, &mut t_small), (&big, &mut t_big)] {
            let t = Instant::now();
            runs(engine, sample);
            out.push(sample as f64 / t.elapsed().as_secs_f64());
        }
    }
    small.store.flush().unwrap();
    big.store.flush().unwrap();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // The store, and the whole folder (the runlog rotates at 16 MiB, keeping 5 old files).
    let sizes = |state: &Path| (du(&state.join("store")), du(state));
    (
        (median(&mut t_small), sizes(&small_state)),
        (median(&mut t_big), sizes(&big_state)),
    )
}

/// One GET on its own connection (as a browser's first visit makes it): the status, the
/// seconds until the last byte, and the response as text.
fn http_get(addr: &str, path: &str, cookie: &str) -> (u16, f64, String) {
    let t = Instant::now();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, secs, text)
}

/// The dashboard's figures on one store: p99-ready samples (ms) of the overview, the runs
/// page and a `/metrics` scrape, and the daemon's RSS (KiB) after `idle` with nothing to do.
struct Board {
    overview: Vec<f64>,
    runs: Vec<f64>,
    metrics: Vec<f64>,
    idle_rss: f64,
}

/// A store of `n` finished runs over four workflows and the last twenty days, written
/// straight through the store (a real governed run is the template), then a daemon on it
/// with the dashboard on, asked each page `samples` times.
fn dashboard(dir: &Path, n: usize, samples: usize, idle: Duration) -> Board {
    let workflows = ["tidy", "digest", "gate", "sync"];
    let wfs: Vec<(String, String)> = workflows
        .iter()
        .map(|w| (w.to_string(), true_workflow()))
        .collect();
    let cfg = config(dir, &wfs);
    // Retention above `n`, so the daemon keeps what was seeded.
    std::fs::write(
        cfg.join("steward.toml"),
        format!("[retention]\nruns = {}\ndays = 30\n", n + 1000),
    )
    .unwrap();
    let state = dir.join("state");
    {
        let config = steward::config::load_dir(&cfg).unwrap();
        let (engine, _) = steward::governed::open(&state).unwrap();
        let wf = std::sync::Arc::new(config.workflows["tidy"].clone());
        engine.go_live(&wf).unwrap();
        let store = engine.store.clone();
        store.set_retention(steward::store::Retention {
            runs: n + 1000,
            days: 30,
        });
        let runner = steward::runner::Runner::new(engine, 1);
        let template = runtime().block_on(governed_run(&runner, &wf, steward::live::Ask::Live));
        let states = [
            steward::store::RunState::Success,
            steward::store::RunState::Success,
            steward::store::RunState::Success,
            steward::store::RunState::Failed,
        ];
        let now = chrono::Utc::now();
        let span_ms = 20 * 86_400_000 / n.max(1) as i64;
        for i in 0..n {
            let started = now - chrono::Duration::milliseconds(span_ms * (n - i) as i64);
            let mut run = template.clone();
            run.run_id = format!("{}-{i:06x}", steward::store::run_id_prefix(started));
            run.workflow = workflows[i % workflows.len()].to_string();
            run.state = states[(i / workflows.len()) % states.len()];
            run.started_at = started;
            run.ended_at = Some(started + chrono::Duration::milliseconds(40));
            store.put_run(&run).unwrap();
        }
        store.flush().unwrap();
    } // the engine and its store lock are gone: the daemon takes the folder
    let (d, _) = start_daemon(&cfg, &state);
    let out = steward_cmd(&cfg, &state)
        .args(["dashboard", "--json"])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).expect("steward dashboard --json");
    let addr = v["listen"].as_str().unwrap().to_string();
    let token = v["url"].as_str().unwrap().split("token=").nth(1).unwrap();
    let cookie = {
        let (_, _, head) = http_get(&addr, &format!("/?token={token}"), "");
        let line = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
            .expect("the token buys a session cookie");
        line.split_once(':')
            .unwrap()
            .1
            .split(';')
            .next()
            .unwrap()
            .trim()
            .to_string()
    };
    let sample = |path: &str, cookie: &str| -> Vec<f64> {
        (0..samples)
            .map(|_| {
                let (status, secs, _) = http_get(&addr, path, cookie);
                assert_eq!(status, 200, "{path}");
                secs * 1e3
            })
            .collect()
    };
    // The runs page with a filter too: the index must serve both as a page of its size.
    let mut runs = sample("/runs", &cookie);
    runs.extend(sample("/runs?workflow=gate&state=failed", &cookie));
    let board = Board {
        overview: sample("/", &cookie),
        runs,
        metrics: sample("/metrics", ""),
        idle_rss: 0.0,
    };
    std::thread::sleep(idle);
    Board {
        idle_rss: proc_status(d.child.id(), "VmRSS:"),
        ..board
    }
}

/// The latency benchmark's maker: appends `<ns since the epoch at start> <scheduled_for>`.
fn child_mark(log: &Path) {
    let started = now_ns();
    let mut ctx = String::new();
    let _ = std::io::stdin().read_to_string(&mut ctx);
    // A schedule's slot, or the end of the upstream run that fired a follower.
    let slot = serde_json::from_str::<Value>(&ctx)
        .ok()
        .and_then(|c| {
            let t = &c["trigger"];
            t["scheduled_for"]
                .as_str()
                .or(t["upstream"]["ended_at"].as_str())
                .map(String::from)
        })
        .unwrap_or_default();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .unwrap();
    // One write, so lines from makers running side by side never interleave.
    f.write_all(format!("{started} {slot}\n").as_bytes())
        .unwrap();
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

    // 4 and 8 at once on 2 cores measure contention (the runner, the store's lock and
    // flushes shared between runs), not speed.
    // `--parallel N` measures throughput at that one width.
    let widths: Vec<usize> = match args.iter().position(|a| a == "--parallel") {
        Some(i) => vec![args[i + 1].parse().expect("--parallel N")],
        None => vec![1, 2, 4, 8],
    };
    for parallel in widths.into_iter().filter(|_| want("throughput")) {
        r.mark();
        let Throughput {
            steward: st,
            bare,
            tokio,
            bash,
            flushes,
        } = throughput(&dir(&format!("tp{parallel}")), s.runs, parallel);
        let label = if parallel == 1 {
            "sequential".to_string()
        } else {
            format!("{parallel} in parallel")
        };
        r.row(&format!("throughput {label} (runs/s) vs bare limit"), format!("{st:.0}"), format!("{bare:.0}"), format!("{:.2}", st / bare), json!({ "steward": st, "bare_limit": bare, "async_limit": tokio, "bash_wrapper": bash, "store_flushes_per_run": flushes }));
        r.row(
            &format!("throughput {label} (runs/s) vs async spawn limit"),
            format!("{st:.0}"),
            format!("{tokio:.0}"),
            format!("{:.2}", st / tokio),
            json!({ "steward": st, "async_limit": tokio }),
        );
        r.row(
            &format!("throughput {label} (runs/s) vs bash wrapper"),
            format!("{st:.0}"),
            format!("{bash:.0}"),
            format!("{:.2}", st / bash),
            json!({ "steward": st, "bash_wrapper": bash }),
        );
        if parallel == 1 {
            let fs = fsync_rate(&dir("fsync"), Duration::from_secs(1));
            r.row(
                "durability: store flushes per run / fsyncs/s",
                format!("{flushes:.1} flushes"),
                format!("{fs:.0} fsync/s"),
                "-".into(),
                json!({ "flushes_per_run": flushes, "fsyncs_per_s": fs }),
            );
        } else {
            // A live run without a key waits for two flushes (before its commit, after its
            // end); concurrent runs share them (group commit).
            r.row(
                &format!("store flushes per run, {label}"),
                format!("{flushes:.2} flushes"),
                "2 durable points".into(),
                format!("{:.2}", flushes / 2.0),
                json!({ "flushes_per_run": flushes }),
            );
        }
    }

    if want("sandbox") {
        r.mark();
        let (on, off) = sandbox_cost(&dir("sandbox"), s.runs);
        r.row(
            "sequential throughput, sandbox on vs off (runs/s)",
            format!("{on:.0}"),
            format!("off {off:.0}"),
            format!("{:.2}", on / off),
            json!({ "sandbox_on": on, "sandbox_off": off }),
        );
    }

    if want("alerts") {
        r.mark();
        let [pass, fail] = alerts_cost(&dir("alerts"), s.runs);
        for ((on, off), label) in [(pass, "passing"), (fail, "failing, each alerting")] {
            r.row(
                &format!("sequential {label}: alerts on vs off (runs/s)"),
                format!("{on:.0}"),
                format!("off {off:.0}"),
                format!("{:.2}", on / off),
                json!({ "alerts_on": on, "alerts_off": off }),
            );
        }
    }

    // Then the same on a slow disk (each flush 20 ms longer) with a live workflow's runs
    // flushing meanwhile: a trigger's road waits for no flush.
    for slow in [false, true] {
        let [file, queue, chain, cron] = if want("latency") {
            r.mark();
            let name = if slow { "latency-slow-disk" } else { "latency" };
            trigger_latency(&dir(name), s.events, s.cron_events, slow)
        } else {
            Default::default()
        };
        let disk = if slow {
            format!(", {SLOW_FLUSH_MS} ms flushes")
        } else {
            String::new()
        };
        for (name, v) in [
            (
                format!("file drop → maker (ms, minus debounce{disk})"),
                file,
            ),
            (format!("enqueue → maker (ms{disk})"), queue),
            (format!("upstream end → follower's maker (ms{disk})"), chain),
            (format!("cron slot → maker (ms{disk})"), cron),
        ] {
            if v.is_empty() {
                continue; // not measured in this run (`--only`)
            }
            let n = v.len();
            let (p50, p99, max) = dist(v);
            r.row(
                &name,
                format!("p50 {p50:.1} p99 {p99:.1}"),
                format!("max {max:.1}"),
                format!("n={n}"),
                json!({ "p50": p50, "p99": p99, "max": max, "n": n }),
            );
        }
    }

    if want("breach") {
        r.mark();
        let (p50, p99, max) = dist(breach_to_dead_tree(&dir("breach"), s.breaches));
        r.row(
            "breach → dead tree (ms)",
            format!("p50 {p50:.1} p99 {p99:.1}"),
            format!("max {max:.1}"),
            format!("n={}", s.breaches),
            json!({ "p50": p50, "p99": p99, "max": max }),
        );
    }

    if want("scale") {
        r.mark();
        let (startup, rss, cpu) = scale(&dir("scale"), s.workflows, Duration::from_secs(s.idle_s));
        r.row(
            &format!("start-up with {} workflows (s)", s.workflows),
            format!("{startup:.3}"),
            "target 0.5".into(),
            "-".into(),
            json!(startup),
        );
        r.row(
            &format!("idle RSS with {} workflows (MiB)", s.workflows),
            format!("{:.1}", rss / 1024.0),
            "target 30".into(),
            "-".into(),
            json!(rss / 1024.0),
        );
        r.row(
            &format!("idle CPU over {} s (% of a core)", s.idle_s),
            format!("{cpu:.2}"),
            "target 1".into(),
            "-".into(),
            json!(cpu),
        );
    }

    if want("drain") {
        r.mark();
        let drain = drain_planning(&dir("drain"), s.markers);
        r.row(
            &format!("drain planning, {} markers (s)", s.markers),
            format!("{drain:.3}"),
            "target 1".into(),
            "-".into(),
            json!(drain),
        );
    }

    if want("seen") {
        r.mark();
        let (secs, hwm) = seen_filtering(&dir("seen"), s.seen, s.candidates);
        r.row(
            &format!(
                "seen filter {}k vs {}k (s, peak MiB)",
                s.candidates / 1000,
                s.seen / 1000
            ),
            format!("{secs:.3} s"),
            format!("{:.0} MiB peak", hwm / 1024.0),
            "-".into(),
            json!({ "secs": secs, "peak_mib": hwm / 1024.0 }),
        );
    }

    if want("reading") {
        r.mark();
        let (ours, bare, bytes) = feed_reading(s.feed_items);
        r.row(
            &format!(
                "read a {:.1} MiB feed of {} items (ms)",
                bytes as f64 / 1048576.0,
                s.feed_items
            ),
            format!("{:.1}", ours * 1e3),
            format!("feed-rs alone {:.1}", bare * 1e3),
            format!("{:.2}", ours / bare),
            json!({ "steward_s": ours, "feed_rs_s": bare, "bytes": bytes }),
        );
    }

    if want("growth") {
        r.mark();
        let ((t1, s1), (t2, s2)) = growth(&dir("growth"), s.growth.0, s.growth.1);
        r.row(
            &format!(
                "throughput after {} vs {} runs (runs/s)",
                s.growth.1, s.growth.0
            ),
            format!("{t2:.0}"),
            format!("{t1:.0}"),
            format!("{:.2}", t2 / t1),
            json!({ "early": t1, "late": t2 }),
        );
        for (name, early, late) in [("store", s1.0, s2.0), ("state dir", s1.1, s2.1)] {
            r.row(
                &format!("{name} after {} vs {} runs (MiB)", s.growth.1, s.growth.0),
                format!("{:.1}", late as f64 / 1048576.0),
                format!("{:.1}", early as f64 / 1048576.0),
                format!("{:.1}", late as f64 / early.max(1) as f64),
                json!({ "early": early, "late": late }),
            );
        }
    }

    if want("gateway") {
        r.mark();
        let g = gateway::run(s.model_calls);
        let (d50, d99, _) = dist(g.direct.calls);
        let (g50, g99, _) = dist(g.gateway.calls);
        r.row(
            "model call via gateway, added (ms, target p99 2)",
            format!("p50 {:.2} p99 {:.2}", g50 - d50, g99 - d99),
            format!("direct p50 {d50:.2} p99 {d99:.2}"),
            format!("{:.2}", g99 / d99),
            json!({ "added_p50_ms": g50 - d50, "added_p99_ms": g99 - d99, "gateway_p50_ms": g50, "gateway_p99_ms": g99, "direct_p50_ms": d50, "direct_p99_ms": d99, "calls": s.model_calls, "metered_calls": g.metered_calls }),
        );
        let (d50, d99, _) = dist(g.direct.first_byte);
        let (g50, g99, _) = dist(g.gateway.first_byte);
        r.row(
            "streamed first byte via gateway, added (ms, target 2)",
            format!("p50 {:.2} p99 {:.2}", g50 - d50, g99 - d99),
            format!("direct p50 {d50:.2} p99 {d99:.2}"),
            format!("{:.2}", g99 / d99),
            json!({ "added_p50_ms": g50 - d50, "added_p99_ms": g99 - d99, "gateway_p50_ms": g50, "gateway_p99_ms": g99, "direct_p50_ms": d50, "direct_p99_ms": d99 }),
        );
        let (through, direct) = g.stream_rss_kib;
        r.row(
            &format!(
                "{:.0} MB stream via gateway: peak RSS growth (MiB)",
                g.stream_bytes as f64 / 1e6
            ),
            format!("{:.1}", through / 1024.0),
            format!("direct {:.1}", direct / 1024.0),
            "-".into(),
            json!({ "gateway_mib": through / 1024.0, "direct_mib": direct / 1024.0, "bytes": g.stream_bytes }),
        );
    }
    if want("dashboard") {
        r.mark();
        let (n, samples) = s.board;
        // The same pages on a store of a hundredth the size: what the store's size costs.
        let small = dashboard(&dir("board-small"), n / 100, samples, Duration::ZERO);
        let big = dashboard(&dir("board"), n, samples, Duration::from_secs(s.idle_s));
        for (name, ours, base, target) in [
            ("overview page", big.overview, small.overview, 50.0),
            ("runs page", big.runs, small.runs, 50.0),
            ("/metrics scrape", big.metrics, small.metrics, 10.0),
        ] {
            let (p50, p99, _) = dist(ours);
            let (_, base99, _) = dist(base);
            r.row(
                &format!("{name} with {}k runs (ms, target p99 {target})", n / 1000),
                format!("p50 {p50:.1} p99 {p99:.1}"),
                format!("{} runs p99 {base99:.1}", n / 100),
                format!("{:.2}", p99 / base99),
                json!({ "p50": p50, "p99": p99, "baseline_p99": base99, "runs": n, "target_p99": target }),
            );
        }
        // Idle after serving those pages, at the default retention (10,000 runs) and with
        // retention raised to `n`.
        let default = steward::store::Retention::default().runs.min(n);
        let kept = dashboard(
            &dir("board-default"),
            default,
            samples,
            Duration::from_secs(s.idle_s),
        );
        for (runs, rss) in [(default, kept.idle_rss), (n, big.idle_rss)] {
            r.row(
                &format!(
                    "idle RSS, dashboard on, pages served, {}k runs (MiB)",
                    runs / 1000
                ),
                format!("{:.1}", rss / 1024.0),
                "target 30".into(),
                "-".into(),
                json!({ "runs": runs, "rss_mib": rss / 1024.0 }),
            );
        }
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
