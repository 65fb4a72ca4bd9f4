//! steward's reading of gofeed's test feeds against gofeed's own (`tests/fixtures/gofeed/`,
//! MIT, from github.com/mmcdole/gofeed at e010ca0): for every feed gofeed reads, the same
//! number of entries, and each entry's title and link where gofeed has one. Any other
//! difference fails the test; the deliberate ones are listed in [`DELIBERATE`], each with
//! why, and each is checked to still be the difference it says it is.
//!
//! `cargo test --test feed_corpus -- --nocapture` prints the figures.

use std::path::Path;

use serde_json::Value;

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/gofeed/testdata/parser"
);

fn source(kind: &str) -> steward::config::agent::Source {
    toml::from_str(&format!(
        "name = \"corpus\"\nkind = \"{kind}\"\nurl = \"http://127.0.0.1/feed\"\ntopic_tags = []\ntier = 1\n"
    ))
    .unwrap()
}

/// Readings where steward differs from gofeed on purpose: (feed, why). In each, an item
/// has several `<link>` elements; steward's link is the first.
const DELIBERATE: &[(&str, &str)] = &[
    (
        "rss/rss_channel_item_links",
        "gofeed takes an item's last <link>; steward the first, as feed-rs and feedparser do: \
         RSS gives an item one link, and the first is the one its publisher wrote first",
    ),
    (
        "rss/rdf_item_links",
        "the same for RSS 1.0: gofeed's link is the item's last <link>, steward's the first",
    ),
];

/// gofeed's entries as (title, link), from its format-specific reading.
fn expected_entries(reading: &Value) -> Vec<(Option<String>, Option<String>)> {
    let list = reading["items"]
        .as_array()
        .or_else(|| reading["entries"].as_array())
        .cloned()
        .unwrap_or_default();
    list.iter()
        .map(|e| {
            let title = e["title"].as_str().map(str::to_string);
            let link = e["link"].as_str().map(str::to_string).or_else(|| {
                let links = e["links"].as_array()?;
                let alternate = links
                    .iter()
                    .find(|l| l["rel"].as_str().is_none_or(|r| r == "alternate"))
                    .or(links.first())?;
                alternate["href"]
                    .as_str()
                    .or(alternate.as_str())
                    .map(str::to_string)
            });
            (title, link)
        })
        .collect()
}

fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// gofeed keeps a title's markup; a digest shows its text. The same cleaning turns
/// gofeed's title into what a reader should see (deliberate difference 1).
fn as_text(title: &str) -> String {
    words(&steward::agent::feed::clean(title, 10_000, &mut Vec::new()))
}

/// A bare origin with and without its `/` is one URL (feed-rs parses links as URLs;
/// deliberate difference 2).
fn same_link(ours: Option<&str>, theirs: &str) -> bool {
    let norm = |l: &str| {
        let l = l.trim();
        match l.split_once("://") {
            Some((_, rest)) if !rest.contains('/') => format!("{l}/"),
            _ => l.to_string(),
        }
    };
    ours.is_some_and(|o| norm(o) == norm(theirs))
}

#[test]
fn steward_reads_what_gofeed_reads() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let mut total = 0;
    for (dir, kind, feed_ext) in [
        ("rss", "rss", "xml"),
        ("atom", "atom", "xml"),
        ("json", "json", "json"),
    ] {
        let (mut feeds, mut agree) = (0, 0);
        let mut misses = Vec::new();
        let mut files: Vec<_> = std::fs::read_dir(Path::new(CORPUS).join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == feed_ext))
            .filter(|p| !p.to_string_lossy().ends_with("_expected.json"))
            .collect();
        files.sort();
        for feed in files {
            let stem = feed.file_stem().unwrap().to_string_lossy().to_string();
            let reading = ["json", "_expected.json"]
                .iter()
                .map(|suffix| {
                    if suffix.starts_with('_') {
                        feed.with_file_name(format!("{stem}{suffix}"))
                    } else {
                        feed.with_extension(suffix)
                    }
                })
                .find(|p| p.exists() && *p != feed);
            let Some(reading) = reading else { continue };
            let Ok(reading) =
                serde_json::from_str::<Value>(&std::fs::read_to_string(&reading).unwrap())
            else {
                continue;
            };
            feeds += 1;
            let want = expected_entries(&reading);
            let got = steward::agent::feed::parse(
                &source(kind),
                &std::fs::read(&feed).unwrap(),
                None,
                10_000,
            );
            let first_links: Vec<Option<String>> = match &got {
                Ok(items) => items.iter().map(|i| i.link.clone()).collect(),
                Err(_) => Vec::new(),
            };
            let verdict = match got {
                Err(e) => Err(format!("not read: {e}")),
                Ok(items) if items.len() != want.len() => {
                    Err(format!("{} entries, gofeed {}", items.len(), want.len()))
                }
                Ok(items) => items
                    .iter()
                    .zip(&want)
                    .find_map(|(i, (title, link))| {
                        if let Some(t) = title.as_deref().filter(|t| !t.trim().is_empty()) {
                            if words(&i.title) != as_text(t) {
                                return Some(format!("title {:?}, gofeed {:?}", i.title, t));
                            }
                        }
                        if let Some(l) = link {
                            if !same_link(i.link.as_deref(), l) {
                                return Some(format!("link {:?}, gofeed {:?}", i.link, l));
                            }
                        }
                        None
                    })
                    .map_or(Ok(()), Err),
            };
            let name = format!("{dir}/{stem}");
            let deliberate = DELIBERATE.iter().find(|(f, _)| *f == name);
            match (verdict, deliberate) {
                (Ok(()), None) => agree += 1,
                (Ok(()), Some(_)) => failures.push(format!(
                    "{name} is listed as a deliberate difference but now reads as gofeed does"
                )),
                (Err(why), None) => failures.push(format!("{name}: {why}")),
                (Err(why), Some((_, because))) => {
                    // Still the difference the list describes: steward's link is the
                    // item's first, which gofeed lists first among its links.
                    let theirs = reading["items"][0]["links"][0].as_str().unwrap_or("");
                    let ours = first_links.first().cloned().flatten();
                    if !same_link(ours.as_deref(), theirs) {
                        failures.push(format!("{name}: {why} (not the listed difference)"));
                    }
                    misses.push(format!("  {name}: {why} (deliberate: {because})"));
                }
            }
        }
        total += feeds;
        report.push(format!(
            "{dir}: {agree} of {feeds} feeds read as gofeed reads them"
        ));
        report.extend(misses);
    }
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The corpus was found and read: 163 RSS, 270 Atom and 3 JSON feeds have readings.
    assert_eq!(total, 436, "the corpus under {CORPUS} changed");
}

/// gofeed's universal-parser fixtures: the feeds it detects are read; a document that is
/// no feed (an XML note, an empty file, broken JSON) is refused with a reason, as gofeed
/// refuses it.
#[test]
fn feeds_of_every_kind_are_recognised_and_non_feeds_refused() {
    let dir = Path::new(CORPUS).join("universal");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(&path).unwrap();
        let got = steward::agent::feed::parse(&source("rss"), &bytes, None, 100);
        match name.as_str() {
            "unknown_feed.xml" | "empty_feed.xml" | "invalid.json" => {
                let err = got.expect_err(&name);
                assert!(
                    matches!(err, steward::agent::feed::FeedError::NotAFeed(_)),
                    "{name}: {err}"
                );
                assert!(err.to_string().starts_with("not a feed"), "{name}: {err}");
            }
            // Feed-level fixtures (most have no entries): what matters is they are read,
            // a byte-order mark and leading blank lines included.
            _ => {
                got.unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 12);
}
