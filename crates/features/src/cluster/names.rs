//! Names in the cluster's store: keys for any text, this machine's name.

/// This machine's name ("host" when it has none).
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// A NATS key for any text: letters, digits, `-` and `_` kept, the rest as `=XX` (the
/// key alphabet allows `=`), so distinct texts stay distinct keys and a key reads back.
pub fn key_part(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    if out.is_empty() {
        out.push('=');
    }
    out
}

/// The text a [`key_part`] was made from (None: not one).
pub fn from_key_part(part: &str) -> Option<String> {
    if part == "=" {
        return Some(String::new());
    }
    let mut bytes = Vec::with_capacity(part.len());
    let mut rest = part.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'=' {
            let hex = tail.get(..2)?;
            bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_parts_are_valid_and_distinct() {
        let texts = ["a", "a.b", "a=2Eb", "", "ünï", "x/y z", "-_"];
        let parts: Vec<String> = texts.iter().map(|t| key_part(t)).collect();
        for p in &parts {
            assert!(
                p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b)),
                "{p}"
            );
        }
        let distinct: std::collections::BTreeSet<_> = parts.iter().collect();
        assert_eq!(distinct.len(), texts.len(), "{parts:?}");
        for (text, part) in texts.iter().zip(&parts) {
            assert_eq!(from_key_part(part).as_deref(), Some(*text));
        }
        assert_eq!(from_key_part("a=Z1"), None);
    }
}
