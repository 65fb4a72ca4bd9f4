//! A daemon's start-up and idle cost with many workflows, the drain's planning, a digest's seen filter and feed reading, and how the store grows.

use super::*;

pub(crate) fn proc_status(pid: u32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(f64::NAN)
}

pub(crate) fn cpu_ticks(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0)
}

/// Start-up time, idle RSS (KiB) and idle CPU (% of a core) with `n` scheduled workflows.
pub(crate) fn scale(dir: &Path, n: usize, idle: Duration) -> (f64, f64, f64) {
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
pub(crate) fn drain_planning(dir: &Path, n: usize) -> f64 {
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
pub(crate) fn seen_filtering(dir: &Path, seen: usize, candidates: usize) -> (f64, f64) {
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

pub(crate) fn child_seen(dir: &Path, seen: usize, candidates: usize) {
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
pub(crate) fn feed_reading(items: usize) -> (f64, f64, usize) {
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
pub(crate) fn du(path: &Path) -> u64 {
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
pub(crate) type StateBytes = (u64, u64);

pub(crate) fn growth(dir: &Path, a: usize, b: usize) -> ((f64, StateBytes), (f64, StateBytes)) {
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
