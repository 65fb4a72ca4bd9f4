//! The durable state: what steward keeps (run records, idempotency keys, the review and
//! dead-letter queues, go-live approvals, each schedule's last slot, case events) behind
//! one interface, [`Backend`], so a second backend can be added without touching the
//! engine. The one backend today is sled (`sled_store`), under `STATE/store`.
//!
//! Every write that must survive a crash is followed by [`Backend::flush`]: before a
//! maker starts, before a commit starts, after a commit. [`Store::open`] also recovers
//! from a crash: runs left `running` become `interrupted` and their reserved keys become
//! *in doubt*, which only an operator can settle.

mod model;
mod sled_store;

use std::path::Path;
use std::sync::Arc;

pub use model::*;

/// A handle on the state folder's store; clones share it.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

impl Store {
    /// Opens (creating) the store under `state_dir` and recovers from any crash.
    pub fn open(state_dir: &Path) -> Result<(Store, Recovery)> {
        let (backend, recovery) = sled_store::SledStore::open(state_dir)?;
        Ok((Store(Arc::new(backend)), recovery))
    }
}

impl std::ops::Deref for Store {
    type Target = dyn Backend;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}
