//! What each fuzz target asserts about one input, shared by the cargo-fuzz targets in
//! `fuzz_targets/` and by `tests/fuzz_corpus.rs`, which replays the committed corpus on
//! stable Rust in every `cargo test`.

use std::path::Path;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use steward::budget::{BudgetGuard, Caps};
use steward::control::Message;
use steward::trigger::webhook::verify::{self, Format};
use steward::trigger::webhook::{check_signature, decode_body, sign};

/// A workflow file and the settings file from arbitrary bytes: errors, never a panic, and
/// every error names a line inside the file.
pub fn config(data: &[u8]) {
    let root = Path::new("/nonexistent-steward-fuzz");
    let file = root.join("workflows/fuzz.toml");
    if let Err(errors) = steward::config::parse_workflow(root, &file, data.to_vec()) {
        let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
        for e in errors {
            assert!(
                e.line >= 1 && e.line <= lines,
                "error line {} of {lines}",
                e.line
            );
        }
    }
    let _ = steward::config::parse_toml::<steward::config::Settings>(&file, data.to_vec());
}

/// fd-3 control lines charged against a budget: charges are finite and non-negative,
/// and the budget's figures stay finite (JSON cannot hold infinity).
pub fn control_line(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut guard = BudgetGuard::new(Caps {
        max_tokens: 1_000_000,
        max_tool_calls: 1_000,
        max_runtime: Duration::from_secs(60),
        max_cost_usd: 10.0,
        stall_timeout: None,
        kill_grace: Duration::from_secs(1),
    });
    for line in text.lines() {
        if let Ok(Message::Charge(resource, amount)) = steward::control::parse(line) {
            assert!(amount.is_finite() && amount >= 0.0);
            let _ = guard.charge(resource, amount);
        }
    }
    let f = guard.figures();
    assert!(f.cost_usd.is_finite() && f.cost_usd >= 0.0);
}

/// A drain marker: line 1 is the file name, the rest its text. An accepted marker's job
/// is always a safe name.
pub fn marker(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (name, body) = text.split_once('\n').unwrap_or((&text, ""));
    let Ok((date, job)) = steward::drain::parse_name(name) else {
        return;
    };
    let path = Path::new("/nonexistent-steward-fuzz").join(name);
    if let Ok(Some(marker)) = steward::drain::parse_text(&path, date, job, body) {
        assert!(steward::config::valid_id(&marker.job), "{:?}", marker.job);
    }
}

/// A queue item: a payload survives the trip into a run's context and back.
pub fn queue_item(data: &[u8]) {
    if let Ok(payload) = steward::trigger::queue::decode_item(data) {
        let text = serde_json::to_string(&payload).expect("a parsed value serializes");
        let again: serde_json::Value = serde_json::from_str(&text).expect("and parses back");
        assert_eq!(payload, again);
    }
}

/// A webhook request: byte 0 picks the mode, then line 1 is X-Steward-Timestamp, line 2
/// X-Steward-Signature, the rest the body. In re-sign mode (even byte 0) the request is
/// signed correctly, so it must pass, and must fail under another secret.
pub fn webhook_body(data: &[u8]) {
    const SECRET: &[u8] = b"fuzz-secret";
    const NOW: i64 = 1_800_000_000;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.splitn(3, |&b| b == b'\n');
    let ts = parts.next().unwrap_or_default();
    let sig = parts.next().unwrap_or_default();
    let body = parts.next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    let resign = mode % 2 == 0;
    if resign {
        headers.insert("x-steward-timestamp", HeaderValue::from(NOW));
        let good = sign(SECRET, NOW, body);
        headers.insert(
            "x-steward-signature",
            HeaderValue::from_str(&good).expect("hex is a valid header"),
        );
    } else {
        if let Ok(v) = HeaderValue::from_bytes(ts) {
            headers.insert("x-steward-timestamp", v);
        }
        if let Ok(v) = HeaderValue::from_bytes(sig) {
            headers.insert("x-steward-signature", v);
        }
    }
    let verdict = check_signature(SECRET, &headers, body, NOW);
    if resign {
        assert!(
            verdict.is_ok(),
            "a correct signature was refused: {verdict:?}"
        );
        assert!(check_signature(b"other-secret", &headers, body, NOW).is_err());
    }
    let _ = decode_body(body);
}

/// A webhook request in any format: byte 0 picks the format (and whether the request is
/// signed correctly), then newline-separated header lines `name: value` up to an empty
/// line, then the body. Never a panic; a request signed as its format documents verifies
/// (and not with another secret), and gives the same delivery id every time.
pub fn webhook_request(data: &[u8]) {
    const NOW: i64 = 1_800_000_000;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let format = [
        Format::Steward,
        Format::Github,
        Format::Stripe,
        Format::Standard,
    ][usize::from(mode % 4)];
    let secret: &[u8] = if format == Format::Standard {
        b"whsec_ZnV6ei1zZWNyZXQtZnV6ei1zZWNyZXQ="
    } else {
        b"fuzz-secret"
    };
    let (head, body) = match rest.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&rest[..at], &rest[at + 2..]),
        None => (rest, &[][..]),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) {
            headers.append(name, value);
        }
    }
    let resign = mode & 4 == 0;
    if resign {
        let id = String::from_utf8_lossy(head)
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(40)
            .collect::<String>();
        for (name, value) in verify::sign(format, secret, &format!("m{id}"), NOW, body) {
            headers.insert(
                name,
                HeaderValue::from_str(&value).expect("a signature is a valid header"),
            );
        }
    }
    let verdict = verify::verify(format, secret, &headers, body, NOW);
    if resign {
        let delivery =
            verdict.unwrap_or_else(|e| panic!("{format:?}: a correct signature was refused: {e}"));
        assert!(!delivery.id.is_empty());
        let again = verify::verify(format, secret, &headers, body, NOW).expect("verifies twice");
        assert_eq!(again.id, delivery.id, "the delivery id is stable");
        assert!(verify::verify(format, b"whsec_b3RoZXI=", &headers, body, NOW).is_err());
    }
}

/// A feed document from arbitrary bytes, read as steward reads a fetched feed: an error or
/// items, never a panic; the same bytes give the same ids, every id is non-empty, and no
/// title or summary carries a control character or a line break.
pub fn feed(data: &[u8]) {
    let source: steward::config::agent::Source = toml::from_str(
        "name = \"fuzz\"\nkind = \"rss\"\nurl = \"http://127.0.0.1/feed.xml\"\ntopic_tags = []\n",
    )
    .expect("the fuzz source parses");
    let Ok(items) = steward::agent::feed::parse(&source, data, None, 1_000) else {
        return;
    };
    let again = steward::agent::feed::parse(&source, data, None, 1_000).expect("parsed once");
    let ids: Vec<&String> = items.iter().map(|i| &i.id).collect();
    assert_eq!(ids, again.iter().map(|i| &i.id).collect::<Vec<_>>());
    for item in &items {
        assert!(!item.id.is_empty());
        for text in [&item.title, &item.summary] {
            assert!(!text.chars().any(char::is_control), "{text:?}");
        }
    }
}
