//! Secret redaction: values of env entries marked secret never reach the runlog, the
//! store or a log line. Every text that leaves a step passes through a [`Redactor`].
//!
//! A secret is masked in the forms it travels in, as GitHub Actions' runner does: as is,
//! JSON-escaped, URL-encoded, in hex, and in base64 (standard and URL-safe) at each of
//! the three byte offsets it can start at inside a longer encoded text. A multi-line
//! secret is masked line by line too. JSON that steward writes is redacted inside its
//! string values only ([`Redactor::redact_json_text`]), so a line stays valid JSON. A
//! secret shorter than [`MIN_SECRET_LEN`] is refused before it is used
//! ([`too_short`]): masking it would mangle every word that contains it.

use std::borrow::Cow;

/// The shortest secret steward will mask (and so the shortest it will run with).
pub const MIN_SECRET_LEN: usize = 6;

/// Why `value`, the secret `name`, cannot be used, or None when it is long enough.
pub fn too_short(name: &str, value: &str) -> Option<String> {
    let len = value.chars().count();
    (len < MIN_SECRET_LEN).then(|| {
        format!(
            "the secret {name} is {len} character(s) long: a secret shorter than {MIN_SECRET_LEN} cannot be masked without masking ordinary text around it (a secret `a` would turn `false` into `f[REDACTED]lse`); use a longer one"
        )
    })
}

#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// (a form of a secret, its mask), longest form first, so a secret containing
    /// another (or a form containing a shorter one) is masked whole.
    forms: Vec<(String, String)>,
}

impl Redactor {
    /// A redactor for `secrets` as (env name, value); empty values are ignored.
    pub fn new(secrets: Vec<(String, String)>) -> Self {
        let mut forms: Vec<(String, String)> = Vec::new();
        for (name, value) in &secrets {
            let mask = format!("[REDACTED:{name}]");
            let lines = value
                .lines()
                .map(|l| l.trim_end_matches('\r'))
                .filter(|l| l.chars().count() >= MIN_SECRET_LEN && *l != value);
            for part in std::iter::once(value.as_str()).chain(lines) {
                for form in encodings(part) {
                    if !forms.iter().any(|(f, _)| *f == form) {
                        forms.push((form, mask.clone()));
                    }
                }
            }
        }
        forms.retain(|(f, _)| !f.is_empty());
        forms.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
        Redactor { forms }
    }

    pub fn is_empty(&self) -> bool {
        self.forms.is_empty()
    }

    /// Masks every form of every secret in a plain text.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (form, mask) in &self.forms {
            if out.contains(form.as_str()) {
                out = Cow::Owned(out.replace(form.as_str(), mask));
            }
        }
        out
    }

    /// Masks secrets in a JSON text inside its strings (keys and values) only, never
    /// across its syntax: the result is as valid JSON as the input was.
    pub fn redact_json_text<'a>(&self, json: &'a str) -> Cow<'a, str> {
        if self.is_empty() {
            return Cow::Borrowed(json);
        }
        let bytes = json.as_bytes();
        let mut out = String::new();
        let mut copied = 0;
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] != b'"' {
                i += 1;
                continue;
            }
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            let end = (i + 1).min(bytes.len());
            i = end;
            let token = &json[start..end];
            let Ok(text) = serde_json::from_str::<String>(token) else {
                continue;
            };
            if let Cow::Owned(masked) = self.redact(&text) {
                out.push_str(&json[copied..start]);
                out.push_str(&serde_json::to_string(&masked).unwrap_or_default());
                copied = end;
            }
        }
        if copied == 0 {
            return Cow::Borrowed(json);
        }
        out.push_str(&json[copied..]);
        Cow::Owned(out)
    }

    /// Redacts every string inside a JSON value (object keys included).
    pub fn redact_json(&self, value: &mut serde_json::Value) {
        if self.is_empty() {
            return;
        }
        match value {
            serde_json::Value::String(s) => {
                if let Cow::Owned(r) = self.redact(s) {
                    *s = r;
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json(v)),
            serde_json::Value::Object(map) => {
                let entries = std::mem::take(map);
                for (k, mut v) in entries {
                    self.redact_json(&mut v);
                    map.insert(self.redact(&k).into_owned(), v);
                }
            }
            _ => {}
        }
    }
}

