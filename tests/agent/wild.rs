//! Feeds as servers serve them: a 304 for an unchanged feed, and every shape of feed found in the wild.

use super::*;

/// A feed server on loopback that answers conditional GETs: ETag `"v1"` and a
/// Last-Modified, 304 when either comes back, and `/old.xml` moved permanently to the
/// feed. It records each request's head, and closes each connection after its answer
/// (saying so, so the client never sends a second request on a closed connection).
pub(crate) fn conditional_feed_server() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let feed = std::fs::read(env_path("rss.xml")).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            log.lock().unwrap().push(head.clone());
            let lower = head.to_ascii_lowercase();
            let mut out = stream;
            let answer = if head.starts_with("GET /old.xml") {
                "HTTP/1.1 301 Moved Permanently\r\nLocation: /feed.xml\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            } else if lower.contains("if-none-match: \"v1\"")
                || lower.contains("if-modified-since:")
            {
                "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
            } else {
                format!("HTTP/1.1 200 OK\r\nContent-Type: application/rss+xml\r\nETag: \"v1\"\r\nLast-Modified: Wed, 02 Dec 2026 10:00:00 GMT\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", feed.len())
            };
            let _ = out.write_all(answer.as_bytes());
            if answer.starts_with("HTTP/1.1 200") {
                let _ = out.write_all(&feed);
            }
        }
    });
    (port, seen)
}

/// Two runs over an unchanged feed: the second sends the server's validators back, gets
/// a 304, finds nothing new, keeps today's digest and mails nobody again.
#[test]
fn an_unchanged_feed_costs_a_304_and_the_second_run_finds_nothing_and_sends_nothing() {
    let env = Env::new();
    let (port, requests) = conditional_feed_server();
    let smtp = util::smtp_server(&[]);
    let source = format!("[[source]]\nname = \"gh\"\nkind = \"rss\"\nurl = \"http://127.0.0.1:{port}/old.xml\"\ntopic_tags = [\"github\"]\ntier = 1\n");
    setup(&env, &source, NOOP_AGENT, &util::smtp_settings(smtp.port));
    env.distribution("- ada@example.org\n");
    env.steward(&["go-live", "noop-test-agent"]);

    let first = env.steward(&["digest", "noop-test-agent"]);
    assert!(summary(&first).contains("new_items=2"), "{first}");
    assert!(summary(&first).contains("emailed=1/1"), "{first}");
    let digest = digest_path(&env, "daily", "noop-test-agent");
    let text = std::fs::read_to_string(&digest).unwrap();
    assert!(
        text.contains("moved permanently to http://127.0.0.1"),
        "{text}"
    );
    let digests = || std::fs::read_dir(digest.parent().unwrap()).unwrap().count();
    assert_eq!(digests(), 1);

    let second = env.steward(&["digest", "noop-test-agent"]);
    let line = summary(&second);
    assert!(line.contains("new_items=0"), "{line}");
    assert!(
        line.contains("emailed=0/1 (1 already had this digest)"),
        "{line}"
    );
    assert_eq!(digests(), 1, "a second digest file was written");
    assert_eq!(smtp.messages.lock().unwrap().len(), 1, "mailed twice");

    let requests = requests.lock().unwrap().clone();
    let feed_gets: Vec<&String> = requests
        .iter()
        .filter(|r| r.starts_with("GET /feed.xml"))
        .collect();
    assert_eq!(feed_gets.len(), 2, "{requests:#?}");
    let lower = feed_gets[1].to_ascii_lowercase();
    assert!(lower.contains("if-none-match: \"v1\""), "{}", feed_gets[1]);
    assert!(
        lower.contains("if-modified-since: wed, 02 dec 2026 10:00:00 gmt"),
        "{}",
        feed_gets[1]
    );
    assert!(lower.contains("user-agent: steward/"), "{}", feed_gets[0]);
    assert!(lower.contains("accept-encoding: gzip"), "{}", feed_gets[0]);
}

/// A loopback HTTP server answering each path with its (content type, body).
pub(crate) fn feed_server(routes: Vec<(&'static str, &'static str, Vec<u8>)>) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            let _ = reader.read_line(&mut request);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
            let mut out = stream;
            match routes.iter().find(|(p, _, _)| *p == path) {
                Some((_, content_type, body)) => {
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                    let _ = out.write_all(head.as_bytes());
                    let _ = out.write_all(body);
                }
                None => {
                    let _ = out.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                }
            }
        }
    });
    port
}

