//! Agency cases end to end: the real binary (and a real daemon for racing drivers), real
//! member workflows and a real planner process.

mod util;

use serde_json::Value;
use util::{Env, Spec};

/// Planner: researcher, then writer, then reviewer; resolves once the reviewer approved.
const DOCS_PLANNER: &str = r#"case=$(cat)
has() { printf '%s' "$case" | grep -q "\"done_members\":\[[^]]*\"$1\""; }
if ! has researcher; then echo '{"action":"dispatch","member":"researcher","task":"collect what changed","needed_scope":["read:repo"]}'
elif ! has writer; then echo '{"action":"dispatch","member":"writer","task":"draft the docs","needed_scope":["write:draft"]}'
elif ! has reviewer; then echo '{"action":"dispatch","member":"reviewer","task":"review the draft","needed_scope":["read:draft"]}'
elif printf '%s' "$case" | grep -q '"approved":true'; then echo '{"action":"resolve","resolution":"docs are current"}'
else echo '{"action":"escalate","missing":"a reviewer approval"}'
fi
"#;

fn docs_agency(env: &Env, planner: &str, limits: &str, extra: &str) {
    env.workflow(
        &Spec::new(
            "research",
            "cat >/dev/null\necho '{\"notes\": \"3 APIs changed\"}'\n",
        )
        .dry(),
    );
    env.workflow(&Spec::new("write", "cat >/dev/null\necho '{\"draft\": \"docs v2\"}'\n").dry());
    env.workflow(&Spec::new("review", "cat >/dev/null\necho '{\"approved\": true}'\n").dry());
    let planner = env.script("planner.sh", planner);
    let text = format!(
        "id = \"docs\"\nmandate = \"Keep the docs current\"\nplanner = [\"{planner}\"]\nescalation_contact = \"docs-lead@example.org\"\n{extra}\n[limits]\n{limits}\n\
         [[roster]]\nname = \"researcher\"\nworkflow = \"research\"\nscopes = [\"read:repo\"]\n\
         [[roster]]\nname = \"writer\"\nworkflow = \"write\"\nscopes = [\"write:draft\"]\n\
         [[roster]]\nname = \"reviewer\"\nworkflow = \"review\"\nscopes = [\"read:draft\"]\n"
    );
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    std::fs::write(env.config.join("agencies/docs.toml"), text).unwrap();
}

const LIMITS_50: &str = "max_turns = 50\nmax_acts = 20\nmax_spend_usd = 5.0";

fn advance(env: &Env, case: &str, driver: &str, run: bool) -> (i32, Value) {
    let mut args = vec!["case", "advance", case, "--driver", driver, "--json"];
    if run {
        args.push("--run");
    }
    let out = env.steward(&args);
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|_| panic!("not JSON\n{out}"));
    (out.code, v)
}

#[test]
fn the_seeds_worked_example_resolves_with_a_receipt_per_dispatch() {
    let env = Env::new();
    docs_agency(&env, DOCS_PLANNER, LIMITS_50, "");
    let open = env.steward(&[
        "case",
        "open",
        "--agency",
        "docs",
        "--case",
        "docs-1",
        "--signal",
        r#"{"release": "2.0"}"#,
    ]);
    assert_eq!(open.code, 0, "{open}");
    let mut members = Vec::new();
    let mut receipts = Vec::new();
    loop {
        let (code, v) = advance(&env, "docs-1", "alice", true);
        let t = &v["agency_turn"];
        assert_eq!(t["schema"], "runx.agency.turn.v1");
        assert_eq!(code, 0, "{v}");
        match t["status"].as_str().unwrap() {
            "advanced" => {
                members.push(t["dispatch"]["member"].as_str().unwrap().to_string());
                receipts.push(t["receipt"].as_str().expect("a receipt run id").to_string());
            }
            "resolved" => {
                let r = &t["resolution"]["receipts"];
                assert_eq!(r.as_array().unwrap().len(), 3, "{v}");
                break;
            }
            other => panic!("unexpected {other}: {v}"),
        }
        assert!(members.len() <= 3, "too many dispatches: {members:?}");
    }
    assert_eq!(members, ["researcher", "writer", "reviewer"]);
    let runs = env.steward(&["runs", "--json"]).json();
    for id in &receipts {
        assert!(
            runs.as_array()
                .unwrap()
                .iter()
                .any(|r| r["run_id"] == id.as_str() && r["state"] == "success"),
            "receipt {id} not in `steward runs`"
        );
    }
    let status = env.steward(&["case", "status", "docs-1", "--json"]).json();
    assert_eq!(status["status"], "resolved");
    assert_eq!(status["turns"], 4);
    assert_eq!(env.steward(&["case", "verify", "docs-1"]).code, 0);
    // A resolved case stays closed.
    assert_eq!(
        advance(&env, "docs-1", "alice", true).1["agency_turn"]["status"],
        "resolved"
    );
}

