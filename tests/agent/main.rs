//! Digest agents end to end: the real binary, real feed files, a real HTTP server and a
//! real SMTP conversation on 127.0.0.1.

mod feeds;
mod mail;
mod runs;
#[path = "../util/mod.rs"]
mod util;
mod wild;

#[allow(unused_imports)]
use feeds::*;
#[allow(unused_imports)]
use mail::*;
#[allow(unused_imports)]
use runs::*;
#[allow(unused_imports)]
use wild::*;

use std::time::Duration;

use serde_json::Value;
use std::path::{Path, PathBuf};
use util::{copy_dir, Env, Run};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/feeds");

/// Writes `config/sources.toml`, `config/agents/NAME.toml` (and `steward.toml`).
fn setup(env: &Env, sources: &str, agent: &str, settings: &str) {
    std::fs::write(env.config.join("sources.toml"), sources).unwrap();
    std::fs::create_dir_all(env.config.join("agents")).unwrap();
    let name = agent
        .lines()
        .find_map(|l| l.strip_prefix("agent_name = \""))
        .unwrap()
        .trim_end_matches('"');
    std::fs::write(env.config.join(format!("agents/{name}.toml")), agent).unwrap();
    std::fs::write(env.config.join("steward.toml"), settings).unwrap();
}

fn file_source(name: &str, fixture: &str) -> String {
    let path = env_path(fixture);
    format!("[[source]]\nname = \"{name}\"\nkind = \"file\"\npath = \"{}\"\ntopic_tags = [\"github\"]\ntier = 1\n", path.display())
}

fn env_path(fixture: &str) -> PathBuf {
    Path::new(FIXTURES).join(fixture)
}

/// The digest written for `agent` (its date is in the agent's time zone, so look it up).
fn digest_path(env: &Env, cadence: &str, agent: &str) -> PathBuf {
    let dir = env.path(&format!("vault/digests/{cadence}"));
    std::fs::read_dir(&dir)
        .ok()
        .and_then(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.to_string_lossy().ends_with(&format!("-{agent}.md")))
        })
        .unwrap_or_else(|| dir.join(format!("missing-{agent}.md")))
}

fn summary(run: &Run) -> String {
    run.stdout
        .lines()
        .find(|l| l.starts_with('['))
        .unwrap_or_else(|| panic!("no summary line\n{run}"))
        .to_string()
}

const NOOP_AGENT: &str = "agent_name = \"noop-test-agent\"\ncadence = \"daily\"\nverify_loadbearing = false\ncurate_findings = false\ndry_run = false\n[source_filter]\ntopic_tags = [\"github\"]\n";
