//! Budgets: a breach ends the run exhausted, kills its whole tree, and commits nothing.

use super::*;

#[test]
fn breach_during_verify_also_ends_exhausted_without_commit() {
    let env = Env::new();
    env.live_workflow(
        &Spec::new(
            "w",
            "cat >/dev/null\necho 'charge tokens 900' >&3\necho '{\"x\":1}'\n",
        )
        .verify("cat >/dev/null\necho 'charge tokens 200' >&3\nsleep 30\necho pass\n"),
    );
    let out = env.run("w", true);
    assert_eq!(out.state(), "exhausted", "{out}");
    assert_eq!(
        out.json()["breach"],
        "tokens 1100/1000",
        "counted across run and verify: {out}"
    );
    assert!(!env.ledger().exists());
}

#[test]
fn charge_exactly_at_the_cap_is_within_budget() {
    let env = Env::new();
    env.live_workflow(&Spec::new(
        "w",
        "cat >/dev/null\necho 'charge tokens 1000' >&3\necho '{\"x\":1}'\n",
    ));
    let out = env.run("w", true);
    assert_eq!(out.state(), "success", "{out}");
}

#[test]
fn breach_kills_the_whole_process_tree() {
    let env = Env::new();
    let run = "cat >/dev/null\nsleep 300 &\necho $! > \"$MARKS/grandchild.pid\"\necho 'charge tokens 5000' >&3\nwait\n";
    env.live_workflow(&Spec::new("w", run));
    let out = env.run("w", true);
    assert_eq!(out.state(), "exhausted", "{out}");
    let pid = read_pid(&env.path("grandchild.pid"));
    wait_for("the grandchild to die", Duration::from_secs(5), || {
        process_gone(pid)
    });
}

#[test]
fn grandchild_that_ignores_sigterm_is_killed_too() {
    let env = Env::new();
    let run = "cat >/dev/null\nsh -c 'trap \"\" TERM; echo $$ > \"$MARKS/stubborn.pid\"; while :; do sleep 1; done' &\nwhile [ ! -s \"$MARKS/stubborn.pid\" ]; do sleep 0.05; done\necho 'charge tokens 5000' >&3\nwait\n";
    env.live_workflow(&Spec::new("w", run).budget(&format!("{BUDGET}kill_grace_s = 0.3\n")));
    let out = env.run("w", true);
    assert_eq!(out.state(), "exhausted", "{out}");
    let pid = read_pid(&env.path("stubborn.pid"));
    wait_for(
        "the stubborn grandchild to die",
        Duration::from_secs(5),
        || process_gone(pid),
    );
}

// ---- happy path, dry-run, idempotency ----
