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
