//! Real servers steward is checked against, on loopback: SMTP, HTTP, Prometheus (and its
//! `promtool`), and the Python venv the tests run clients from.

use super::*;

pub struct SmtpServer {
    pub port: u16,
    pub messages: Mailbox,
}

pub fn smtp_server(reject: &[&str]) -> SmtpServer {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let messages = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reject: Vec<String> = reject.iter().map(|s| s.to_string()).collect();
    let store = messages.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let store = store.clone();
            let reject = reject.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let _ = conn.write_all(b"220 test ESMTP\r\n");
                let mut rcpts = Vec::new();
                let mut line = String::new();
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let cmd = line.trim_end().to_string();
                    let upper = cmd.to_uppercase();
                    let reply: &[u8] = if upper.starts_with("EHLO") {
                        b"250-test\r\n250 8BITMIME\r\n"
                    } else if upper.starts_with("HELO") || upper.starts_with("NOOP") {
                        b"250 OK\r\n"
                    } else if upper.starts_with("MAIL FROM") || upper.starts_with("RSET") {
                        rcpts.clear();
                        b"250 OK\r\n"
                    } else if upper.starts_with("RCPT TO") {
                        let addr = cmd.split(['<', '>']).nth(1).unwrap_or("").to_string();
                        if reject.contains(&addr) {
                            b"550 5.1.1 no such user\r\n"
                        } else {
                            rcpts.push(addr);
                            b"250 OK\r\n"
                        }
                    } else if upper == "DATA" {
                        let _ = conn.write_all(b"354 go on\r\n");
                        let mut data = String::new();
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == ".\r\n" || line == ".\n" {
                                break;
                            }
                            data.push_str(&line);
                        }
                        store
                            .lock()
                            .unwrap()
                            .push((std::mem::take(&mut rcpts), data));
                        b"250 OK queued\r\n"
                    } else if upper.starts_with("QUIT") {
                        let _ = conn.write_all(b"221 bye\r\n");
                        return;
                    } else {
                        b"502 not implemented\r\n"
                    };
                    if conn.write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    SmtpServer { port, messages }
}

/// A small HTTP server on loopback: `routes` maps a path to (status, body); a status of 0
/// accepts the request and never answers (a feed that hangs).
pub fn http_server(routes: Vec<(&'static str, u16, String)>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let routes = std::sync::Arc::new(routes);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let routes = routes.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut request = String::new();
                let _ = reader.read_line(&mut request);
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                }
                match routes.iter().find(|(p, _, _)| *p == path) {
                    Some((_, 0, _)) => std::thread::sleep(Duration::from_secs(60)),
                    Some((_, status, body)) => {
                        let _ = write!(conn, "HTTP/1.1 {status} X\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                    }
                    None => {
                        let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    }
                }
            });
        }
    });
    addr
}

/// The reference clients the tests run, from PyPI: cron implementations (cronsim,
/// croniter), Selenium for driving Chromium, and aiosmtpd (the SMTP server alerts reach).
/// `tests/run` installs the same file.
pub const PYTHON_REQUIREMENTS: &str = include_str!("../python-requirements.txt");

/// A Python with [`PYTHON_REQUIREMENTS`]: `STEWARD_TEST_PYTHON` (`tests/run` makes one), or a
/// venv made here once per build.
pub fn python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("STEWARD_TEST_PYTHON") {
                return PathBuf::from(p);
            }
            let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-venv");
            let python = venv.join("bin/python");
            let ready = venv.join("ready");
            // The marker holds the pins it was made with: a changed pin list remakes it.
            if std::fs::read_to_string(&ready).ok().as_deref() != Some(PYTHON_REQUIREMENTS) {
                let _ = std::fs::remove_dir_all(&venv);
                let ok = Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&venv)
                    .status()
                    .is_ok_and(|s| s.success())
                    && Command::new(&python)
                        .args(["-m", "pip", "install", "-q"])
                        .args(PYTHON_REQUIREMENTS.split_whitespace())
                        .status()
                        .is_ok_and(|s| s.success());
                assert!(
                    ok,
                    "cannot make a venv with {PYTHON_REQUIREMENTS:?} in {}",
                    venv.display()
                );
                std::fs::write(&ready, PYTHON_REQUIREMENTS).unwrap();
            }
            python
        })
        .clone()
}

/// A real Prometheus scraping `target` every second, killed on drop.
pub struct Prometheus {
    child: std::process::Child,
    pub addr: String,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus (its files in `dir`) and waits until it has seen `target` up.
    pub fn scraping(dir: &Path, target: &str) -> Prometheus {
        assert!(
            Path::new("/usr/bin/prometheus").exists(),
            "/usr/bin/prometheus is missing: apt-get install prometheus (tests/run does)"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: steward\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let log = dir.join("prometheus.log");
        let child = dies_with_test(&mut Command::new("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, addr, log };
        wait_for(
            "Prometheus to see the target up",
            Duration::from_secs(60),
            || p.value("up{job=\"steward\"}").as_deref() == Some("1"),
        );
        p
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The result of an instant query, as Prometheus's JSON.
    pub fn query(&self, query: &str) -> Value {
        let q: String = query
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let Ok(mut conn) = std::net::TcpStream::connect(&self.addr) else {
            return Value::Null;
        };
        use std::io::{Read, Write};
        let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
        let head = format!(
            // HTTP/1.0: the answer comes whole, never chunked.
            "GET /api/v1/query?query={q} HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.addr
        );
        if conn.write_all(head.as_bytes()).is_err() {
            return Value::Null;
        }
        let mut raw = String::new();
        let _ = conn.read_to_string(&mut raw);
        let Some((head, body)) = raw.split_once("\r\n\r\n") else {
            return Value::Null;
        };
        if head.split_whitespace().nth(1) != Some("200") {
            return Value::Null;
        }
        serde_json::from_str(body).unwrap_or(Value::Null)
    }

    /// The value of the query's one series, if Prometheus has it.
    pub fn value(&self, query: &str) -> Option<String> {
        self.query(query)["data"]["result"][0]["value"][1]
            .as_str()
            .map(String::from)
    }
}

/// `promtool check metrics` on `text`: what it objected to, if anything.
pub fn promtool_objection(text: &str) -> Option<String> {
    use std::io::Write;
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs (tests/run installs it)");
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    (!out.status.success()).then(|| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
