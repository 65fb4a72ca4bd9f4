//! Makers confined by the kernel (Landlock), tried as a hostile maker would inside a dry
//! run under a real daemon: write the state folder, the config folder, `$HOME` and another
//! run's scratch folder; read a secret in the state folder; connect to a loopback server on
//! a port not allowed; signal the daemon and a process outside the run; command the daemon
//! through its socket. Every attempt
//! fails inside the maker and leaves the daemon and the files untouched. The same maker
//! with the sandbox widened succeeds at each, so the denials are the sandbox's, not a
//! broken setup.
//!
//! Needs Landlock with TCP rules and scoping (ABI 6+); on a kernel without it the test
//! says so and checks only that the run record says what is missing.

mod util;

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use util::{Env, Spec};

/// Each attempt prints `NAME=ok` or `NAME=denied` on stderr, a denial followed by what
/// the attempt itself said (the kernel's error, as its program reports it).
const HOSTILE: &str = r#"cat >/dev/null
try() {
  name=$1; shift
  if err=$("$@" 2>&1 >/dev/null); then echo "$name=ok" >&2
  else echo "$name=denied" >&2; echo "$name said: $err" >&2; fi
}
try write-state sh -c 'echo owned > "$STEWARD_STATE_DIR/owned"'
try write-config sh -c 'echo owned > "$STEWARD_CONFIG_DIR/owned"'
try write-home sh -c 'echo owned > "$HOME/owned"'
try write-other-run sh -c 'echo owned > "$OTHER_SCRATCH/owned"'
try read-secret sh -c 'cat "$STEWARD_STATE_DIR/secret.txt" > "$STEWARD_SCRATCH/stolen"'
try connect bash -c 'echo hello > /dev/tcp/127.0.0.1/$PORT'
try signal-other kill -TERM "$DECOY"
try signal-daemon kill -0 "$PPID"
try control-socket /usr/bin/python3 -c 'import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["STEWARD_STATE_DIR"] + "/steward.sock")
s.sendall(b"{\"protocol\": 1, \"request\": \"status\"}\n")
reply = s.recv(65536)
sys.exit(1 if not reply or b"refused" in reply else 0)'
try write-scratch sh -c 'echo mine > "$STEWARD_SCRATCH/mine" && echo tmp > "$TMPDIR/t"'
echo '{"done": true}'
"#;

struct Setup {
    env: Env,
    home: std::path::PathBuf,
    other: std::path::PathBuf,
    port: u16,
    accepted: Arc<AtomicUsize>,
    decoy: std::process::Child,
}

fn setup(sandbox: &str) -> Setup {
    let env = Env::new();
    let home = env.path("home");
    std::fs::create_dir_all(&home).unwrap();
    let other = env.state.join("scratch/20261203T000000000-other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(env.state.join("secret.txt"), "hunter2").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            let _ = stream.read(&mut [0u8; 64]);
        }
    });
    let decoy = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let tables = sandbox
        .replace("@STATE", &env.state.to_string_lossy())
        .replace("@CONFIG", &env.config.to_string_lossy())
        .replace("@HOME", &home.to_string_lossy())
        .replace("@OTHER", &other.to_string_lossy())
        .replace("@PORT", &port.to_string());
    let spec = Spec::new("hostile", HOSTILE)
        .dry()
        .env(&format!(
            "OTHER_SCRATCH = \"{}\"\nPORT = \"{port}\"\nDECOY = \"{}\"\n",
            other.display(),
            decoy.id()
        ))
        .tables(&tables);
    env.workflow(&spec);
    Setup {
        env,
        home,
        other,
        port,
        accepted,
        decoy,
    }
}

/// Runs the hostile maker through a daemon; returns its attempts and the run record.
fn attempt(
    s: &mut Setup,
) -> (
    std::collections::BTreeMap<String, String>,
    serde_json::Value,
) {
    let home = s.home.to_string_lossy().to_string();
    let daemon = s.env.daemon_env(&[], &[("HOME", &home)]);
    let run = s.env.steward(&["run", "hostile", "--json"]);
    assert_eq!(run.code, 0, "{run}");
    let rec = run.json();
    assert_eq!(rec["dry_run"], true, "{run}");
    let attempts = util::attempts(rec["stderr"]["run"].as_str().unwrap_or(""));
    // The daemon is untouched: alive and answering.
    assert!(!util::process_gone(daemon.pid()), "the daemon died");
    assert_eq!(s.env.steward(&["status"]).code, 0);
    let _ = s.port;
    (attempts, rec)
}

fn full_landlock() -> bool {
    steward::sandbox::Support::current().abi >= 6
}

