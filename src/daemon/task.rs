//! A task the daemon started, with the token that stops it: stopping is asking, then
//! waiting for it to end.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(super) struct Task {
    pub(super) cancel: CancellationToken,
    pub(super) handle: JoinHandle<()>,
}

impl Task {
    /// Spawns what `start` returns, given the token that will ask it to stop.
    pub(super) fn spawn<F, Fut>(start: F) -> Task
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(start(cancel.clone()));
        Task { cancel, handle }
    }

    /// Asks the task to stop and waits until it has.
    pub(super) async fn stop(self) {
        self.cancel.cancel();
        let _ = self.handle.await;
    }
}
