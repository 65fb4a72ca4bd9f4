//! `steward calendar` and `steward next` against cron implementations steward did not
//! write, from PyPI in a venv: croniter for wildcard jobs, cronsim (which mimics Debian
//! cron) for fixed-time jobs — see `fixtures/cron_reference.py` for why each, and the
//! known deviation of each that is removed — around both 2027 transitions of Berlin,
//! New York, Sydney and Lord Howe (whose clocks move by 30 minutes).

mod util;

use std::process::{Command, Stdio};

use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};
use util::{Env, Spec};

/// The reference fires for each row.
fn reference(rows: &[Value]) -> Vec<Vec<String>> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/cron_reference.py"
    );
    let mut child = Command::new(util::python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the reference");
    serde_json::to_writer(child.stdin.take().unwrap(), rows).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the reference failed");
    serde_json::from_slice(&out.stdout).expect("reference output is JSON")
}

fn fires_of(run: &util::Run) -> Vec<String> {
    assert_eq!(run.code, 0, "{run}");
    run.json()["fires"]
        .as_array()
        .unwrap_or_else(|| panic!("no fires array:\n{run}"))
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

/// (zone, the UTC instants its clocks change in 2027: back, then forward or the reverse)
const ZONES: [(&str, [&str; 2]); 4] = [
    (
        "Europe/Berlin",
        ["2027-03-28T01:00:00Z", "2027-10-31T01:00:00Z"],
    ),
    (
        "America/New_York",
        ["2027-03-14T07:00:00Z", "2027-11-07T06:00:00Z"],
    ),
    (
        "Australia/Sydney",
        ["2027-04-03T16:00:00Z", "2027-10-02T16:00:00Z"],
    ),
    (
        "Australia/Lord_Howe",
        ["2027-04-03T15:00:00Z", "2027-10-02T15:30:00Z"],
    ),
];

/// Wildcard jobs (minute or hour starts with `*`) and fixed-time jobs, each touching the
/// hours that some zone above skips or repeats.
const EXPRESSIONS: [&str; 11] = [
    "*/15 * * * *",
    "@hourly",
    "30 * * * *",
    "*/10 2 * * *",
    "30 2 * * *",
    "0 2 * * *",
    "45 1 * * *",
    "15 2 * * *",
    "0,30 1-3 * * *",
    "@daily",
    "0 9 * * *",
];

#[test]
fn calendar_agrees_with_debian_cron_across_dst_in_four_zones() {
    let env = Env::new();
    let mut rows = Vec::new();
    for (zone, changes) in ZONES {
        for change in changes {
            let change: DateTime<Utc> = change.parse().unwrap();
            // Well before, inside the first pass of a repeated hour, inside its second pass.
            for minutes in [-150, -20, 20] {
                let from = (change + Duration::minutes(minutes)).to_rfc3339();
                for expr in EXPRESSIONS {
                    rows.push(json!({"expr": expr, "tz": zone, "from": from, "count": 9}));
                }
            }
        }
    }
    let expected = reference(&rows);
    let mut wrong = Vec::new();
    for (row, want) in rows.iter().zip(&expected) {
        let (expr, tz, from) = (
            row["expr"].as_str().unwrap(),
            row["tz"].as_str().unwrap(),
            row["from"].as_str().unwrap(),
        );
        let run = env.steward(&[
            "calendar", expr, "--tz", tz, "--from", from, "-n", "9", "--json",
        ]);
        let got = fires_of(&run);
        if &got != want {
            wrong.push(format!(
                "{expr} in {tz} after {from}:\n  steward   {got:?}\n  reference {want:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} rows differ:\n{}",
        wrong.len(),
        rows.len(),
        wrong.join("\n")
    );
}

#[test]
fn next_reads_the_workflow_schedule_from_disk_and_agrees_with_debian_cron() {
    let env = Env::new();
    let spec = Spec::new("quarterly", "echo '{}'")
        .trigger(r#"schedule = { cron = "*/15 * * * *", timezone = "Europe/Berlin" }"#);
    env.workflow(&spec);
    let from = "2027-10-31T02:45:00+02:00";
    let got = fires_of(&env.steward(&[
        "next",
        "quarterly",
        "--from",
        from,
        "--count",
        "6",
        "--json",
    ]));
    let want = reference(&[
        json!({"expr": "*/15 * * * *", "tz": "Europe/Berlin", "from": from, "count": 6}),
    ]);
    assert_eq!(got, want[0]);
    // The repeated hour's second pass is not lost: 02:00+01:00 follows 02:45+02:00.
    assert_eq!(got[0], "2027-10-31T02:00:00+01:00");

    // An edit is read at once: no daemon, no reload.
    let spec = spec.trigger(r#"schedule = { cron = "30 2 * * *", timezone = "Europe/Berlin" }"#);
    env.workflow(&spec);
    let got = fires_of(&env.steward(&[
        "next",
        "quarterly",
        "--from",
        from,
        "--count",
        "2",
        "--json",
    ]));
    assert_eq!(
        got,
        ["2027-11-01T02:30:00+01:00", "2027-11-02T02:30:00+01:00"]
    );
}

#[test]
fn the_readable_preview_marks_repeated_and_skipped_hours() {
    let env = Env::new();
    let run = env.steward(&[
        "calendar",
        "*/30 * * * *",
        "--tz",
        "Europe/Berlin",
        "--from",
        "2027-10-31T02:10:00+02:00",
        "-n",
        "4",
    ]);
    assert_eq!(run.code, 0, "{run}");
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.contains("2027-10-31T"))
        .collect();
    assert!(
        lines[1].contains("2027-10-31T02:30:00+02:00") && lines[1].contains("first pass"),
        "{run}"
    );
    assert!(
        lines[2].contains("2027-10-31T02:00:00+01:00") && lines[2].contains("second pass"),
        "{run}"
    );
    let run = env.steward(&[
        "calendar",
        "30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--from",
        "2027-03-27T12:00:00+01:00",
        "-n",
        "1",
    ]);
    assert!(
        run.stdout.contains("2027-03-28T03:00:00+02:00") && run.stdout.contains("skipped hour"),
        "{run}"
    );
}

#[test]
fn bad_expressions_zones_and_starts_name_what_was_expected() {
    let env = Env::new();
    for (args, says) in [
        (vec!["calendar", "0 25 * * *"], "the hour field `25`"),
        (vec!["calendar", "0 9 * *"], "has 4 field(s)"),
        (
            vec!["calendar", "0 9 * * *", "--tz", "Mars/Olympus"],
            "not an IANA time zone",
        ),
        (
            vec!["calendar", "0 9 * * *", "--from", "tomorrow"],
            "not an RFC 3339 time",
        ),
        (
            vec!["next", "nope"],
            "no workflow, agent or agency named `nope`",
        ),
    ] {
        let run = env.steward(&args);
        assert_eq!(run.code, 1, "{run}");
        assert!(run.stderr.contains(says), "expected `{says}`:\n{run}");
    }
}
