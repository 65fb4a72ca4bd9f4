//! Candidates from a source: its bytes fetched (`fetch`), decoded to UTF-8 (`charset`),
//! read by feed-rs (RSS 0.9x/1.0/2.0, Atom 0.3/1.0, JSON Feed 1.x; the patched copy in
//! `vendor/feed-rs`), and each entry made an [`Item`] with a stable id.
//!
//! Everything fetched is untrusted: markup becomes text (`text`), sizes are capped, and
//! lines that read like instructions to an AI reader are flagged and withheld from the
//! digest (a prompt-injection guard) rather than passed on silently.

mod charset;
mod fetch;
mod text;

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::agent::{Source, SourceKind};

pub use charset::{decode, Basis, Decoded};
pub use fetch::{FeedError, Validators, MAX_FEED_BYTES};
pub use text::{clean, html_to_text};

const MAX_TITLE: usize = 200;
const MAX_SUMMARY: usize = 600;

/// One candidate item, cleaned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub id: String,
    pub source: String,
    pub title: String,
    pub link: Option<String>,
    pub summary: String,
    pub published: Option<String>,
    /// sha256 of title, link and summary: a change makes the item *updated*.
    pub hash: String,
    /// Warnings for a reader (e.g. text withheld as a possible prompt injection).
    pub flags: Vec<String>,
}

/// One source's fetch: its items, and what to remember about the server's answer.
#[derive(Debug, Default)]
pub struct Fetched {
    pub items: Vec<Item>,
    /// The server said 304: nothing changed since the validators were sent.
    pub not_modified: bool,
    /// Validators to send next time (HTTP sources only).
    pub validators: Option<Validators>,
    /// Where a permanent redirect (301, 308) now points: the source's URL should change.
    pub moved_to: Option<String>,
}

/// Fetches and parses one source; the error is the reason shown in the digest. `sent`
/// are the validators of the last fetch of an HTTP source, sent back.
pub async fn fetch(
    source: &Source,
    base: &Path,
    max_items: usize,
    sent: Option<&Validators>,
) -> Result<Fetched, FeedError> {
    let mut fetched = Fetched::default();
    let mut charset = None;
    let bytes = match (&source.url, &source.path, &source.command) {
        (Some(url), _, _) => {
            let answer = fetch::http(url, source.timeout(), sent).await?;
            charset = answer.charset;
            fetched.validators = Some(answer.validators);
            fetched.moved_to = answer.moved_to;
            match answer.body {
                None => {
                    fetched.not_modified = true;
                    return Ok(fetched);
                }
                Some(body) => body,
            }
        }
        (_, Some(path), _) => fetch::file(&base.join(path))?,
        (_, _, Some(cmd)) => fetch::command(cmd, base, source.timeout()).await?,
        _ => return Err(FeedError::NoSource),
    };
    fetched.items = parse(source, &bytes, charset.as_deref(), max_items)?;
    Ok(fetched)
}

