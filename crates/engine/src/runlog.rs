//! `STATE/runlog.jsonl`: one JSON object per step, appended and flushed per record,
//! rotated by size (`runlog.jsonl.1` is the newest rotated file).
//!
//! Every line passes through the run's [`Redactor`] as a whole, so a secret cannot reach
//! the file through any field.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::budget::Figures;
use crate::redact::Redactor;

/// One record. `step` is `trigger`, `run`, `verify`, `commit`, `retry` or `end`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub ts: DateTime<Utc>,
    pub run_id: String,
    pub workflow: String,
    pub attempt: u32,
    pub step: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<Figures>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default)]
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

pub const DEFAULT_MAX_BYTES: u64 = 16 << 20;
pub const DEFAULT_KEEP: usize = 5;

#[derive(Clone)]
pub struct RunLog {
    inner: Arc<Mutex<Inner>>,
    /// Where each line goes besides the file (a cluster's log stream), if anywhere.
    tee: Arc<std::sync::RwLock<Option<Tee>>>,
}

/// Takes a copy of each runlog line as written (redacted, with its newline); must not
/// block.
pub type Tee = Box<dyn Fn(&str) + Send + Sync>;

struct Inner {
    path: PathBuf,
    file: File,
    size: u64,
    max_bytes: u64,
    keep: usize,
}

impl RunLog {
    pub fn open(state_dir: &Path) -> std::io::Result<RunLog> {
        Self::with_limits(state_dir, DEFAULT_MAX_BYTES, DEFAULT_KEEP)
    }

    pub fn with_limits(state_dir: &Path, max_bytes: u64, keep: usize) -> std::io::Result<RunLog> {
        let path = state_dir.join("runlog.jsonl");
        let file = open_append(&path)?;
        let size = file.metadata()?.len();
        Ok(RunLog {
            inner: Arc::new(Mutex::new(Inner {
                path,
                file,
                size,
                max_bytes: max_bytes.max(1024),
                keep: keep.max(1),
            })),
            tee: Arc::new(std::sync::RwLock::new(None)),
        })
    }

    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("runlog.jsonl")
    }

    /// Appends one record (redacted) and flushes it to the OS.
    pub fn record(&self, entry: &Entry, redactor: &Redactor) -> std::io::Result<()> {
        let line = serde_json::to_string(entry).map_err(std::io::Error::other)?;
        let mut line = redactor.redact_json_text(&line).into_owned();
        line.push('\n');
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.size > 0 && inner.size + line.len() as u64 > inner.max_bytes {
            inner.rotate()?;
        }
        inner.file.write_all(line.as_bytes())?;
        inner.file.flush()?;
        inner.size += line.len() as u64;
        drop(inner);
        if let Some(tee) = self.tee.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            tee(&line);
        }
        Ok(())
    }

    /// Sends a copy of every line from now on to `tee` too (every clone of this log).
    pub fn set_tee(&self, tee: Tee) {
        *self.tee.write().unwrap_or_else(|p| p.into_inner()) = Some(tee);
    }
}

impl Inner {
    fn rotate(&mut self) -> std::io::Result<()> {
        let name = |n: usize| PathBuf::from(format!("{}.{n}", self.path.display()));
        let _ = std::fs::remove_file(name(self.keep));
        for n in (1..self.keep).rev() {
            let from = name(n);
            if from.exists() {
                std::fs::rename(&from, name(n + 1))?;
            }
        }
        std::fs::rename(&self.path, name(1))?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// Every record of one run, oldest first, read from the runlog and the rotated files
/// before it (newest first, stopping at the first older file without the run).
pub fn entries_of(state_dir: &Path, run_id: &str) -> Vec<Entry> {
    let current = RunLog::path(state_dir);
    let needle = format!("\"run_id\":\"{run_id}\"");
    let finder = memchr::memmem::Finder::new(needle.as_bytes());
    let mut found = Vec::new();
    for n in 0..=DEFAULT_KEEP {
        let path = match n {
            0 => current.clone(),
            n => PathBuf::from(format!("{}.{n}", current.display())),
        };
        let Ok(bytes) = std::fs::read(&path) else {
            break;
        };
        let before = found.len();
        for line in bytes.split(|b| *b == b'\n') {
            if finder.find(line).is_some() {
                if let Ok(e) = serde_json::from_slice::<Entry>(line) {
                    found.push(e);
                }
            }
        }
        if before > 0 && found.len() == before {
            break;
        }
    }
    found.sort_by_key(|e| e.ts);
    found
}

/// A person-readable rendering of one record.
pub fn render(e: &Entry) -> String {
    let mut s = format!(
        "{} {} {} #{} {:<7} {}",
        e.ts.format("%Y-%m-%d %H:%M:%S%.3f"),
        e.workflow,
        e.run_id,
        e.attempt,
        e.step,
        e.status
    );
    if let Some(f) = &e.figures {
        s.push_str(&format!(
            " [tokens={} tool_calls={} cost_usd={} runtime_ms={}]",
            f.tokens, f.tool_calls, f.cost_usd, f.runtime_ms
        ));
    }
    if let Some(ms) = e.duration_ms {
        s.push_str(&format!(" ({ms} ms)"));
    }
    if !e.detail.is_empty() {
        s.push_str(" — ");
        s.push_str(&e.detail);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(detail: &str) -> Entry {
        Entry {
            ts: Utc::now(),
            run_id: "r".into(),
            workflow: "w".into(),
            attempt: 1,
            step: "run".into(),
            status: "ok".into(),
            figures: None,
            duration_ms: None,
            detail: detail.into(),
            data: None,
        }
    }

    #[test]
    fn rotates_by_size_and_keeps_n_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = RunLog::with_limits(dir.path(), 1024, 2).unwrap();
        let r = Redactor::default();
        for _ in 0..40 {
            log.record(&entry(&"x".repeat(200)), &r).unwrap();
        }
        let main = std::fs::metadata(dir.path().join("runlog.jsonl"))
            .unwrap()
            .len();
        assert!(main <= 1024, "main file {main} bytes");
        assert!(dir.path().join("runlog.jsonl.1").exists());
        assert!(dir.path().join("runlog.jsonl.2").exists());
        assert!(!dir.path().join("runlog.jsonl.3").exists());
    }

    #[test]
    fn lines_are_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let log = RunLog::open(dir.path()).unwrap();
        let r = Redactor::new(vec![("TOKEN".into(), "hunter2-abc".into())]);
        log.record(&entry("leaked hunter2-abc here"), &r).unwrap();
        let text = std::fs::read_to_string(dir.path().join("runlog.jsonl")).unwrap();
        assert!(!text.contains("hunter2-abc"));
        assert!(text.contains("[REDACTED:TOKEN]"));
    }
}
