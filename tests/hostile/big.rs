//! Big inputs streamed, not buffered: a 100 MB file drop and webhook body; a feed title that would inject mail headers.

use super::*;

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
pub(crate) fn post_streaming(addr: &str, length: Option<usize>) -> String {
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