/// Parses a feed document into clean items; `http_charset` is the charset the server
/// named for it, if any.
pub fn parse(
    source: &Source,
    bytes: &[u8],
    http_charset: Option<&str>,
    max_items: usize,
) -> Result<Vec<Item>, FeedError> {
    let document = decode(bytes, http_charset);
    if document.basis == Basis::Detected && document.encoding != "UTF-8" {
        tracing::debug!(source = %source.name, encoding = document.encoding, "encoding guessed");
    }
    // feed-rs's own fallback for an entry with no id is a random UUID when it has no link
    // or title either: every parse would make the entry new again. Leave it empty and
    // derive a stable one here, from more than feed-rs sees.
    let parser = feed_rs::parser::Builder::new()
        .base_uri(source.url.as_deref())
        .id_generator(|_, _, _| String::new())
        .build();
    let feed = parser
        .parse(document.text.as_bytes())
        .map_err(FeedError::NotAFeed)?;
    if matches!(
        source.kind,
        SourceKind::Rss | SourceKind::Atom | SourceKind::Json
    ) {
        let actual = match feed.feed_type {
            feed_rs::model::FeedType::Atom => SourceKind::Atom,
            feed_rs::model::FeedType::JSON => SourceKind::Json,
            _ => SourceKind::Rss,
        };
        if actual != source.kind {
            tracing::debug!(source = %source.name, "feed is {actual:?}, configured as {:?}", source.kind);
        }
    }
    let site = feed
        .links
        .iter()
        .map(|l| l.href.clone())
        .find(|h| h.starts_with("http"))
        .or_else(|| source.url.clone());
    let mut items = Vec::new();
    let mut derived = std::collections::HashMap::<String, usize>::new();
    for entry in feed.entries.into_iter().take(max_items) {
        let id = match entry.id.trim() {
            "" => {
                // The entry's own link is its identity (as it always was here); with no
                // link, a digest of what it does have.
                let base = match entry.links.first() {
                    Some(l) => absolute(&l.href, site.as_deref()),
                    None => derived_id(source, &entry),
                };
                let n = derived.entry(base.clone()).or_default();
                *n += 1;
                // Two entries that look alike stay two, numbered in document order.
                if *n == 1 {
                    base
                } else {
                    format!("{base}#{n}")
                }
            }
            given => given.to_string(),
        };
        let mut flags = Vec::new();
        // The page a reader opens: the `alternate` link (or one with no rel), not an
        // `edit`, `replies` or `self` link a feed may list first.
        let link = entry
            .links
            .iter()
            .find(|l| l.rel.as_deref().is_none_or(|r| r == "alternate"))
            .or(entry.links.first())
            .map(|l| absolute(&l.href, site.as_deref()));
        let published = entry
            .published
            .or(entry.updated)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        let title = match entry.title.as_ref().map(|t| t.content.trim()) {
            Some(t) if !t.is_empty() => clean(t, MAX_TITLE, &mut flags),
            // An untitled entry is named by what it has: its link, else its date.
            _ => match (&link, &published) {
                (Some(l), _) => clean(l, MAX_TITLE, &mut flags),
                (None, Some(p)) => format!("untitled item of {p}"),
                (None, None) => "untitled item".to_string(),
            },
        };
        let body = entry
            .summary
            .as_ref()
            .map(|t| t.content.clone())
            .or_else(|| entry.content.as_ref().and_then(|c| c.body.clone()))
            .unwrap_or_default();
        let summary = clean(&body, MAX_SUMMARY, &mut flags);
        let mut h = Sha256::new();
        h.update(title.as_bytes());
        h.update([0]);
        h.update(link.as_deref().unwrap_or("").as_bytes());
        h.update([0]);
        h.update(summary.as_bytes());
        items.push(Item {
            id,
            source: source.name.clone(),
            title,
            link,
            summary,
            published,
            hash: hex::encode(h.finalize()),
            flags,
        });
    }
    Ok(items)
}

/// An id for an entry with neither id nor link, the same on every parse of the same
/// entry: a digest of the feed, the entry's title, date, enclosures and text. Prefixed
/// `steward:` so it never passes for a publisher's guid.
fn derived_id(source: &Source, entry: &feed_rs::model::Entry) -> String {
    let mut h = Sha256::new();
    let mut part = |p: &str| {
        h.update(p.as_bytes());
        h.update([0]);
    };
    part(source.url.as_deref().unwrap_or(&source.name));
    part(entry.title.as_ref().map_or("", |t| t.content.as_str()));
    let date = entry.published.or(entry.updated).map(|d| d.to_rfc3339());
    part(date.as_deref().unwrap_or(""));
    for media in &entry.media {
        for c in &media.content {
            part(c.url.as_ref().map_or("", |u| u.as_str()));
        }
    }
    part(entry.summary.as_ref().map_or("", |t| t.content.as_str()));
    part(
        entry
            .content
            .as_ref()
            .and_then(|c| c.body.as_deref())
            .unwrap_or(""),
    );
    format!("steward:{}", &hex::encode(h.finalize())[..32])
}

