//! Queue items from arbitrary bytes: a JSON payload or an error, never a panic; an
//! accepted payload survives the trip into a run's context and back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(payload) = steward::trigger::queue::decode_item(data) {
        let text = serde_json::to_string(&payload).expect("a parsed value serializes");
        let again: serde_json::Value = serde_json::from_str(&text).expect("and parses back");
        assert_eq!(payload, again);
    }
});
