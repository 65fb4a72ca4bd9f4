//! `steward logs`: the runlog, readable or raw, optionally followed across rotation.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use crate::runlog::{self, Entry};

pub struct Filter {
    pub run: Option<String>,
    pub workflow: Option<String>,
}

impl Filter {
    fn keeps(&self, e: &Entry) -> bool {
        self.run.as_ref().is_none_or(|r| &e.run_id == r)
            && self.workflow.as_ref().is_none_or(|w| &e.workflow == w)
    }
}

/// How often `-f` looks for new lines; a person reading a tail does not notice 200 ms.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

pub fn print(state: &Path, filter: Filter, last: usize, json: bool, follow: bool) -> Result<()> {
    let path = runlog::RunLog::path(state);
    let mut lines = Vec::new();
    let mut pos = 0;
    let mut inode = 0;
    if let Ok(file) = File::open(&path) {
        inode = file.metadata()?.ino();
        let mut reader = BufReader::new(file);
        let mut buf = String::new();
        while reader.read_line(&mut buf)? > 0 {
            if buf.ends_with('\n') {
                lines.push(std::mem::take(&mut buf));
            } else {
                break; // a line still being written: follow picks it up whole
            }
        }
        pos = lines.iter().map(|l| l.len() as u64).sum();
    } else if !follow {
        super::output::print_out(&format!("no runlog yet at {}\n", path.display()));
        return Ok(());
    }
    let kept: Vec<&String> = lines
        .iter()
        .filter(|l| parse(l).is_none_or(|e| filter.keeps(&e)))
        .collect();
    for line in &kept[kept.len().saturating_sub(last)..] {
        if !emit(line, json) {
            return Ok(()); // the reader went away (`steward logs | head`)
        }
    }
    if !follow {
        return Ok(());
    }
    loop {
        std::thread::sleep(FOLLOW_POLL);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.ino() != inode || meta.len() < pos {
            // Rotated: the old file became runlog.jsonl.1; read the new one from the start.
            inode = meta.ino();
            pos = 0;
        }
        if meta.len() == pos {
            continue;
        }
        let mut file = File::open(&path)?;
        file.seek(SeekFrom::Start(pos))?;
        let mut reader = BufReader::new(file);
        let mut buf = String::new();
        while reader.read_line(&mut buf)? > 0 {
            if !buf.ends_with('\n') {
                break;
            }
            pos += buf.len() as u64;
            if parse(&buf).is_none_or(|e| filter.keeps(&e)) && !emit(&buf, json) {
                return Ok(());
            }
            buf.clear();
        }
    }
}

fn parse(line: &str) -> Option<Entry> {
    serde_json::from_str(line).ok()
}

/// Prints one runlog line; false once stdout's reader is gone.
fn emit(line: &str, json: bool) -> bool {
    if json {
        return super::output::print_out(line);
    }
    match parse(line) {
        Some(e) => super::output::print_out(&format!("{}\n", runlog::render(&e))),
        None => {
            super::output::print_out(&format!("(unreadable runlog line) {}\n", line.trim_end()))
        }
    }
}

/// `steward logs --cluster`: the last `last` lines of every daemon's runlog from the
/// cluster's log stream (filtered), then with `follow` each new one. A line reads as
/// `steward logs` prints it, after the daemon's name (`--json`: the raw line, with a
/// `daemon` field added).
pub fn print_cluster(
    settings: &crate::config::cluster::ClusterSettings,
    filter: Filter,
    last: usize,
    json: bool,
    follow: bool,
) -> Result<()> {
    let settings = settings.checked()?;
    let bridge = crate::cluster::bridge::Bridge::start()?;
    let name = format!("cli-{}", crate::cluster::Cluster::daemon_name());
    // Filtered lines are not counted: ask for more than `last` when filtering.
    let want = if filter.run.is_some() || filter.workflow.is_some() {
        u64::MAX / 2
    } else {
        last as u64
    };
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let (sink, settings_c) = (lines.clone(), settings.clone());
    let keep = move |daemon: &str, line: &str| -> bool {
        let entry = parse(line);
        if entry.as_ref().is_some_and(|e| !filter.keeps(e)) {
            return true;
        }
        if follow {
            return emit_cluster(daemon, line, json);
        }
        sink.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((daemon.to_string(), line.to_string()));
        true
    };
    bridge.block(async move {
        let cluster = crate::cluster::Cluster::connect(&settings_c, name).await?;
        cluster.read_log(want, follow, keep).await
    })?;
    let lines = lines.lock().unwrap_or_else(|p| p.into_inner());
    for (daemon, line) in &lines[lines.len().saturating_sub(last)..] {
        if !emit_cluster(daemon, line, json) {
            break;
        }
    }
    Ok(())
}

/// One line of the cluster's log; false once stdout's reader is gone.
fn emit_cluster(daemon: &str, line: &str, json: bool) -> bool {
    if json {
        let mut v: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => return super::output::print_out(line),
        };
        v["daemon"] = serde_json::Value::String(daemon.to_string());
        return super::output::print_out(&format!("{v}\n"));
    }
    match parse(line) {
        Some(e) => super::output::print_out(&format!("{daemon}  {}\n", runlog::render(&e))),
        None => super::output::print_out(&format!(
            "{daemon}  (unreadable runlog line) {}\n",
            line.trim_end()
        )),
    }
}
