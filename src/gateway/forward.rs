//! The gateway's listener: the provider APIs, unchanged, on loopback. A step calls
//! `OPENAI_BASE_URL` (`http://ADDR/openai/v1`) or `ANTHROPIC_BASE_URL`
//! (`http://ADDR/anthropic`) with its per-run key; the gateway checks the key and the
//! model, forwards the request to the real provider with the real key (which the step
//! never sees), and passes the answer back as it arrives — a stream is never buffered —
//! while [`super::meter`] reads what it spent. Each call ends in one [`Call`] to the
//! grant's sink.
//!
//! Refusals use the provider's own error shape, so the SDKs raise their usual errors: an
//! unknown or revoked key is 401, a model or provider outside the grant 403, an unknown
//! path 404.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::keys::{Call, Registry};
use super::meter::{self, Provider, StreamMeter};

/// The largest request body the gateway reads (prompts with images can be large).
pub const MAX_REQUEST: usize = 32 << 20;

/// The largest whole (not streamed) response the meter keeps a copy of to read its usage.
const MAX_METERED_BODY: usize = 32 << 20;

/// A real provider: where it is and its key (from the daemon's environment).
#[derive(Clone)]
pub struct Upstream {
    /// e.g. `https://api.openai.com/v1` or `https://api.anthropic.com`
    pub base_url: String,
    pub key: String,
}

/// The providers the gateway can reach.
#[derive(Clone, Default)]
pub struct Upstreams {
    pub openai: Option<Upstream>,
    pub anthropic: Option<Upstream>,
}

impl Upstreams {
    fn of(&self, provider: Provider) -> Option<&Upstream> {
        match provider {
            Provider::Openai => self.openai.as_ref(),
            Provider::Anthropic => self.anthropic.as_ref(),
        }
    }
}

#[derive(Clone)]
struct Gateway {
    registry: Registry,
    upstreams: Arc<Upstreams>,
    client: reqwest::Client,
}

/// Serves the gateway on `listener` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Registry,
    upstreams: Upstreams,
    cancel: CancellationToken,
) {
    let gateway = Gateway {
        registry,
        upstreams: Arc::new(upstreams),
        client: reqwest::Client::new(),
    };
    let app = Router::new()
        .route("/{provider}/v1/{*endpoint}", post(forward_call))
        .fallback(|| async {
            refuse(
                Provider::Openai,
                StatusCode::NOT_FOUND,
                "no such endpoint on the steward gateway",
            )
        })
        .with_state(gateway);
    crate::listener::serve_http(listener, app, "model gateway", cancel).await;
}

/// The endpoints forwarded, per provider.
fn known(provider: Provider, endpoint: &str) -> bool {
    match provider {
        Provider::Openai => matches!(endpoint, "chat/completions" | "responses" | "embeddings"),
        Provider::Anthropic => endpoint == "messages",
    }
}

