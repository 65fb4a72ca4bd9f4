//! Hostile clients: slow headers cut off, hundreds of connections held with few descriptors.

use super::*;

/// A webhook workflow and its signed request, for the connection tests.
pub(crate) fn hook_env() -> Env {
    let env = Env::new();
    std::fs::write(
        env.config.join("steward.toml"),
        "webhook_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    env.workflow(
        &Spec::new("hook", QUICK)
            .trigger("webhook = { path = \"/h\", secret_env = \"TEST_HOOK_SECRET\" }")
            .dry(),
    );
    env
}

pub(crate) const HOOK_SECRET: &str = "hook-secret-123";

/// POSTs a correctly signed delivery; the status code.
pub(crate) fn signed_post(addr: &str, body: &str) -> u16 {
    let now = chrono::Utc::now().timestamp();
    let sig = steward::trigger::webhook::sign(HOOK_SECRET.as_bytes(), now, body.as_bytes());
    let Ok(mut conn) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let sent = write!(
        conn,
        "POST /h HTTP/1.1\r\nHost: {addr}\r\nX-Steward-Timestamp: {now}\r\nX-Steward-Signature: {sig}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if sent.is_err() {
        return 0; // closed at once: the listener was at its cap
    }
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The connection tests hold hundreds of sockets each: one at a time, so together they
/// stay well inside this test process's own open-file limit.
pub(crate) static MANY_SOCKETS: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn many_sockets() -> std::sync::MutexGuard<'static, ()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard.min(65536).max(soft), hard);
    }
    MANY_SOCKETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `n` connections that send the start of a request's headers and never finish them.
pub(crate) fn slow_clients(addr: &str, n: usize) -> Vec<std::net::TcpStream> {
    (0..n)
        .filter_map(|_| {
            let mut c = std::net::TcpStream::connect(addr).ok()?;
            let _ = c.write_all(b"POST /h HTTP/1.1\r\nHost: x\r\nX-Slow: ");
            Some(c)
        })
        .collect()
}

#[test]
fn slow_header_clients_are_cut_off_while_a_signed_delivery_is_answered() {
    let _sockets = many_sockets();
    let env = hook_env();
    let _d = env.daemon_env(&[], &[("TEST_HOOK_SECRET", HOOK_SECRET)]);
    let addr = env.webhook_addr();
    let mut slow = slow_clients(&addr, 300);
    assert_eq!(slow.len(), 300);
    let asked = std::time::Instant::now();
    assert_eq!(signed_post(&addr, r#"{"n":1}"#), 202);
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(3), "the delivery took {took:?}");
    // Each slow client is closed by the daemon once its headers are overdue (10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for c in &mut slow {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        c.set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .unwrap();
        let mut buf = [0u8; 512];
        match c.read(&mut buf) {
            Ok(_) => {} // closed (0), or a 408 before closing
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("a slow client was still connected after 60 s: {e}"),
        }
    }
    assert_eq!(env.steward(&["status"]).code, 0);
}

#[test]
fn with_few_file_descriptors_and_400_connections_held_status_answers_and_the_log_stays_small() {
    let _sockets = many_sockets();
    let env = hook_env();
    // Soft and hard limit both 256: steward cannot raise it, so its caps must hold.
    let d = env.daemon_with(&[], &[("TEST_HOOK_SECRET", HOOK_SECRET)], |cmd| {
        // SAFETY: setrlimit is async-signal-safe and touches no shared memory.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 256, 256)
                    .map_err(std::io::Error::from)
            });
        }
    });
    let addr = env.webhook_addr();
    let held = slow_clients(&addr, 400);
    let status = std::time::Instant::now();
    let out = env.steward(&["status"]);
    assert_eq!(out.code, 0, "{out}");
    assert!(
        status.elapsed() < Duration::from_secs(10),
        "{:?}",
        status.elapsed()
    );
    // Another round while they are held: nothing in the daemon spins or floods its log.
    let more = slow_clients(&addr, 200);
    assert_eq!(env.steward(&["status"]).code, 0);
    let size = std::fs::metadata(&d.log).unwrap().len();
    assert!(size < 1 << 20, "the log grew to {size} bytes");
    wait_for("the cap's one log line", Duration::from_secs(10), || {
        d.log_text().contains("(the cap)")
    });
    // Once they let go, deliveries are served again.
    drop((held, more));
    wait_for("a delivery to be served", Duration::from_secs(30), || {
        signed_post(&addr, r#"{"n":2}"#) == 202
    });
}

#[test]
fn a_low_soft_open_file_limit_is_raised_to_the_hard_one() {
    let _sockets = many_sockets();
    let env = hook_env();
    let d = env.daemon_with(&[], &[("TEST_HOOK_SECRET", HOOK_SECRET)], |cmd| {
        // SAFETY: as above.
        unsafe {
            cmd.pre_exec(|| {
                let (_, hard) =
                    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    256.min(hard),
                    hard,
                )
                .map_err(std::io::Error::from)
            });
        }
    });
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    if hard > 256 {
        assert!(
            d.log_text().contains(&format!(
                "soft limit raised from 256 to the hard limit {hard}"
            )),
            "{}",
            d.log_text()
        );
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let soft: u64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(soft, hard, "{line}");
    // As the operator who set `ulimit -Sn 256` would try it: 400 clients held.
    let addr = env.webhook_addr();
    let held = slow_clients(&addr, 400);
    assert_eq!(held.len(), 400);
    assert_eq!(env.steward(&["status"]).code, 0);
    assert_eq!(signed_post(&addr, r#"{"n":3}"#), 202);
    let size = std::fs::metadata(&d.log).unwrap().len();
    assert!(size < 1 << 20, "the log grew to {size} bytes");
}
