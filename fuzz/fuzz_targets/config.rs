//! A workflow file and the settings file, from arbitrary bytes: an error, never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let root = Path::new("/nonexistent-steward-fuzz");
    let file = root.join("workflows/fuzz.toml");
    if let Err(errors) = steward::config::parse_workflow(root, &file, data.to_vec()) {
        // Every error must name a line inside the file (or line 1 for whole-file errors).
        let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
        for e in errors {
            assert!(e.line >= 1 && e.line <= lines, "error line {} of {lines}", e.line);
        }
    }
    let _ = steward::config::parse_toml::<steward::config::Settings>(&file, data.to_vec());
});
