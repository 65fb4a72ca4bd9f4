//! fd-3 control lines from arbitrary text, charged against a budget.
//! The assertions live in `src/checks.rs`, which `tests/fuzz_corpus.rs` also replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| steward_fuzz::control_line(data));
