//! The daemon follows its config folder without a signal: an edit, a new file and a
//! deleted one take effect within 2 s; a broken edit is reported (log, `status`, the next
//! command) while the last valid config keeps running; and a command never acts on a
//! file's old content while its new content is on disk.

mod util;

use std::time::{Duration, Instant};

use util::{runs_of, wait_for, Env, Spec};

const QUICK: &str = "cat >/dev/null\necho '{\"ok\": true}'\n";
const EVERY_SECOND: &str = r#"schedule = { cron = "* * * * * *" }"#;

/// Scheduled runs of `workflow` in the runlog file (read directly: asking the daemon
/// would make it look at the folder itself, and this is about the watcher).
fn fires_in_runlog(env: &Env, workflow: &str) -> usize {
    env.runlog()
        .iter()
        .filter(|l| l["workflow"] == workflow && l["step"] == "trigger")
        .count()
}

fn log_has(d: &util::Daemon, text: &str) -> bool {
    d.log_text().contains(text)
}

#[test]
fn new_edited_and_deleted_files_take_effect_within_two_seconds_without_a_signal() {
    let env = Env::new();
    env.workflow(&Spec::new("hello", QUICK).dry());
    let d = env.daemon(&[]);

    // A new scheduled workflow starts firing: the watcher loaded it, no request asked.
    let started = Instant::now();
    env.workflow(&Spec::new("tick", QUICK).dry().trigger(EVERY_SECOND));
    wait_for("the new schedule to fire", Duration::from_secs(3), || {
        fires_in_runlog(&env, "tick") > 0
    });
    let took = started.elapsed();
    assert!(
        log_has(&d, "config change: config reloaded"),
        "{}",
        d.log_text()
    );
    // Loaded within 2 s; its first slot is at most a second later.
    assert!(took < Duration::from_secs(3), "took {took:?}");

    // An edit: tick becomes manual and stops firing.
    let reloads = d.log_text().matches("config reloaded").count();
    env.workflow(&Spec::new("tick", QUICK).dry());
    wait_for("the edit to load", Duration::from_secs(2), || {
        d.log_text().matches("config reloaded").count() > reloads
    });
    let status = env.steward(&["status", "--json"]).json();
    let tick = status["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == "tick")
        .cloned()
        .unwrap();
    assert_eq!(tick["trigger"], "manual", "{status:#}");
    // A run the old schedule had started may still end; nothing fires after it.
    let settled = fires_in_runlog(&env, "tick");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        fires_in_runlog(&env, "tick") <= settled + 1,
        "the edited-away schedule kept firing"
    );

    // A deleted file: the workflow is gone from the running daemon.
    let reloads = d.log_text().matches("config reloaded").count();
    std::fs::remove_file(env.config.join("workflows/tick.toml")).unwrap();
    wait_for("the deletion to load", Duration::from_secs(2), || {
        d.log_text().matches("config reloaded").count() > reloads
    });
    let run = env.steward(&["run", "tick"]);
    assert_eq!(run.code, 1, "{run}");
    assert!(run.stderr.contains("no workflow named `tick`"), "{run}");
}

#[test]
fn a_command_right_after_an_edit_answers_from_the_file_as_saved() {
    let env = Env::new();
    let hello = || Spec::new("hello", QUICK).commit("echo committed >> \"$LEDGER\"");
    env.workflow(&hello().dry());
    let _d = env.daemon(&[]);

    // dry_run = false saved, then go-live at once: the daemon reads the file as it is now.
    env.workflow(&hello());
    let out = env.steward(&["go-live", "hello"]);
    assert_eq!(out.code, 0, "{out}");
    let run = env.run("hello", true);
    assert_eq!(run.state(), "success", "{run}");
    assert_eq!(env.ledger_lines().len(), 1);

    // A workflow written a moment ago runs through the daemon.
    env.workflow(&Spec::new("greet", QUICK).dry());
    let run = env.run("greet", false);
    assert_eq!(run.state(), "success", "{run}");

    // An edit after go-live: the very next live run is refused, nothing commits.
    let path = env.config.join("workflows/hello.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}\n# edited\n")).unwrap();
    let run = env.steward(&["run", "hello", "--live", "--json"]);
    assert_ne!(run.code, 0, "{run}");
    assert!(run.stderr.contains("config changed after go-live"), "{run}");
    let run = env.run("hello", false);
    assert_eq!(run.state(), "success", "{run}");
    assert_eq!(env.ledger_lines().len(), 1, "an edited file committed");
}

#[test]
fn a_broken_edit_keeps_the_running_config_and_is_reported_until_fixed() {
    let env = Env::new();
    env.workflow(&Spec::new("hello", QUICK).dry());
    let tick = env.workflow(&Spec::new("tick", QUICK).dry().trigger(EVERY_SECOND));
    let d = env.daemon(&[]);
    let good = std::fs::read_to_string(&tick).unwrap();
    let broken = good.replace("* * * * * *", "0 25 * * *");
    let line = broken.lines().position(|l| l.contains("0 25")).unwrap() + 1;
    std::fs::write(&tick, &broken).unwrap();
    let at = format!("tick.toml:{line}:");

    // The log names the file, the line and the field, without a request asking.
    wait_for("the error in the log", Duration::from_secs(2), || {
        log_has(&d, &at) && log_has(&d, "keeping the running config")
    });
    assert!(log_has(&d, "the hour field `25`"), "{}", d.log_text());

    // The last valid config keeps running: the old schedule still fires.
    let before = fires_in_runlog(&env, "tick");
    wait_for("tick to keep firing", Duration::from_secs(5), || {
        fires_in_runlog(&env, "tick") > before
    });

    // status shows it; a command that needs the config says why it cannot act.
    let status = env.steward(&["status", "--json"]).json();
    let errors = status["config_errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{status:#}");
    assert!(errors[0].as_str().unwrap().contains(&at), "{status:#}");
    let human = env.steward(&["status"]);
    assert!(human.stdout.contains("CONFIG EDIT NOT LOADED"), "{human}");
    let run = env.steward(&["run", "tick"]);
    assert_eq!(run.code, 1, "{run}");
    assert!(
        run.stderr.contains(&at) && run.stderr.contains("keeps running the config loaded"),
        "{run}"
    );

    // Fixed: loaded again, the problem is gone.
    std::fs::write(&tick, &good).unwrap();
    wait_for("the fix to load", Duration::from_secs(2), || {
        log_has(&d, "config change: config reloaded")
    });
    let status = env.steward(&["status", "--json"]).json();
    assert_eq!(
        status["config_errors"].as_array().unwrap().len(),
        0,
        "{status:#}"
    );
    assert_eq!(runs_of(&env, "hello").len(), 0);
}
