//! A dashboard spoken to over raw HTTP/1.1 (so a test can send what a browser never
//! would): one request per connection, and the sign-in a browser makes with the URL's
//! token.

use std::io::{Read, Write};
use std::time::Duration;

use super::Env;

/// An HTTP response as it came off the wire.
pub struct Http {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Http {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Request headers, as sent.
pub type Headers<'a> = [(&'a str, &'a str)];

/// One HTTP/1.1 request on its own connection; `headers` go out as given (Host too).
pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Http {
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to the dashboard");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).expect("read the response");
    parse(&raw)
}

pub fn parse(raw: &[u8]) -> Http {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = unchunk(&body);
    }
    Http {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn unchunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
            .expect("a chunk size");
        if size == 0 {
            break;
        }
        out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
        rest = &rest[eol + 2 + size + 2..];
    }
    out
}

/// The running daemon's dashboard, as `steward dashboard --json` names it.
pub struct Board {
    pub addr: String,
    pub url: String,
    pub token: String,
}

pub fn board(env: &Env) -> Board {
    let out = env.steward(&["dashboard", "--json"]);
    assert_eq!(out.code, 0, "{out}");
    let v = out.json();
    let url = v["url"].as_str().unwrap().to_string();
    let token = url.split("token=").nth(1).unwrap().to_string();
    let on_disk = std::fs::read_to_string(env.state.join("dashboard.token")).unwrap();
    assert_eq!(
        on_disk.trim(),
        token,
        "the URL carries state/dashboard.token"
    );
    Board {
        addr: v["listen"].as_str().unwrap().to_string(),
        url,
        token,
    }
}

impl Board {
    /// The session cookie, got the way a browser gets it: by opening the URL.
    pub fn sign_in(&self) -> String {
        let r = request(
            &self.addr,
            "GET",
            &format!("/?token={}", self.token),
            &[],
            "",
        );
        assert_eq!(r.status, 303, "{}", r.body);
        let cookie = r.header("set-cookie").expect("a Set-Cookie").to_string();
        cookie.split(';').next().unwrap().to_string()
    }

    pub fn get(&self, cookie: &str, path: &str) -> Http {
        request(&self.addr, "GET", path, &[("Cookie", cookie)], "")
    }

    /// The CSRF token the page's forms carry.
    pub fn csrf(&self, cookie: &str) -> String {
        let page = self.get(cookie, "/review").body;
        let at = page
            .find("name=\"csrf\" value=\"")
            .expect("a form with a CSRF token")
            + "name=\"csrf\" value=\"".len();
        page[at..at + 64].to_string()
    }
}
