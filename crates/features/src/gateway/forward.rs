//! The gateway's listener: the provider APIs, unchanged, on loopback. A step calls
//! `OPENAI_BASE_URL` (`http://ADDR/openai/v1`) or `ANTHROPIC_BASE_URL`
//! (`http://ADDR/anthropic`) with its per-run key; the gateway checks the key and the
//! model, forwards the request to the real provider with the real key (which the step
//! never sees), and passes the answer back as it arrives — a stream is never buffered —
//! while [`crate::metering::meter`] reads what it spent. Each call ends in one [`Call`] to the
//! grant's sink.
//!
//! Before forwarding, the call's worst case is reserved out of the run's budget
//! ([`crate::metering::reserve`]) and its output limit lowered to fit; a call the budget cannot
//! cover is refused (429) and the sink told, which ends the run exhausted. A stream whose
//! output passes its reservation is cut at the next event.
//!
//! Refusals use the provider's own error shape, so the SDKs raise their usual errors: an
//! unknown or revoked key is 401, a model or provider outside the grant 403, an unknown
//! path 404, a call over budget 429. Each carries `x-should-retry: false`, which both
//! official SDKs honour, so none of them retries what will be refused again.

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

use crate::budget::Left;
use crate::control::Resource;
use crate::metering::keys::{Call, Event, Grant, Registry};
use crate::metering::meter::{self, Price, Provider, StreamMeter};
use crate::metering::reserve;

/// The largest request body the gateway reads (prompts with images can be large).
pub const MAX_REQUEST: usize = 32 << 20;

/// The largest whole (not streamed) response the meter keeps a copy of to read its usage.
const MAX_METERED_BODY: usize = 32 << 20;

pub use crate::metering::keys::Upstream;

#[derive(Clone)]
struct Gateway {
    registry: Registry,
    client: reqwest::Client,
}

/// Serves the gateway on `listener` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Registry,
    cancel: CancellationToken,
) {
    let gateway = Gateway {
        registry,
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
        [
            (axum::http::header::CONTENT_TYPE, "application/json"),
            (
                axum::http::HeaderName::from_static("x-should-retry"),
                "false",
            ),
        ],
        body.to_string(),
    )
        .into_response()
}

/// A call the gateway agreed to forward: its grant, its request (JSON) and the request's
/// size, the model asked for, and where it goes.
struct Admitted {
    grant: Grant,
    request: Value,
    size: usize,
    model: String,
    upstream: crate::metering::keys::Upstream,
}

async fn call(
    g: Gateway,
    provider: Provider,
    endpoint: &str,
    key: String,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Admitted {
        grant,
        mut request,
        size,
        model,
        upstream,
    } = match admit(&g, provider, endpoint, &key, body).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    // An OpenAI stream tells its usage only when asked: ask, always.
    if provider == Provider::Openai && request["stream"] == true && endpoint == "chat/completions" {
        request["stream_options"]["include_usage"] = json!(true);
    }
    let price = grant.pricing.get(&model).copied();
    let reserved = match &grant.budget {
        None => None,
        Some(headroom) => {
            let reserved = headroom.reserve(|free| {
                reserve::within(
                    provider,
                    endpoint,
                    &model,
                    &mut request,
                    size,
                    free,
                    price.as_ref(),
                )
            });
            match reserved {
                Ok(r) => Some(r),
                Err(refusal) => {
                    (grant.sink)(Event::Refused(&refusal));
                    return refuse(provider, StatusCode::TOO_MANY_REQUESTS, &refusal.why);
                }
            }
        }
    };
    let forward = upstream_request(&g, provider, endpoint, &upstream, &request, &headers);
    let mut reading = Reading {
        meter: None,
        whole: Vec::new(),
        call: Some(Call {
            provider,
            model,
            endpoint: endpoint.to_string(),
            metered: Default::default(),
            status: 0,
            latency_ms: 0,
            reserved: reserved.map(|(r, _)| r),
            charges: Vec::new(),
            cost_usd: None,
            cut: false,
            bodies: None,
        }),
        held: reserved.map(|(_, held)| held),
        price,
        request: grant.log_bodies.then_some(request),
        grant,
        started: Instant::now(),
    };
    match forward.send().await {
        Ok(answer) => pass_through(provider, answer, reading),
        Err(e) => {
            tracing::warn!(workflow = %reading.grant.workflow, run = %reading.grant.run_id, "gateway: the provider did not answer: {e}");
            reading.status(502);
            refuse(
                provider,
                StatusCode::BAD_GATEWAY,
                "the provider did not answer",
            )
        }
    }
}

