//! What the features give the engine, in one place: [`open`] opens the engine on a state
//! folder with each feature's hook in place — today a digest agent's end (its email's
//! fate and its summary line). The daemon adds its own at start-up (the alert
//! dispatcher, the model gateway, the followers told of each run's end).

use std::path::Path;
use std::sync::Arc;

use crate::governed::{Engine, EngineError, Summarize};
use crate::store::{Recovery, RunRecord};

/// The engine on `state_dir`, with what crash recovery found, and the features' hooks.
pub fn open(state_dir: &Path) -> Result<(Engine, Recovery), EngineError> {
    let (mut engine, recovery) = crate::governed::open(state_dir)?;
    install(&mut engine);
    Ok((engine, recovery))
}

/// Puts the features' hooks on an engine opened some other way.
pub fn install(engine: &mut Engine) {
    engine.summarize = Some(Arc::new(Digests));
}

/// A digest agent's steps 11 and 12, as the engine asks for them at a run's end.
struct Digests;

impl Summarize for Digests {
    fn email_skipped(&self, rec: &RunRecord) -> Option<String> {
        crate::agent::email_skipped_reason(rec)
    }

    fn summary_line(&self, rec: &RunRecord) -> String {
        crate::agent::summary_line(rec)
    }
}
