//! What a new user runs into at the command line: output to a closed pipe, listings that
//! cover agents and agencies, and errors that name the file, line and field.

mod util;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use util::{wait_for, Env, Spec};

const QUICK: &str = "cat >/dev/null\necho '{\"ok\": true}'\n";

/// Runs `steward ARGS` with stdout's reader already gone (as after `| head -1`); returns
/// the exit code and stderr. `meanwhile` runs every 200 ms until steward has ended (a
/// follower only notices the reader is gone when it next has something to print).
fn with_closed_stdout(env: &Env, args: &[&str], mut meanwhile: impl FnMut()) -> (i32, String) {
    let mut child = env
        .command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "steward {args:?} did not end");
        meanwhile();
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code().unwrap_or(-1), err)
}

#[test]
fn logs_to_a_closed_pipe_end_quietly_with_exit_0() {
    let env = Env::new();
    env.workflow(&Spec::new("hello", QUICK).dry());
    for _ in 0..3 {
        assert_eq!(env.run("hello", false).state(), "success");
    }
    for args in [&["logs"][..], &["logs", "--json"], &["list"], &["validate"]] {
        let (code, err) = with_closed_stdout(&env, args, || {});
        assert_eq!(code, 0, "steward {args:?}: {err}");
        assert!(!err.contains("panicked"), "steward {args:?}: {err}");
    }
    // `logs -f`: it notices when it next has something to print, so runs keep coming
    // until it has ended.
    let (code, err) = with_closed_stdout(&env, &["logs", "-f", "-n", "0"], || {
        env.run("hello", false);
    });
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn logs_piped_to_head_prints_its_line_and_exits_0() {
    let env = Env::new();
    env.workflow(&Spec::new("hello", QUICK).dry());
    env.run("hello", false);
    // The acceptance line, literally: `steward logs | head -1`, and steward's own status.
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "'{}' logs | head -1; echo \"steward exited ${{PIPESTATUS[0]}}\"",
            env!("CARGO_BIN_EXE_steward")
        ))
        .env("STEWARD_CONFIG", &env.config)
        .env("STEWARD_STATE", &env.state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("hello"), "{text}");
    assert_eq!(lines[1], "steward exited 0", "{text}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn list_and_validate_cover_agents_and_agencies_and_show_next_fires() {
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let env = Env::new();
    let list = env.steward(&["--config", cfg, "list", "--json"]).json();
    let kinds: Vec<(String, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("hello".into(), "workflow".into())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("steward-news".into(), "agent".into())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("docs-team".into(), "agency".into())),
        "{kinds:?}"
    );
    let validate = env.steward(&["--config", cfg, "validate"]);
    assert_eq!(validate.code, 0, "{validate}");
    assert!(
        validate.stdout.contains("1 agency (docs-team)"),
        "{validate}"
    );
    assert!(
        validate.stdout.contains("1 agent (steward-news)"),
        "{validate}"
    );
    assert!(validate.stdout.contains("heartbeat: next 20"), "{validate}");
}

