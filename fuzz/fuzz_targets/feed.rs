//! Feed documents (RSS, Atom, JSON Feed, in any encoding) as a fetched source gives them.
//! The assertions live in `src/checks.rs`, which `tests/fuzz_corpus.rs` also replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| steward_fuzz::feed(data));
