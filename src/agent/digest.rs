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
{% for i in items[:5] %}- {{ i.title }} ({{ i.source }}){% if i.novelty == "updated" %} — updated{% endif %}
{% endfor %}{% else %}No new items{% if since %} since {{ since }}{% endif %}.
{% endif %}{% if why_you_care_extra %}
> {{ why_you_care_extra }}
{% endif %}{% endblock %}
## Items
{% block items -%}
{% for group in groups %}
### {{ group.source }}
{% for i in group.items %}- {% if i.link %}[{{ i.title }}]({{ i.link }}){% else %}{{ i.title }}{% endif %}{% if i.novelty == "updated" %} *(updated)*{% endif %}{% if i.published %} · {{ i.published }}{% endif %}
{% if i.summary %}  {{ i.summary }}
{% endif %}{% for f in i.flags %}  - ⚠ {{ f }}
{% endfor %}{% endfor %}{% else %}
Nothing new this time.
{% endfor %}{% endblock %}
## Sources
{% block sources -%}
| source | status | items |
|---|---|---|
{% for s in sources %}| {{ s.name }} | {{ s.status }} | {{ s.items }} |
{% endfor %}{% if failures %}
Failures:
{% for f in failures %}- {{ f.source }}: {{ f.reason }}
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

/// Renders the digest. `custom` is an override template's text, if the agent has one.
pub fn render(input: &serde_json::Value, custom: Option<&str>) -> Result<String, String> {
    let mut env = Environment::new();
    env.add_template("digest.md", DEFAULT_TEMPLATE)
        .map_err(|e| format!("digest template: {e}"))?;
    let name = match custom {
        Some(text) => {
            env.add_template_owned("custom.md", text.to_string())
                .map_err(|e| format!("override template: {e}"))?;
            "custom.md"
        }
        None => "digest.md",
    };
    let tmpl = env
        .get_template(name)
        .map_err(|e| format!("template: {e}"))?;
    tmpl.render(input)
        .map_err(|e| format!("cannot render the digest: {e}"))
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
