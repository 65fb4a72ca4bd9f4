//! The daemon, end to end: a real `steward daemon` child process per test, fed by real
//! cron slots, files, queue items, HTTP requests and signals.

mod daemon;
mod overlap;
mod signals;
mod triggers;
#[path = "../util/mod.rs"]
mod util;

#[allow(unused_imports)]
use daemon::*;
#[allow(unused_imports)]
use overlap::*;
#[allow(unused_imports)]
use signals::*;
#[allow(unused_imports)]
use triggers::*;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use sha2::{Digest, Sha256};
use util::{process_gone, read_pid, runs_of, wait_for, Env, Spec};

const QUICK: &str = "cat >/dev/null\necho '{\"ok\": true}'\n";