/// Every feed shape issue 14 found unread, served over loopback HTTP and read into one
/// digest: each source's entry reaches it, titled as its publisher meant.
#[test]
fn every_shape_of_feed_found_in_the_wild_reaches_the_digest() {
    let xml = |s: &str| s.as_bytes().to_vec();
    let (latin1, _, _) = encoding_rs::WINDOWS_1252.encode(
        "<rss version=\"2.0\"><channel><title>l</title><item><title>Café crème brûlée</title><guid>l1</guid></item></channel></rss>",
    );
    let (cyrillic, _, _) = encoding_rs::WINDOWS_1251.encode(
        "<rss version=\"2.0\"><channel><title>Новости</title><item><title>Привет из Москвы: новости дня</title><guid>c1</guid>\
         <description>Сегодня в городе прошёл большой праздник, и жители вышли на улицы.</description></item></channel></rss>",
    );
    let shapes: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        ("/atom03.xml", "application/atom+xml", xml(r#"<feed version="0.3" xmlns="http://purl.org/atom/ns#"><title>a</title>
            <entry><title mode="base64">QXRvbSB6ZXJvIHRocmVl</title><id>tag:a,2004:1</id><issued>2004-01-01T00:00:00Z</issued></entry></feed>"#), "Atom zero three"),
        ("/atom-types.xml", "application/atom+xml", xml(r#"<feed xmlns="http://www.w3.org/2005/Atom"><title>t</title>
            <entry><id>t1</id><title type="application/xhtml+xml"><div xmlns="http://www.w3.org/1999/xhtml">Inline <b>xhtml</b> type</div></title></entry>
            <entry><id>t2</id><title type="text/plain">A text/plain title</title></entry>
            <entry><id>t3</id><title type="">An empty type</title></entry>
            <entry><id>t4</id><title type="xhtml"><div xmlns="http://www.w3.org/1999/xhtml">&lt;b&gt;Escaped&lt;/b&gt; markup</div></title></entry>
            </feed>"#), r"\<b\>Escaped\</b\> markup"),
        ("/no-version.xml", "application/rss+xml", xml("<rss><channel><title>n</title><item><title>No version at all</title><guid>n1</guid></item></channel></rss>"), "No version at all"),
        ("/userland.xml", "application/rss+xml", xml(r#"<rss version="2.0" xmlns="http://backend.userland.com/rss2"><channel><title>u</title>
            <item><title>Userland namespace</title><guid>u1</guid></item></channel></rss>"#), "Userland namespace"),
        ("/rss090.xml", "application/rdf+xml", xml(r#"<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" xmlns="http://my.netscape.com/rdf/simple/0.9/">
            <channel><title>m</title><link>http://m.example/</link></channel>
            <item><title>Netscape RSS 0.90</title><link>http://m.example/090</link></item></rdf:RDF>"#), "Netscape RSS 0.90"),
        ("/rdf-nolink.xml", "application/rdf+xml", xml(r#"<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" xmlns="http://purl.org/rss/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/">
            <channel rdf:about="http://r.example/index.rdf"><title>r</title></channel>
            <item rdf:about="http://r.example/1"><title>RDF item without a link</title></item>
            <item rdf:about="http://r.example/2"><dc:title>Dublin Core title</dc:title></item></rdf:RDF>"#), "Dublin Core title"),
        ("/truncated.xml", "application/rss+xml", xml("<rss version=\"2.0\"><channel><title>x</title><item><title>Cut off at the end</title><guid>x1</guid></item></chan"), "Cut off at the end"),
        ("/latin1.xml", "application/rss+xml; charset=ISO-8859-1", latin1.into_owned(), "Café crème brûlée"),
        ("/cyrillic.xml", "application/rss+xml", cyrillic.into_owned(), "Привет из Москвы"),
        ("/feed10.json", "application/feed+json", xml(r#"{"version": "1.0", "title": "j", "items": [{"id": "j1", "title": "JSON Feed 1.0", "content_text": "x"}]}"#), "JSON Feed 1.0"),
        ("/entities.xml", "application/rss+xml", xml("<rss version=\"2.0\"><channel><title>e</title><item><title>Caf&eacute; &rarr; &frac12; price</title><guid>e1</guid></item></channel></rss>"), "Café → ½ price"),
        ("/blogger.xml", "application/atom+xml", xml(r#"<feed xmlns="http://www.w3.org/2005/Atom"><title>b</title>
            <entry><id>b1</id><title>Blogger post</title><link rel="edit" href="https://blogger.example/api/1"/><link rel="alternate" href="https://blog.example/post.html"/></entry></feed>"#),
            "[Blogger post](https://blog.example/post.html)"),
    ];
    let port = feed_server(
        shapes
            .iter()
            .map(|(path, ct, body, _)| (*path, *ct, body.clone()))
            .collect(),
    );
    let sources: String = shapes
        .iter()
        .map(|(path, _, _, _)| {
            let name = path.trim_start_matches('/').replace('.', "-");
            format!("[[source]]\nname = \"{name}\"\nkind = \"rss\"\nurl = \"http://127.0.0.1:{port}{path}\"\ntopic_tags = [\"github\"]\ntier = 1\n")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let env = Env::new();
    setup(&env, &sources, NOOP_AGENT, "");
    let run = env.steward(&["digest", "noop-test-agent"]);
    assert_eq!(run.code, 0, "{run}");
    let line = summary(&run);
    // One entry per shape, four in atom-types and two in rdf-nolink.
    assert!(
        line.contains(&format!("polled={} sources, new_items=16", shapes.len())),
        "{line}"
    );
    let digest = std::fs::read_to_string(digest_path(&env, "daily", "noop-test-agent")).unwrap();
    for (path, _, _, want) in &shapes {
        assert!(
            digest.contains(want),
            "{path}: {want:?} is not in\n{digest}"
        );
    }
    for also in [
        "Inline xhtml type",
        "A text/plain title",
        "An empty type",
        "RDF item without a link",
    ] {
        assert!(digest.contains(also), "{also:?} is not in\n{digest}");
    }
    assert!(!digest.contains("not a feed"), "a source failed:\n{digest}");
}
