//! Reading config files: TOML with errors that name the file, line and column, and the
//! rule for ids that are safe in a path.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in one config file, located as precisely as the parser allows.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

impl std::error::Error for ConfigError {}

/// The `*.toml` files of a folder, sorted; none if the folder does not exist.
pub fn toml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    files.sort();
    Ok(files)
}

/// Reads and parses one TOML file; returns the value, its text and its bytes.
pub fn read_toml<T: serde::de::DeserializeOwned>(
    file: &Path,
) -> Result<(T, (String, Vec<u8>)), ConfigError> {
    parse_toml(file, read_bytes(file)?)
}

pub(super) fn read_bytes(file: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(file).map_err(|e| ConfigError::whole_file(file, format!("cannot read: {e}")))
}

/// Parses TOML bytes; `file` only names them in errors.
pub fn parse_toml<T: serde::de::DeserializeOwned>(
    file: &Path,
    bytes: Vec<u8>,
) -> Result<(T, (String, Vec<u8>)), ConfigError> {
    let text = String::from_utf8(bytes.clone())
        .map_err(|_| ConfigError::whole_file(file, "not valid UTF-8"))?;
    let value = toml::from_str(&text).map_err(|e| {
        let (line, column) = e.span().map(|s| line_col(&text, s.start)).unwrap_or((1, 1));
        let mut message = e.message().trim().to_string();
        if let Some(hint) = quote_hint(text.lines().nth(line.saturating_sub(1)).unwrap_or("")) {
            message.push_str(hint);
        }
        ConfigError {
            file: file.to_path_buf(),
            line,
            column,
            message,
        }
    })?;
    Ok((value, (text, bytes)))
}

/// A hint when the line a TOML error points at opens a string it never closes (the
/// parser's own message is about what it read past the end of the string).
fn quote_hint(line: &str) -> Option<&'static str> {
    let code = line.split(" #").next().unwrap_or(line);
    let doubles = code.matches('"').count() - code.matches("\\\"").count();
    let singles = code.matches('\'').count();
    if doubles % 2 == 1 {
        Some(" (hint: a \"string\" on this line has no closing quote)")
    } else if singles % 2 == 1 && doubles == 0 {
        Some(" (hint: a 'string' on this line has no closing quote)")
    } else {
        None
    }
}

/// `a, b, c` for an error that lists what exists, or `none`.
pub fn list_or_none<S: AsRef<str>>(names: &[S]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Whether `name` is safe to use as a workflow id and in a path.
pub fn valid_id(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric()
}

impl ConfigError {
    /// An error about the value of `key` (`name`, or `table.name` for a key of a
    /// `[table]`), located at the line that sets it; at the file's start if none does.
    pub fn at_key(
        file: impl Into<PathBuf>,
        text: &str,
        key: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        let (table, name) = match key.rsplit_once('.') {
            Some((t, n)) => (Some(t), n),
            None => (None, key),
        };
        let mut current: Option<&str> = None;
        let mut found = None;
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.starts_with('[') {
                current = Some(t.trim_matches(|c| c == '[' || c == ']').trim());
                continue;
            }
            let sets = t
                .strip_prefix(name)
                .is_some_and(|rest| rest.trim_start().starts_with('='));
            if sets && current == table {
                found = Some((n + 1, line.len() - line.trim_start().len() + 1));
                break;
            }
        }
        ConfigError::found_at(file, found, message)
    }

    /// An error located at the first line containing `needle` (a value that appears in
    /// more than one table, like a roster member's name); at the file's start if none does.
    pub fn at_text(
        file: impl Into<PathBuf>,
        text: &str,
        needle: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        let found = text.lines().enumerate().find_map(|(n, line)| {
            line.find(needle)
                .map(|c| (n + 1, line[..c].chars().count() + 1))
        });
        ConfigError::found_at(file, found, message)
    }

    /// An error at `(line, column)` if the place was found, else at the file's start.
    fn found_at(
        file: impl Into<PathBuf>,
        found: Option<(usize, usize)>,
        message: impl Into<String>,
    ) -> ConfigError {
        let (line, column) = found.unwrap_or((1, 1));
        ConfigError {
            file: file.into(),
            line,
            column,
            message: message.into(),
        }
    }

    /// An error about a file (or folder) as a whole, located at its start.
    pub fn whole_file(file: impl Into<PathBuf>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: file.into(),
            line: 1,
            column: 1,
            message: message.into(),
        }
    }
}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("a\nbc\n", 0), (1, 1));
        assert_eq!(line_col("a\nbc\n", 3), (2, 2));
        assert_eq!(line_col("a\nbc\n", 99), (3, 1));
    }

    #[test]
    fn ids_are_path_safe() {
        assert!(valid_id("invoice-intake_2"));
        for bad in ["", "../x", "a/b", "A", "-x", "a\0b", "/abs"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_missing_closing_quote_gets_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("w.toml");
        for text in [
            "id = \"x\ncron = 1\n",
            "[trigger]\nschedule = { cron = \"0 9 * * * }\n",
            "x = 'abc\n",
        ] {
            let err = parse_toml::<toml::Table>(&file, text.as_bytes().to_vec()).unwrap_err();
            assert!(err.message.contains("no closing quote"), "{text:?}: {err}");
        }
        let err = parse_toml::<toml::Table>(&file, b"x = abc\n".to_vec()).unwrap_err();
        assert!(!err.message.contains("hint"), "{err}");
    }

    #[test]
    fn at_key_finds_the_line_that_sets_a_key() {
        let text = "id = \"a\"\nschedule = \"x\"\n[t]\nschedule = 1\n  name = 2\n";
        let at = |key| {
            let e = ConfigError::at_key("f", text, key, "m");
            (e.line, e.column)
        };
        assert_eq!(at("schedule"), (2, 1));
        assert_eq!(at("t.schedule"), (4, 1));
        assert_eq!(at("t.name"), (5, 3));
        assert_eq!(at("missing"), (1, 1));
    }
}
