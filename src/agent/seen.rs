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

/// Only what filtering needs of a line, borrowed from the buffer (no allocation per field).
#[derive(Deserialize)]
struct Key<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    hash: std::borrow::Cow<'a, str>,
}

/// 128 bits of a sha256: ids and content hashes are kept this compact, so a million
/// surfaced items fit in tens of MiB (a collision among 2^64 items is not a concern).
type Digest16 = [u8; 16];

fn id_key(id: &str) -> Digest16 {
    // Two SipHash passes with different prefixes: fast, and only ever compared within one
    // process (the file keeps the ids themselves).
    use std::hash::{Hash, Hasher};
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (i as u8).hash(&mut h);
        id.hash(&mut h);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// A content hash: its first 16 bytes when it is hex (steward writes sha256), else a digest of it.
fn content_key(hash: &str) -> Digest16 {
    let mut out = [0u8; 16];
    match hash.get(..32).map(|h| hex::decode_to_slice(h, &mut out)) {
        Some(Ok(())) if hash.len() == 64 => out,
        _ => id_key(hash),
    }
}

pub struct Seen {
    path: PathBuf,
    hashes: HashMap<Digest16, Digest16>,
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
        // Sized from the file (about 150 bytes a line) so the table is not regrown.
        let expected = std::fs::metadata(&path).map(|m| m.len() / 150).unwrap_or(0) as usize;
        let mut hashes = HashMap::with_capacity(expected);
        let mut bad_lines = 0;
        match std::fs::File::open(&path) {
            Ok(f) => {
                let mut reader = std::io::BufReader::with_capacity(1 << 20, f);
                let mut line = String::new();
                loop {
                    line.clear();
                    if reader.read_line(&mut line)? == 0 {
                        break;
                    }
                    if line.trim().is_empty() {
                        continue;
                    }
                    match serde_json::from_str::<Key>(&line) {
                        Ok(k) => {
                            hashes.insert(id_key(&k.id), content_key(&k.hash));
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
        match self.hashes.get(&id_key(&item.id)) {
            None => Some(Novelty::New),
            Some(h) if *h != content_key(&item.hash) => Some(Novelty::Updated),
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
            self.hashes
                .insert(id_key(&item.id), content_key(&item.hash));
        }
        f.write_all(&buf)?;
        f.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, hash: &str) -> Item {
        Item {
            id: id.into(),
            source: "s".into(),
            title: "t".into(),
            link: None,
            summary: String::new(),
            published: None,
            hash: hash.into(),
            flags: vec![],
        }
    }

    #[test]
    fn new_updated_and_unchanged_items_and_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let h1 = "a".repeat(64);
        let mut seen = Seen::load(dir.path()).unwrap();
        let a = item("a", &h1);
        assert_eq!(seen.novelty(&a), Some(Novelty::New));
        seen.mark_surfaced(&[&a]).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("seen.jsonl"))
            .unwrap()
            .write_all(b"{not json\n")
            .unwrap();
        let seen = Seen::load(dir.path()).unwrap();
        assert_eq!(seen.bad_lines, 1);
        assert_eq!(seen.novelty(&a), None);
        assert_eq!(
            seen.novelty(&item("a", &"b".repeat(64))),
            Some(Novelty::Updated)
        );
        assert_eq!(seen.novelty(&item("a", "not-hex")), Some(Novelty::Updated));
    }
}
