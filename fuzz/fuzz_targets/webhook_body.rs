//! Webhook requests from arbitrary bytes: line 1 is X-Steward-Timestamp, line 2
//! X-Steward-Signature, the rest the body. Half the inputs are re-signed correctly so the
//! body decoding is reached too. A refusal or a value, never a panic; a signature made
//! with another secret is never accepted.
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use steward::trigger::webhook::{check_signature, decode_body, sign};

const SECRET: &[u8] = b"fuzz-secret";
const NOW: i64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
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
        headers.insert("x-steward-signature", HeaderValue::from_str(&good).unwrap());
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
        assert!(verdict.is_ok(), "a correct signature was refused: {verdict:?}");
        // The same body under another secret is refused.
        assert!(check_signature(b"other-secret", &headers, body, NOW).is_err());
    }
    let _ = decode_body(body);
});
