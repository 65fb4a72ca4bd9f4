//! Who may use the dashboard, checked for every request before any page sees it:
//!
//! 1. the `Host` header must name the listen address (a page of another site, reached
//!    through a DNS name rebound to 127.0.0.1, sends its own name: refused);
//! 2. `/metrics` needs a loopback client, or its own bearer token (`state/metrics.token`);
//! 3. every other path needs the session cookie, which the first request gets in exchange
//!    for the token (`?token=`, from `state/dashboard.token`, as `steward dashboard`
//!    prints it): HttpOnly, SameSite=Strict, and the URL is rewritten without the token;
//! 4. a POST (every state-changing request) must carry the CSRF token in its form, and
//!    an `Origin`, when sent, must be the dashboard's own.
//!
//! The cookie and the CSRF token are derived from the token (HMAC-SHA256), so a restart
//! keeps sessions and a new token (delete the file) ends them all.

use std::net::SocketAddr;
use std::sync::Arc;

use super::context::Dashboard;
use super::keys::same;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

pub const COOKIE: &str = "steward_session";
/// The largest form a POST may send (a reason for a rejection, a CSRF token).
const MAX_FORM: usize = 64 << 10;

/// The `Host` values the dashboard answers to: its listen address, and `localhost:PORT`
/// when that is loopback.
pub fn allowed_hosts(listen: SocketAddr) -> Vec<String> {
    let mut hosts = vec![listen.to_string()];
    if listen.ip().is_loopback() {
        hosts.push(format!("localhost:{}", listen.port()));
    }
    hosts
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        format!("{why}\n"),
    )
        .into_response()
}

fn session_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(cookie::Cookie::split_parse)
        .flatten()
        .find(|c| c.name() == COOKIE)
        .map(|c| c.value().to_string())
}

fn query_token(req: &Request) -> Option<String> {
    form_urlencoded::parse(req.uri().query()?.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
}

/// The request's path and query without its `token` parameter.
fn without_token(req: &Request) -> String {
    let rest: Vec<(String, String)> =
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .filter(|(k, _)| k != "token")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    let path = req.uri().path();
    if rest.is_empty() {
        return path.to_string();
    }
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(rest)
        .finish();
    format!("{path}?{query}")
}

/// The middleware every request passes.
pub async fn check(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !d.hosts.iter().any(|h| h == host) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            &format!(
                "refused: this is steward's dashboard at {}, not \"{host}\"",
                d.hosts[0]
            ),
        );
    }
    if req.uri().path() == "/metrics" {
        return match metrics_allowed(&d, peer, req.headers()) {
            Ok(()) => next.run(req).await,
            Err(why) => refuse(StatusCode::UNAUTHORIZED, why),
        };
    }
    if let Some(token) = query_token(&req) {
        if !same(&token, &d.keys.token) {
            return refuse(
                StatusCode::FORBIDDEN,
                "refused: that token is not this dashboard's (run `steward dashboard` for the URL)",
            );
        }
        let cookie = cookie::Cookie::build((COOKIE, d.keys.session.clone()))
            .http_only(true)
            .same_site(cookie::SameSite::Strict)
            .path("/")
            .build();
        let mut resp = Redirect::to(&without_token(&req)).into_response();
        if let Ok(value) = cookie.to_string().parse() {
            resp.headers_mut().insert(header::SET_COOKIE, value);
        }
        return resp;
    }
    if !session_of(req.headers()).is_some_and(|s| same(&s, &d.keys.session)) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "not signed in: open the URL that `steward dashboard` prints (it carries the token)",
        );
    }
    if req.method() == Method::POST {
        return match csrf_checked(&d, req).await {
            Ok(req) => next.run(req).await,
            Err(resp) => resp,
        };
    }
    next.run(req).await
}

fn metrics_allowed(
    d: &Dashboard,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<(), &'static str> {
    match &d.keys.metrics {
        None if peer.ip().is_loopback() => Ok(()),
        None => Err("refused: /metrics answers loopback clients only ([dashboard] metrics = \"token\" for others)"),
        Some(token) => {
            let sent = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            if same(sent.trim(), token) {
                Ok(())
            } else {
                Err("refused: /metrics needs `Authorization: Bearer` with the token in state/metrics.token")
            }
        }
    }
}

/// A POST's form must carry the CSRF token, and its `Origin` (if any) be this dashboard.
/// The body is read here and handed on unchanged.
async fn csrf_checked(d: &Dashboard, req: Request) -> Result<Request, Response> {
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok());
    if let Some(origin) = origin {
        let ours = d.hosts.iter().any(|h| origin == format!("http://{h}"));
        if !ours {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                "refused: a form from another site",
            ));
        }
    }
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_FORM)
        .await
        .map_err(|_| refuse(StatusCode::PAYLOAD_TOO_LARGE, "refused: form too large"))?;
    let sent = form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if !same(&sent, d.keys.csrf()) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "refused: this form has no valid CSRF token (reload the page and try again)",
        ));
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}
