//! The workflow standard's acceptance suite, against the real `steward` binary: every
//! guard breach ends exhausted, dead-lettered, logged, with nothing committed; the happy
//! path commits once; dry-run, idempotency, verify verdicts, noop, block, stall, retries,
//! approvals, go-live, crash recovery and secret redaction.

mod budget;
mod commit;
mod crashes;
mod retries;
#[path = "../util/mod.rs"]
mod util;
mod verdicts;

#[allow(unused_imports)]
use budget::*;
#[allow(unused_imports)]
use commit::*;
#[allow(unused_imports)]
use crashes::*;
#[allow(unused_imports)]
use retries::*;
#[allow(unused_imports)]
use verdicts::*;

use std::time::Duration;

use util::{process_gone, read_pid, wait_for, Env, Spec, BUDGET, COMMIT};

// ---- the four caps: each breach ends exhausted, dead-lettered, logged, never committed ----

/// A live workflow whose maker crosses `cap`, run once.
fn breach(cap: &str) -> (Env, util::Run) {
    let env = Env::new();
    let (run, budget) = match cap {
        "tokens" => (
            "cat >/dev/null\necho 'charge tokens 600' >&3\necho 'charge tokens 600' >&3\nsleep 30\n",
            BUDGET.to_string(),
        ),
        "tool_calls" => (
            "cat >/dev/null\nfor i in 1 2 3 4 5 6; do echo 'charge tool_calls 1' >&3; done\nsleep 30\n",
            BUDGET.to_string(),
        ),
        "runtime_s" => (
            "cat >/dev/null\nsleep 30\n",
            "max_tokens = 1000\nmax_tool_calls = 5\nmax_runtime_s = 0.5\nmax_cost_usd = 1.0\nkill_grace_s = 0.5\n".to_string(),
        ),
        "cost_usd" => (
            "cat >/dev/null\necho 'charge cost_usd 0.6' >&3\necho 'charge cost_usd 0.6' >&3\nsleep 30\n",
            BUDGET.to_string(),
        ),
        other => panic!("unknown cap {other}"),
    };
    env.live_workflow(&Spec::new("guarded", run).budget(&budget));
    let out = env.run("guarded", true);
    (env, out)
}

fn assert_exhausted(cap: &str) {
    let (_env, out) = breach(cap);
    assert_eq!(out.state(), "exhausted", "{out}");
    assert_eq!(out.code, 6, "{out}");
    let reason = out.reason().to_string();
    assert!(
        reason.contains(cap),
        "reason should name {cap}: {reason}\n{out}"
    );
}

fn assert_dead_lettered(cap: &str) {
    let (env, out) = breach(cap);
    assert_eq!(env.dead_letter_ids(), vec![out.run_id()], "{out}");
    let show = env.steward(&["dead-letter", "show", &out.run_id(), "--json"]);
    let entry = show.json();
    assert_eq!(entry["run"]["state"], "exhausted", "{show}");
    assert!(
        entry["run"]["breach"].as_str().unwrap().starts_with(cap),
        "{show}"
    );
    assert_eq!(
        entry["run"]["trigger"]["kind"], "manual",
        "full context kept: {show}"
    );
}

fn assert_logged(cap: &str) {
    let (env, out) = breach(cap);
    let log = env.runlog_for(&out.run_id());
    let breach = log
        .iter()
        .find(|e| e["status"] == "breach")
        .unwrap_or_else(|| panic!("no breach record\n{out}"));
    assert_eq!(breach["data"]["cap"], cap, "{out}");
    assert!(breach["detail"].as_str().unwrap().contains(cap), "{out}");
    let end = log.iter().find(|e| e["step"] == "end").expect("end record");
    assert_eq!(end["status"], "exhausted", "{out}");
    assert_eq!(end["data"]["dead_lettered"], true, "{out}");
}

fn assert_not_committed(cap: &str) {
    let (env, out) = breach(cap);
    assert!(
        out.json()["breach"].as_str().unwrap_or("").starts_with(cap),
        "not a {cap} breach\n{out}"
    );
    assert!(
        !env.ledger().exists(),
        "commit ran after a {cap} breach\n{out}"
    );
    assert_eq!(out.json()["committed"], false);
    let log = env.runlog_for(&out.run_id());
    assert!(
        !log.iter()
            .any(|e| e["step"] == "commit" || e["step"] == "verify"),
        "{out}"
    );
}

macro_rules! cap_tests {
    ($($cap:ident => $name:literal),*) => {$(
        mod $cap {
            #[test] fn breach_ends_exhausted() { super::assert_exhausted($name) }
            #[test] fn breach_is_dead_lettered() { super::assert_dead_lettered($name) }
            #[test] fn breach_writes_runlog_record_naming_the_cap() { super::assert_logged($name) }
            #[test] fn breach_never_commits() { super::assert_not_committed($name) }
        }
    )*};
}

cap_tests!(tokens => "tokens", tool_calls => "tool_calls", runtime => "runtime_s", cost => "cost_usd");
