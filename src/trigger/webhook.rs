//! Webhooks: signed HTTP POSTs, on loopback by default.
//!
//! A request must carry `X-Steward-Timestamp` (unix seconds) and
//! `X-Steward-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">` made with the
//! workflow's secret (from the env var its config names). The signature is checked in
//! constant time; a missing, bad or stale one (outside ±5 minutes: replay protection) is
//! 401 and runs nothing. A body over the workflow's cap is 413. An accepted request is 202
//! with the run id; the run goes on in the daemon.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

use crate::governed::Fire;

pub const DEFAULT_MAX_BODY: u64 = 1 << 20;
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// How far a signed timestamp may be from now.
pub const TOLERANCE_S: i64 = 300;
pub const SIGNATURE_HEADER: &str = "x-steward-signature";
pub const TIMESTAMP_HEADER: &str = "x-steward-timestamp";

/// One workflow's endpoint.
#[derive(Clone)]
pub struct Route {
    pub workflow: String,
    /// None when the secret's env var is unset: the endpoint answers 503.
    pub secret: Option<Vec<u8>>,
    pub max_body: u64,
}

pub type Routes = Arc<RwLock<HashMap<String, Route>>>;
pub type Submit = Arc<dyn Fn(String, Fire) + Send + Sync>;

#[derive(Clone)]
struct AppState {
    routes: Routes,
    submit: Submit,
}

/// Serves webhooks on `listener` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    routes: Routes,
    submit: Submit,
    cancel: CancellationToken,
) {
    let app = Router::new()
        .fallback(handle)
        .with_state(AppState { routes, submit });
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
    if let Err(e) = result {
        tracing::error!("webhook server stopped: {e}");
    }
}

async fn handle(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let route = app
        .routes
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(uri.path())
        .cloned();
    let Some(route) = route else {
        return (StatusCode::NOT_FOUND, "no webhook at this path\n").into_response();
    };
    if method != Method::POST {
        return (StatusCode::METHOD_NOT_ALLOWED, "POST only\n").into_response();
    }
    let Some(secret) = &route.secret else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "webhook secret is not configured on the server\n",
        )
            .into_response();
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > route.max_body) {
        return (StatusCode::PAYLOAD_TOO_LARGE, "body too large\n").into_response();
    }
    let Ok(bytes) = to_bytes(body, route.max_body as usize).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "body too large\n").into_response();
    };
    if let Err(why) = check_signature(secret, &headers, &bytes, chrono::Utc::now().timestamp()) {
        tracing::warn!(workflow = %route.workflow, "webhook refused: {why}");
        return (StatusCode::UNAUTHORIZED, format!("{why}\n")).into_response();
    }
    let body = decode_body(&bytes);
    let fire = Fire::new(
        "webhook",
        None,
        json!({ "path": uri.path(), "headers": safe_headers(&headers), "body": body }),
    );
    let run_id = fire.run_id.clone();
    (app.submit)(route.workflow.clone(), fire);
    let body = json!({ "run_id": run_id }).to_string();
    (
        StatusCode::ACCEPTED,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// Verifies the timestamp window and the HMAC (constant-time compare).
pub fn check_signature(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<(), &'static str> {
    let ts = headers
        .get(TIMESTAMP_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or("missing X-Steward-Timestamp")?;
    let ts_num: i64 = ts.trim().parse().map_err(|_| "bad X-Steward-Timestamp")?;
    if (now - ts_num).abs() > TOLERANCE_S {
        return Err("timestamp outside the allowed window (replay?)");
    }
    let sig = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or("missing X-Steward-Signature")?;
    let hex_sig = sig
        .trim()
        .strip_prefix("sha256=")
        .ok_or("signature must be sha256=<hex>")?;
    let given = hex::decode(hex_sig).map_err(|_| "signature is not hex")?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| "bad secret")?;
    mac.update(ts.trim().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&given)
        .map_err(|_| "signature does not match")
}

/// A verified body as the run sees it: its JSON, or else its text (lossy UTF-8).
/// Never panics, whatever the bytes (a fuzz target holds it to that).
pub fn decode_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// `sha256=<hex>` for a body: what a sender computes.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Headers passed to the run: everything but credentials and the signature.
fn safe_headers(headers: &HeaderMap) -> Value {
    let mut map = serde_json::Map::new();
    for (k, v) in headers {
        let name = k.as_str();
        if matches!(
            name,
            "authorization" | "cookie" | "proxy-authorization" | SIGNATURE_HEADER
        ) {
            continue;
        }
        if let Ok(v) = v.to_str() {
            map.insert(name.to_string(), Value::String(v.to_string()));
        }
    }
    Value::Object(map)
}

/// The address to bind: `webhook_listen` from steward.toml, loopback by default.
pub fn listen_addr(configured: Option<&str>) -> Result<SocketAddr, String> {
    configured.unwrap_or(DEFAULT_LISTEN).parse().map_err(|e| {
        format!(
            "webhook_listen `{}` is not an address like 127.0.0.1:8787: {e}",
            configured.unwrap_or("")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ts: i64, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(TIMESTAMP_HEADER, ts.to_string().parse().unwrap());
        h.insert(SIGNATURE_HEADER, sig.parse().unwrap());
        h
    }

    #[test]
    fn good_signature_passes_and_tampering_fails() {
        let now = 1_800_000_000;
        let sig = sign(b"s3cret", now, b"{\"a\":1}");
        assert!(check_signature(b"s3cret", &headers(now, &sig), b"{\"a\":1}", now).is_ok());
        assert!(check_signature(b"s3cret", &headers(now, &sig), b"{\"a\":2}", now).is_err());
        assert!(check_signature(b"other", &headers(now, &sig), b"{\"a\":1}", now).is_err());
        assert!(check_signature(b"s3cret", &HeaderMap::new(), b"{\"a\":1}", now).is_err());
    }

    #[test]
    fn stale_timestamps_are_refused() {
        let then = 1_800_000_000;
        let sig = sign(b"k", then, b"x");
        assert_eq!(
            check_signature(b"k", &headers(then, &sig), b"x", then + TOLERANCE_S + 1),
            Err("timestamp outside the allowed window (replay?)")
        );
    }
}
