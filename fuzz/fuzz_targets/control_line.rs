//! fd-3 control lines, from arbitrary text, charged against a budget: a message or a
//! parse error, never a panic; charges never make the budget's figures negative or NaN.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use steward::budget::{BudgetGuard, Caps};
use steward::control::{parse, Message};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut guard = BudgetGuard::new(Caps {
        max_tokens: 1_000_000,
        max_tool_calls: 1_000,
        max_runtime: Duration::from_secs(60),
        max_cost_usd: 10.0,
        stall_timeout: None,
        kill_grace: Duration::from_secs(1),
    });
    for line in text.lines() {
        if let Ok(Message::Charge(resource, amount)) = parse(line) {
            assert!(amount.is_finite() && amount >= 0.0);
            let _ = guard.charge(resource, amount);
        }
    }
    let f = guard.figures();
    assert!(f.cost_usd.is_finite() && f.cost_usd >= 0.0);
});
