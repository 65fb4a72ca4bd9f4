//! The alert receivers of `tests/fixtures/alert_sink.py` (aiosmtpd for mail, Python's
//! http.server for webhooks): what each received, one JSON line per message.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{wait_for, Env};

/// The alert receivers, killed on drop.
pub struct Sink {
    child: Child,
    out: std::path::PathBuf,
    pub smtp: u16,
    pub http: u16,
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn sink(env: &Env, name: &str, http_port: Option<u16>) -> Sink {
    let out = env.path(name);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/alert_sink.py");
    let mut cmd = Command::new(super::python());
    cmd.arg(script).arg(&out);
    if let Some(p) = http_port {
        cmd.args(["--http-port", &p.to_string()]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("start alert_sink.py");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.len(), 4, "alert_sink.py said {line:?}");
    Sink {
        child,
        out,
        smtp: words[1].parse().unwrap(),
        http: words[3].parse().unwrap(),
    }
}

impl Sink {
    pub fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub fn of(&self, via: &str, event: &str) -> Vec<Value> {
        self.received()
            .into_iter()
            .filter(|m| m["via"] == via)
            .filter(|m| {
                let text = m["subject"].as_str().unwrap_or("").to_string()
                    + m["body"].as_str().unwrap_or("");
                text.contains(&format!("] {event}:"))
                    || text.contains(&format!("\"event\":\"{event}\""))
            })
            .collect()
    }
}

pub fn hooks(sink: &Sink, event: &str) -> Vec<Value> {
    sink.of("http", event)
        .iter()
        .map(|m| serde_json::from_str(m["body"].as_str().unwrap()).unwrap())
        .collect()
}

/// The first webhook alert of `event`, waited for up to `secs` seconds.
pub fn first_hook(sink: &Sink, event: &str, secs: u64) -> Value {
    wait_for(
        &format!("the {event} alert"),
        Duration::from_secs(secs),
        || !hooks(sink, event).is_empty(),
    );
    hooks(sink, event).swap_remove(0)
}