/// Checks a call before anything is reserved: a key in force, a known endpoint, a body
/// that is JSON within its bounds, a model and provider the grant allows. Err is the
/// refusal to answer with.
async fn admit(
    g: &Gateway,
    provider: Provider,
    endpoint: &str,
    key: &str,
    body: Body,
) -> Result<Admitted, Response> {
    let Some(grant) = g.registry.grant(key) else {
        return Err(refuse(
            provider,
            StatusCode::UNAUTHORIZED,
            "this key is not in force (a step's key works only while that step runs)",
        ));
    };
    if !known(provider, endpoint) {
        return Err(refuse(
            provider,
            StatusCode::NOT_FOUND,
            "no such endpoint on the steward gateway",
        ));
    }
    let bytes = crate::listener::read_body(body, MAX_REQUEST)
        .await
        .map_err(|status| {
            refuse(
                provider,
                status,
                "the request body is too large or too slow",
            )
        })?;
    let Ok(request) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(refuse(
            provider,
            StatusCode::BAD_REQUEST,
            "the request body is not JSON",
        ));
    };
    let model = request["model"].as_str().unwrap_or("").to_string();
    if !grant.allows(provider, &model) {
        return Err(refuse(
            provider,
            StatusCode::FORBIDDEN,
            &format!(
                "model `{model}` through {} is not among this workflow's [gateway] providers and models",
                provider.name()
            ),
        ));
    }
    let Some(upstream) = grant.upstream(provider).cloned() else {
        return Err(refuse(
            provider,
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway has no upstream for this provider",
        ));
    };
    Ok(Admitted {
        grant,
        request,
        size: bytes.len(),
        model,
        upstream,
    })
}

/// The request to the real provider: the real key, the (possibly lowered) body, and the
/// client's version and beta headers.
fn upstream_request(
    g: &Gateway,
    provider: Provider,
    endpoint: &str,
    upstream: &crate::metering::keys::Upstream,
    request: &Value,
    headers: &HeaderMap,
) -> reqwest::RequestBuilder {
    let url = format!("{}/{}", upstream.base_url.trim_end_matches('/'), endpoint);
    let mut forward = g
        .client
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(request).unwrap_or_default());
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
    forward
}

/// The provider's answer, passed through as it arrives; the meter reads along, and its
/// reading goes to the sink once the answer has ended (or was cut, or dropped by the
/// client).
fn pass_through(provider: Provider, answer: reqwest::Response, mut reading: Reading) -> Response {
    let status = answer.status();
    reading.status(status.as_u16());
    let content_type = answer
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    if content_type.starts_with("text/event-stream") {
        reading.meter = Some(StreamMeter::new(provider));
    }
    let passed: Vec<_> = answer
        .headers()
        .iter()
        .filter(|(name, _)| passes(name.as_str()))
        .filter_map(|(name, value)| {
            Some((
                axum::http::HeaderName::from_bytes(name.as_str().as_bytes()).ok()?,
                axum::http::HeaderValue::from_bytes(value.as_bytes()).ok()?,
            ))
        })
        .collect();
    let stream = answer.bytes_stream().scan(reading, |reading, chunk| {
        let next = match chunk {
            Ok(bytes) if reading.read(&bytes) => Some(Ok(bytes)),
            Ok(_) => {
                reading.cut();
                None
            }
            Err(e) => {
                reading.done();
                Some(Err(std::io::Error::other(e)))
            }
        };
        futures_util::future::ready(next)
    });
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() =
        StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Ok(v) = content_type.parse() {
        response
            .headers_mut()
            .insert(axum::http::header::CONTENT_TYPE, v);
    }
    response.headers_mut().extend(passed);
    response
}

