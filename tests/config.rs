//! Config validation through `steward validate`: each mistake gets its own clear error
//! with file, line and column; a folder reports all errors; nothing panics.

mod util;

use util::{Env, Spec};

/// Writes a valid workflow, then applies `edit` to its text.
fn broken(env: &Env, id: &str, edit: impl Fn(String) -> String) -> std::path::PathBuf {
    let path = env.workflow(&Spec::new(id, "cat >/dev/null\n"));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(text)).unwrap();
    path
}

fn line_of(path: &std::path::Path, needle: &str) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .position(|l| l.contains(needle))
        .expect("needle in file")
        + 1
}

fn validate(env: &Env) -> util::Run {
    let out = env.steward(&["validate"]);
    assert!(!out.stderr.contains("panicked"), "{out}");
    out
}

#[test]
fn unknown_key_is_an_error_with_file_and_line() {
    let env = Env::new();
    let path = broken(&env, "w", |t| {
        t.replace("max_tokens = 1000", "max_tokns = 1000")
    });
    let out = validate(&env);
    assert_eq!(out.code, 1, "{out}");
    let want = format!("{}:{}:", path.display(), line_of(&path, "max_tokns"));
    assert!(out.stderr.contains(&want), "want {want}\n{out}");
    assert!(out.stderr.contains("unknown field `max_tokns`"), "{out}");
}

#[test]
fn missing_verify_is_rejected() {
    let env = Env::new();
    let path = broken(&env, "w", |t| {
        t.lines()
            .filter(|l| !l.starts_with("[verify]") && !l.contains("w-verify.sh"))
            .collect::<Vec<_>>()
            .join("\n")
    });
    let out = validate(&env);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr.contains(&format!("{}:", path.display())),
        "{out}"
    );
    assert!(out.stderr.contains("missing [verify]"), "{out}");
}

#[test]
fn bad_template_is_an_error_with_its_line() {
    let env = Env::new();
    let path = env.workflow(&Spec::new("w", "cat >/dev/null\n").key("{{ trigger.sha256 "));
    let out = validate(&env);
    assert_eq!(out.code, 1, "{out}");
    let want = format!("{}:{}:", path.display(), line_of(&path, "idempotency_key"));
    assert!(out.stderr.contains(&want), "want {want}\n{out}");
    assert!(
        out.stderr
            .contains("idempotency_key is not a valid template"),
        "{out}"
    );
}

#[test]
fn negative_budget_is_an_error_with_its_line() {
    let env = Env::new();
    let path = broken(&env, "w", |t| {
        t.replace("max_tokens = 1000", "max_tokens = -5")
    });
    let out = validate(&env);
    assert_eq!(out.code, 1, "{out}");
    let want = format!("{}:{}:", path.display(), line_of(&path, "max_tokens"));
    assert!(out.stderr.contains(&want), "want {want}\n{out}");
    assert!(
        out.stderr
            .contains("budget.max_tokens must be zero or more, got -5"),
        "{out}"
    );
}

#[test]
fn negative_cost_cap_is_an_error() {
    let env = Env::new();
    broken(&env, "w", |t| {
        t.replace("max_cost_usd = 1.0", "max_cost_usd = -0.5")
    });
    let out = validate(&env);
    assert!(
        out.stderr
            .contains("budget.max_cost_usd must be a number zero or more"),
        "{out}"
    );
}

#[test]
fn missing_budget_cap_is_an_error() {
    let env = Env::new();
    broken(&env, "w", |t| t.replace("max_tool_calls = 5\n", ""));
    let out = validate(&env);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("budget.max_tool_calls is missing"),
        "{out}"
    );
}

#[test]
fn validate_reports_every_error_of_the_folder() {
    let env = Env::new();
    broken(&env, "a", |t| t.replace("max_tokens", "max_tokns"));
    broken(&env, "b", |t| {
        t.replace("max_tokens = 1000", "max_tokens = -1")
    });
    broken(&env, "c", |t| {
        t.replace("id = \"c\"", "id = \"c\"\nbogus = 1")
    });
    env.workflow(&Spec::new("d", "cat >/dev/null\n"));
    let out = validate(&env);
    assert_eq!(out.code, 1);
    for f in ["a.toml", "b.toml", "c.toml"] {
        assert!(out.stderr.contains(f), "{f} missing\n{out}");
    }
    assert!(!out.stderr.contains("d.toml"), "{out}");
    assert!(out.stderr.contains("3 errors"), "{out}");
}

#[test]
fn a_valid_folder_passes_and_malformed_toml_does_not_panic() {
    let env = Env::new();
    env.workflow(&Spec::new("ok", "cat >/dev/null\n"));
    assert_eq!(validate(&env).code, 0);
    for junk in [
        "id = ",
        "[[[",
        "id = \"x\"\n[budget]\nmax_tokens = 1e999",
        "\u{0}\u{1}",
        "id = 5",
    ] {
        std::fs::write(env.config.join("workflows/junk.toml"), junk).unwrap();
        let out = validate(&env);
        assert_eq!(out.code, 1, "{junk:?}\n{out}");
        assert!(out.stderr.contains("junk.toml:"), "{out}");
    }
}

#[test]
fn missing_script_is_reported_at_validate_time() {
    let env = Env::new();
    let path = broken(&env, "w", |t| {
        t.replace("scripts/w-run.sh", "scripts/nope.sh")
    });
    let out = validate(&env);
    assert!(
        out.stderr.contains(&format!(
            "{}:{}:",
            path.display(),
            line_of(&path, "nope.sh")
        )),
        "{out}"
    );
    assert!(out.stderr.contains("run.command"), "{out}");
}

