//! A real `steward daemon` per test, dying with the test that started it.

use super::*;

/// A real `steward daemon` child process; killed (SIGKILL) on drop if still running, so
/// a test that fails or panics leaves none behind (and [`dies_with_test`] covers a test
/// process that is killed outright).
pub struct Daemon {
    pub child: Option<std::process::Child>,
    pub log: PathBuf,
}

/// Makes the process `cmd` starts die with the test that started it: the kernel sends it
/// SIGKILL when the spawning thread ends (each test runs on a thread of its own, which
/// ends when the test does: passed, failed or panicked) or the test process is killed.
/// For daemons, which would otherwise outlive a killed test holding its state and ports.
pub fn dies_with_test(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the hook runs between fork and exec and makes only two system calls
    // (prctl, getppid), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            // The test may have died before the line above took hold.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    }
}

impl Env {
    /// Starts the daemon and waits until it answers `status`.
    pub fn daemon(&self, extra: &[&str]) -> Daemon {
        self.daemon_env(extra, &[])
    }

    pub fn daemon_env(&self, extra: &[&str], vars: &[(&str, &str)]) -> Daemon {
        self.daemon_with(extra, vars, |_| {})
    }

    /// [`Env::daemon_env`], with `configure` applied to the command before it starts.
    pub fn daemon_with(
        &self,
        extra: &[&str],
        vars: &[(&str, &str)],
        configure: impl FnOnce(&mut Command),
    ) -> Daemon {
        let log = self.path(&format!(
            "daemon-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let file = std::fs::File::create(&log).unwrap();
        let mut args = vec!["daemon"];
        args.extend_from_slice(extra);
        let mut cmd = self.command(&args);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        configure(&mut cmd);
        let child = dies_with_test(&mut cmd)
            .env("STEWARD_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn daemon");
        let mut d = Daemon {
            child: Some(child),
            log,
        };
        let sock = self.state.join("steward.sock");
        wait_for(
            "the daemon to answer status",
            Duration::from_secs(15),
            || {
                if let Some(status) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    panic!("daemon exited early ({status}):\n{}", d.log_text());
                }
                sock.exists() && self.steward(&["status"]).code == 0
            },
        );
        d
    }
}

impl Daemon {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(-1)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).expect("signal daemon");
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait for exit (panics after `limit`); returns the exit status.
    pub fn stop(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let mut child = self.child.take().expect("daemon running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("daemon did not stop within {limit:?}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs with this trigger, in the order they started.
pub fn runs_of(env: &Env, workflow: &str) -> Vec<Value> {
    let out = env.steward(&["runs", "--workflow", workflow, "-n", "100000", "--json"]);
    assert_eq!(out.code, 0, "{out}");
    let mut runs: Vec<Value> = out.json().as_array().cloned().unwrap_or_default();
    runs.reverse();
    runs
}

/// A small SMTP server on loopback speaking the real protocol over TCP; `reject` lists
/// recipients answered with 550. Each accepted message is (recipients, data).
/// Messages received: (recipients, data).
pub type Mailbox = std::sync::Arc<std::sync::Mutex<Vec<(Vec<String>, String)>>>;
