//! The digest note: `VAULT/digests/<cadence>/YYYY-MM-DD-<agent>.md`, YAML frontmatter, a
//! TL;DR, the items grouped by source, and a Sources section naming every source with its
//! status and every failure with its reason. Rendered with minijinja; an agent's
//! `digest_template_overrides.template` may `{% extends "digest.md" %}` and replace blocks.

use std::path::{Path, PathBuf};

use minijinja::Environment;
use serde::Serialize;

pub const DEFAULT_TEMPLATE: &str = r#"---
agent: {{ agent | tojson }}
cadence: {{ cadence | tojson }}
date: {{ date | tojson }}
since: {{ since | tojson }}
previous_digest: {{ previous_digest | tojson }}
items_new: {{ counts.new }}
items_updated: {{ counts.updated }}
sources_polled: {{ counts.polled }}
sources_failed: {{ counts.failed }}
---
# {{ agent }} — {{ date }}

## TL;DR
{% block tldr -%}
{% if items %}{{ counts.new }} new and {{ counts.updated }} updated item{{ "" if counts.new + counts.updated == 1 else "s" }} from {{ counts.polled }} source{{ "" if counts.polled == 1 else "s" }}{% if since %} since {{ since }}{% endif %}.
{% for i in items[:5] %}- {{ i.title | md }} ({{ i.source | md }}){% if i.novelty == "updated" %} — updated{% endif %}
{% endfor %}{% else %}No new items{% if since %} since {{ since }}{% endif %}.
{% endif %}{% if why_you_care_extra %}
> {{ why_you_care_extra }}
{% endif %}{% endblock %}
## Items
{% block items -%}
{% for group in groups %}
### {{ group.source }}
{% for i in group.items %}- {% if i.link %}[{{ i.title | md }}]({{ i.link | md_url }}){% else %}{{ i.title | md }}{% endif %}{% if i.novelty == "updated" %} *(updated)*{% endif %}{% if i.published %} · {{ i.published }}{% endif %}
{% if i.summary %}  {{ i.summary | md }}
{% endif %}{% for f in i.flags %}  - ⚠ {{ f }}
{% endfor %}{% endfor %}{% else %}
Nothing new this time.
{% endfor %}{% endblock %}
## Sources
{% block sources -%}
| source | status | items |
|---|---|---|
{% for s in sources %}| {{ s.name | md }} | {{ s.status | md }} | {{ s.items }} |
{% endfor %}{% if failures %}
Failures:
{% for f in failures %}- {{ f.source | md }}: {{ f.reason | md }}
{% endfor %}{% endif %}{% endblock %}
{% if previous_digest %}
Previous digest: [[{{ previous_digest }}]]
{% endif %}"#;

#[derive(Debug, Clone, Serialize)]
pub struct SourceStatus {
    pub name: String,
    pub status: String,
    pub items: usize,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Failure {
    pub source: String,
    pub reason: String,
}

/// Instructions a digest template may execute: room for thousands of items.
const DIGEST_FUEL: u64 = 20_000_000;

/// Renders the digest. `custom` is an override template's text, if the agent has one.
pub fn render(input: &serde_json::Value, custom: Option<&str>) -> Result<String, RenderError> {
    let mut env = Environment::new();
    // Bounded like every template steward runs: a loop in an override template ends in
    // an error, not a step that spins until its runtime cap.
    env.set_fuel(Some(DIGEST_FUEL));
    env.add_filter("md", escape_markdown);
    env.add_filter("md_url", escape_url);
    env.add_template("digest.md", DEFAULT_TEMPLATE)
        .map_err(RenderError::Default)?;
    let name = match custom {
        Some(text) => {
            env.add_template_owned("custom.md", text.to_string())
                .map_err(RenderError::Override)?;
            "custom.md"
        }
        None => "digest.md",
    };
    let tmpl = env.get_template(name).map_err(RenderError::Lookup)?;
    tmpl.render(input).map_err(RenderError::Render)
}

/// Why a digest could not be rendered: a template that does not parse, or one that fails
/// (or runs out of fuel) while rendering.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("digest template: {0}")]
    Default(minijinja::Error),
    #[error("override template: {0}")]
    Override(minijinja::Error),
    #[error("template: {0}")]
    Lookup(minijinja::Error),
    #[error("cannot render the digest: {0}")]
    Render(minijinja::Error),
}

/// Text from a feed, made inert in markdown: every character that could open a link, a
/// table cell, emphasis, code, a heading or raw HTML is backslash-escaped (CommonMark's
/// escapable ASCII punctuation), so a `]`, `|` or `<tag>` in a title is shown as typed.
pub fn escape_markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if matches!(
            c,
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' | '!' | '(' | ')' | '~'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A link destination that cannot end the markdown link early: spaces, brackets and
/// parentheses percent-encoded.
pub fn escape_url(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    for c in url.chars() {
        match c {
            ' ' => out.push_str("%20"),
            '<' => out.push_str("%3C"),
            '>' => out.push_str("%3E"),
            '(' => out.push_str("%28"),
            ')' => out.push_str("%29"),
            '[' => out.push_str("%5B"),
            ']' => out.push_str("%5D"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// `VAULT/digests/<cadence>/YYYY-MM-DD-<agent>.md`
pub fn path_for(vault: &Path, cadence: &str, date: &str, agent: &str) -> PathBuf {
    vault
        .join("digests")
        .join(cadence)
        .join(format!("{date}-{agent}.md"))
}

/// Writes a file atomically: a temp file beside it, synced, renamed into place.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent folder"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_a_feed_cannot_break_a_link_or_a_table() {
        let input = serde_json::json!({
            "agent": "a", "cadence": "daily", "date": "2026-12-03", "since": null,
            "previous_digest": null,
            "counts": {"new": 1, "updated": 0, "polled": 1, "failed": 0},
            "items": [{"title": "Fix ] and | and <b>", "source": "s|x", "novelty": "new"}],
            "groups": [{"source": "s|x", "items": [{
                "title": "Fix ] and | and <b>", "link": "https://x.org/a (b)",
                "summary": "*not bold* `not code`", "novelty": "new", "flags": []
            }]}],
            "sources": [{"name": "s|x", "status": "ok", "items": 1}],
            "failures": [],
        });
        let text = render(&input, None).unwrap();
        assert!(
            text.contains(r"- [Fix \] and \| and \<b\>](https://x.org/a%20%28b%29)"),
            "{text}"
        );
        assert!(text.contains(r"\*not bold\* \`not code\`"), "{text}");
        assert!(text.contains(r"| s\|x | ok | 1 |"), "{text}");
        // A markdown parser sees one link with the whole title as its text.
        let links: Vec<String> = pulldown_cmark::Parser::new(&text)
            .filter_map(|e| match e {
                pulldown_cmark::Event::Start(pulldown_cmark::Tag::Link { dest_url, .. }) => {
                    Some(dest_url.to_string())
                }
                _ => None,
            })
            .collect();
        assert_eq!(links, ["https://x.org/a%20%28b%29"]);
    }
}
