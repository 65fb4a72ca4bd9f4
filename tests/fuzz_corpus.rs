//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the fuzz targets'
//! own assertions on stable Rust, so every `cargo test` re-checks each input the fuzzer
//! found interesting, including those that once crashed steward.

#[path = "../fuzz/src/checks.rs"]
mod checks;

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let bytes = std::fs::read(entry.path()).unwrap();
        let name = entry.file_name();
        let result = std::panic::catch_unwind(|| check(&bytes));
        assert!(result.is_ok(), "{target}: corpus input {name:?} fails");
        n += 1;
    }
    assert!(n > 0, "no corpus for {target} in {}", dir.display());
}

#[test]
fn config_corpus() {
    replay("config", checks::config);
}

#[test]
fn control_line_corpus() {
    replay("control_line", checks::control_line);
}

#[test]
fn marker_corpus() {
    replay("marker", checks::marker);
}

#[test]
fn queue_item_corpus() {
    replay("queue_item", checks::queue_item);
}

#[test]
fn webhook_body_corpus() {
    replay("webhook_body", checks::webhook_body);
}

#[test]
fn webhook_request_corpus() {
    replay("webhook_request", checks::webhook_request);
}

#[test]
fn feed_corpus() {
    replay("feed", checks::feed);
}