/// A typo'd case id must not look like a turn that merely waits: a script looping
/// "advance until resolved" would spin forever on exit 0. (The seed answers
/// `needs_input`; the issue that found the loop wins.)
#[test]
fn advancing_a_case_that_does_not_exist_or_with_no_driver_is_an_error() {
    let env = Env::new();
    docs_agency(&env, DOCS_PLANNER, LIMITS_50, "");
    let out = env.steward(&["case", "advance", "nope", "--driver", "alice"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr.contains("no case `nope`") && out.stderr.contains("case open"),
        "{out}"
    );
    env.steward(&["case", "open", "--agency", "docs", "--case", "c1"]);
    let out = env.steward(&["case", "advance", "c1", "--driver", ""]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("--driver is empty"), "{out}");
    let status = env.steward(&["case", "status", "c1", "--json"]).json();
    assert_eq!(status["turns"], 0, "an empty driver advanced the case");
}

#[test]
fn a_member_outside_the_roster_or_a_scope_above_the_ceiling_is_refused() {
    let env = Env::new();
    docs_agency(&env, "cat >/dev/null\necho '{\"action\":\"dispatch\",\"member\":\"intruder\",\"task\":\"x\",\"needed_scope\":[]}'\n", LIMITS_50, "");
    env.steward(&["case", "open", "--agency", "docs", "--case", "c1"]);
    let (code, v) = advance(&env, "c1", "alice", true);
    assert_eq!(code, 4, "{v}");
    assert_eq!(v["agency_turn"]["status"], "refused");
    assert!(
        v["agency_turn"]["reason"]
            .as_str()
            .unwrap()
            .contains("not on the roster"),
        "{v}"
    );
    env.script("planner.sh", "cat >/dev/null\necho '{\"action\":\"dispatch\",\"member\":\"writer\",\"task\":\"deploy\",\"needed_scope\":[\"write:prod\"]}'\n");
    let (code, v) = advance(&env, "c1", "alice", true);
    assert_eq!(code, 4, "{v}");
    assert!(
        v["agency_turn"]["reason"]
            .as_str()
            .unwrap()
            .contains("beyond writer's ceiling"),
        "{v}"
    );
    let status = env.steward(&["case", "status", "c1", "--json"]).json();
    assert_eq!(status["version"], 1, "the case must not advance");
    assert_eq!(status["acts"], 0);
    let refusals = env
        .runlog()
        .into_iter()
        .filter(|e| e["step"] == "case" && e["status"] == "refused")
        .count();
    assert_eq!(refusals, 2, "each refusal is logged");
}

#[test]
fn a_spend_cap_caps_the_third_member_and_fails_the_next_turn_naming_spend() {
    let env = Env::new();
    let charge = "cat >/dev/null\necho 'charge cost_usd 0.4' >&3\nsleep 0.2\necho '{\"ok\":1}'\n";
    env.workflow(&Spec::new("work", charge).dry());
    let planner = env.script("planner.sh", "cat >/dev/null\necho '{\"action\":\"dispatch\",\"member\":\"worker\",\"task\":\"spend\",\"needed_scope\":[]}'\n");
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    std::fs::write(
        env.config.join("agencies/spend.toml"),
        format!("id = \"spendy\"\nmandate = \"m\"\nplanner = [\"{planner}\"]\nescalation_contact = \"x@example.org\"\n[limits]\nmax_turns = 50\nmax_acts = 50\nmax_spend_usd = 1.0\n[[roster]]\nname = \"worker\"\nworkflow = \"work\"\n"),
    )
    .unwrap();
    env.steward(&["case", "open", "--agency", "spendy", "--case", "s1"]);
    let mut states = Vec::new();
    for _ in 0..3 {
        let (_, v) = advance(&env, "s1", "d", true);
        assert_eq!(v["agency_turn"]["status"], "advanced", "{v}");
        let rid = v["agency_turn"]["receipt"].as_str().unwrap().to_string();
        states.push(env.steward(&["show", &rid, "--json"]).json());
    }
    assert_eq!(states[0]["state"], "success");
    assert_eq!(states[1]["state"], "success");
    assert_eq!(
        states[2]["state"], "exhausted",
        "the third run gets only the 0.20 left"
    );
    assert_eq!(states[2]["breach"], "cost_usd 0.4/0.2");
    let (code, v) = advance(&env, "s1", "d", true);
    assert_eq!(code, 5, "{v}");
    assert_eq!(v["agency_turn"]["status"], "failed");
    assert!(
        v["agency_turn"]["reason"]
            .as_str()
            .unwrap()
            .contains("spend 1.00/1.00"),
        "{v}"
    );
    assert_eq!(v["agency_turn"]["predicates"]["spend_over"], true);
    let status = env.steward(&["case", "status", "s1", "--json"]).json();
    let spend = status["spend_usd"].as_f64().unwrap();
    assert!(
        spend <= 1.0 + 1e-9,
        "recorded spend {spend} exceeds the cap"
    );
}

#[test]
fn a_consequential_move_waits_for_approval() {
    let env = Env::new();
    docs_agency(
        &env,
        DOCS_PLANNER,
        LIMITS_50,
        "[approval]\nmembers = [\"writer\"]\n",
    );
    env.steward(&["case", "open", "--agency", "docs", "--case", "a1"]);
    assert_eq!(
        advance(&env, "a1", "d", true).1["agency_turn"]["status"],
        "advanced"
    );
    let (_, v) = advance(&env, "a1", "d", true);
    assert_eq!(v["agency_turn"]["status"], "awaiting_approval", "{v}");
    assert!(v["agency_turn"]["approval_prompt"]
        .as_str()
        .unwrap()
        .contains("writer"));
    assert_eq!(
        advance(&env, "a1", "d", true).1["agency_turn"]["status"],
        "awaiting_approval",
        "still waiting"
    );
    assert_eq!(env.steward(&["case", "approve", "a1"]).code, 0);
    let (_, v) = advance(&env, "a1", "d", true);
    assert_eq!(v["agency_turn"]["dispatch"]["member"], "writer", "{v}");
}

#[test]
fn tampering_with_a_stored_event_is_named_by_verify() {
    let env = Env::new();
    docs_agency(&env, DOCS_PLANNER, LIMITS_50, "");
    env.steward(&["case", "open", "--agency", "docs", "--case", "t1"]);
    advance(&env, "t1", "d", true);
    advance(&env, "t1", "d", true);
    assert_eq!(env.steward(&["case", "verify", "t1"]).code, 0);
    {
        // Tampering as someone with the state folder would: the database edited in place,
        // not through steward (its case events are keyed `case\0version`, big-endian).
        let db = sled::open(env.state.join("store")).unwrap();
        let events = db.open_tree("case_events").unwrap();
        let mut key = b"t1\0".to_vec();
        key.extend_from_slice(&3u64.to_be_bytes());
        let bytes = events.get(&key).unwrap().expect("the case has an event 3");
        let mut e: Value = serde_json::from_slice(&bytes).unwrap();
        e["data"]["spend_usd"] = serde_json::json!(0.0001);
        e["data"]["state"] = serde_json::json!("forged");
        events.insert(key, serde_json::to_vec(&e).unwrap()).unwrap();
        db.flush().unwrap();
    }
    let out = env.steward(&["case", "verify", "t1"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stdout.contains("event 3"), "{out}");
    let (code, _) = (
        env.steward(&["case", "advance", "t1", "--driver", "d"])
            .code,
        (),
    );
    assert_ne!(code, 0, "a broken chain is not advanced");
}

/// Two drivers race the same turn as separate processes through a running daemon.
#[test]
fn racing_drivers_through_the_daemon_dispatch_once_per_turn() {
    let env = Env::new();
    let slow_planner = format!("sleep 0.2\n{DOCS_PLANNER}");
    docs_agency(&env, &slow_planner, LIMITS_50, "");
    let _d = env.daemon(&[]);
    env.steward(&["case", "open", "--agency", "docs", "--case", "r1"]);
    let result = env.path("result.json");
    std::fs::write(
        &result,
        r#"{"run_id": "by-hand", "state": "elsewhere", "output": null}"#,
    )
    .unwrap();
    // Round 1 races the first turn; later rounds race the advance that records the last
    // member's result and plans the next turn (both drivers hold the same receipt).
    for round in 1..=8u64 {
        let res = result.to_str().unwrap().to_string();
        let spawn = |driver: &str| {
            let mut args = vec!["case", "advance", "r1", "--driver", driver, "--json"];
            if round > 1 {
                args.extend(["--member-result", res.as_str()]);
            }
            env.command(&args)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn("alpha"), spawn("beta"));
        let outs: Vec<(i32, String)> = [a, b]
            .into_iter()
            .map(|c| {
                let o = c.wait_with_output().unwrap();
                (
                    o.status.code().unwrap_or(-1),
                    String::from_utf8_lossy(&o.stdout).into_owned(),
                )
            })
            .collect();
        let winners = outs
            .iter()
            .filter(|(c, s)| *c == 0 && s.contains("\"advanced\""))
            .count();
        let losers = outs
            .iter()
            .filter(|(c, s)| *c == 10 && s.contains("version_conflict"))
            .count();
        assert_eq!((winners, losers), (1, 1), "round {round}: {outs:?}");
        let status = env.steward(&["case", "status", "r1", "--json"]).json();
        assert_eq!(status["acts"], round, "exactly one dispatch per turn");
        assert_eq!(
            status["receipts"].as_array().unwrap().len() as u64,
            round - 1,
            "exactly one result per turn"
        );
    }
}

/// The same race as concurrent tasks in one process, against the library.
#[test]
fn racing_drivers_in_one_process_dispatch_once_per_turn() {
    let env = Env::new();
    docs_agency(&env, &format!("sleep 0.1\n{DOCS_PLANNER}"), LIMITS_50, "");
    let cfg = steward::config::load_dir(&env.config).expect("config");
    let (engine, _) = steward::governed::open(&env.state).unwrap();
    let runner = steward::runner::Runner::new(engine.clone(), 8);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        steward::agency::open(&engine, &cfg.agencies["docs"], "p1", Value::Null).unwrap();
        for round in 1..=12u64 {
            let receipt = || {
                (round > 1).then(|| steward::agency::Receipt {
                    turn: 0,
                    member: String::new(),
                    run_id: format!("hand-{round}"),
                    state: "elsewhere".into(),
                    output: Value::Null,
                    spend_usd: 0.0,
                })
            };
            let (a, b) = tokio::join!(
                steward::agency::advance(&runner, &cfg, "p1", "alpha", receipt(), false),
                steward::agency::advance(&runner, &cfg, "p1", "beta", receipt(), false)
            );
            let ok = [&a, &b]
                .iter()
                .filter(|r| matches!(r, Ok(t) if t.status == steward::agency::TurnStatus::Advanced))
                .count();
            let conflicts = [&a, &b]
                .iter()
                .filter(|r| matches!(r, Err(steward::agency::CaseError::Conflict { .. })))
                .count();
            assert_eq!((ok, conflicts), (1, 1), "round {round}: {a:?} {b:?}");
            let (case, _) = steward::agency::load(&engine, "p1").unwrap().unwrap();
            assert_eq!(case.acts, round, "exactly one dispatch per turn");
            assert_eq!(
                case.receipts.len() as u64,
                round - 1,
                "exactly one result per turn"
            );
        }
    });
}

