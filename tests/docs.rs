//! The README is a front door and the manual lives in `docs/`: every relative link in
//! them resolves inside the repository (a file that exists, a heading that exists), every
//! page of `docs/` is reachable from the README, and the README stays short.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ has pages");
    pages.extend(docs);
    pages
}

/// A page's text outside fenced code blocks (a `](` in a code sample is not a link).
fn prose(text: &str) -> String {
    let mut inside = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            continue;
        }
        if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The targets of `[text](target)` and `![alt](target)` links.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves_inside_the_repository() {
    let root = std::fs::canonicalize(ROOT).unwrap();
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let shown = page.strip_prefix(ROOT).unwrap().display().to_string();
        for link in links(&prose(&text)) {
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(path)
            };
            let Ok(resolved) = std::fs::canonicalize(&target) else {
                problems.push(format!("{shown}: `{link}` names no file"));
                continue;
            };
            if !resolved.starts_with(&root) {
                problems.push(format!("{shown}: `{link}` leaves the repository"));
                continue;
            }
            if !fragment.is_empty() {
                let there = std::fs::read_to_string(&resolved).unwrap_or_default();
                if !anchors(&there).contains(fragment) {
                    problems.push(format!("{shown}: `{link}`: no heading `#{fragment}` there"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 12, "the scan found the links ({checked})");
}

#[test]
fn every_page_of_docs_is_linked_from_the_readme() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let linked: BTreeSet<String> = links(&prose(&readme)).into_iter().collect();
    for page in pages().into_iter().skip(1) {
        let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        assert!(linked.contains(&name), "the README links no `{name}`");
    }
}

#[test]
fn the_readme_is_a_front_door_of_at_most_250_lines_with_its_commands_first() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 250, "the README has {lines} lines");
    let first: Vec<&str> = readme.lines().take(8).collect();
    let first = first.join("\n");
    for command in ["-- daemon", "tests/run", "cargo deb", "dpkg -i"] {
        assert!(
            first.contains(command),
            "the README's first lines give `{command}`"
        );
    }
}

#[test]
fn a_broken_link_and_a_missing_heading_are_found() {
    // The checks above, on a page made to fail them.
    let text = "see [a](nowhere.md) and [b](#no-such-heading)\n```\n[c](in-code.md)\n```\n## A heading: here\n";
    let found = links(&prose(text));
    assert_eq!(found, ["nowhere.md", "#no-such-heading"]);
    assert!(anchors(text).contains("a-heading-here"));
    assert!(!anchors(text).contains("no-such-heading"));
}