#[test]
fn a_confined_maker_is_denied_every_escape_and_the_daemon_is_untouched() {
    let mut s = setup("[sandbox]\nenabled = true\n");
    let (attempts, rec) = attempt(&mut s);
    if !full_landlock() {
        eprintln!("this kernel lacks Landlock ABI 6: checking only that the record says so");
        assert!(
            rec["sandbox"].as_str().unwrap_or("").contains("partial")
                || rec["sandbox"].as_str().unwrap_or("").contains("off")
        );
        return;
    }
    let confined = rec["sandbox"].as_str().unwrap_or_default();
    assert!(
        confined.starts_with("full; no network; no UDP, raw or packet sockets; "),
        "{rec}"
    );
    for name in [
        "write-state",
        "write-config",
        "write-home",
        "write-other-run",
        "read-secret",
        "connect",
        "signal-other",
        "signal-daemon",
        "control-socket",
    ] {
        assert_eq!(
            attempts.get(name).map(String::as_str),
            Some("denied"),
            "{name}: {attempts:?}"
        );
    }
    assert_eq!(
        attempts.get("write-scratch").map(String::as_str),
        Some("ok"),
        "{attempts:?}"
    );
    // The record says what was denied, in the kernel's words as each program reports them.
    let stderr = rec["stderr"]["run"].as_str().unwrap_or("");
    for (name, kernel_says) in [
        ("write-state", "Permission denied"),
        ("write-config", "Permission denied"),
        ("write-home", "Permission denied"),
        ("write-other-run", "Permission denied"),
        ("read-secret", "Permission denied"),
        ("connect", "Permission denied"),
        ("signal-other", "Operation not permitted"),
        ("signal-daemon", "Operation not permitted"),
    ] {
        let said = stderr
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} said: ")))
            .unwrap_or_else(|| panic!("no word from {name} in {stderr}"));
        assert!(said.contains(kernel_says), "{name}: {said:?}");
    }
    for file in [
        s.env.state.join("owned"),
        s.env.config.join("owned"),
        s.home.join("owned"),
        s.other.join("owned"),
    ] {
        assert!(!file.exists(), "{} was written", file.display());
    }
    assert_eq!(
        s.accepted.load(Ordering::SeqCst),
        0,
        "the server was reached"
    );
    assert!(
        s.decoy.try_wait().unwrap().is_none(),
        "the decoy was signalled"
    );
    assert!(
        !s.env
            .state
            .join("scratch")
            .join(rec["run_id"].as_str().unwrap())
            .exists(),
        "scratch folder left behind"
    );
    let _ = s.decoy.kill();
}

#[test]
fn the_same_maker_widened_succeeds_at_each() {
    let mut s = setup(
        "[sandbox]\nenabled = true\nread = [\"@STATE\"]\nwrite = [\"@STATE\", \"@CONFIG\", \"@HOME\", \"@OTHER\"]\nnet = [\"tcp:@PORT\"]\n",
    );
    let (attempts, rec) = attempt(&mut s);
    if !full_landlock() {
        eprintln!("this kernel lacks Landlock ABI 6: nothing to widen");
        return;
    }
    let confined = rec["sandbox"].as_str().unwrap_or_default();
    assert!(
        confined.starts_with(&format!(
            "full; TCP to port {} only; UDP allowed (name resolution); no raw or packet sockets; ",
            s.port
        )),
        "{rec}"
    );
    for name in [
        "write-state",
        "write-config",
        "write-home",
        "write-other-run",
        "read-secret",
        "connect",
        "write-scratch",
    ] {
        assert_eq!(
            attempts.get(name).map(String::as_str),
            Some("ok"),
            "{name}: {attempts:?}"
        );
    }
    // Signals stay scoped to the run's own processes, however wide the rest is.
    // ... and the daemon's socket refuses a confined step, however wide the rest is.
    assert_eq!(
        attempts.get("signal-other").map(String::as_str),
        Some("denied")
    );
    assert_eq!(
        attempts.get("control-socket").map(String::as_str),
        Some("denied"),
        "{attempts:?}"
    );
    util::wait_for(
        "the connection to be counted",
        std::time::Duration::from_secs(5),
        || s.accepted.load(Ordering::SeqCst) == 1,
    );
    let _ = s.decoy.kill();
}

#[test]
fn with_the_sandbox_off_a_maker_can_signal_outside_its_run() {
    let mut s = setup("[sandbox]\nenabled = false\n");
    let (attempts, rec) = attempt(&mut s);
    assert_eq!(rec["sandbox"], "off", "{rec}");
    assert_eq!(
        attempts.get("signal-other").map(String::as_str),
        Some("ok"),
        "{attempts:?}"
    );
    assert_eq!(
        attempts.get("control-socket").map(String::as_str),
        Some("ok"),
        "{attempts:?}"
    );
    util::wait_for(
        "the decoy to die",
        std::time::Duration::from_secs(5),
        || s.decoy.try_wait().unwrap().is_some(),
    );
}