#[test]
fn the_daemon_drives_a_scheduled_agencys_open_case_to_resolution() {
    let env = Env::new();
    docs_agency(
        &env,
        DOCS_PLANNER,
        LIMITS_50,
        "[trigger]\nschedule = { cron = \"* * * * * *\" }\n",
    );
    env.steward(&["case", "open", "--agency", "docs", "--case", "auto-1"]);
    let _d = env.daemon(&[]);
    util::wait_for(
        "the daemon to resolve the case",
        std::time::Duration::from_secs(20),
        || env.steward(&["case", "status", "auto-1", "--json"]).json()["status"] == "resolved",
    );
    let status = env.steward(&["case", "status", "auto-1", "--json"]).json();
    assert_eq!(status["receipts"].as_array().unwrap().len(), 3, "{status}");
}

#[test]
fn the_example_agency_in_config_resolves() {
    let env = Env::new();
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let st = |args: &[&str]| {
        let mut all = vec!["--config", cfg];
        all.extend_from_slice(args);
        env.steward(&all)
    };
    assert_eq!(
        st(&["case", "open", "--agency", "docs-team", "--case", "rel-2"]).code,
        0
    );
    // researcher, writer, then the publisher, whose `publish` scope waits for approval.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let out = st(&[
            "case", "advance", "rel-2", "--driver", "test", "--run", "--json",
        ]);
        let status = out.json()["agency_turn"]["status"]
            .as_str()
            .unwrap_or("")
            .to_string();
        statuses.push(status.clone());
        match status.as_str() {
            "advanced" => {}
            "awaiting_approval" => assert_eq!(st(&["case", "approve", "rel-2"]).code, 0),
            _ => break,
        }
    }
    assert_eq!(
        statuses,
        [
            "advanced",
            "advanced",
            "awaiting_approval",
            "advanced",
            "resolved"
        ]
    );
    assert_eq!(st(&["case", "verify", "rel-2"]).code, 0);
}

