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

/// The source trees: the engine's, the features' and the binary's (this package).
const TREES: [&str; 3] = ["crates/engine/src", "crates/features/src", "src"];

/// Source files by module path (`workflow::parse`, `runner`; `crate` for the package's
/// lib.rs), over the three crates: the engine's and the features' modules are
/// re-exported under the same paths.
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
    let mut mods = BTreeMap::new();
    for tree in TREES {
        let src = Path::new(ROOT).join(tree);
        let mut files = Vec::new();
        walk(&src, &mut files);
        for p in files {
            let rel = p.strip_prefix(&src).unwrap().with_extension("");
            let mut name = rel.to_string_lossy().replace('/', "::");
            if let Some(folder) = name.strip_suffix("::mod") {
                name = folder.to_string();
            }
            if name == "lib" {
                if tree != "src" {
                    // The engine's and the features' lib.rs only declare their modules.
                    continue;
                }
                name = "crate".into();
            }
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(
                mods.insert(name.clone(), text).is_none(),
                "module `{name}` is in two crates"
            );
        }
    }
    mods
}

/// The folder a module's files are in, whichever crate holds it.
fn folder_of(name: &str) -> Option<std::path::PathBuf> {
    TREES
        .iter()
        .map(|tree| Path::new(ROOT).join(tree).join(name.replace("::", "/")))
        .find(|dir| dir.join("mod.rs").exists())
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
        let is_folder = name == "crate" || folder_of(name).is_some();
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

/// Crates the engine must not depend on, directly or through another crate: the web,
/// mail, feed, model-gateway and cluster crates of the features above it.
const NOT_IN_THE_ENGINE: [&str; 8] = [
    "axum",
    "lettre",
    "feed-rs",
    "reqwest",
    "scraper",
    "async-nats",
    "hyper",
    "hyper-util",
];

#[test]
fn the_engine_crate_depends_on_no_web_mail_feed_gateway_or_cluster_crate() {
    let manifest =
        std::fs::read_to_string(Path::new(ROOT).join("crates/engine/Cargo.toml")).unwrap();
    let listed: Vec<&str> = manifest
        .split("[dependencies]")
        .nth(1)
        .expect("the engine's Cargo.toml has [dependencies]")
        .split("\n[")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split('=').next())
        .map(str::trim)
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert!(listed.contains(&"sled"), "the list was read: {listed:?}");
    for name in NOT_IN_THE_ENGINE {
        assert!(!listed.contains(&name), "the engine lists {name}");
    }
    // And none arrives through another crate: the resolved tree, from the lock file.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = std::process::Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            "steward-engine",
            "-e",
            "normal",
        ])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(ROOT)
        .output()
        .expect("cargo tree runs");
    assert!(
        tree.status.success(),
        "{}",
        String::from_utf8_lossy(&tree.stderr)
    );
    let resolved: BTreeSet<String> = String::from_utf8_lossy(&tree.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(
        resolved.contains("sled") && resolved.contains("tokio"),
        "{resolved:?}"
    );
    for name in NOT_IN_THE_ENGINE {
        assert!(
            !resolved.contains(name),
            "the engine depends on {name} through another crate"
        );
    }
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
