//! The four ways out of the sandbox an operator found (issue 27), tried by a maker in
//! shell and perl under a real daemon: send a UDP datagram with no network granted, read
//! a file of the state folder that sits beneath its own program's folder, read
//! `/etc/shadow`'s entries as root (masked empty in the step's mount namespace, or denied
//! by Landlock where it has none), write outside its scratch folder. Each fails. The same maker
//! can write `/tmp/x` — its own private `/tmp`, gone when the run ends and unseen by the
//! next run — and with `net = "any"` it can send UDP, so the denials are the sandbox's.
//!
//! The test folder is made outside `/tmp` (in `/var/tmp`), as a private `/tmp` hides the
//! host's, so steward gives none to a step whose own files are there.

mod util;

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

const MAKER: &str = r#"#!/bin/sh
cat >/dev/null
try() {
  name=$1; shift
  if err=$("$@" 2>&1 >/dev/null); then echo "$name=ok" >&2
  else echo "$name=denied" >&2; echo "$name said: $err" >&2; fi
}
try udp perl -MIO::Socket::INET -e '
  my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1", PeerPort => $ENV{UDP_PORT}, Proto => "udp")
    or die "socket: $!\n";
  $s->send("escaped") or die "send: $!\n"'
try read-state cat "$STATE_BELOW/secret.txt"
try read-shadow sh -c 'grep -q : /etc/shadow'   # denied, or masked empty
try read-passwd cat /etc/passwd
try write-outside sh -c 'echo owned > "$OUTSIDE/owned"'
try tmp-fresh test ! -e /tmp/x
try tmp-write sh -c 'echo "$STEWARD_RUN_ID" > /tmp/x && test "$(cat /tmp/x)" = "$STEWARD_RUN_ID"'
try read-late-key grep -q . /etc/ssh/ssh_host_stewardtest_key
try see-late-mount test -e "$LATE/fresh"
echo '{"done": true}'
"#;

struct Layout {
    _dir: tempfile::TempDir,
    base: PathBuf,
    config: PathBuf,
    state: PathBuf,
    outside: PathBuf,
    /// Granted for reading; a mount is made over it while the daemon runs.
    late: PathBuf,
}