#[test]
fn when_no_member_can_act_the_case_escalates_naming_the_missing_input() {
    let env = Env::new();
    docs_agency(
        &env,
        "cat >/dev/null\necho '{\"action\":\"escalate\",\"missing\":\"the release date\"}'\n",
        LIMITS_50,
        "",
    );
    env.steward(&["case", "open", "--agency", "docs", "--case", "e1"]);
    let (code, v) = advance(&env, "e1", "d", true);
    assert_eq!(code, 0, "{v}");
    let t = &v["agency_turn"];
    assert_eq!(t["status"], "needs_input");
    let reason = t["reason"].as_str().unwrap();
    assert!(
        reason.contains("the release date") && reason.contains("docs-lead@example.org"),
        "{reason}"
    );
}

#[test]
fn a_planner_run_by_the_daemon_sees_the_steps_environment_not_the_daemons() {
    let env = Env::new();
    let seen = env.path("planner-env");
    docs_agency(
        &env,
        &format!(
            "cat >/dev/null\nenv > {}\necho '{{\"action\":\"escalate\",\"missing\":\"x\"}}'\n",
            seen.display()
        ),
        LIMITS_50,
        "",
    );
    let _d = env.daemon_env(&[], &[("PLANNER_MUST_NOT_SEE", "hunter2")]);
    env.steward(&["case", "open", "--agency", "docs", "--case", "e1"]);
    let (code, v) = advance(&env, "e1", "d", false);
    assert_eq!(code, 0, "{v}");
    let text = std::fs::read_to_string(&seen).unwrap();
    assert!(text.contains("PATH="), "{text}");
    assert!(
        !text.contains("hunter2"),
        "the daemon's environment leaked:\n{text}"
    );
}

