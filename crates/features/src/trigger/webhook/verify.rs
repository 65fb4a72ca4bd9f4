//! Who may send a webhook, checked as each sender documents its signature: steward's own
//! scheme, GitHub's, Stripe's and Standard Webhooks' (Svix and the services built on it).
//! Every comparison is constant-time. A verified delivery gets an id — the sender's own
//! where it has one, else a hash of what was signed — so that a redelivery of it can be
//! answered without running anything, and so that its run has a natural idempotency key.

use std::time::Duration;

use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

pub const SIGNATURE_HEADER: &str = "x-steward-signature";
pub const TIMESTAMP_HEADER: &str = "x-steward-timestamp";

/// How far a signed timestamp may be from now (every format that signs one).
pub const TOLERANCE_S: i64 = 300;

/// How long the id of a delivery without a signed timestamp (GitHub's) is remembered. A
/// replay of it verifies at any time; after a day its idempotency key still keeps it from
/// committing twice.
pub const UNTIMED_KEEP: Duration = Duration::from_secs(24 * 3600);

pub use crate::workflow::webhook::Format;

/// A delivery that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The sender's delivery id, or `sha256:<hex>` of the signed timestamp and body.
    pub id: String,
    /// How long a replay of this very request would still verify: how long its id is
    /// worth remembering.
    pub replayable_for: Duration,
}

type HmacSha256 = Hmac<Sha256>;

/// Why a request was refused: said in the 401 and the log, never anything about the
/// secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("missing {0}")]
    Missing(String),
    #[error("timestamp `{0}` is not unix seconds")]
    NotUnixSeconds(String),
    #[error("timestamp outside the allowed window of 5 minutes (a replay?)")]
    OutsideWindow,
    /// The header's name as the sender's documentation writes it.
    #[error("{0} must be sha256=<hex>")]
    NotSha256(&'static str),
    #[error("signature is not hex")]
    NotHex,
    #[error("Stripe-Signature has no t=")]
    NoStripeTimestamp,
    #[error("Stripe-Signature has no v1= signature")]
    NoStripeSignature,
    #[error("signature does not match")]
    Mismatch,
    #[error("the endpoint's secret is not a Standard Webhooks secret (whsec_<base64>)")]
    NotStandardSecret,
}

