//! The cluster's runs. Each daemon keeps its own runs in its own store, as on one
//! machine (its recovery after a crash reads them), and writes each record to the runs
//! bucket too, in order, from one task its runs never wait for ([`Mirror`]).
//!
//! Every daemon keeps a *view* of the whole cluster's runs: a store of its own under
//! `STATE/cluster-view/`, made afresh at each start from the bucket (the newest record of
//! each run), then kept current by a watch of it ([`feed_view`]). `steward runs`, the
//! dashboard, `why`, the breaker's streak and the dead-man's switch read the view, so a
//! run on one daemon counts on every daemon: a slot run by another daemon is not overdue
//! here.

use std::time::Duration;

use async_nats::jetstream::kv;

use super::buckets::RUNS;
use super::connection::Cluster;
use super::error::ClusterError;
use crate::store::{RunRecord, Store};

impl Cluster {
    /// Writes `run` (whose `daemon` says who ran it) to the runs bucket.
    pub async fn put_run(&self, run: &RunRecord) -> Result<(), ClusterError> {
        self.records
            .runs
            .put_json(&run.run_id, run)
            .await
            .map(|_| ())
    }
}

/// How long the writer gathers records before writing the newest of each run.
const GATHER: Duration = Duration::from_millis(20);

/// Writes this daemon's run records to the bucket in the order they were made, never
/// making a run wait: a record written while the server is away is written when it is
/// back (the newest of each run only, should several be waiting).
#[derive(Clone)]
pub struct Mirror {
    tx: tokio::sync::mpsc::UnboundedSender<ToWrite>,
}

/// What the writer is handed: a record, or a wish to hear once all before it are written.
enum ToWrite {
    Run(Box<RunRecord>),
    Written(tokio::sync::oneshot::Sender<()>),
}

impl Mirror {
    /// Starts the writer on `bridge`'s runtime.
    pub fn start(cluster: Cluster, bridge: &super::bridge::Bridge) -> Mirror {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<ToWrite>();
        bridge.spawn(async move {
            while let Some(first) = rx.recv().await {
                // A moment for a short run's later records to come: the newest of each run
                // is written, not every step of it (the others' views lag by as much).
                if matches!(first, ToWrite::Run(_)) {
                    tokio::time::sleep(GATHER).await;
                }
                let mut batch: Vec<RunRecord> = Vec::new();
                let mut waiting = Vec::new();
                let mut next = Some(first);
                while let Some(item) = next.take().or_else(|| rx.try_recv().ok()) {
                    match item {
                        ToWrite::Run(run) => {
                            match batch.iter_mut().find(|r| r.run_id == run.run_id) {
                                Some(older) => *older = *run,
                                None => batch.push(*run),
                            }
                        }
                        ToWrite::Written(tell) => waiting.push(tell),
                    }
                }
                for run in batch {
                    write_until_done(&cluster, &run).await;
                }
                for tell in waiting {
                    let _ = tell.send(());
                }
            }
        });
        Mirror { tx }
    }

    pub fn send(&self, run: RunRecord) {
        let _ = self.tx.send(ToWrite::Run(Box::new(run)));
    }

    /// Returns once every record sent before is written (at a daemon's stop).
    pub async fn written(&self) {
        let (tell, heard) = tokio::sync::oneshot::channel();
        if self.tx.send(ToWrite::Written(tell)).is_ok() {
            let _ = heard.await;
        }
    }
}

async fn write_until_done(cluster: &Cluster, run: &RunRecord) {
    let mut pause = Duration::from_millis(50);
    let mut told = false;
    while let Err(e) = cluster.put_run(run).await {
        if !told {
            tracing::warn!(run = %run.run_id, "cluster: cannot write the run record ({e}); trying until the server is back");
            told = true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Fills `view` with the bucket's runs of other daemons, returns once it holds every one
/// there was at the start, and keeps it current until the process ends.
pub async fn feed_view(cluster: Cluster, view: Store) -> Result<(), ClusterError> {
    let runs = cluster.records.runs.clone();
    runs.follow(move |entry| apply(&cluster, &view, entry))
        .await
}

/// One record from the bucket into the view: another daemon's (this daemon's own are
/// written to the view as they are made).
fn apply(cluster: &Cluster, view: &Store, entry: &kv::Entry) {
    if entry.operation != kv::Operation::Put {
        return;
    }
    let run: RunRecord = match serde_json::from_slice(&entry.value) {
        Ok(run) => run,
        Err(e) => {
            tracing::warn!(key = %entry.key, "cluster: a run record in {RUNS} cannot be read ({e}): skipped");
            return;
        }
    };
    if run.daemon.as_deref() == Some(cluster.daemon.as_str()) {
        return;
    }
    if let Err(e) = view.put_run(&run) {
        tracing::warn!(run = %run.run_id, "cluster: cannot keep another daemon's run in the view: {e}");
    }
}
