//! steward's reading of gofeed's test feeds against gofeed's own (`tests/fixtures/gofeed/`,
//! MIT, from github.com/mmcdole/gofeed at e010ca0): for every feed gofeed reads, the same
//! number of entries, and each entry's title and link where gofeed has one.
//!
//! Issue 14 is under way: feed-rs does not yet read every shape gofeed does (Atom 0.3,
//! RSS without a version, unknown Atom text types, …). Until it does, this test reports
//! the figures instead of gating CI: `cargo test --test feed_corpus -- --ignored
//! --nocapture`. The acceptance turns it into a gate with the deliberate
//! differences listed here.

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
#[ignore = "issue 14 in progress: reports the reading figures; see the module docs"]
fn steward_reads_what_gofeed_reads() {
    let mut report = Vec::new();
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
            match verdict {
                Ok(()) => agree += 1,
                Err(why) => misses.push(format!("  {dir}/{stem}: {why}")),
            }
        }
        report.push(format!(
            "{dir}: {agree} of {feeds} feeds read as gofeed reads them"
        ));
        report.extend(misses);
    }
    println!("{}", report.join("\n"));
}
