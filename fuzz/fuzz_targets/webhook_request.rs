//! Webhook requests in every format (steward, GitHub, Stripe, Standard Webhooks) from
//! arbitrary bytes. The assertions live in `src/checks.rs`, which `tests/fuzz_corpus.rs`
//! also replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| steward_fuzz::webhook_request(data));
