//! The cluster's own runtime: the NATS client's connection task and every request to the
//! server run on a thread of their own. The store's interface is synchronous and is
//! called from the daemon's runtime threads; blocking one of those on a request whose
//! answer the connection task (on the same two threads) must read could stall both. Here
//! a caller waits on a request that another runtime carries.

use std::future::Future;

use super::error::ClusterError;

/// A handle on the cluster's runtime; clones share it.
#[derive(Clone, Debug)]
pub struct Bridge {
    handle: tokio::runtime::Handle,
}

impl Bridge {
    /// Starts the runtime on a thread named `steward-nats`, which it keeps for the life of
    /// the process.
    pub fn start() -> Result<Bridge, ClusterError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("steward-nats")
            .enable_all()
            .build()
            .map_err(|e| ClusterError::Store(format!("cannot start the cluster's runtime: {e}")))?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("steward-nats-rt".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .map_err(|e| ClusterError::Store(format!("cannot start the cluster's thread: {e}")))?;
        Ok(Bridge { handle })
    }

    /// Runs `work` on the cluster's runtime and waits for it, blocking this thread (from
    /// synchronous code, such as the store's interface).
    pub fn block<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, ClusterError>> + Send + 'static,
    ) -> Result<T, ClusterError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(work.await);
        });
        rx.recv()
            .map_err(|_| ClusterError::Store("the cluster's runtime stopped".into()))?
    }

    /// Runs `work` on the cluster's runtime and awaits it (from async code on any runtime).
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, ClusterError> {
        self.handle
            .spawn(work)
            .await
            .map_err(|e| ClusterError::Store(format!("the cluster's runtime stopped: {e}")))
    }

    /// Starts `work` on the cluster's runtime, not waited for.
    pub fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.handle.spawn(work);
    }
}