/// Resolves a relative link against the site.
fn absolute(href: &str, site: Option<&str>) -> String {
    if href.contains("://") || href.starts_with("mailto:") {
        return href.to_string();
    }
    let Some(site) = site else {
        return href.to_string();
    };
    let origin_end = site
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| site[start..].find('/').map(|j| start + j))
        .unwrap_or(site.len());
    if href.starts_with('/') {
        format!("{}{href}", &site[..origin_end])
    } else {
        let dir = &site[..site
            .rfind('/')
            .filter(|i| *i >= origin_end)
            .map_or(site.len(), |i| i + 1)];
        let sep = if dir.ends_with('/') { "" } else { "/" };
        format!("{dir}{sep}{href}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> Source {
        toml::from_str("name = \"t\"\nkind = \"rss\"\nurl = \"http://127.0.0.1/feed.xml\"\ntopic_tags = []\ntier = 1\n")
            .unwrap()
    }

    /// Neither guid, link nor title: feed-rs would give each a fresh random UUID.
    const IDLESS: &str = r#"<?xml version="1.0"?><rss version="2.0"><channel><title>c</title>
<item><description>first</description></item>
<item><description>second</description></item>
<item><description>second</description></item>
<item><title>Same</title></item><item><title>Same</title></item>
<item><link>http://127.0.0.1/p</link><title>Linked</title></item>
<item><guid>g-1</guid><title>Guid</title></item>
</channel></rss>"#;

    #[test]
    fn ids_are_the_same_on_every_parse_and_alike_entries_stay_apart() {
        let ids = || -> Vec<String> {
            parse(&source(), IDLESS.as_bytes(), None, 100)
                .unwrap()
                .into_iter()
                .map(|i| i.id)
                .collect()
        };
        let first = ids();
        assert_eq!(first, ids(), "a second parse of the same bytes changed ids");
        assert_eq!(first.len(), 7);
        let unique: std::collections::BTreeSet<&String> = first.iter().collect();
        assert_eq!(unique.len(), 7, "entries collided: {first:?}");
        assert!(first[0].starts_with("steward:") && !first[0].contains('#'));
        assert_eq!(first[2], format!("{}#2", first[1]));
        assert_eq!(first[4], format!("{}#2", first[3]));
        assert_eq!(first[5], "http://127.0.0.1/p");
        assert_eq!(first[6], "g-1");
    }

    #[test]
    fn the_alternate_link_wins_and_untitled_entries_are_named_by_what_they_have() {
        let atom = r#"<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"><title>b</title><id>urn:b</id><updated>2026-12-01T00:00:00Z</updated>
<entry><id>urn:1</id><title>Post</title><updated>2026-12-01T00:00:00Z</updated>
<link rel="edit" href="https://blogger.example/api/1"/><link rel="alternate" href="https://blog.example/post.html"/></entry>
<entry><id>urn:2</id><updated>2026-12-01T00:00:00Z</updated><link href="https://blog.example/untitled.html"/></entry>
<entry><id>urn:3</id><updated>2026-12-01T00:00:00Z</updated></entry>
</feed>"#;
        let items = parse(&source(), atom.as_bytes(), None, 10).unwrap();
        assert_eq!(
            items[0].link.as_deref(),
            Some("https://blog.example/post.html")
        );
        assert_eq!(items[1].title, "https://blog.example/untitled.html");
        assert_eq!(items[2].title, "untitled item of 2026-12-01T00:00:00Z");
    }

    #[test]
    fn an_edited_title_of_a_linked_entry_keeps_its_id() {
        let edited = IDLESS.replace("<title>Linked</title>", "<title>Linked, edited</title>");
        let a = parse(&source(), IDLESS.as_bytes(), None, 100).unwrap();
        let b = parse(&source(), edited.as_bytes(), None, 100).unwrap();
        assert_eq!(a[5].id, b[5].id);
        assert_ne!(a[5].hash, b[5].hash, "the edit must show as updated");
    }

    #[test]
    fn relative_links_resolve_against_xml_base_and_else_the_feed_url() {
        let atom = r#"<feed xmlns="http://www.w3.org/2005/Atom" xml:base="https://x.org/blog/"><title>b</title>
<entry><id>urn:1</id><title>a</title><link href="post.html"/></entry>
<entry xml:base="/other/"><id>urn:2</id><title>b</title><link href="deep.html"/></entry></feed>"#;
        let items = parse(&source(), atom.as_bytes(), None, 10).unwrap();
        assert_eq!(
            items[0].link.as_deref(),
            Some("https://x.org/blog/post.html")
        );
        assert_eq!(
            items[1].link.as_deref(),
            Some("https://x.org/other/deep.html")
        );
        let rss = r#"<rss version="2.0"><channel><title>r</title>
<item><guid>1</guid><title>r</title><link>/notes/1.html</link></item></channel></rss>"#;
        let items = parse(&source(), rss.as_bytes(), None, 10).unwrap();
        assert_eq!(
            items[0].link.as_deref(),
            Some("http://127.0.0.1/notes/1.html")
        );
    }

    #[test]
    fn relative_links_resolve_against_the_site() {
        assert_eq!(
            absolute("/a/b", Some("https://x.org/feed.xml")),
            "https://x.org/a/b"
        );
        assert_eq!(
            absolute("post.html", Some("https://x.org/blog/feed.xml")),
            "https://x.org/blog/post.html"
        );
        assert_eq!(
            absolute("https://y.org/p", Some("https://x.org/")),
            "https://y.org/p"
        );
    }
}