/// Checks a request as `format` documents it; the error says what is wrong (for the 401
/// and the log), never anything about the secret.
pub fn verify(
    format: Format,
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<Delivery, Rejected> {
    match format {
        Format::Steward => steward(secret, headers, body, now),
        Format::Github => github(secret, headers, body),
        Format::Stripe => stripe(secret, headers, body, now),
        Format::Standard => standard(secret, headers, body, now),
    }
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Result<&'h str, Rejected> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Rejected::Missing(name.to_string()))
}

fn mac(secret: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Whether any of `candidates` is the MAC (each compared in constant time).
fn any_matches(mac: &HmacSha256, candidates: impl IntoIterator<Item = Vec<u8>>) -> bool {
    candidates
        .into_iter()
        .any(|c| mac.clone().verify_slice(&c).is_ok())
}

fn timestamp(value: &str, now: i64) -> Result<i64, Rejected> {
    let ts: i64 = value
        .parse()
        .map_err(|_| Rejected::NotUnixSeconds(value.to_string()))?;
    if now.abs_diff(ts) > TOLERANCE_S as u64 {
        return Err(Rejected::OutsideWindow);
    }
    Ok(ts)
}

/// `sha256:<hex>` of what was signed: the id of a delivery whose sender gives none.
fn hashed(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

fn timed() -> Duration {
    Duration::from_secs(2 * TOLERANCE_S as u64)
}

fn steward(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<Delivery, Rejected> {
    let ts = header(headers, TIMESTAMP_HEADER)?;
    timestamp(ts, now)?;
    let sig = header(headers, SIGNATURE_HEADER)?;
    let hex_sig = sig
        .strip_prefix("sha256=")
        .ok_or(Rejected::NotSha256("signature"))?;
    let given = hex::decode(hex_sig).map_err(|_| Rejected::NotHex)?;
    if !any_matches(&mac(secret, &[ts.as_bytes(), b".", body]), [given]) {
        return Err(Rejected::Mismatch);
    }
    Ok(Delivery {
        id: hashed(&[ts.as_bytes(), b".", body]),
        replayable_for: timed(),
    })
}

fn github(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<Delivery, Rejected> {
    let sig = header(headers, "x-hub-signature-256")?;
    let hex_sig = sig
        .strip_prefix("sha256=")
        .ok_or(Rejected::NotSha256("X-Hub-Signature-256"))?;
    let given = hex::decode(hex_sig).map_err(|_| Rejected::NotHex)?;
    if !any_matches(&mac(secret, &[body]), [given]) {
        return Err(Rejected::Mismatch);
    }
    let id = match header(headers, "x-github-delivery") {
        Ok(id) => format!("github:{id}"),
        Err(_) => hashed(&[body]),
    };
    Ok(Delivery {
        id,
        replayable_for: UNTIMED_KEEP,
    })
}

fn stripe(secret: &[u8], headers: &HeaderMap, body: &[u8], now: i64) -> Result<Delivery, Rejected> {
    let sig = header(headers, "stripe-signature")?;
    let mut ts = None;
    let mut v1 = Vec::new();
    for item in sig.split(',') {
        match item.trim().split_once('=') {
            Some(("t", t)) => ts = Some(t),
            Some(("v1", s)) => v1.extend(hex::decode(s).ok()),
            _ => {}
        }
    }
    let ts = ts.ok_or(Rejected::NoStripeTimestamp)?;
    timestamp(ts, now)?;
    if v1.is_empty() {
        return Err(Rejected::NoStripeSignature);
    }
    if !any_matches(&mac(secret, &[ts.as_bytes(), b".", body]), v1) {
        return Err(Rejected::Mismatch);
    }
    let event_id = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("id")?.as_str().map(str::to_string));
    let id = match event_id {
        Some(id) => format!("stripe:{id}"),
        None => hashed(&[ts.as_bytes(), b".", body]),
    };
    Ok(Delivery {
        id,
        replayable_for: timed(),
    })
}

fn standard(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<Delivery, Rejected> {
    let key = standard_key(secret)?;
    let id = header(headers, "webhook-id")?;
    let ts = header(headers, "webhook-timestamp")?;
    timestamp(ts, now)?;
    let sig = header(headers, "webhook-signature")?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let given = sig
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|s| b64.decode(s).ok());
    if !any_matches(
        &mac(&key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]),
        given,
    ) {
        return Err(Rejected::Mismatch);
    }
    Ok(Delivery {
        id: format!("standard:{id}"),
        replayable_for: timed(),
    })
}

/// A Standard Webhooks secret is `whsec_` and the base64 of the key.
fn standard_key(secret: &[u8]) -> Result<Vec<u8>, Rejected> {
    let text = std::str::from_utf8(secret).unwrap_or("");
    let b64 = text.strip_prefix("whsec_").unwrap_or(text);
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| Rejected::NotStandardSecret)
}

/// Signs a request as `format`'s sender would (tests, fuzzing, and anyone scripting a
/// sender): the headers to add.
pub fn sign(
    format: Format,
    secret: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    let ts = timestamp.to_string();
    let hex_mac = |parts: &[&[u8]]| hex::encode(mac(secret, parts).finalize().into_bytes());
    match format {
        Format::Steward => vec![
            (TIMESTAMP_HEADER, ts.clone()),
            (
                SIGNATURE_HEADER,
                format!("sha256={}", hex_mac(&[ts.as_bytes(), b".", body])),
            ),
        ],
        Format::Github => vec![
            ("x-github-delivery", id.to_string()),
            (
                "x-hub-signature-256",
                format!("sha256={}", hex_mac(&[body])),
            ),
        ],
        Format::Stripe => vec![(
            "stripe-signature",
            format!("t={ts},v1={}", hex_mac(&[ts.as_bytes(), b".", body])),
        )],
        Format::Standard => {
            let key = standard_key(secret).unwrap_or_default();
            let sig = mac(&key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
            let b64 = base64::engine::general_purpose::STANDARD.encode(sig.finalize().into_bytes());
            vec![
                ("webhook-id", id.to_string()),
                ("webhook-timestamp", ts),
                ("webhook-signature", format!("v1,{b64}")),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn secret(format: Format) -> &'static [u8] {
        match format {
            Format::Standard => b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            _ => b"s3cret-value",
        }
    }

    const ALL: [Format; 4] = [
        Format::Steward,
        Format::Github,
        Format::Stripe,
        Format::Standard,
    ];

    #[test]
    fn each_format_verifies_its_own_signature_and_refuses_a_tampered_body() {
        for format in ALL {
            let body = br#"{"id":"evt_1","type":"paid"}"#;
            let h = headers(&sign(format, secret(format), "msg_1", NOW, body));
            let d = verify(format, secret(format), &h, body, NOW)
                .unwrap_or_else(|e| panic!("{format:?}: {e}"));
            assert!(!d.id.is_empty());
            assert!(
                verify(format, secret(format), &h, b"{}", NOW).is_err(),
                "{format:?}"
            );
            assert!(
                verify(format, b"whsec_b3RoZXI=", &h, body, NOW).is_err(),
                "{format:?}"
            );
            assert!(verify(format, secret(format), &HeaderMap::new(), body, NOW).is_err());
        }
    }

    #[test]
    fn the_delivery_id_is_the_senders_where_it_has_one() {
        let body = br#"{"id":"evt_1"}"#;
        let id = |format: Format| {
            let h = headers(&sign(format, secret(format), "abc", NOW, body));
            verify(format, secret(format), &h, body, NOW).unwrap().id
        };
        assert_eq!(id(Format::Github), "github:abc");
        assert_eq!(id(Format::Stripe), "stripe:evt_1");
        assert_eq!(id(Format::Standard), "standard:abc");
        assert!(id(Format::Steward).starts_with("sha256:"));
    }

    #[test]
    fn timestamps_outside_the_window_are_refused() {
        for format in [Format::Steward, Format::Stripe, Format::Standard] {
            let body = b"x";
            let h = headers(&sign(
                format,
                secret(format),
                "m",
                NOW - TOLERANCE_S - 1,
                body,
            ));
            let e = verify(format, secret(format), &h, body, NOW).unwrap_err();
            assert_eq!(e, Rejected::OutsideWindow, "{format:?}: {e}");
            assert!(e.to_string().contains("window"), "{format:?}: {e}");
        }
    }

    #[test]
    fn a_stripe_header_may_carry_several_v1_signatures() {
        let body = b"{}";
        let good = &sign(Format::Stripe, secret(Format::Stripe), "", NOW, body)[0].1;
        let v1 = good.split(",v1=").nth(1).unwrap();
        let h = headers(&[(
            "stripe-signature",
            format!("t={NOW},v1={},v1={v1},v0=00", "ab".repeat(32)),
        )]);
        assert!(verify(Format::Stripe, secret(Format::Stripe), &h, body, NOW).is_ok());
    }
}