#[test]
fn errors_name_what_the_user_typed_and_what_exists() {
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let env = Env::new();
    let out = env.steward(&["--config", cfg, "digest", "nope"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr.contains("no digest agent named `nope`")
            && out.stderr.contains("agents: steward-news"),
        "{out}"
    );
    let out = env.steward(&[
        "--config", cfg, "case", "open", "--agency", "nope", "--case", "x",
    ]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("agencies: docs-team"), "{out}");

    // A queue nobody reads: kept, with a warning.
    env.workflow(
        &Spec::new("intake", QUICK)
            .dry()
            .trigger(r#"queue = "invoices""#),
    );
    let out = env.steward(&["enqueue", "invoice", "--payload", "{}"]);
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stderr
            .contains("no workflow reads queue `invoice` (queues read: invoices)"),
        "{out}"
    );
    let out = env.steward(&["enqueue", "invoices", "--payload", "{}"]);
    assert!(!out.stderr.contains("warning"), "{out}");
}

#[test]
fn config_errors_point_at_the_value_and_are_not_repeated_downstream() {
    let env = Env::new();
    let path = env.workflow(
        &Spec::new("writer", QUICK)
            .dry()
            .trigger("schedule = { cron = \"0 25 * * *\", timezone = \"Europe/Berlin\" }"),
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text.lines().position(|l| l.contains("0 25")).unwrap() + 1;
    let column = text.lines().nth(line - 1).unwrap().find("\"0 25").unwrap() + 1;
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    std::fs::write(
        env.config.join("agencies/team.toml"),
        "id = \"team\"\nmandate = \"m\"\nplanner = [\"scripts/p.sh\"]\nescalation_contact = \"x@example.org\"\n[limits]\nmax_turns = 1\nmax_acts = 1\nmax_spend_usd = 0.1\n[[roster]]\nname = \"w\"\nworkflow = \"writer\"\nscopes = []\n",
    )
    .unwrap();
    let out = env.steward(&["validate"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr.contains(&format!(
            "writer.toml:{line}:{column}: schedule.cron: the hour field `25`"
        )),
        "{out}"
    );
    assert!(out.stderr.contains("expected 0-23"), "{out}");
    // The agency that uses `writer` is not blamed for it too.
    assert!(!out.stderr.contains("team.toml"), "{out}");
    assert!(out.stderr.contains("1 error in"), "{out}");

    // A missing closing quote is named as such.
    std::fs::write(&path, text.replace("\"0 25 * * *\"", "\"0 9 * * *")).unwrap();
    let out = env.steward(&["validate"]);
    assert!(out.stderr.contains("no closing quote"), "{out}");
}

#[test]
fn a_schedule_added_while_the_daemon_runs_is_shown_by_next() {
    let env = Env::new();
    let _d = env.daemon(&[]);
    env.workflow(
        &Spec::new("nightly", QUICK)
            .dry()
            .trigger("schedule = { cron = \"30 2 * * *\", timezone = \"Europe/Berlin\" }"),
    );
    let mut fires = Vec::new();
    wait_for("next to answer", Duration::from_secs(2), || {
        let out = env.steward(&[
            "next",
            "nightly",
            "--from",
            "2027-03-27T12:00:00+01:00",
            "-n",
            "2",
            "--json",
        ]);
        if out.code == 0 {
            fires = out.json()["fires"].as_array().unwrap().clone();
        }
        out.code == 0
    });
    assert_eq!(
        fires,
        ["2027-03-28T03:00:00+02:00", "2027-03-29T02:30:00+02:00"]
    );
}

#[test]
fn agency_and_agent_errors_point_at_the_line_they_are_about() {
    let env = Env::new();
    env.workflow(&Spec::new("writer", QUICK).dry());
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    let agency = "id = \"team\"\nmandate = \"m\"\nplanner = [\"scripts/p.sh\"]\nescalation_contact = \"x@example.org\"\n[limits]\nmax_turns = 1\nmax_acts = 1\nmax_spend_usd = 0.1\n[[roster]]\nname = \"w\"\nworkflow = \"writer\"\nscopes = []\n[[roster]]\nname = \"r\"\nworkflow = \"reviewer\"\nscopes = []\n";
    std::fs::write(env.config.join("agencies/team.toml"), agency).unwrap();
    std::fs::create_dir_all(env.config.join("agents")).unwrap();
    std::fs::write(env.config.join("sources.toml"), "").unwrap();
    std::fs::write(
        env.config.join("agents/news.toml"),
        "agent_name = \"news\"\ncadence = \"daily\"\nschedule = \"0 7 * * Mon\"\ntimezone = \"Mars/Olympus\"\n",
    )
    .unwrap();
    let out = env.steward(&["validate"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr.contains("team.toml:15:12: roster member `r` runs workflow `reviewer`, which is not in the config (workflows: writer)"),
        "{out}"
    );
    assert!(
        out.stderr
            .contains("news.toml:4:1: schedule.timezone `Mars/Olympus`"),
        "{out}"
    );
}