/// A member whose checker escalates holds the case until an operator settles that run:
/// the planner is not asked again meanwhile (the writer is not dispatched twice), and once
/// the run is approved the writer counts as done and the reviewer is next.
#[test]
fn a_member_run_that_escalates_holds_the_case_until_its_review_is_settled() {
    let env = Env::new();
    docs_agency(&env, DOCS_PLANNER, LIMITS_50, "");
    // The writer's checker asks for a human.
    env.workflow(
        &Spec::new("write", "cat >/dev/null\necho '{\"draft\": \"docs v2\"}'\n")
            .verify("cat >/dev/null\nexit 2\n")
            .dry(),
    );
    env.steward(&["case", "open", "--agency", "docs", "--case", "r1"]);
    let (_, first) = advance(&env, "r1", "d", true);
    assert_eq!(
        first["agency_turn"]["dispatch"]["member"], "researcher",
        "{first}"
    );
    let (_, second) = advance(&env, "r1", "d", true);
    assert_eq!(
        second["agency_turn"]["dispatch"]["member"], "writer",
        "{second}"
    );
    let review_run = second["agency_turn"]["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    for _ in 0..2 {
        let (code, held) = advance(&env, "r1", "d", true);
        assert_eq!(code, 0, "{held}");
        let t = &held["agency_turn"];
        assert_eq!(t["status"], "awaiting_approval", "{held}");
        assert!(
            t["reason"].as_str().unwrap().contains(&review_run),
            "{held}"
        );
    }
    let case = env.steward(&["case", "status", "r1", "--json"]).json();
    assert_eq!(
        case["acts"], 2,
        "no dispatch while the review waits: {case}"
    );
    let approve = env.steward(&["approve", &review_run]);
    assert_eq!(approve.code, 0, "{approve}");
    let (_, third) = advance(&env, "r1", "d", true);
    assert_eq!(
        third["agency_turn"]["dispatch"]["member"], "reviewer",
        "{third}"
    );
    let case = env.steward(&["case", "status", "r1", "--json"]).json();
    assert!(
        case["done_members"]
            .as_array()
            .unwrap()
            .contains(&"writer".into()),
        "{case}"
    );
}