#[test]
fn running_with_a_broken_config_names_the_error() {
    let env = Env::new();
    broken(&env, "w", |t| t.replace("max_tokens", "max_tokns"));
    let out = env.run("w", false);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("unknown field `max_tokns`"), "{out}");
}

#[test]
fn steward_new_scaffolds_a_workflow_that_validates_and_runs_dry() {
    let env = Env::new();
    let out = env.steward(&["new", "nightly-report"]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(validate(&env).code, 0);
    let run = env.run("nightly-report", false);
    assert_eq!(run.state(), "success", "{run}");
    assert_eq!(run.json()["dry_run"], true);
    let again = env.steward(&["new", "nightly-report"]);
    assert_eq!(again.code, 1, "must refuse to overwrite\n{again}");
    let bad = env.steward(&["new", "../escape"]);
    assert_eq!(bad.code, 1, "{bad}");
}

#[test]
fn the_shipped_example_config_validates() {
    let env = Env::new();
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let out = env.steward(&["--config", cfg, "validate"]);
    assert_eq!(out.code, 0, "{out}");
}

/// `[budget]` caps held by cgroups: sizes with units, and a clear error for a bad one.
#[test]
fn budget_resource_caps_parse_and_bad_ones_name_the_field() {
    let root = std::path::Path::new("/cfg");
    let file = root.join("workflows/w.toml");
    let head = "id = \"w\"\n[trigger]\nmanual = true\n[run]\ncommand = [\"/bin/true\"]\n[verify]\ncommand = [\"/bin/true\"]\n[budget]\nmax_tokens = 1\nmax_tool_calls = 1\nmax_runtime_s = 1\nmax_cost_usd = 0\n";
    let parse = |extra: &str| {
        steward::config::parse_workflow(root, &file, format!("{head}{extra}").into_bytes())
    };
    let wf = parse("memory_max = \"512M\"\npids_max = 64\ncpu_weight = 50\n").unwrap();
    assert_eq!(wf.limits.memory_max, Some(512 << 20));
    assert_eq!(wf.limits.pids_max, Some(64));
    assert_eq!(wf.limits.cpu_weight, Some(50));
    assert_eq!(
        parse("memory_max = 2147483648\n")
            .unwrap()
            .limits
            .memory_max,
        Some(2 << 30)
    );
    for (bad, field) in [
        ("memory_max = \"12Q\"\n", "budget.memory_max"),
        ("memory_max = \"10K\"\n", "budget.memory_max"),
        ("pids_max = 0\n", "budget.pids_max"),
        ("cpu_weight = 20000\n", "budget.cpu_weight"),
    ] {
        let errors = parse(bad).unwrap_err();
        let text = errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            text.contains(field) && text.contains("w.toml:13"),
            "{bad}: {text}"
        );
    }
}

/// The keys of steering by exception: each mistake names its file, line and key.
#[test]
fn notify_window_expect_and_jitter_mistakes_name_the_key() {
    let env = Env::new();
    let path = broken(&env, "w", |t| {
        t.replace("[budget]\n", "[expect]\nwithin = \"15m\"\n\n[budget]\n")
            + "\n[budget.window]\nperiod = \"soon\"\n"
    });
    std::fs::write(
        env.config.join("steward.toml"),
        "[[notify]]\nkind = \"webhook\"\nurl = \"https://alerts.example.org/hook\"\nevents = [\"overdue\"]\n\n[[notify]]\nkind = \"email\"\nto = [\"ops@example.org\"]\nevents = [\"breaker_opn\"]\n",
    )
    .unwrap();
    let out = validate(&env);
    assert_eq!(out.code, 1, "{out}");
    // An unknown event names what exists.
    assert!(out.stderr.contains("steward.toml:9:"), "{out}");
    assert!(
        out.stderr.contains("unknown variant `breaker_opn`"),
        "{out}"
    );
    assert!(out.stderr.contains("breaker_open"), "{out}");
    std::fs::write(
        env.config.join("steward.toml"),
        "[[notify]]\nkind = \"webhook\"\nurl = \"https://alerts.example.org/hook\"\nevents = [\"overdue\"]\n\n[[notify]]\nkind = \"email\"\nevents = [\"overdue\"]\n",
    )
    .unwrap();
    let out = validate(&env);
    let text = &out.stderr;
    assert!(text.contains("steward.toml:6:1: notify[1].to:"), "{out}");
    assert!(
        text.contains("notify[1].kind: an email channel needs the [smtp] table"),
        "{out}"
    );
    let want = format!("{}:{}:", path.display(), line_of(&path, "within"));
    assert!(
        text.contains(&want) && text.contains("expect.within is for a schedule"),
        "{out}"
    );
    let want = format!("{}:{}:", path.display(), line_of(&path, "period"));
    assert!(
        text.contains(&want) && text.contains("budget.window.period: `soon`"),
        "{out}"
    );

    // A jitter that is not a duration, and a window without a sum.
    std::fs::remove_file(env.config.join("steward.toml")).unwrap();
    let path = broken(&env, "w", |t| {
        t.replace(
            "manual = true",
            "schedule = { cron = \"0 9 * * *\", jitter = \"lots\" }",
        ) + "\n[budget.window]\nperiod = \"24h\"\n"
    });
    let out = validate(&env);
    let want = format!("{}:{}:", path.display(), line_of(&path, "jitter"));
    assert!(
        out.stderr.contains(&want) && out.stderr.contains("schedule.jitter `lots`"),
        "{out}"
    );
    assert!(
        out.stderr
            .contains("[budget.window] needs at least one of cost_usd, tokens, runs"),
        "{out}"
    );
}
