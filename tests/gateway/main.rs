//! The model gateway (issue 26, in progress) against implementations steward did not
//! write: the official `openai` and `anthropic` Python SDKs. A provider stand-in on
//! loopback (`tests/fixtures/provider_standin.py`; there is no internet here, so no real
//! provider) answers in the documented JSON and stream shapes.
//!
//! - The meter reads the same tokens and tool calls from its answers as the SDKs parse
//!   (`tests/fixtures/sdk_usage.py`, streams accumulated by their own helpers).
//! - Through the gateway, the SDKs, unchanged and holding only a run's key, get their
//!   answers intact; each call is metered once; the provider sees only the real key; a
//!   model outside the grant, an unknown path, a revoked or a stranger's key is refused
//!   in the provider's error shape before anything reaches the provider.

mod caps;
mod roads;
mod sdks;
mod shapes;
#[path = "../util/mod.rs"]
mod util;

#[allow(unused_imports)]
use caps::*;
#[allow(unused_imports)]
use roads::*;
#[allow(unused_imports)]
use sdks::*;
#[allow(unused_imports)]
use shapes::*;

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use steward::gateway::meter::{self, Metered, Provider, StreamMeter};

/// The stand-in, killed on drop.
struct StandIn {
    child: Child,
    port: u16,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stand-in; with `keys_seen`, it notes the key of every request it gets there.
fn stand_in(keys_seen: Option<&std::path::Path>) -> StandIn {
    stand_in_logging(keys_seen, None)
}

/// [`stand_in`], noting each request's model and output limits in `log` (JSON lines).
fn stand_in_logging(keys_seen: Option<&std::path::Path>, log: Option<&std::path::Path>) -> StandIn {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/provider_standin.py"
    );
    let mut cmd = Command::new(util::python());
    if let Some(log) = log {
        cmd.env("STANDIN_LOG", log);
    }
    let mut child = util::dies_with_test(&mut cmd)
        .arg(script)
        .args(keys_seen)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start provider_standin.py");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .strip_prefix("port ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("provider_standin.py said {line:?}"));
    StandIn { child, port }
}

/// One POST to the stand-in; the response body's bytes.
fn post(port: u16, path: &str, body: &Value) -> Vec<u8> {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let body = body.to_string();
    write!(
        conn,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    raw[split + 4..].to_vec()
}

/// What steward's meter reads from a response: whole JSON, or a stream fed in small,
/// uneven pieces as a proxy would see it.
fn metered(provider: Provider, body: &[u8], streamed: bool) -> Metered {
    if !streamed {
        return meter::from_response(provider, &serde_json::from_slice(body).unwrap());
    }
    let mut m = StreamMeter::new(provider);
    for piece in body.chunks(7) {
        m.feed(piece);
    }
    m.finish()
}

/// What the official SDKs read from each call kind (`tests/fixtures/sdk_usage.py`), by
/// call name.
fn sdk_usage(openai: &str, anthropic: &str, env: &[(&str, &str)]) -> HashMap<String, Value> {
    let out = Command::new(util::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/sdk_usage.py"
        ))
        .args([openai, anthropic])
        .envs(env.iter().copied())
        .output()
        .expect("run sdk_usage.py");
    assert!(
        out.status.success(),
        "the SDKs failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["call"].as_str().unwrap().to_string(), v)
        })
        .collect()
}
