//! The code's shape: no two source files import each other in a circle, and every
//! import runs the way the module map of `docs/architecture.md` ("How it fits together")
//! says — a module
//! uses only modules of earlier layers, or of its own folder.
//!
//! Imports are read from the source text: every `crate::…` and `super::…` path (and a
//! folder module's `use child::…`), resolved to the longest module path it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Source files by module path (`config::agent`, `runner`; `crate` for lib.rs).
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).unwrap().with_extension("");
            let mut name = rel.to_string_lossy().replace('/', "::");
            if let Some(folder) = name.strip_suffix("::mod") {
                name = folder.to_string();
            }
            if name == "lib" {
                name = "crate".into();
            }
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The module a path names: its longest prefix that is a module.
fn resolve(path: &[&str], mods: &BTreeMap<String, String>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| mods.contains_key(m))
}

/// Each path after `prefix` in `code`, with a `{a, b::c}` group expanded.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let head: Vec<&str> = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty() && *s != "self")
            .collect();
        if rest[end..].starts_with('{') {
            let group = &rest[end + 1..rest[end..].find('}').map_or(end + 1, |c| end + c)];
            for item in group.split(',') {
                let mut p = head.clone();
                p.extend(
                    item.split_whitespace()
                        .next()
                        .unwrap_or("")
                        .split("::")
                        .filter(|s| !s.is_empty() && *s != "self"),
                );
                out.push(p);
            }
        } else {
            out.push(head);
        }
    }
    out
}

/// Module → the modules it imports.
fn imports(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges = BTreeMap::new();
    for (name, text) in mods {
        // Unit tests are not part of the shape (their `super::` is the file itself).
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let is_folder = name == "crate"
            || Path::new(ROOT)
                .join("src")
                .join(name.replace("::", "/"))
                .join("mod.rs")
                .exists();
        // Where `super::` points: the module's parent (a file's folder, a folder's parent).
        let parent = |of: &str| {
            of.rsplit_once("::")
                .map_or(String::new(), |(p, _)| p.to_string())
        };
        let sup = parent(name);
        let mut to = BTreeSet::new();
        let mut add = |prefix: &str, p: Vec<&str>| {
            let p_is_empty = p.is_empty();
            let mut full: Vec<&str> = prefix.split("::").filter(|s| !s.is_empty()).collect();
            full.extend(p);
            if p_is_empty {
                return;
            }
            if let Some(m) = resolve(&full, mods) {
                if &m != name {
                    to.insert(m);
                }
            }
        };
        for p in paths_after(&code, "crate::") {
            add("", p);
        }
        let mut glob_parent = false;
        for p in paths_after(&code, "super::") {
            if p.is_empty() {
                // `use super::*`: the whole parent module.
                glob_parent = true;
                continue;
            }
            add(&sup, p);
        }
        if is_folder && name != "crate" {
            // A folder module naming a child by a path of its own (`child::Item`).
            let children: Vec<&String> = mods
                .keys()
                .filter(|m| m.rsplit_once("::").is_some_and(|(p, _)| p == name))
                .collect();
            for child in children {
                let short = child.rsplit_once("::").map_or(child.as_str(), |(_, c)| c);
                if !paths_after(&code, &format!("{short}::")).is_empty() {
                    add(name, vec![short]);
                }
            }
            for line in code.lines() {
                let l = line.trim_start().trim_start_matches("pub ");
                if let Some(rest) = l.strip_prefix("use ") {
                    let first = rest.split("::").next().unwrap_or("");
                    add(name, vec![first]);
                }
            }
        }
        if glob_parent && mods.contains_key(&sup) && sup != *name {
            to.insert(sup.clone());
        }
        edges.insert(name.clone(), to);
    }
    edges
}

#[test]
fn no_two_source_files_import_each_other_in_a_circle() {
    let mods = modules();
    let edges = imports(&mods);
    // Depth-first search for a back edge; report the circle it closes.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(at) = path.iter().position(|p| p == m) {
            panic!("import circle: {} -> {m}", path[at..].join(" -> "));
        }
        path.push(m.to_string());
        for next in &edges[m] {
            visit(next, edges, path, done);
        }
        path.pop();
        done.insert(m.to_string());
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        visit(m, &edges, &mut Vec::new(), &mut done);
    }
    assert!(
        edges["runner"].contains("governed"),
        "the scan sees imports"
    );
}

/// The module map of `docs/architecture.md`: entry (module or folder) → layer.
fn readme_layers() -> BTreeMap<String, usize> {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let section = doc
        .split("## How it fits together")
        .nth(1)
        .expect("docs/architecture.md has a `How it fits together` section");
    let mut layers = BTreeMap::new();
    for line in section.lines().take_while(|l| !l.starts_with("## ")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(layer) = cells.get(1).and_then(|c| c.parse::<usize>().ok()) else {
            continue;
        };
        for name in cells[2].split('`').skip(1).step_by(2) {
            layers.insert(name.to_string(), layer);
        }
    }
    assert!(!layers.is_empty(), "the module map has no rows");
    layers
}

#[test]
fn every_import_runs_the_way_the_module_map_says() {
    let mods = modules();
    let edges = imports(&mods);
    let layers = readme_layers();
    let entry = |m: &str| -> Option<String> {
        let parts: Vec<&str> = m.split("::").collect();
        (1..=parts.len())
            .rev()
            .map(|n| parts[..n].join("::"))
            .find(|e| layers.contains_key(e))
    };
    let mut problems = Vec::new();
    for m in mods.keys().filter(|m| *m != "crate") {
        let Some(from) = entry(m) else {
            problems.push(format!(
                "{m} is not in the module map of docs/architecture.md"
            ));
            continue;
        };
        for to in &edges[m] {
            let Some(target) = entry(to) else { continue };
            if target != from && layers[&target] >= layers[&from] {
                problems.push(format!(
                    "{m} (layer {}) imports {to} (layer {})",
                    layers[&from], layers[&target]
                ));
            }
        }
    }
    for listed in layers.keys() {
        if !mods.contains_key(listed) {
            problems.push(format!(
                "the module map of docs/architecture.md names `{listed}`, which is not a module"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
