//! The limits steward is measured against: spawning bare, through tokio, through a bash wrapper, and the disk's fsync rate.

use super::*;

/// The bare limit: the same 3×N processes, spawned with no bookkeeping at all.
pub(crate) fn bare_limit(n: usize, parallel: usize) -> f64 {
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
pub(crate) fn async_limit(rt: &tokio::runtime::Runtime, n: usize, parallel: usize) -> f64 {
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
pub(crate) fn bash_wrapper(dir: &Path, n: usize, parallel: usize) -> f64 {
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
pub(crate) fn fsync_rate(dir: &Path, dur: Duration) -> f64 {
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