/// On a kernel without TCP rules (ABI 3, as `STEWARD_SANDBOX_ABI=3` makes steward act) the
/// run says its sandbox is partial, and `require = true` refuses to run the maker at all.
#[test]
fn a_kernel_without_tcp_rules_gives_a_partial_sandbox_and_require_refuses() {
    let env = Env::new();
    env.workflow(
        &Spec::new("partial", "cat >/dev/null\necho '{}'\n")
            .dry()
            .tables("[sandbox]\nenabled = true\n"),
    );
    env.workflow(
        &Spec::new(
            "strict",
            "cat >/dev/null\necho ran > \"$STEWARD_SCRATCH/ran\"\necho '{}'\n",
        )
        .dry()
        .tables("[sandbox]\nenabled = true\nrequire = true\n"),
    );
    let old = [("STEWARD_SANDBOX_ABI", "3")];
    let run = env.steward_env(&["run", "partial", "--json"], &old);
    assert_eq!(run.code, 0, "{run}");
    assert_eq!(
        run.json()["sandbox"],
        "partial (no TCP rules, no signal and socket scoping); network not confined (this kernel has no TCP rules); no UDP, raw or packet sockets; no /tmp (its own files are under /tmp, which a private one would hide)",
        "{run}"
    );
    let run = env.steward_env(&["run", "strict", "--json"], &old);
    let rec = run.json();
    assert_eq!(rec["state"], "failed", "{run}");
    assert!(
        rec["reason"]
            .as_str()
            .unwrap_or("")
            .contains("sandbox: required, but this kernel has no TCP rules"),
        "{run}"
    );
    // The maker never started: its step ended in the refusal.
    let steps = env.runlog_for(rec["run_id"].as_str().unwrap());
    assert!(
        steps
            .iter()
            .any(|e| e["step"] == "run" && e["status"] == "error"),
        "{run}"
    );
    assert!(
        !steps
            .iter()
            .any(|e| e["step"] == "run" && e["status"] == "ok"),
        "{run}"
    );
    let daemon = env.daemon_env(&[], &old);
    // Said once the daemon is ready, which can be just after its socket answers.
    let said = "sandbox: Landlock ABI 3 (filesystem, partial: no TCP rules";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !daemon.log_text().contains(said) {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            daemon.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A maker that forks 40 sleepers and allocates 200 MiB: with `pids_max = 20` its forks
/// past the cap fail inside it, and with `memory_max = "64M"` the kernel kills the
/// allocation and the run ends exhausted (memory). Without the caps the same maker does
/// both. Where this machine offers no memory or pids controller, the run says so.
#[test]
fn pids_max_and_memory_max_hold_and_a_breach_ends_exhausted_memory() {
    const HOG: &str = r#"import os, sys, time
kids = []
for i in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    kids.append(pid)
print(f"forks={len(kids)}", file=sys.stderr)
for k in kids:
    os.kill(k, 9)
    os.waitpid(k, 0)
b = bytearray(200 * 1024 * 1024)
print(len(b), file=sys.stderr)
print("{}")
"#;
    let hog = "cat >/dev/null\nexec /usr/bin/python3 \"$(dirname \"$0\")/hog.py\"\n";
    let env = Env::new();
    std::fs::write(env.config.join("scripts/hog.py"), HOG).unwrap();
    let budget = format!(
        "{}memory_max = \"64M\"\npids_max = 20\ncpu_weight = 50\n",
        util::BUDGET
    );
    env.workflow(&Spec::new("capped", hog).dry().budget(&budget));
    env.workflow(&Spec::new("free", hog).dry());
    let run = env.steward(&["run", "capped", "--json"]);
    let rec = run.json();
    if !host_mounts_v1_controllers(&["memory", "pids"]) {
        // A host without them: the capped maker is refused, with the reason.
        assert!(
            rec["reason"]
                .as_str()
                .unwrap_or("")
                .contains("cannot hold the [budget] caps"),
            "{run}"
        );
        eprintln!("no memory or pids controller here: {}", rec["reason"]);
        return;
    }
    assert_eq!(rec["state"], "exhausted", "{run}");
    assert_eq!(rec["breach"], "memory 64MiB/64MiB", "{run}");
    let stderr = rec["stderr"]["run"].as_str().unwrap_or("");
    let forks: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("forks="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no fork count in {stderr:?}"));
    assert!(forks < 20, "forks past pids_max succeeded: {forks}");
    assert!(
        !stderr.contains("209715200"),
        "the allocation succeeded: {stderr}"
    );

    let run = env.steward(&["run", "free", "--json"]);
    let rec = run.json();
    assert_eq!(rec["state"], "success", "{run}");
    let stderr = rec["stderr"]["run"].as_str().unwrap_or("");
    assert!(
        stderr.contains("forks=40") && stderr.contains("209715200"),
        "{stderr}"
    );
}

/// Whether this host mounts cgroup v1 hierarchies for all of `controllers` (read from
/// mountinfo here, not from steward), the only caps steward holds so far.
fn host_mounts_v1_controllers(controllers: &[&str]) -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    controllers.iter().all(|c| {
        mountinfo.lines().any(|line| {
            line.split_once(" - cgroup ")
                .is_some_and(|(_, rest)| rest.split([' ', ',']).any(|o| o == *c))
        })
    })
}
