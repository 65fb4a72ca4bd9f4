//! The daemon at rest and among others: no spinning when idle, one per state folder, a private socket.

use super::*;

/// User plus system CPU time of a process, in clock ticks (USER_HZ, 100 a second).
pub(crate) fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn an_idle_daemon_watching_a_queue_and_a_folder_does_not_spin() {
    let env = Env::new();
    env.workflow(&Spec::new("q", QUICK).trigger("queue = \"jobs\"").dry());
    env.workflow(
        &Spec::new("drop", QUICK)
            .trigger("file = { path = \"drop\", pattern = \"*.txt\", debounce_ms = 50 }")
            .dry(),
    );
    std::fs::create_dir_all(env.path("drop")).unwrap();
    let d = env.daemon(&[]);
    // One item through each first: the bug this guards against (the trigger's own listing
    // of its folder seen as an event, waking it again) starts with the first wake.
    assert_eq!(env.steward(&["enqueue", "jobs", "--payload", "1"]).code, 0);
    std::fs::write(env.path("drop/a.txt"), "a").unwrap();
    wait_for("both runs", Duration::from_secs(30), || {
        runs_of(&env, "q").len() == 1 && runs_of(&env, "drop").len() == 1
    });
    let before = cpu_ticks(d.pid());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(d.pid()) - before;
    // Idle means timers only: a tick or two in 3 s. Spinning on its own folder listing
    // used about a third of a core (~90 ticks).
    assert!(used <= 15, "idle daemon used {used} ticks of CPU in 3 s");
}

#[test]
fn a_second_daemon_on_the_same_state_folder_refuses_to_start() {
    let env = Env::new();
    env.workflow(&Spec::new("a", QUICK).dry());
    let _d = env.daemon(&[]);
    let out = env.steward(&["daemon"]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("already"), "{out}");
}

#[test]
fn control_socket_is_private_and_status_reports_the_daemon() {
    let env = Env::new();
    env.workflow(
        &Spec::new("tick", QUICK)
            .trigger("schedule = { cron = \"0 9 * * *\", timezone = \"Europe/Berlin\" }")
            .dry(),
    );
    let _d = env.daemon(&[]);
    let mode = std::fs::metadata(env.state.join("steward.sock"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let s = env.steward(&["status", "--json"]).json();
    assert!(s["uptime"].is_string() && s["in_flight"].is_array(), "{s}");
    assert_eq!(s["forced_dry_run"], false);
    let w = &s["workflows"][0];
    assert_eq!(w["id"], "tick");
    assert!(
        w["next_fire"]["local"]
            .as_str()
            .unwrap()
            .contains("09:00:00"),
        "{w}"
    );
    assert!(
        w["next_fire"]["utc"].as_str().unwrap().ends_with('Z'),
        "{w}"
    );
    let text = env.steward(&["status"]);
    assert!(
        text.stdout.contains("tick") && text.stdout.contains("up "),
        "{text}"
    );
}
