//! Trigger → maker latency: a real daemon fed file drops, queue items, an upstream's end and cron slots, on a normal disk and a slow one.

use super::*;

pub(crate) struct Daemon {
    pub(crate) child: std::process::Child,
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

pub(crate) fn steward_cmd(cfg: &Path, state: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_steward"));
    c.env("STEWARD_CONFIG", cfg)
        .env("STEWARD_STATE", state)
        .env("STEWARD_DASHBOARD_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// Starts a daemon; returns it and the seconds until it answered `status`.
pub(crate) fn start_daemon(cfg: &Path, state: &Path) -> (Daemon, f64) {
    start_daemon_env(cfg, state, &[])
}

/// [`start_daemon`] with variables set in the daemon's environment.
pub(crate) fn start_daemon_env(cfg: &Path, state: &Path, vars: &[(&str, &str)]) -> (Daemon, f64) {
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

pub(crate) fn wait_lines(path: &Path, n: usize, limit: Duration) -> Vec<String> {
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
pub(crate) const SLOW_FLUSH_MS: &str = "20";

/// A live workflow on queue `busy` (maker, checker and commit `/bin/true`: two flushes a
/// run the run waits for), which keeps the store flushing while latencies are taken.
pub(crate) fn busy_workflow() -> (String, String) {
    let steps = "[run]\ncommand = [\"/bin/true\"]\n[verify]\ncommand = [\"/bin/true\"]\n[commit]\ncommand = [\"/bin/true\"]\n";
    (
        "busy".into(),
        format!("dry_run = false\n[trigger]\nqueue = \"busy\"\n{BUDGET}{steps}"),
    )
}

/// Keeps a few items waiting on queue `busy` until dropped; says how many it wrote.
pub(crate) struct Feeder {
    pub(crate) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(crate) thread: Option<std::thread::JoinHandle<usize>>,
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
/// The start a `--child-mark` maker noted on the last line of its log (ns since the epoch).
fn last_start(lines: &[String]) -> u128 {
    let line = lines.last().expect("a maker marked its start");
    line.split_whitespace().next().unwrap().parse().unwrap()
}

pub(crate) fn trigger_latency(
    dir: &Path,
    events: usize,
    cron_events: usize,
    slow: bool,
) -> [Vec<f64>; 4] {
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
        file_lat.push((last_start(&lines) - t0) as f64 / 1e6 - debounce_ms);
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
        queue_lat.push((last_start(&lines) - t0) as f64 / 1e6);
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
