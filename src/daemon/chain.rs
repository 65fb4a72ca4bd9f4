//! The daemon's side of `after` triggers ([`crate::chain`]): at start-up the followers'
//! fires owed from while no daemon ran, then each run's end, as the engine hands it over,
//! fires the followers of its workflow.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

use super::shared::Shared;
use crate::chain::{self, ChainFire};
use crate::store::RunRecord;

/// Fires what was missed, then follows `ended` until the engine is gone.
pub fn start(shared: Arc<Shared>, mut ended: UnboundedReceiver<RunRecord>) {
    let config = shared.config();
    for owed in chain::missed(&shared.engine, &config) {
        run(&shared, owed);
    }
    tokio::spawn(async move {
        while let Some(rec) = ended.recv().await {
            let config = shared.config();
            for due in chain::due_after(&config, &shared.engine.store, &rec) {
                let store = shared.engine.store.clone();
                let follower = due.follower.clone();
                // The record is flushed before the follower starts: off the runtime.
                match tokio::task::spawn_blocking(move || chain::record(&store, &due)).await {
                    Ok(Ok(Some(fire))) => run(&shared, fire),
                    Ok(Ok(None)) => {} // fired already (a repeat, or another daemon)
                    Ok(Err(e)) => {
                        tracing::error!(%follower, upstream = %rec.run_id, "cannot record the follower's fire: not fired: {e}")
                    }
                    Err(e) => tracing::error!(%follower, "the follower's fire was lost: {e}"),
                }
            }
        }
    });
}

fn run(shared: &Arc<Shared>, fire: ChainFire) {
    let shared = shared.clone();
    tokio::spawn(async move {
        shared
            .fire_asking(&fire.follower, fire.fire, fire.ask)
            .await
    });
}