/// The forms a secret travels in: as is, JSON-escaped, URL-encoded (both hex cases, and
/// `+` for a space), hex (both cases), and base64 (standard and URL-safe) at offsets 0,
/// 1 and 2 — only the characters that depend on the secret alone.
fn encodings(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_string()];
    let json = serde_json::to_string(value).unwrap_or_default();
    forms.push(json.trim_matches('"').to_string());
    let percent = percent_encode(value);
    forms.push(percent.to_ascii_lowercase_hex());
    forms.push(form_urlencoded::byte_serialize(value.as_bytes()).collect());
    forms.push(percent);
    forms.push(hex::encode(value));
    forms.push(hex::encode_upper(value));
    for engine in [
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for offset in 0..3 {
            forms.push(base64_at(&engine, value.as_bytes(), offset));
        }
    }
    forms.sort();
    forms.dedup();
    forms
}

/// The base64 characters that depend only on `secret` when it starts `offset` bytes into
/// a group of three, wherever it sits in a longer encoded text.
fn base64_at(engine: &impl base64::Engine, secret: &[u8], offset: usize) -> String {
    let mut padded = vec![0u8; offset];
    padded.extend_from_slice(secret);
    let encoded = engine.encode(&padded);
    // Character k holds bits [6k, 6k + 6) of the input.
    let first = (8 * offset).div_ceil(6);
    let end = (8 * padded.len()) / 6;
    encoded.get(first..end).unwrap_or_default().to_string()
}

/// Every byte but RFC 3986's unreserved ones as `%XX` (upper-case hex).
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

trait LowerHex {
    fn to_ascii_lowercase_hex(&self) -> String;
}

impl LowerHex for String {
    /// `%2F` as `%2f`, the rest unchanged.
    fn to_ascii_lowercase_hex(&self) -> String {
        let mut out = String::with_capacity(self.len());
        let mut chars = self.chars();
        while let Some(c) = chars.next() {
            out.push(c);
            if c == '%' {
                out.extend(chars.by_ref().take(2).map(|h| h.to_ascii_lowercase()));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn redactor(value: &str) -> Redactor {
        Redactor::new(vec![("K".into(), value.into())])
    }

    #[test]
    fn masks_raw_and_json_escaped_values() {
        let r = redactor("s3cr\"et");
        assert_eq!(r.redact("a s3cr\"et b"), "a [REDACTED:K] b");
        assert_eq!(r.redact(r#"{"x":"s3cr\"et"}"#), r#"{"x":"[REDACTED:K]"}"#);
    }

    #[test]
    fn json_stays_json_whatever_the_secret() {
        let r = redactor("false,");
        let line = r#"{"committed":false,"detail":"it was false, then","n":1}"#;
        let out = r.redact_json_text(line);
        let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        assert_eq!(v["committed"], false);
        assert_eq!(v["detail"], "it was [REDACTED:K] then");
    }

    #[test]
    fn the_encoded_forms_are_masked() {
        let secret = "hunter2/Zz+ ok";
        let r = redactor(secret);
        let encoded = [
            hex::encode(secret),
            hex::encode_upper(secret),
            percent_encode(secret),
            form_urlencoded::byte_serialize(secret.as_bytes()).collect(),
        ];
        for e in encoded {
            let text = format!("x={e}&y=1");
            let out = r.redact(&text);
            assert!(!out.contains(&e), "{e} → {out}");
            assert!(out.contains("[REDACTED:K]"), "{e} → {out}");
        }
    }

    #[test]
    fn base64_is_masked_at_every_offset_in_a_longer_text() {
        let secret = "correct horse battery";
        let r = redactor(secret);
        for prefix in ["", "a", "ab", "abc", "user:"] {
            for engine in [
                base64::engine::general_purpose::STANDARD,
                base64::engine::general_purpose::URL_SAFE,
            ] {
                let text = engine.encode(format!("{prefix}{secret}!"));
                let out = r.redact(&text);
                assert!(out.contains("[REDACTED:K]"), "{prefix:?}: {text} → {out}");
            }
        }
    }

    #[test]
    fn a_multi_line_secret_is_masked_line_by_line() {
        let r = redactor("-----BEGIN KEY-----\nMIIEvQIBADANBg\n-----END KEY-----\n");
        let out = r.redact("line two alone: MIIEvQIBADANBg");
        assert_eq!(out, "line two alone: [REDACTED:K]");
    }

    #[test]
    fn a_short_secret_is_refused_with_the_reason() {
        assert!(too_short("K", "a").unwrap().contains("shorter than 6"));
        assert!(too_short("K", "abcdef").is_none());
    }
}
