//! Webhooks: signed HTTP POSTs, on loopback by default, each delivery run exactly once.
//!
//! A request must be signed as the trigger's `format` says ([`verify`]: steward's own
//! `X-Steward-Signature`, GitHub, Stripe, Standard Webhooks), with the workflow's secret
//! (from the env var its config names), checked in constant time; a missing, bad or stale
//! one is 401 and runs nothing. A body over the workflow's cap is 413. A verified delivery
//! is remembered in the store under its id (the sender's delivery id, or a hash of the
//! signed timestamp and body) for as long as a replay of it could verify: the first copy
//! is 202 with the run id, and every later copy — a provider's redelivery, an attacker's
//! replay — is 200 with the first run's id and runs nothing. The delivery id is also the
//! run's default idempotency key, so even a copy that outlived the memory never commits
//! twice.

pub mod verify;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::governed::Fire;
use crate::store::{SeenDelivery, Store};
pub use verify::{Format, SIGNATURE_HEADER, TIMESTAMP_HEADER, TOLERANCE_S};

pub const DEFAULT_MAX_BODY: u64 = 1 << 20;
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

/// How often deliveries past their replay window are forgotten.
const FORGET_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// One workflow's endpoint.
#[derive(Clone)]
pub struct Route {
    pub workflow: String,
    pub format: Format,
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
    store: Store,
    /// Refusals and redeliveries are per request, so a sender (or an attacker) decides
    /// how often they happen: logged once per 10 s with a count.
    refused: Arc<crate::throttle::Shared>,
    repeated: Arc<crate::throttle::Shared>,
}

/// Serves webhooks on `listener` until `cancel`; deliveries are remembered in `store`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    routes: Routes,
    submit: Submit,
    store: Store,
    cancel: CancellationToken,
) {
    tokio::spawn(forget_old_deliveries(store.clone(), cancel.clone()));
    let app = Router::new().fallback(handle).with_state(AppState {
        routes,
        submit,
        store,
        refused: Arc::default(),
        repeated: Arc::default(),
    });
    crate::listener::serve_http(listener, app, "webhook listener", cancel).await;
}

async fn forget_old_deliveries(store: Store, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(FORGET_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        let store = store.clone();
        match tokio::task::spawn_blocking(move || store.forget_deliveries(chrono::Utc::now())).await
        {
            Ok(Ok(0)) | Err(_) => {}
            Ok(Ok(n)) => tracing::debug!("forgot {n} webhook deliveries past their replay window"),
            Ok(Err(e)) => tracing::warn!("cannot forget old webhook deliveries: {e}"),
        }
    }
}

fn text(status: StatusCode, message: &str) -> Response {
    (status, format!("{message}\n")).into_response()
}

fn json_reply(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
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
        return text(StatusCode::NOT_FOUND, "no webhook at this path");
    };
    if method != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "POST only");
    }
    let Some(secret) = &route.secret else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "webhook secret is not configured on the server",
        );
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > route.max_body) {
        return text(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
    }
    let bytes = match crate::listener::read_body(body, route.max_body as usize).await {
        Ok(bytes) => bytes,
        Err(StatusCode::REQUEST_TIMEOUT) => {
            return text(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive in time",
            )
        }
        Err(status) => return text(status, "body too large"),
    };
    let now = chrono::Utc::now();
    let delivery = match verify::verify(route.format, secret, &headers, &bytes, now.timestamp()) {
        Ok(d) => d,
        Err(why) => {
            if let Some(n) = app.refused.due() {
                tracing::warn!(workflow = %route.workflow, format = route.format.name(), "webhook refused: {why} ({n} refused in the last {}s)", crate::throttle::LOG_EVERY.as_secs());
            }
            return text(StatusCode::UNAUTHORIZED, &why.to_string());
        }
    };
    let fire = Fire::new(
        "webhook",
        None,
        json!({
            "path": uri.path(),
            "format": route.format.name(),
            "delivery_id": delivery.id,
            "headers": run_headers(route.format, &headers),
            "body": decode_body(&bytes),
        }),
    );
    let seen = SeenDelivery {
        run_id: fire.run_id.clone(),
        until: now + chrono::Duration::from_std(delivery.replayable_for).unwrap_or_default(),
    };
    let store = app.store.clone();
    let (workflow, id) = (route.workflow.clone(), delivery.id.clone());
    let earlier =
        tokio::task::spawn_blocking(move || store.remember_delivery(&workflow, &id, &seen, now))
            .await;
    match earlier {
        Ok(Ok(None)) => {}
        Ok(Ok(Some(earlier))) => {
            if let Some(n) = app.repeated.due() {
                tracing::info!(workflow = %route.workflow, delivery = %delivery.id, run = %earlier.run_id, "webhook delivery seen before: answered, nothing run ({n} such in the last {}s)", crate::throttle::LOG_EVERY.as_secs());
            }
            return json_reply(
                StatusCode::OK,
                json!({ "run_id": earlier.run_id, "duplicate": true }),
            );
        }
        Ok(Err(e)) => {
            tracing::error!(workflow = %route.workflow, "cannot record the webhook delivery: {e}");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot record the delivery now; send it again",
            );
        }
        Err(e) => {
            tracing::error!(workflow = %route.workflow, "recording the webhook delivery failed: {e}");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot record the delivery now; send it again",
            );
        }
    }
    let run_id = fire.run_id.clone();
    (app.submit)(route.workflow.clone(), fire);
    json_reply(StatusCode::ACCEPTED, json!({ "run_id": run_id }))
}

/// Verifies a request signed in steward's own format (the timestamp window and the HMAC).
pub fn check_signature(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<(), verify::Rejected> {
    verify::verify(Format::Steward, secret, headers, body, now).map(|_| ())
}

/// A verified body as the run sees it: its JSON, or else its text (lossy UTF-8).
/// Never panics, whatever the bytes (a fuzz target holds it to that).
pub fn decode_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// `sha256=<hex>` for a body: what a sender in steward's format computes.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    verify::sign(Format::Steward, secret, "", timestamp, body)
        .into_iter()
        .find(|(name, _)| *name == SIGNATURE_HEADER)
        .map(|(_, v)| v)
        .unwrap_or_default()
}

/// The headers a run sees: those `format` lists ([`Format::run_headers`]), never a
/// signature or a credential.
fn run_headers(format: Format, headers: &HeaderMap) -> Value {
    let mut map = serde_json::Map::new();
    for name in format.run_headers() {
        if let Some(v) = headers.get(*name).and_then(|v| v.to_str().ok()) {
            map.insert(name.to_string(), Value::String(v.to_string()));
        }
    }
    Value::Object(map)
}

/// A `webhook_listen` that is not an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("webhook_listen `{given}` is not an address like 127.0.0.1:8787: {error}")]
pub struct BadListen {
    given: String,
    error: std::net::AddrParseError,
}

/// The address to bind: `webhook_listen` from steward.toml, loopback by default.
pub fn listen_addr(configured: Option<&str>) -> Result<SocketAddr, BadListen> {
    configured
        .unwrap_or(DEFAULT_LISTEN)
        .parse()
        .map_err(|error| BadListen {
            given: configured.unwrap_or("").to_string(),
            error,
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
        let refused = check_signature(b"k", &headers(then, &sig), b"x", then + TOLERANCE_S + 1);
        assert_eq!(refused, Err(verify::Rejected::OutsideWindow));
        assert_eq!(
            refused.unwrap_err().to_string(),
            "timestamp outside the allowed window of 5 minutes (a replay?)"
        );
    }
}
