//! Names that climb out of their folders, bad items, symlinks and non-UTF-8 names.

use super::*;

#[test]
fn names_that_climb_out_of_their_folders_are_refused_everywhere() {
    let env = Env::new();
    // The example config: a real agency and agent, so only the bad id can be refused.
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/."))
        .arg(&env.config)
        .status()
        .unwrap();
    assert!(copied.success());
    // Every file outside the state folder (config/ included: `new ../x` would land there).
    let outside_state = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = files_under(env.dir.path())
            .into_iter()
            .filter(|p| !p.starts_with(&env.state))
            .collect();
        v.sort();
        v
    };
    let before = outside_state();
    // (A NUL cannot travel in argv; the config cases below carry one.)
    let bad_names = ["../escape", "/tmp/abs", "a/../../b", ".."];
    for bad in bad_names {
        // Queue names.
        let refused = |args: &[&str], says: &str| {
            let out = env.steward(args);
            assert!(
                out.code != 0 && out.stderr.contains(says),
                "{args:?} must be refused saying `{says}`:\n{out}"
            );
        };
        refused(
            &["enqueue", bad, "--payload", "{}"],
            "is not a valid queue name",
        );
        refused(&["new", bad], "is not a valid workflow id");
        refused(
            &["case", "open", "--agency", "docs-team", "--case", bad],
            "is not allowed",
        );
        // Agent names are looked up among the loaded ones, never used as a path.
        refused(&["digest", bad], "no digest agent named");
    }
    // Nothing was created anywhere but in the state folder.
    assert_eq!(outside_state(), before, "files appeared outside state/");
    assert!(!Path::new("/tmp/abs").exists());

    // The same names in config files: validation names the file and the field.
    for (file, text, field) in [
        (
            "workflows/a.toml",
            "id = \"../a\"\n[trigger]\nmanual = true\n[run]\ncommand = [\"true\"]\n[verify]\ncommand = [\"true\"]\n",
            "id",
        ),
        (
            "workflows/b.toml",
            "id = \"b\"\n[trigger]\nqueue = \"../../etc\"\n[run]\ncommand = [\"true\"]\n[verify]\ncommand = [\"true\"]\n",
            "queue",
        ),
        (
            "workflows/d.toml",
            "id = \"d\\u0000x\"\n[trigger]\nqueue = \"q\\u0000\"\n[run]\ncommand = [\"true\"]\n[verify]\ncommand = [\"true\"]\n",
            "id",
        ),
        (
            "agents/c.toml",
            "agent_name = \"../c\"\ncadence = \"daily\"\n[source_filter]\ntopic_tags = [\"x\"]\n",
            "agent_name",
        ),
    ] {
        let path = env.config.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        let out = env.steward(&["validate"]);
        assert_ne!(out.code, 0, "{file}:\n{out}");
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(
            all.contains(file.rsplit('/').next().unwrap()) && all.contains(field),
            "{file}: the error names the file and `{field}`:\n{out}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_bad_queue_item_is_set_aside_with_its_reason_and_the_next_one_runs() {
    let env = Env::new();
    env.live_workflow(&Spec::new("q", QUICK).trigger("queue = \"jobs\""));
    let spool = env.state.join("queues/jobs");
    std::fs::create_dir_all(&spool).unwrap();
    // Not JSON, and a name no `steward enqueue` would make.
    std::fs::write(spool.join("0000 -weird ünïcode.json"), b"{\"half\": ").unwrap();
    std::fs::write(spool.join("0001-good.json"), b"{\"n\": 1}").unwrap();
    let _d = env.daemon(&[]);
    wait_for("the good item to commit", Duration::from_secs(15), || {
        env.ledger_lines().len() == 1
    });
    let reason = std::fs::read_to_string(spool.join("rejected/0000 -weird ünïcode.json.reason"))
        .expect("the bad item is set aside with its reason");
    assert!(reason.contains("not JSON"), "{reason}");
    assert_eq!(runs_of(&env, "q").len(), 1);
}

#[test]
fn symlinks_in_a_watched_folder_are_never_followed() {
    let env = Env::new();
    let inbox = env.path("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let secret = env.path("secret.txt");
    std::fs::write(&secret, "do not read").unwrap();
    env.live_workflow(
        &Spec::new("drop", "cat >/dev/null\necho '{\"ok\": true}'\n").trigger(&format!(
            "file = {{ path = \"{}\", pattern = \"*.txt\", debounce_ms = 50 }}",
            inbox.display()
        )),
    );
    let _d = env.daemon(&[]);
    std::os::unix::fs::symlink(&secret, inbox.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(env.path("."), inbox.join("dir.txt")).unwrap();
    // A real file after them: once it has run, the links had their chance.
    std::fs::write(env.path("real.tmp"), "real").unwrap();
    std::fs::rename(env.path("real.tmp"), inbox.join("real.txt")).unwrap();
    wait_for("the real file to run", Duration::from_secs(10), || {
        runs_of(&env, "drop").len() == 1
    });
    let runs = runs_of(&env, "drop");
    assert_eq!(runs[0]["trigger"]["name"], "real.txt", "{runs:?}");
    // The links stay where they were, the target untouched and unclaimed.
    assert!(inbox
        .join("link.txt")
        .symlink_metadata()
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "do not read");
    assert!(files_under(&env.state.join("claimed"))
        .iter()
        .all(|p| !p.ends_with("link.txt")));
}

#[test]
fn a_symlink_in_a_queue_spool_is_not_followed_and_a_non_utf8_file_name_is_reported() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let inbox = env.path("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let secret = env.path("secret.json");
    std::fs::write(&secret, r#"{"stolen": "do not read"}"#).unwrap();
    env.workflow(
        &Spec::new(
            "q",
            "cat > \"$MARKS/ctx-$STEWARD_RUN_ID.json\"\necho '{}'\n",
        )
        .trigger("queue = \"jobs\"")
        .dry(),
    );
    env.workflow(
        &Spec::new("drop", QUICK)
            .trigger(&format!(
                "file = {{ path = \"{}\", pattern = \"*\", debounce_ms = 50 }}",
                inbox.display()
            ))
            .dry(),
    );
    let spool = env.state.join("queues/jobs");
    std::fs::create_dir_all(&spool).unwrap();
    // Sorted first, so the spool meets it before the real item.
    std::os::unix::fs::symlink(&secret, spool.join("0000-link.json")).unwrap();
    let d = env.daemon(&[]);
    std::fs::write(
        inbox.join(std::ffi::OsStr::from_bytes(b"report-\xff.csv")),
        "a,b\n",
    )
    .unwrap();
    assert_eq!(
        env.steward(&["enqueue", "jobs", "--payload", r#"{"real": 1}"#])
            .code,
        0
    );
    wait_for("the real item to run", Duration::from_secs(20), || {
        runs_of(&env, "q").len() == 1
    });
    let runs = runs_of(&env, "q");
    assert_eq!(runs[0]["trigger"]["payload"]["real"], 1, "{runs:#?}");
    for ctx in files_under(env.dir.path()) {
        if ctx
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("ctx-")
        {
            let text = std::fs::read_to_string(&ctx).unwrap();
            assert!(!text.contains("do not read"), "{text}");
        }
    }
    wait_for(
        "the spool's and the folder's warnings",
        Duration::from_secs(10),
        || {
            let log = d.log_text();
            log.contains("0000-link.json") && log.contains("is not UTF-8")
        },
    );
    let log = d.log_text();
    assert_eq!(
        log.matches("a symlink is never followed").count(),
        1,
        "said once, not once per look:\n{log}"
    );
    assert!(
        spool.join("0000-link.json").symlink_metadata().is_ok(),
        "left in place"
    );
    assert!(runs_of(&env, "drop").is_empty());
}