async fn forward_call(
    State(g): State<Gateway>,
    Path((provider, endpoint)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let provider = match provider.as_str() {
        "openai" => Provider::Openai,
        "anthropic" => Provider::Anthropic,
        _ => {
            return refuse(
                Provider::Openai,
                StatusCode::NOT_FOUND,
                "no such provider on the steward gateway (openai, anthropic)",
            )
        }
    };
    let key = presented_key(&headers);
    call(g, provider, &endpoint, key, headers, body).await
}

/// The key a client shows: `x-api-key` (Anthropic's documented header) or
/// `Authorization: Bearer` (OpenAI's, and what newer Anthropic SDKs send).
fn presented_key(headers: &HeaderMap) -> String {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    header("x-api-key")
        .or_else(|| header("authorization").and_then(|v| v.strip_prefix("Bearer ")))
        .unwrap_or("")
        .to_string()
}

/// An error in the provider's own shape.
fn refuse(provider: Provider, status: StatusCode, message: &str) -> Response {
    let body = match provider {
        Provider::Openai => {
            json!({"error": {"message": message, "type": "steward_gateway", "code": status.as_u16()}})
        }
        Provider::Anthropic => {
            json!({"type": "error", "error": {"type": "steward_gateway", "message": message}})
        }
    };
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn call(
    g: Gateway,
    provider: Provider,
    endpoint: &str,
    key: String,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(grant) = g.registry.grant(&key) else {
        return refuse(
            provider,
            StatusCode::UNAUTHORIZED,
            "this key is not in force (a step's key works only while that step runs)",
        );
    };
    if !known(provider, endpoint) {
        return refuse(
            provider,
            StatusCode::NOT_FOUND,
            "no such endpoint on the steward gateway",
        );
    }
    let bytes = match crate::listener::read_body(body, MAX_REQUEST).await {
        Ok(b) => b,
        Err(status) => {
            return refuse(
                provider,
                status,
                "the request body is too large or too slow",
            )
        }
    };
    let Ok(mut request) = serde_json::from_slice::<Value>(&bytes) else {
        return refuse(
            provider,
            StatusCode::BAD_REQUEST,
            "the request body is not JSON",
        );
    };
    let model = request["model"].as_str().unwrap_or("").to_string();
    if !grant.allows(provider, &model) {
        return refuse(
            provider,
            StatusCode::FORBIDDEN,
            &format!("model `{model}` is not among this workflow's [gateway] models"),
        );
    }
    let Some(upstream) = g.upstreams.of(provider) else {
        return refuse(
            provider,
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway has no upstream for this provider",
        );
    };
    // An OpenAI stream tells its usage only when asked: ask, always.
    if provider == Provider::Openai && request["stream"] == true && endpoint == "chat/completions" {
        request["stream_options"]["include_usage"] = json!(true);
    }
    let url = format!("{}/{}", upstream.base_url.trim_end_matches('/'), endpoint);
    let mut forward = g
        .client
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&request).unwrap_or_default());
    forward = match provider {
        Provider::Openai => forward.bearer_auth(&upstream.key),
        Provider::Anthropic => forward.header("x-api-key", &upstream.key),
    };
    for name in [
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "accept",
    ] {
        if let Some(v) = headers.get(name) {
            forward = forward.header(name, v.clone());
        }
    }
    let started = Instant::now();
    let answer = match forward.send().await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(workflow = %grant.workflow, run = %grant.run_id, "gateway: the provider did not answer: {e}");
            return refuse(
                provider,
                StatusCode::BAD_GATEWAY,
                "the provider did not answer",
            );
        }
    };
    let status = answer.status();
    let content_type = answer
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let streamed = content_type.starts_with("text/event-stream");
    let sink = grant.sink.clone();
    // The answer passes through as it arrives; the meter reads along, and its reading
    // goes to the sink once the answer has ended (or was dropped by the client).
    let mut reading = Reading {
        meter: streamed.then(|| StreamMeter::new(provider)),
        whole: Vec::new(),
        call: Some(Call {
            provider,
            model,
            metered: Default::default(),
            status: status.as_u16(),
            latency_ms: 0,
        }),
        sink,
        started,
    };
    let stream = answer.bytes_stream().map(move |chunk| {
        if let Ok(bytes) = &chunk {
            reading.read(bytes);
        } else {
            reading.done();
        }
        chunk.map_err(std::io::Error::other)
    });
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() =
        StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Ok(v) = content_type.parse() {
        response
            .headers_mut()
            .insert(axum::http::header::CONTENT_TYPE, v);
    }
    response
}

/// The meter's side of one answer in flight; tells its sink once, when the answer ends
/// or is dropped.
struct Reading {
    meter: Option<StreamMeter>,
    whole: Vec<u8>,
    call: Option<Call>,
    sink: super::keys::Sink,
    started: Instant,
}

impl Reading {
    fn read(&mut self, bytes: &Bytes) {
        match &mut self.meter {
            Some(m) => {
                m.feed(bytes);
            }
            None if self.whole.len() + bytes.len() <= MAX_METERED_BODY => {
                self.whole.extend_from_slice(bytes)
            }
            None => {}
        }
    }

    fn done(&mut self) {
        let Some(mut call) = self.call.take() else {
            return;
        };
        call.metered = match self.meter.take() {
            Some(m) => m.finish(),
            None => serde_json::from_slice::<Value>(&self.whole)
                .map(|v| meter::from_response(call.provider, &v))
                .unwrap_or_default(),
        };
        call.latency_ms = self.started.elapsed().as_millis() as u64;
        (self.sink)(&call);
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.done();
    }
}
