//! The model gateway against calling the provider directly, in one run: a stand-in
//! provider in this process (answers prepared, so the provider adds no noise), the same
//! client, the same calls — once straight to the stand-in, once through the gateway with
//! a run's key, its budget held (each call reserved, its limit lowered, metered, charged).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use steward::budget::{Headroom, Left};
use steward::gateway::keys::{Event, Grant, Upstream};
use steward::gateway::{Gateway, Provider};
use tokio_util::sync::CancellationToken;

/// Figures of one side (direct or through the gateway), in ms.
pub struct Side {
    pub calls: Vec<f64>,
    pub first_byte: Vec<f64>,
}

pub struct Figures {
    pub direct: Side,
    pub gateway: Side,
    /// Peak RSS growth (KiB) while 10 MB stream through the gateway, and directly.
    pub stream_rss_kib: (f64, f64),
    pub stream_bytes: u64,
    pub metered_calls: u64,
}

const CHAT: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}"#;

/// Events of the big stream: 1000 × 10 KB of content, then usage.
const BIG_EVENTS: usize = 1000;

fn stream_body(big: bool) -> Body {
    let piece = if big { "x".repeat(10_000) } else { "ok".into() };
    let n = if big { BIG_EVENTS } else { 8 };
    let events = (0..n)
        .map(move |_| {
            Ok::<_, std::io::Error>(Bytes::from(format!(
                "data: {{\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{piece}\"}}}}]}}\n\n"
            )))
        })
        .chain(std::iter::once(Ok(Bytes::from_static(
            b"data: {\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":8,\"total_tokens\":20}}\n\ndata: [DONE]\n\n",
        ))));
    Body::from_stream(futures_util::stream::iter(events))
}

async fn standin(body: Bytes) -> axum::response::Response {
    let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let mut response = if req["stream"] == true {
        let mut r = axum::response::Response::new(stream_body(req["model"] == "big"));
        r.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            "text/event-stream".parse().unwrap(),
        );
        r
    } else {
        let mut r = axum::response::Response::new(Body::from(CHAT));
        r.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            "application/json".parse().unwrap(),
        );
        r
    };
    *response.status_mut() = axum::http::StatusCode::OK;
    response
}

fn vm_kib(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Peak RSS growth (KiB) while `f` runs: the peak is reset first (clear_refs 5).
async fn peak_growth<F: std::future::Future<Output = u64>>(f: F) -> (f64, u64) {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = vm_kib("VmRSS:");
    let bytes = f.await;
    (vm_kib("VmHWM:") - before, bytes)
}

async fn call(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    stream: bool,
    model: &str,
) -> (f64, f64, u64) {
    let started = Instant::now();
    // The big stream asks no output limit: the gateway then sets what the budget leaves.
    let limit = if model == "big" {
        ""
    } else {
        r#""max_tokens":64,"#
    };
    let body = format!(
        r#"{{"model":"{model}","stream":{stream},{limit}"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let answer = client
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the call is answered");
    assert!(answer.status().is_success(), "{}", answer.status());
    let mut first = None;
    let mut bytes = 0u64;
    let mut body = answer.bytes_stream();
    while let Some(chunk) = body.next().await {
        first.get_or_insert_with(|| started.elapsed().as_secs_f64() * 1000.0);
        bytes += chunk.expect("the body arrives").len() as u64;
    }
    let total = started.elapsed().as_secs_f64() * 1000.0;
    (total, first.unwrap_or(total), bytes)
}

pub fn run(calls: usize) -> Figures {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let cancel = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        let app = Router::new().route("/v1/chat/completions", post(standin));
        let stop = cancel.clone();
        // No Nagle on either side, as the gateway's own listener has none.
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        });
        let gateway = Gateway::start("127.0.0.1:0", cancel.clone()).await.unwrap();
        let metered = Arc::new(AtomicU64::new(0));
        let sink = {
            let metered = metered.clone();
            Arc::new(move |e: Event<'_>| {
                if let Event::Call(_) = e {
                    metered.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let issued = gateway
            .registry
            .issue(Grant {
                run_id: "bench".into(),
                workflow: "bench".into(),
                step: "run".into(),
                upstreams: vec![(
                    Provider::Openai,
                    Upstream {
                        base_url: format!("http://{upstream}/v1"),
                        key: "sk-bench".into(),
                    },
                )],
                models: vec!["m".into(), "big".into()],
                pricing: Default::default(),
                budget: Some(Headroom::new(Left {
                    tokens: u64::MAX / 4,
                    cost_usd: 1e12,
                })),
                log_bodies: false,
                sink,
            })
            .unwrap();
        let client = reqwest::Client::new();
        let direct_url = format!("http://{upstream}/v1/chat/completions");
        let gateway_url = format!("{}/chat/completions", gateway.base_url(Provider::Openai));
        let mut direct = Side {
            calls: Vec::new(),
            first_byte: Vec::new(),
        };
        let mut through = Side {
            calls: Vec::new(),
            first_byte: Vec::new(),
        };
        // Warm both paths (connections, allocator). Then blocks of calls, one side at a
        // time (a call right after a gateway call would pay for that call's settling on
        // the other thread), alternated so drift hits both sides alike.
        for _ in 0..20 {
            call(&client, &direct_url, "sk-bench", false, "m").await;
            call(&client, &gateway_url, &issued.key, false, "m").await;
        }
        let block = calls.div_ceil(4).max(1);
        for _ in 0..4 {
            for (url, key, side) in [
                (&direct_url, "sk-bench", &mut direct),
                (&gateway_url, issued.key.as_str(), &mut through),
            ] {
                for _ in 0..block {
                    side.calls.push(call(&client, url, key, false, "m").await.0);
                }
                for _ in 0..block {
                    side.first_byte
                        .push(call(&client, url, key, true, "m").await.1);
                }
            }
        }
        let (direct_rss, _) =
            peak_growth(async { call(&client, &direct_url, "sk-bench", true, "big").await.2 })
                .await;
        let (gateway_rss, stream_bytes) = peak_growth(async {
            call(&client, &gateway_url, &issued.key, true, "big")
                .await
                .2
        })
        .await;
        // The last call's sink runs as its answer's body is dropped.
        let deadline = Instant::now() + Duration::from_secs(10);
        let want = (2 * 4 * block + 20 + 1) as u64;
        while metered.load(Ordering::Relaxed) < want && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(issued);
        cancel.cancel();
        Figures {
            direct,
            gateway: through,
            stream_rss_kib: (gateway_rss, direct_rss),
            stream_bytes,
            metered_calls: metered.load(Ordering::Relaxed),
        }
    })
}