/// BASE/maker.sh is the program, BASE/state the state folder beneath its folder.
fn layout(net: &str, udp_port: u16) -> Layout {
    // Outside /tmp wherever the checkout is: /var/tmp where it can be written.
    let dir = tempfile::tempdir_in("/var/tmp")
        .or_else(|_| tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")))
        .unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let config = base.join("config");
    let state = base.join("state");
    let outside = base.join("outside");
    let late = base.join("late");
    for d in [
        config.join("workflows"),
        state.clone(),
        outside.clone(),
        late.clone(),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(state.join("secret.txt"), "hunter2").unwrap();
    let maker = base.join("maker.sh");
    std::fs::write(&maker, MAKER).unwrap();
    let verify = base.join("verify.sh");
    std::fs::write(&verify, "#!/bin/sh\ncat >/dev/null\necho pass\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    for f in [&maker, &verify] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        config.join("workflows/escape.toml"),
        format!(
            r#"id = "escape"
dry_run = true
[trigger]
manual = true
[budget]
max_tokens = 1000
max_tool_calls = 5
max_runtime_s = 30
max_cost_usd = 1.0
[run]
command = ["{maker}"]
[verify]
command = ["{verify}"]
[env]
UDP_PORT = "{udp_port}"
STATE_BELOW = "{state}"
OUTSIDE = "{outside}"
LATE = "{late}"
[sandbox]
net = {net}
read = ["{late}"]
"#,
            maker = maker.display(),
            verify = verify.display(),
            state = state.display(),
            outside = outside.display(),
            late = late.display(),
        ),
    )
    .unwrap();
    Layout {
        _dir: dir,
        base,
        config,
        state,
        outside,
        late,
    }
}

fn steward(l: &Layout, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(args)
        .env("STEWARD_CONFIG", &l.config)
        .env("STEWARD_STATE", &l.state)
        .env("STEWARD_DASHBOARD_LISTEN", "127.0.0.1:0")
        .env_remove("STEWARD_LOG")
        .output()
        .unwrap()
}

struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a confined step gets its mount namespace, if any.
#[derive(Clone, Copy, PartialEq)]
enum Road {
    /// Made ahead by the daemon's pool, joined by the step (the usual road).
    MadeAhead,
    /// Made by the step's child itself, which installs its socket filter itself too (the
    /// pool is empty, or turned off as here).
    MadeInChild,
    /// None (as where the kernel refuses steward one).
    NoNamespace,
}

fn daemon(l: &Layout, road: Road) -> Daemon {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_steward"));
    match road {
        Road::MadeAhead => {}
        Road::MadeInChild => {
            cmd.env("STEWARD_SANDBOX_POOL", "0");
        }
        Road::NoNamespace => {
            cmd.env("STEWARD_SANDBOX_NAMESPACE", "0");
        }
    }
    cmd.arg("daemon")
        .env("STEWARD_CONFIG", &l.config)
        .env("STEWARD_STATE", &l.state)
        .env("STEWARD_DASHBOARD_LISTEN", "127.0.0.1:0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let d = Daemon(util::dies_with_test(&mut cmd).spawn().unwrap());
    util::wait_for("the daemon to answer", Duration::from_secs(15), || {
        steward(l, &["status"]).status.success()
    });
    d
}

/// One run through the daemon: its record and each attempt's `ok` or `denied`.
fn run(l: &Layout) -> (Value, BTreeMap<String, String>) {
    let out = steward(l, &["run", "escape", "--json"]);
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no record ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let attempts = util::attempts(rec["stderr"]["run"].as_str().unwrap_or(""));
    (rec, attempts)
}

/// The names of the daemon's threads.
fn threads(d: &Daemon) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{}/task", d.0.id()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}

fn listener() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s
}

fn received(s: &UdpSocket) -> Option<String> {
    let mut buf = [0u8; 64];
    s.recv(&mut buf)
        .ok()
        .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn landlock_and_seccomp() -> bool {
    steward::sandbox::Support::current().abi >= 1
}

#[test]
fn no_udp_no_state_below_the_program_no_shadow_no_write_outside_and_a_private_tmp() {
    escapes_fail(Road::MadeAhead);
}

/// The same where the step's child makes its namespace itself.
#[test]
fn the_same_in_a_namespace_the_child_makes_itself() {
    escapes_fail(Road::MadeInChild);
}

/// The other road: no mount namespace (as where the kernel refuses steward one). The
/// secrets are fenced off by a Landlock layer instead of masked, and there is no /tmp.
#[test]
fn without_a_mount_namespace_the_secrets_are_fenced_off_and_tmp_is_denied() {
    escapes_fail(Road::NoNamespace);
}

fn escapes_fail(road: Road) {
    let namespace = road != Road::NoNamespace;
    if !landlock_and_seccomp() {
        eprintln!("this kernel has no Landlock: nothing to test here");
        return;
    }
    let udp = listener();
    let l = layout("\"none\"", udp.local_addr().unwrap().port());
    let d = daemon(&l, road);

    // validate says the program is granted alone, and why.
    let check = steward(&l, &["validate"]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        said.contains(&format!(
            "maker.sh lives in a folder that holds the state folder {}: the sandbox grants the program file alone",
            l.state.display()
        )),
        "{said}"
    );

    let (rec, attempts) = run(&l);
    assert_eq!(rec["state"], "success", "{rec:#}");
    let record = rec["sandbox"].as_str().unwrap_or_default();
    assert!(record.contains("no UDP, raw or packet sockets"), "{record}");
    let want = |name: &str, what: &str| {
        assert_eq!(
            attempts.get(name).map(String::as_str),
            Some(what),
            "{name}: {}",
            rec["stderr"]["run"]
        )
    };
    want("udp", "denied");
    assert_eq!(received(&udp), None, "a datagram got out");
    // The road taken: the daemon's threads that make namespaces ahead and that carry the
    // socket filter (used where steps are cloned into cgroups) exist unless turned off.
    let threads = threads(&d);
    let cloned_into_cgroups = matches!(
        steward::containment::current(),
        steward::containment::Containment::Cgroup(_)
    );
    let supported = steward::sandbox::tmp::supported().is_ok();
    assert_eq!(
        threads.contains("steward-mntns"),
        road == Road::MadeAhead && supported,
        "{threads:?}"
    );
    assert_eq!(
        threads.contains("steward-seccomp"),
        road != Road::MadeInChild && cloned_into_cgroups,
        "{threads:?}"
    );
    want("read-state", "denied");
    want("write-outside", "denied");
    assert!(!l.outside.join("owned").exists());
    want("read-passwd", "ok");
    if nix::unistd::geteuid().is_root() {
        want("read-shadow", "denied");
    }
    let private_tmp = match steward::sandbox::tmp::supported() {
        Err(why) => Err(why.to_string()),
        Ok(()) if !namespace => Err("turned off".to_string()),
        Ok(()) if l.base.starts_with("/tmp") => Err("the test folder is under /tmp".to_string()),
        Ok(()) => Ok(()),
    };
    match private_tmp {
        Ok(()) => {
            assert!(record.contains("private /tmp"), "{record}");
            want("tmp-fresh", "ok");
            want("tmp-write", "ok");
            // The host's /tmp never saw it, and the run's scratch folder is gone.
            let id = rec["run_id"].as_str().unwrap();
            assert_ne!(
                std::fs::read_to_string("/tmp/x").unwrap_or_default().trim(),
                id
            );
            assert!(!l.state.join("scratch").join(id).exists());
            // The next run starts with an empty /tmp of its own.
            let (_, again) = run(&l);
            assert_eq!(again.get("tmp-fresh").map(String::as_str), Some("ok"));
        }
        Err(why) => {
            assert!(record.contains("no /tmp"), "{record} ({why})");
            want("tmp-write", "denied");
        }
    }
}

/// Namespaces made ahead are copies of the host's mounts at the time, with the secrets
/// of the time masked. A mount made, or an SSH host key written, once the daemon runs is
/// seen as it is by the next step: the mount is there, the key masked.
#[test]
fn a_mount_or_a_secret_made_after_the_start_is_seen_by_the_next_step() {
    let root = nix::unistd::geteuid().is_root();
    if !landlock_and_seccomp() || !root || steward::sandbox::tmp::supported().is_err() {
        eprintln!("needs root, Landlock and a mount namespace: nothing to test here");
        return;
    }
    let l = layout("\"none\"", listener().local_addr().unwrap().port());
    let _d = daemon(&l, Road::MadeAhead);
    let (rec, before) = run(&l);
    assert_eq!(rec["state"], "success", "{rec:#}");
    assert_eq!(
        before.get("see-late-mount").map(String::as_str),
        Some("denied")
    );

    // Each change alone, so each is seen for itself.
    let mut late = Late::mount(&l);
    let (rec, after) = run(&l);
    assert_eq!(
        after.get("see-late-mount").map(String::as_str),
        Some("ok"),
        "{}",
        rec["stderr"]["run"]
    );
    late.write_key();
    let (rec, after) = run(&l);
    assert_eq!(
        after.get("read-late-key").map(String::as_str),
        Some("denied"),
        "{}",
        rec["stderr"]["run"]
    );
}

/// A tmpfs over the layout's `late` folder with a file in it, and a new SSH host key;
/// both undone when dropped.
struct Late {
    mount: PathBuf,
    key: PathBuf,
    /// /etc/ssh, when it was made here.
    made_ssh: Option<PathBuf>,
}

impl Late {
    fn mount(l: &Layout) -> Late {
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "steward-test", &l.late.display().to_string()])
            .status()
            .unwrap();
        assert!(mounted.success());
        std::fs::write(l.late.join("fresh"), "made after the start").unwrap();
        Late {
            mount: l.late.clone(),
            key: PathBuf::from("/etc/ssh/ssh_host_stewardtest_key"),
            made_ssh: None,
        }
    }

    fn write_key(&mut self) {
        let ssh = self.key.parent().unwrap().to_path_buf();
        if !ssh.exists() {
            std::fs::create_dir(&ssh).unwrap();
            self.made_ssh = Some(ssh);
        }
        std::fs::write(&self.key, "-----BEGIN OPENSSH PRIVATE KEY-----\n").unwrap();
    }
}

impl Drop for Late {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
        let _ = std::fs::remove_file(&self.key);
        if let Some(ssh) = &self.made_ssh {
            let _ = std::fs::remove_dir(ssh);
        }
    }
}

#[test]
fn with_net_any_the_same_maker_can_send_udp() {
    if !landlock_and_seccomp() {
        return;
    }
    let udp = listener();
    let l = layout("\"any\"", udp.local_addr().unwrap().port());
    let _d = daemon(&l, Road::MadeAhead);
    let (rec, attempts) = run(&l);
    assert_eq!(
        attempts.get("udp").map(String::as_str),
        Some("ok"),
        "{rec:#}"
    );
    assert_eq!(received(&udp).as_deref(), Some("escaped"));
    // Still no state below the program, nor anything outside its scratch folder.
    assert_eq!(
        attempts.get("read-state").map(String::as_str),
        Some("denied")
    );
    assert_eq!(
        attempts.get("write-outside").map(String::as_str),
        Some("denied")
    );
}
