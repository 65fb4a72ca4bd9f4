//! The durable state: what steward keeps (run records, idempotency keys, the review and
//! dead-letter queues, go-live approvals, each schedule's last slot, case events) behind
//! one interface, [`Backend`], so a second backend can be added without touching the
//! engine. The one backend today is sled (`sled_store`), under `STATE/store`.
//!
//! Every write that must survive a crash is followed by [`Backend::flush`]: before a
//! maker starts when a key is reserved, before a commit starts, after a run ends.
//! Concurrent runs share flushes ([`group`]); what no one waits for (a schedule's last
//! slot, the record of a run that reserved nothing) is on disk with the next flush or
//! within [`BACKGROUND_FLUSH_MS`]. [`Store::open`] also recovers
//! from a crash: runs left `running` become `interrupted` and their reserved keys become
//! *in doubt*, which only an operator can settle.

mod group;
mod memory;
mod model;
mod sled_store;

use std::path::Path;
use std::sync::Arc;

pub use memory::MemoryStore;
pub use model::*;
pub use sled_store::BACKGROUND_FLUSH_MS;

/// A handle on the state folder's store; clones share it.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

impl Store {
    /// A store over another backend (a cluster member's, see `crate::cluster::store`).
    pub fn from_backend(backend: Arc<dyn Backend>) -> Store {
        Store(backend)
    }

    /// Opens (creating) the store under `state_dir` and recovers from any crash.
    pub fn open(state_dir: &Path) -> Result<(Store, Recovery)> {
        let (backend, recovery) = sled_store::SledStore::open(state_dir)?;
        Ok((Store(Arc::new(backend)), recovery))
    }
}

/// Makes what this process creates from now on private to its user (umask 077): the state
/// folder holds run records, outputs and queue items. Steps inherit it, as PostgreSQL's
/// archive commands do; a step that must share a file says so itself (`umask`, `chmod`).
pub fn private_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Why `state_dir` is open to other users (any group or other permission bit), if it is.
pub fn openness(state_dir: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state_dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "state folder {} is open to other users (mode {mode:04o}): it holds run records and outputs; `chmod 700 {}`",
            state_dir.display(),
            state_dir.display()
        )
    })
}

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}
