//! Hostile input: names that try to climb out of their folders, symlinks in watched
//! folders, 100 MB file drops and webhook bodies, header injection through feed titles,
//! and a control-socket client of another user. Each gets a clear refusal or bounded,
//! correct handling, and the daemon keeps running.

mod big;
mod clients;
mod paths;
mod users;
#[path = "../util/mod.rs"]
mod util;

#[allow(unused_imports)]
use big::*;
#[allow(unused_imports)]
use clients::*;
#[allow(unused_imports)]
use paths::*;
#[allow(unused_imports)]
use users::*;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use util::{hwm_kib, runs_of, wait_for, Env, Spec};

const QUICK: &str = "cat >/dev/null\necho '{\"ok\": true}'\n";
const HUNDRED_MB: usize = 100 << 20;

/// Every file under `dir`, recursively (to prove nothing was written outside a folder).
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}
