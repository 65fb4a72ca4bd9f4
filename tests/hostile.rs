//! Hostile input: names that try to climb out of their folders, symlinks in watched
//! folders, 100 MB file drops and webhook bodies, header injection through feed titles,
//! and a control-socket client of another user. Each gets a clear refusal or bounded,
//! correct handling, and the daemon keeps running.

mod util;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use util::{hwm_kib, runs_of, wait_for, Env, Spec};

const QUICK: &str = "cat >/dev/null\necho '{\"ok\": true}'\n";
const HUNDRED_MB: usize = 100 << 20;

/// Every file under `dir`, recursively (to prove nothing was written outside a folder).
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn names_that_climb_out_of_their_folders_are_refused_everywhere() {
    let env = Env::new();
    // The example config: a real agency and agent, so only the bad id can be refused.
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/."))
        .arg(&env.config)
        .status()
        .unwrap();
    assert!(copied.success());
    // Every file outside the state folder (config/ included: `new ../x` would land there).
    let outside_state = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = files_under(env.dir.path())
            .into_iter()
            .filter(|p| !p.starts_with(&env.state))
            .collect();
        v.sort();
        v
    };
    let before = outside_state();
    // (A NUL cannot travel in argv; the config cases below carry one.)
    let bad_names = ["../escape", "/tmp/abs", "a/../../b", ".."];
    for bad in bad_names {
        // Queue names.
        let refused = |args: &[&str], says: &str| {
            let out = env.steward(args);
            assert!(
                out.code != 0 && out.stderr.contains(says),
                "{args:?} must be refused saying `{says}`:\n{out}"
            );
        };
        refused(
            &["enqueue", bad, "--payload", "{}"],
            "is not a valid queue name",
        );
        refused(&["new", bad], "is not a valid workflow id");
        refused(
            &["case", "open", "--agency", "docs-team", "--case", bad],
            "is not allowed",
        );
        // Agent names are looked up among the loaded ones, never used as a path.
        refused(&["digest", bad], "no digest agent named");
    }
    // Nothing was created anywhere but in the state folder.
    assert_eq!(outside_state(), before, "files appeared outside state/");
    assert!(!Path::new("/tmp/abs").exists());

    // The same names in config files: validation names the file and the field.
    for (file, text, field) in [
        (
            "workflows/a.toml",
            "id = \"../a\"\n[trigger]\nmanual = true\n[run]\ncommand = [\"true\"]\n[verify]\ncommand = [\"true\"]\n",
            "id",
        ),
        (
            "workflows/b.toml",
            "id = \"b\"\n[trigger]\nqueue = \"../../etc\"\n[run]\ncommand = [\"true\"]\n[verify]\ncommand = [\"true\"]\n",
            "queue",
        ),
        (
            "workflows/d.toml",
            "id = \"d\\u0000x\"\n[trigger]\nqueue = \"q\\u0000\"\n[run]\ncommand = [\"true\"]\n[verify]\ncommand = [\"true\"]\n",
            "id",
        ),
        (
            "agents/c.toml",
            "agent_name = \"../c\"\ncadence = \"daily\"\n[source_filter]\ntopic_tags = [\"x\"]\n",
            "agent_name",
        ),
    ] {
        let path = env.config.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        let out = env.steward(&["validate"]);
        assert_ne!(out.code, 0, "{file}:\n{out}");
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(
            all.contains(file.rsplit('/').next().unwrap()) && all.contains(field),
            "{file}: the error names the file and `{field}`:\n{out}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_bad_queue_item_is_set_aside_with_its_reason_and_the_next_one_runs() {
    let env = Env::new();
    env.live_workflow(&Spec::new("q", QUICK).trigger("queue = \"jobs\""));
    let spool = env.state.join("queues/jobs");
    std::fs::create_dir_all(&spool).unwrap();
    // Not JSON, and a name no `steward enqueue` would make.
    std::fs::write(spool.join("0000 -weird ünïcode.json"), b"{\"half\": ").unwrap();
    std::fs::write(spool.join("0001-good.json"), b"{\"n\": 1}").unwrap();
    let _d = env.daemon(&[]);
    wait_for("the good item to commit", Duration::from_secs(15), || {
        env.ledger_lines().len() == 1
    });
    let reason = std::fs::read_to_string(spool.join("rejected/0000 -weird ünïcode.json.reason"))
        .expect("the bad item is set aside with its reason");
    assert!(reason.contains("not JSON"), "{reason}");
    assert_eq!(runs_of(&env, "q").len(), 1);
}

#[test]
fn symlinks_in_a_watched_folder_are_never_followed() {
    let env = Env::new();
    let inbox = env.path("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let secret = env.path("secret.txt");
    std::fs::write(&secret, "do not read").unwrap();
    env.live_workflow(
        &Spec::new("drop", "cat >/dev/null\necho '{\"ok\": true}'\n").trigger(&format!(
            "file = {{ path = \"{}\", pattern = \"*.txt\", debounce_ms = 50 }}",
            inbox.display()
        )),
    );
    let _d = env.daemon(&[]);
    std::os::unix::fs::symlink(&secret, inbox.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(env.path("."), inbox.join("dir.txt")).unwrap();
    // A real file after them: once it has run, the links had their chance.
    std::fs::write(env.path("real.tmp"), "real").unwrap();
    std::fs::rename(env.path("real.tmp"), inbox.join("real.txt")).unwrap();
    wait_for("the real file to run", Duration::from_secs(10), || {
        runs_of(&env, "drop").len() == 1
    });
    let runs = runs_of(&env, "drop");
    assert_eq!(runs[0]["trigger"]["name"], "real.txt", "{runs:?}");
    // The links stay where they were, the target untouched and unclaimed.
    assert!(inbox
        .join("link.txt")
        .symlink_metadata()
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "do not read");
    assert!(files_under(&env.state.join("claimed"))
        .iter()
        .all(|p| !p.ends_with("link.txt")));
}

#[test]
fn a_symlink_in_a_queue_spool_is_not_followed_and_a_non_utf8_file_name_is_reported() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let inbox = env.path("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let secret = env.path("secret.json");
    std::fs::write(&secret, r#"{"stolen": "do not read"}"#).unwrap();
    env.workflow(
        &Spec::new(
            "q",
            "cat > \"$MARKS/ctx-$STEWARD_RUN_ID.json\"\necho '{}'\n",
        )
        .trigger("queue = \"jobs\"")
        .dry(),
    );
    env.workflow(
        &Spec::new("drop", QUICK)
            .trigger(&format!(
                "file = {{ path = \"{}\", pattern = \"*\", debounce_ms = 50 }}",
                inbox.display()
            ))
            .dry(),
    );
    let spool = env.state.join("queues/jobs");
    std::fs::create_dir_all(&spool).unwrap();
    // Sorted first, so the spool meets it before the real item.
    std::os::unix::fs::symlink(&secret, spool.join("0000-link.json")).unwrap();
    let d = env.daemon(&[]);
    std::fs::write(
        inbox.join(std::ffi::OsStr::from_bytes(b"report-\xff.csv")),
        "a,b\n",
    )
    .unwrap();
    assert_eq!(
        env.steward(&["enqueue", "jobs", "--payload", r#"{"real": 1}"#])
            .code,
        0
    );
    wait_for("the real item to run", Duration::from_secs(20), || {
        runs_of(&env, "q").len() == 1
    });
    let runs = runs_of(&env, "q");
    assert_eq!(runs[0]["trigger"]["payload"]["real"], 1, "{runs:#?}");
    for ctx in files_under(env.dir.path()) {
        if ctx
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("ctx-")
        {
            let text = std::fs::read_to_string(&ctx).unwrap();
            assert!(!text.contains("do not read"), "{text}");
        }
    }
    wait_for(
        "the spool's and the folder's warnings",
        Duration::from_secs(10),
        || {
            let log = d.log_text();
            log.contains("0000-link.json") && log.contains("is not UTF-8")
        },
    );
    let log = d.log_text();
    assert_eq!(
        log.matches("a symlink is never followed").count(),
        1,
        "said once, not once per look:\n{log}"
    );
    assert!(
        spool.join("0000-link.json").symlink_metadata().is_ok(),
        "left in place"
    );
    assert!(runs_of(&env, "drop").is_empty());
}

#[test]
fn a_100_mb_file_drop_is_hashed_streaming_with_bounded_memory() {
    let env = Env::new();
    let inbox = env.path("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    env.live_workflow(&Spec::new("big", QUICK).trigger(&format!(
        "file = {{ path = \"{}\", pattern = \"*.bin\", debounce_ms = 50 }}",
        inbox.display()
    )));
    let d = env.daemon(&[]);
    let before = hwm_kib(d.pid());
    let staged = env.path("big.part");
    let mut hasher = Sha256::new();
    {
        let mut f = std::fs::File::create(&staged).unwrap();
        let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        for _ in 0..100 {
            f.write_all(&block).unwrap();
            hasher.update(&block);
        }
    }
    std::fs::rename(&staged, inbox.join("big.bin")).unwrap();
    wait_for("the big file's run to end", Duration::from_secs(60), || {
        runs_of(&env, "big")
            .first()
            .is_some_and(|r| r["state"] != "running")
    });
    let run = &runs_of(&env, "big")[0];
    assert_eq!(run["state"], "success", "{run}");
    assert_eq!(run["trigger"]["size"], HUNDRED_MB as u64);
    assert_eq!(
        run["trigger"]["sha256"],
        hex::encode(hasher.finalize()),
        "{run}"
    );
    let grew = hwm_kib(d.pid()).saturating_sub(before);
    assert!(
        grew < 32 * 1024,
        "the daemon's peak memory grew {grew} KiB for a 100 MB file"
    );
}

#[test]
fn a_100_mb_webhook_body_is_refused_without_being_buffered() {
    let env = hook_env();
    let d = env.daemon_env(&[], &[("TEST_HOOK_SECRET", HOOK_SECRET)]);
    let addr = env.webhook_addr();
    let before = hwm_kib(d.pid());

    // Declared up front: refused before a byte of the body is read.
    let answer = post_streaming(&addr, Some(HUNDRED_MB));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // Chunked, no length: refused once the cap (1 MiB by default) is passed.
    let answer = post_streaming(&addr, None);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    let grew = hwm_kib(d.pid()).saturating_sub(before);
    assert!(
        grew < 32 * 1024,
        "the daemon's peak memory grew {grew} KiB for 100 MB bodies"
    );
    assert!(runs_of(&env, "hook").is_empty());
    assert_eq!(env.steward(&["status"]).code, 0);
}

/// POSTs 100 MB (with a Content-Length, or chunked) and returns the response head; the
/// server may stop reading early, so write errors end the sending, not the test.
fn post_streaming(addr: &str, length: Option<usize>) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let framing = match length {
        Some(n) => format!("Content-Length: {n}"),
        None => "Transfer-Encoding: chunked".to_string(),
    };
    let head = format!(
        "POST /h HTTP/1.1\r\nHost: {addr}\r\nX-Steward-Timestamp: 1\r\nX-Steward-Signature: sha256=00\r\n{framing}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let block = vec![b'x'; 1 << 20];
    for _ in 0..100 {
        let sent = match length {
            Some(_) => s.write_all(&block),
            None => s
                .write_all(format!("{:x}\r\n", block.len()).as_bytes())
                .and_then(|_| s.write_all(&block))
                .and_then(|_| s.write_all(b"\r\n")),
        };
        if sent.is_err() {
            break;
        }
    }
    if length.is_none() {
        let _ = s.write_all(b"0\r\n\r\n");
    }
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn a_feed_title_cannot_inject_mail_headers() {
    let env = Env::new();
    let smtp = util::smtp_server(&[]);
    let feed = env.path("evil.xml");
    std::fs::write(
        &feed,
        "<?xml version=\"1.0\"?><rss version=\"2.0\"><channel><title>evil</title>\
         <item><title>Hello&#13;&#10;Bcc: thief@example.org&#13;&#10;Subject: pwned</title>\
         <link>https://example.org/a</link><guid>a</guid>\
         <pubDate>Tue, 01 Dec 2026 10:00:00 GMT</pubDate>\
         <description>x&#13;&#10;&#13;&#10;Bcc: thief@example.org</description></item>\
         </channel></rss>",
    )
    .unwrap();
    std::fs::write(
        env.config.join("sources.toml"),
        format!(
            "[[source]]\nname = \"evil\"\nkind = \"file\"\npath = \"{}\"\ntopic_tags = [\"t\"]\n",
            feed.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(env.config.join("agents")).unwrap();
    std::fs::write(
        env.config.join("agents/mailer.toml"),
        "agent_name = \"mailer\"\ncadence = \"daily\"\nverify_loadbearing = false\ncurate_findings = false\ndry_run = false\n[source_filter]\ntopic_tags = [\"t\"]\n",
    )
    .unwrap();
    std::fs::write(
        env.config.join("steward.toml"),
        util::smtp_settings(smtp.port),
    )
    .unwrap();
    env.distribution(
        "- ada@example.org
",
    );
    assert_eq!(env.steward(&["go-live", "mailer"]).code, 0);
    let out = env.steward(&["digest", "mailer"]);
    assert_eq!(out.code, 0, "{out}");
    let messages = smtp.messages.lock().unwrap().clone();
    assert_eq!(messages.len(), 1, "{out}");
    let (rcpts, data) = &messages[0];
    assert_eq!(
        rcpts,
        &vec!["ada@example.org".to_string()],
        "no extra recipient"
    );
    let head = data.split("\r\n\r\n").next().unwrap_or_default();
    // No Bcc header (the random MIME boundary may hold the letters "bcc").
    assert!(
        !head.lines().any(|l| l.to_lowercase().starts_with("bcc:")),
        "{head}"
    );
    assert_eq!(
        head.lines()
            .filter(|l| l.to_lowercase().starts_with("subject:"))
            .count(),
        1,
        "{head}"
    );
    assert!(!head.contains("pwned"), "{head}");
    assert!(data.contains("Hello"), "the item is in the body: {data}");
}

#[test]
fn a_control_socket_client_of_another_user_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to start a client as another user");
        return;
    }
    let env = Env::new();
    env.workflow(&Spec::new("w", QUICK).dry());
    let _d = env.daemon(&[]);
    let sock = env.state.join("steward.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is the owner's alone");
    let nobody = |env: &Env| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
            .args(["status", "--state"])
            .arg(&env.state)
            .env_remove("STEWARD_STATE")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Layer one: the file mode (and the 0700 folders) keep other users out.
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&env.state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let (code, stderr) = nobody(&env);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    // Layer two: even with the socket opened up, the daemon checks the peer's uid.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, stderr) = nobody(&env);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    // The daemon's own user still gets in.
    assert_eq!(env.steward(&["status"]).code, 0);
}

/// steward never needs root: a live run, end to end, as an unprivileged user that owns
/// only its own folders (where it may not create cgroups, status says so and process
/// groups still contain each step).
#[test]
fn a_live_run_works_as_an_unprivileged_user() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to become another user");
        return;
    }
    let env = Env::new();
    env.workflow(&Spec::new("w", QUICK));
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(env.dir.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let as_nobody = |args: &[&str]| {
        let out = env
            .command(args)
            .env("HOME", env.dir.path())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        env.result(args, out)
    };
    let out = as_nobody(&["go-live", "w"]);
    assert_eq!(out.code, 0, "{out}");
    let out = as_nobody(&["run", "w", "--live", "--json"]);
    assert_eq!(out.state(), "success", "{out}");
    assert_eq!(env.ledger_lines().len(), 1, "{out}");
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(env.state.join("runlog.jsonl")).unwrap(),
    );
    assert_eq!(owner, 65534);
}

/// A key template that would loop 10^10 times: it must run out of its budget instead.
const LOOPING_KEY: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";

#[test]
fn looping_key_templates_fail_their_runs_and_the_daemon_keeps_answering() {
    let env = Env::new();
    for id in ["loop-a", "loop-b"] {
        env.workflow(&Spec::new(id, QUICK).key(LOOPING_KEY));
    }
    let validate = env.steward(&["validate"]);
    assert_eq!(validate.code, 1, "{validate}");
    for id in ["loop-a", "loop-b"] {
        assert!(
            validate
                .stderr
                .contains(&format!("{id}.toml: idempotency_key")),
            "{validate}"
        );
    }

    let mut d = env.daemon(&[]);
    let started = std::time::Instant::now();
    let runs: Vec<_> = ["loop-a", "loop-b"]
        .iter()
        .map(|id| env.spawn(&["run", id, "--json"]))
        .collect();
    let status = env.steward(&["status"]);
    assert_eq!(status.code, 0, "{status}");
    for (child, id) in runs.into_iter().zip(["loop-a", "loop-b"]) {
        let out = child.wait_with_output().unwrap();
        let rec: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{id}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        assert_eq!(rec["state"], "failed", "{rec:#}");
        let reason = rec["reason"].as_str().unwrap();
        assert!(
            reason.contains(&format!("idempotency_key of workflow `{id}`")),
            "{reason}"
        );
        assert!(reason.contains("{% for i in range(100000) %}"), "{reason}");
        assert!(reason.contains("budget"), "{reason}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the runs took {:?}",
        started.elapsed()
    );
    assert_eq!(env.steward(&["status"]).code, 0);
    let stopped = d.stop(Duration::from_secs(10));
    assert!(stopped.success(), "{}", d.log_text());
}

/// A webhook workflow and its signed request, for the connection tests.
fn hook_env() -> Env {
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

const HOOK_SECRET: &str = "hook-secret-123";

/// POSTs a correctly signed delivery; the status code.
fn signed_post(addr: &str, body: &str) -> u16 {
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
static MANY_SOCKETS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn many_sockets() -> std::sync::MutexGuard<'static, ()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard.min(65536).max(soft), hard);
    }
    MANY_SOCKETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `n` connections that send the start of a request's headers and never finish them.
fn slow_clients(addr: &str, n: usize) -> Vec<std::net::TcpStream> {
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
