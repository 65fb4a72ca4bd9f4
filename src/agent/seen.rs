//! The seen-tracker: `STATE/agents/<agent>/seen.jsonl`, one line per surfaced item
//! (`id`, content `hash`, `source`, `surfaced_at`); the last line for an id wins.
//!
//! An item is *new* if its id was never surfaced, *updated* if its hash changed.
//! Lines that do not parse are reported and skipped, never fatal.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::feed::Item;

#[derive(Debug, Serialize, Deserialize)]
struct Line {
    id: String,
    hash: String,
    source: String,
    surfaced_at: String,
}

pub struct Seen {
    path: PathBuf,
    hashes: HashMap<String, String>,
    pub bad_lines: usize,
}

/// Whether a candidate is worth surfacing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Novelty {
    New,
    Updated,
}

impl Seen {
    pub fn load(agent_dir: &Path) -> std::io::Result<Seen> {
        let path = agent_dir.join("seen.jsonl");
        let mut hashes = HashMap::new();
        let mut bad_lines = 0;
        match std::fs::File::open(&path) {
            Ok(f) => {
                for line in std::io::BufReader::new(f).lines() {
                    let line = line?;
                    if line.trim().is_empty() {
                        continue;
                    }
                    match serde_json::from_str::<Line>(&line) {
                        Ok(l) => {
                            hashes.insert(l.id, l.hash);
                        }
                        Err(_) => bad_lines += 1,
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(Seen {
            path,
            hashes,
            bad_lines,
        })
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    pub fn novelty(&self, item: &Item) -> Option<Novelty> {
        match self.hashes.get(&item.id) {
            None => Some(Novelty::New),
            Some(h) if *h != item.hash => Some(Novelty::Updated),
            Some(_) => None,
        }
    }

    /// Appends the items as surfaced (flushed to disk before returning).
    pub fn mark_surfaced(&mut self, items: &[&Item]) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut buf = Vec::new();
        for item in items {
            let line = Line {
                id: item.id.clone(),
                hash: item.hash.clone(),
                source: item.source.clone(),
                surfaced_at: now.clone(),
            };
            serde_json::to_writer(&mut buf, &line).map_err(std::io::Error::other)?;
            buf.push(b'\n');
            self.hashes.insert(item.id.clone(), item.hash.clone());
        }
        f.write_all(&buf)?;
        f.sync_data()
    }
}
