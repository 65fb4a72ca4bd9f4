//! The dashboard's pages and /metrics on a big store, and the latency maker's own mark.

use super::*;

/// One GET on its own connection (as a browser's first visit makes it): the status, the
/// seconds until the last byte, and the response as text.
pub(crate) fn http_get(addr: &str, path: &str, cookie: &str) -> (u16, f64, String) {
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
pub(crate) struct Board {
    pub(crate) overview: Vec<f64>,
    pub(crate) runs: Vec<f64>,
    pub(crate) metrics: Vec<f64>,
    pub(crate) idle_rss: f64,
}

/// A store of `n` finished runs over four workflows and the last twenty days, written
/// straight through the store (a real governed run is the template), then a daemon on it
/// with the dashboard on, asked each page `samples` times.
pub(crate) fn dashboard(dir: &Path, n: usize, samples: usize, idle: Duration) -> Board {
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
pub(crate) fn child_mark(log: &Path) {
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
