//! Drain markers (`vault/_inbox/scheduled-jobs/YYYY-MM-DD-<job>.md`): the first line of
//! the input is the file name, the rest its text. A marker or an error, never a panic,
//! and an accepted marker's job is always a safe name.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (name, body) = text.split_once('\n').unwrap_or((&text, ""));
    let Ok((date, job)) = steward::drain::parse_name(name) else {
        return;
    };
    let path = Path::new("/nonexistent-steward-fuzz").join(name);
    if let Ok(Some(marker)) = steward::drain::parse_text(&path, date, job, body) {
        assert!(steward::config::valid_id(&marker.job), "{:?}", marker.job);
    }
});
