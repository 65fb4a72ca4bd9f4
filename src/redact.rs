//! Secret redaction: values of env entries marked secret never reach the runlog, the
//! store or a log line. Every text that leaves a step passes through a [`Redactor`].

use std::borrow::Cow;

#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// (env name, value), longest value first so a secret containing another is masked whole.
    secrets: Vec<(String, String)>,
}

impl Redactor {
    pub fn new(mut secrets: Vec<(String, String)>) -> Self {
        secrets.retain(|(_, v)| !v.is_empty());
        secrets.sort_by_key(|s| std::cmp::Reverse(s.1.len()));
        Redactor { secrets }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// Masks every secret value, raw or as it appears inside a JSON string.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (name, value) in &self.secrets {
            let mask = format!("[REDACTED:{name}]");
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), &mask));
            }
            let escaped = serde_json::to_string(value).unwrap_or_default();
            let escaped = escaped.trim_matches('"');
            if escaped != value && out.contains(escaped) {
                out = Cow::Owned(out.replace(escaped, &mask));
            }
        }
        out
    }

    /// Redacts every string inside a JSON value.
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
            serde_json::Value::Object(map) => map.values_mut().for_each(|v| self.redact_json(v)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_raw_and_json_escaped_values() {
        let r = Redactor::new(vec![("K".into(), "s3cr\"et".into())]);
        assert_eq!(r.redact("a s3cr\"et b"), "a [REDACTED:K] b");
        assert_eq!(r.redact(r#"{"x":"s3cr\"et"}"#), r#"{"x":"[REDACTED:K]"}"#);
    }
}
