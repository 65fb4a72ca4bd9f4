//! Agency cases and webhook deliveries, decided once for the whole cluster.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_appends_at_one_version_the_server_takes_one() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    for version in 1..=5u64 {
        let (ea, eb) = (format!("a{version}"), format!("b{version}"));
        let (x, y) = tokio::join!(
            a.append_case_event("case/1", version, ea.as_bytes()),
            b.append_case_event("case/1", version, eb.as_bytes()),
        );
        let won = [x.unwrap(), y.unwrap()];
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "version {version}: {won:?}"
        );
    }
    // A version out of turn is refused; a new case starts at 1.
    assert!(!a.append_case_event("case/1", 9, b"late").await.unwrap());
    assert!(!a.append_case_event("other", 2, b"x").await.unwrap());
    assert!(b.append_case_event("other", 1, b"x").await.unwrap());
    let events = b.case_events("case/1").await.unwrap();
    assert_eq!(
        events.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(a.case_ids().await.unwrap(), ["case/1", "other"]);
}

/// The docs agency of tests/agency.rs: a planner that dispatches three members in turn.
pub(crate) const DOCS_PLANNER: &str = r#"sleep 0.2
case=$(cat)
has() { printf '%s' "$case" | grep -q "\"done_members\":\[[^]]*\"$1\""; }
if ! has researcher; then echo '{"action":"dispatch","member":"researcher","task":"collect","needed_scope":["read:repo"]}'
elif ! has writer; then echo '{"action":"dispatch","member":"writer","task":"draft","needed_scope":["write:draft"]}'
elif ! has reviewer; then echo '{"action":"dispatch","member":"reviewer","task":"review","needed_scope":["read:draft"]}'
else echo '{"action":"resolve","resolution":"docs are current"}'
fi
"#;

pub(crate) fn docs_agency(env: &util::Env) {
    for (id, out) in [
        ("research", "notes"),
        ("write", "draft"),
        ("review", "approved"),
    ] {
        env.workflow(
            &util::Spec::new(id, &format!("cat >/dev/null\necho '{{\"{out}\": 1}}'\n")).dry(),
        );
    }
    let planner = env.script("planner.sh", DOCS_PLANNER);
    let text = format!(
        "id = \"docs\"\nmandate = \"Keep the docs current\"\nplanner = [\"{planner}\"]\nescalation_contact = \"docs-lead@example.org\"\n[limits]\nmax_turns = 50\nmax_acts = 20\nmax_spend_usd = 5.0\n\
         [[roster]]\nname = \"researcher\"\nworkflow = \"research\"\nscopes = [\"read:repo\"]\n\
         [[roster]]\nname = \"writer\"\nworkflow = \"write\"\nscopes = [\"write:draft\"]\n\
         [[roster]]\nname = \"reviewer\"\nworkflow = \"review\"\nscopes = [\"read:draft\"]\n"
    );
    std::fs::create_dir_all(env.config.join("agencies")).unwrap();
    std::fs::write(env.config.join("agencies/docs.toml"), text).unwrap();
}

#[test]
fn two_drivers_racing_one_case_on_two_daemons_win_one_append_each_turn() {
    let server = NatsServer::start();
    let three = three_with(&server, &[], docs_agency);
    let out = three.views[0].steward(&["case", "open", "--agency", "docs", "--case", "r1"]);
    assert_eq!(out.code, 0, "{out}");
    let result = three.env.path("result.json");
    std::fs::write(
        &result,
        r#"{"run_id": "by-hand", "state": "elsewhere", "output": null}"#,
    )
    .unwrap();
    for round in 1..=3u64 {
        let res = result.to_str().unwrap().to_string();
        // alpha through the first daemon, beta through the second: one case, two daemons.
        let spawn = |view: &util::Env, driver: &str| {
            let mut args = vec!["case", "advance", "r1", "--driver", driver, "--json"];
            if round > 1 {
                args.extend(["--member-result", res.as_str()]);
            }
            view.command(&args)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let racing = [
            spawn(&three.views[0], "alpha"),
            spawn(&three.views[1], "beta"),
        ];
        let outs: Vec<(i32, String)> = racing
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
        assert_eq!(
            (winners, losers),
            (1, 1),
            "round {round}: {outs:?}\n{}",
            three.logs()
        );
        // Either daemon reads the same case.
        for view in &three.views[..2] {
            let status = view.steward(&["case", "status", "r1", "--json"]).json();
            assert_eq!(
                status["acts"], round,
                "exactly one dispatch per turn: {status:#}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_delivery_is_remembered_once_for_the_whole_cluster() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    let now = Utc::now();
    let seen = |run: &str, secs: i64| steward::store::SeenDelivery {
        run_id: run.into(),
        until: now + chrono::Duration::seconds(secs),
    };
    let (sa, sb) = (seen("run-a", 300), seen("run-b", 300));
    let (x, y) = tokio::join!(
        a.remember_delivery("hook", "evt/1", &sa, now),
        b.remember_delivery("hook", "evt/1", &sb, now),
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    // One remembered it; the other was told of that sighting.
    assert_eq!(
        [x.is_none(), y.is_none()].iter().filter(|f| **f).count(),
        1,
        "{x:?} {y:?}"
    );
    let first = x.or(y).unwrap();
    assert!(first == sa || first == sb);
    // Past its time, a sighting is replaced; forgetting drops only the expired.
    let short = seen("run-c", 1);
    assert!(a
        .remember_delivery("hook", "evt/2", &short, now)
        .await
        .unwrap()
        .is_none());
    let later = now + chrono::Duration::seconds(5);
    assert!(b
        .remember_delivery("hook", "evt/2", &seen("run-d", 300), later)
        .await
        .unwrap()
        .is_none());
    assert!(a
        .remember_delivery("hook", "evt/3", &short, now)
        .await
        .unwrap()
        .is_none());
    assert_eq!(b.forget_deliveries(later).await.unwrap(), 1);
    assert!(a
        .remember_delivery("hook", "evt/1", &seen("run-e", 300), later)
        .await
        .unwrap()
        .is_some());
}