/// The provider's answer headers a client may act on: when to retry, its rate limits,
/// the request id to quote to support. Not hop-by-hop ones, not cookies.
fn passes(name: &str) -> bool {
    matches!(
        name,
        "retry-after" | "retry-after-ms" | "x-request-id" | "request-id" | "openai-processing-ms"
    ) || name.starts_with("x-ratelimit-")
        || name.starts_with("anthropic-ratelimit-")
}

/// The meter's side of one answer in flight; settles the call once — charges it, frees
/// its reservation, tells the sink — when the answer ends, is cut, or is dropped.
struct Reading {
    meter: Option<StreamMeter>,
    /// A whole answer, kept to read its usage (and, under `log_bodies`, a stream's text).
    whole: Vec<u8>,
    call: Option<Call>,
    /// What the reservation holds of the headroom.
    held: Option<Left>,
    price: Option<Price>,
    /// The request as forwarded, under `log_bodies`.
    request: Option<Value>,
    grant: Grant,
    started: Instant,
}

/// What `log_bodies` keeps of an answer at most.
const MAX_LOGGED_ANSWER: usize = 1 << 20;

impl Reading {
    fn status(&mut self, status: u16) {
        if let Some(call) = &mut self.call {
            call.status = status;
        }
    }

    /// Reads a piece of the answer; false when the stream has gone past its reservation
    /// and must be cut here.
    fn read(&mut self, bytes: &Bytes) -> bool {
        let keep = match &self.meter {
            Some(_) if self.request.is_some() => MAX_LOGGED_ANSWER,
            Some(_) => 0,
            None => MAX_METERED_BODY,
        };
        if self.whole.len() + bytes.len() <= keep {
            self.whole.extend_from_slice(bytes);
        }
        let (Some(meter), Some(call)) = (&mut self.meter, &self.call) else {
            return true;
        };
        meter.feed(bytes);
        call.reserved
            .is_none_or(|r| meter.output_so_far() <= r.output)
    }

    fn cut(&mut self) {
        if let Some(call) = &mut self.call {
            call.cut = true;
        }
        self.done();
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
        // A cut stream's usage so far is not what the provider bills: charge all it
        // could have spent.
        if call.cut {
            call.metered.usage = None;
        }
        call.latency_ms = self.started.elapsed().as_millis() as u64;
        // An error answer (the provider refused, was overloaded or unreachable) is not
        // billed: it charges nothing, so an SDK retrying a provider's 429 does not drain
        // the budget. Anything else without usage is charged its whole reservation.
        let unbilled = (400..600).contains(&call.status) && call.metered.usage.is_none();
        call.charges = if unbilled {
            Vec::new()
        } else {
            reserve::charges(&call.metered, call.reserved, self.price.as_ref())
        };
        call.cost_usd = call
            .charges
            .iter()
            .find(|(r, _)| *r == Resource::CostUsd)
            .map(|(_, c)| *c);
        if let Some(request) = self.request.take() {
            let answer = String::from_utf8_lossy(&self.whole).into_owned();
            call.bodies = Some((request, answer));
        }
        if let (Some(headroom), Some(held)) = (&self.grant.budget, self.held) {
            let spent = Left {
                tokens: call
                    .charges
                    .iter()
                    .find(|(r, _)| *r == Resource::Tokens)
                    .map_or(0, |(_, t)| *t as u64),
                cost_usd: call.cost_usd.unwrap_or(0.0),
            };
            headroom.settle(held, spent);
        }
        (self.grant.sink)(Event::Call(&call));
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.done();
    }
}
