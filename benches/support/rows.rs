//! Each figure the benchmark measures, as the rows of its table: one function per `--only`
//! name.

use super::*;

/// Throughput at each width, against the bare, async and bash limits, and the store's flushes.
pub(crate) fn throughput_rows(
    r: &mut Report,
    s: &Sizes,
    dir: &dyn Fn(&str) -> PathBuf,
    args: &[String],
) {
    // 4 and 8 at once on 2 cores measure contention (the runner, the store's lock and
    // flushes shared between runs), not speed.
    // `--parallel N` measures throughput at that one width.
    let widths: Vec<usize> = match args.iter().position(|a| a == "--parallel") {
        Some(i) => vec![args[i + 1].parse().expect("--parallel N")],
        None => vec![1, 2, 4, 8],
    };
    for parallel in widths {
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
}

/// Sequential throughput with the sandbox on and off.
pub(crate) fn sandbox_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
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

/// Sequential throughput with alerting on and off, passing and failing.
pub(crate) fn alerts_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
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

/// Trigger → maker latency; then the same on a slow disk (each flush 20 ms longer) with a
/// live workflow's runs flushing meanwhile: a trigger's road waits for no flush.
pub(crate) fn latency_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
    for slow in [false, true] {
        r.mark();
        let name = if slow { "latency-slow-disk" } else { "latency" };
        let [file, queue, chain, cron] = trigger_latency(&dir(name), s.events, s.cron_events, slow);
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
}

/// From a cap crossed to a dead process tree.
pub(crate) fn breach_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
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

/// Start-up, idle RSS and idle CPU with many workflows.
pub(crate) fn scale_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
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

/// Planning the drain of many queue markers.
pub(crate) fn drain_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
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

/// A digest's seen filter over many items.
pub(crate) fn seen_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
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

/// Reading a big feed, against feed-rs alone.
pub(crate) fn reading_rows(r: &mut Report, s: &Sizes) {
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

/// Throughput and the state folder after many runs.
pub(crate) fn growth_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
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

/// What a model call and a stream pay for going through the gateway.
pub(crate) fn gateway_rows(r: &mut Report, s: &Sizes) {
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

/// The dashboard's pages and `/metrics` on a big store, and the idle RSS after them.
pub(crate) fn dashboard_rows(r: &mut Report, s: &Sizes, dir: &dyn Fn(&str) -> PathBuf) {
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
