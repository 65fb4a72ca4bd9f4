//! Drain markers (`vault/_inbox/scheduled-jobs/YYYY-MM-DD-<job>.md`): name and text.
//! The assertions live in `src/checks.rs`, which `tests/fuzz_corpus.rs` also replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| steward_fuzz::marker(data));