#[test]
fn an_agency_spend_window_holds_every_case_once_their_total_reaches_it() {
    let env = Env::new();
    let charge = "cat >/dev/null\necho 'charge cost_usd 0.4' >&3\necho '{\"ok\":1}'\n";
    env.workflow(&Spec::new("work", charge).dry());
    let planner = env.script("planner.sh", "cat >/dev/null\necho '{\"action\":\"dispatch\",\"member\":\"worker\",\"task\":\"spend\",\"needed_scope\":[]}'\n");
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    // Each case may spend 5.00, the agency 1.00 a day over all of them.
    std::fs::write(
        env.config.join("agencies/spend.toml"),
        format!("id = \"spendy\"\nmandate = \"m\"\nplanner = [\"{planner}\"]\nescalation_contact = \"x@example.org\"\n[limits]\nmax_turns = 50\nmax_acts = 50\nmax_spend_usd = 5.0\n[limits.window]\nperiod = \"24h\"\nspend_usd = 1.0\n[[roster]]\nname = \"worker\"\nworkflow = \"work\"\n"),
    )
    .unwrap();
    for case in ["c1", "c2"] {
        env.steward(&["case", "open", "--agency", "spendy", "--case", case]);
    }
    // 0.40 + 0.40 in c1, then 0.40 in c2: 1.20 in all.
    for case in ["c1", "c1", "c2"] {
        let (_, v) = advance(&env, case, "d", true);
        assert_eq!(v["agency_turn"]["status"], "advanced", "{v}");
    }
    for case in ["c1", "c2"] {
        let (code, v) = advance(&env, case, "d", true);
        assert_eq!(
            (code, v["agency_turn"]["status"].as_str()),
            (9, Some("held")),
            "{v}"
        );
        let reason = v["agency_turn"]["reason"].as_str().unwrap();
        assert!(reason.contains("1.20 of 1.00 USD"), "{reason}");
    }
    // Held, not failed: the case stays open for when the window has room.
    let status = env.steward(&["case", "status", "c1", "--json"]).json();
    assert_eq!(status["status"], "open", "{status:#}");
}
