//! The seen-tracker: `STATE/agents/<agent>/seen.jsonl`, one line per surfaced item
//! (`id`, content `hash`, `source`, `surfaced_at`); the last line for an id wins.
//!
//! An item is *new* if its id was never surfaced, *updated* if its hash changed.
//! Lines that do not parse are reported and skipped, never fatal.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::io::{Read, Write};
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

/// `id` and `hash` of a line as steward writes it (`{"id":"…","hash":"…",…}`, no escapes
/// in either), found without parsing the rest; None for any other shape, which then goes
/// through serde_json. A line that does not end in `}` is never taken this way, so a torn
/// last line is still reported as bad.
fn fast_key(line: &[u8]) -> Option<(&str, &str)> {
    let rest = line.strip_prefix(br#"{"id":""#)?;
    if line.trim_ascii_end().last() != Some(&b'}') {
        return None;
    }
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    let (id, rest) = rest.split_at(end);
    let rest = rest.strip_prefix(br#"","hash":""#)?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    if rest[end] != b'"' {
        return None;
    }
    Some((
        std::str::from_utf8(id).ok()?,
        std::str::from_utf8(&rest[..end]).ok()?,
    ))
}

/// 128 bits of keyed SipHash: ids and content hashes are kept this compact, so a million
/// surfaced items fit in tens of MiB (a collision among 2^64 items is not a concern).
type Digest16 = [u8; 16];

/// A table key that is already a random-keyed hash: the table uses its first 8 bytes as
/// is rather than hashing it again.
#[derive(Clone, Copy, PartialEq, Eq)]
struct IdKey(Digest16);

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_ne_bytes(first));
    }
}

#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only IdKey is ever hashed here (through write_u64); fold anything else.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
}

/// The hasher keys are random per process (ids come from feeds, which could be chosen to
/// collide under a known key); the file keeps the ids themselves.
struct Keys(RandomState);

impl Keys {
    fn id(&self, id: &str) -> IdKey {
        let mut out = [0u8; 16];
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            let mut h = self.0.build_hasher();
            (i as u8).hash(&mut h);
            id.hash(&mut h);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
        IdKey(out)
    }

    /// A content hash: its first 16 bytes when it is hex (steward writes sha256), else a
    /// digest of it.
    fn content(&self, hash: &str) -> Digest16 {
        let mut out = [0u8; 16];
        match hash.get(..32).map(|h| hex::decode_to_slice(h, &mut out)) {
            Some(Ok(())) if hash.len() == 64 => out,
            _ => self.id(hash).0,
        }
    }
}

pub struct Seen {
    path: PathBuf,
    keys: Keys,
    hashes: HashMap<IdKey, Digest16, BuildHasherDefault<Prehashed>>,
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
        let mut seen = Seen {
            path,
            keys: Keys(RandomState::new()),
            hashes: HashMap::with_capacity_and_hasher(expected, Default::default()),
            bad_lines: 0,
        };
        let file = match std::fs::File::open(&seen.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(seen),
            Err(e) => return Err(e),
        };
        // Lines are taken straight from 1 MiB blocks of the file (no copy per line).
        let mut file = file;
        let mut buf = vec![0u8; 1 << 20];
        let mut filled = 0;
        loop {
            let n = match file.read(&mut buf[filled..]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            filled += n;
            let mut start = 0;
            for end in memchr::memchr_iter(b'\n', &buf[..filled]) {
                seen.take_line(&buf[start..end]);
                start = end + 1;
            }
            if n == 0 {
                seen.take_line(&buf[start..filled]); // a last line without its newline
                break;
            }
            buf.copy_within(start..filled, 0);
            filled -= start;
            if filled == buf.len() {
                buf.resize(buf.len() * 2, 0); // one line longer than the block
            }
        }
        Ok(seen)
    }

    fn take_line(&mut self, line: &[u8]) {
        if line.trim_ascii().is_empty() {
            return;
        }
        let (id, hash) = match fast_key(line) {
            Some((id, hash)) => (self.keys.id(id), self.keys.content(hash)),
            None => match serde_json::from_slice::<Key>(line) {
                Ok(k) => (self.keys.id(&k.id), self.keys.content(&k.hash)),
                Err(_) => {
                    self.bad_lines += 1;
                    return;
                }
            },
        };
        self.hashes.insert(id, hash);
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    pub fn novelty(&self, item: &Item) -> Option<Novelty> {
        match self.hashes.get(&self.keys.id(&item.id)) {
            None => Some(Novelty::New),
            Some(h) if *h != self.keys.content(&item.hash) => Some(Novelty::Updated),
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
                .insert(self.keys.id(&item.id), self.keys.content(&item.hash));
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

    #[test]
    fn lines_read_the_quick_way_and_through_serde_agree_and_a_torn_line_is_bad() {
        let plain = br#"{"id":"a/b","hash":"ff","source":"s","surfaced_at":"t"}"#;
        assert_eq!(fast_key(plain), Some(("a/b", "ff")));
        // Escapes, other field orders and spacing are left to serde_json.
        for line in [
            &br#"{"id":"say \"hi\"","hash":"ff"}"#[..],
            br#"{"hash":"ff","id":"a"}"#,
            br#"{ "id": "a", "hash": "ff" }"#,
            br#"{"id":"a","hash":"ff""#,
        ] {
            assert_eq!(fast_key(line), None, "{}", String::from_utf8_lossy(line));
        }
        let dir = tempfile::tempdir().unwrap();
        let h = "c".repeat(64);
        let lines = [
            format!(r#"{{"id":"quick","hash":"{h}","source":"s","surfaced_at":"t"}}"#),
            format!(r#"{{"id":"say \"hi\"","hash":"{h}","source":"s","surfaced_at":"t"}}"#),
            format!(r#"{{ "hash": "{h}", "id": "spaced" }}"#),
            // Longer than the 1 MiB block the file is read in.
            format!(r#"{{"id":"{}","hash":"{h}"}}"#, "L".repeat(1_500_000)),
            // The last write, cut short by a crash.
            format!(r#"{{"id":"torn","hash":"{h}","sou"#),
        ];
        std::fs::write(dir.path().join("seen.jsonl"), lines.join("\n")).unwrap();
        let seen = Seen::load(dir.path()).unwrap();
        assert_eq!(seen.len(), 4);
        assert_eq!(seen.bad_lines, 1);
        let long = "L".repeat(1_500_000);
        for id in ["quick", "say \"hi\"", "spaced", &long] {
            assert_eq!(seen.novelty(&item(id, &h)), None, "{id}");
        }
        assert_eq!(seen.novelty(&item("torn", &h)), Some(Novelty::New));
    }
}
