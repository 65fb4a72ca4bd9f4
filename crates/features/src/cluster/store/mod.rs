//! The store of a daemon in a cluster: what must be decided once for the whole cluster —
//! idempotency keys ([`super::keys`], compare-and-set on revision), agency cases
//! ([`super::cases`], appends that expect the last sequence), webhook deliveries seen
//! ([`super::webhooks`]), go-live approvals ([`super::approvals`]), and the rest of the
//! state ([`super::state`]: review, dead letters, pauses, day spend, alerts owed) — is
//! kept in the cluster. Runs are this daemon's own in its own store, written to the
//! cluster too, and read from a view of every daemon's ([`super::runs`]). What only
//! concerns this state folder stays in it: each schedule's last slot, when a workflow
//! was first loaded.
//!
//! A key this daemon reserved is held with a lease (the revision it last wrote); each move
//! of the key is made at that revision, so a daemon whose key was freed or taken over
//! meanwhile (it was cut off past its heartbeat) gets an error instead of moving it, and
//! its run does not commit. A server that cannot be reached is waited for, up to
//! [`STORE_WAIT`]: a run in flight across a short outage finishes, its commit waiting.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::bridge::Bridge;
use super::connection::Cluster;
use super::keys::Lease;
use super::runs::Mirror;
use crate::store::{
    Approval, Backend, Counts, DaySpend, DeadLetter, KeyPhase, KeyRecord, OwedUpdate, Pause,
    Result, Retention, RunQuery, RunRecord, RunState, SeenDelivery, Store, StoreError,
};

/// How long a key's move waits for an unreachable server before the run gives up on it:
/// a short outage (a restart of the server) is waited out; a long one fails the run
/// before its commit, or leaves its key in doubt after it.
pub const STORE_WAIT: Duration = Duration::from_secs(30);

/// How long what alerting and the dead-man's switch keep waits for an unreachable
/// server: past it, an alert is sent (better twice than not at all) and its keeping is
/// logged as failed.
pub const OWED_WAIT: Duration = Duration::from_secs(2);

/// This state folder's newest runs compared with the cluster's at a start.
const REPUBLISH: usize = 500;

/// The view of the cluster's runs, under the state folder.
pub const VIEW: &str = "cluster-view";

/// Whether a run of this daemon is in flight, by run id.
pub type InFlight = Arc<dyn Fn(&str) -> bool + Send + Sync>;

use crate::store::OWNED_OWED as OUTBOX;

/// Why a member's store could not be made at a start.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("cannot clear {}: {why}", .folder.display())]
    Clear {
        folder: std::path::PathBuf,
        why: std::io::Error,
    },
    #[error("cannot make {}: {why}", .folder.display())]
    Make {
        folder: std::path::PathBuf,
        why: std::io::Error,
    },
    #[error("cannot open the view of the cluster's runs in {}: {why}", .folder.display())]
    View {
        folder: std::path::PathBuf,
        why: StoreError,
    },
    #[error("cannot read the cluster's {what}: {cause}")]
    Unread {
        what: &'static str,
        cause: super::ClusterError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A cluster member's store: the shared state in the cluster, this daemon's runs in
/// `local` (and the cluster's in `view`).
pub struct MemberStore {
    local: Store,
    view: Store,
    /// The cluster's pauses and go-live approvals, read on every fire without a round
    /// trip.
    pauses: super::records::Cached,
    approvals: super::records::Cached,
    mirror: Mirror,
    cluster: Cluster,
    bridge: Bridge,
    /// The keys this daemon holds, by (workflow, key).
    leases: Mutex<HashMap<(String, String), Lease>>,
    /// Which of this daemon's runs are in flight (set once the runner exists).
    in_flight: std::sync::RwLock<Option<InFlight>>,
}

impl MemberStore {
    /// The store of `member`, over this state folder's `local` store: its view of the
    /// cluster's runs made afresh under `STATE/cluster-view/` from the runs bucket (waited
    /// for, up to [`STORE_WAIT`]), and the runs `recovered` as interrupted at this start
    /// written to the cluster.
    pub async fn join(
        member: &super::member::Member,
        local: Store,
        state_dir: &Path,
        recovered: &[String],
    ) -> std::result::Result<Arc<MemberStore>, JoinError> {
        let folder = state_dir.join(VIEW);
        if folder.exists() {
            std::fs::remove_dir_all(&folder).map_err(|why| JoinError::Clear {
                folder: folder.clone(),
                why,
            })?;
        }
        std::fs::create_dir_all(&folder).map_err(|why| JoinError::Make {
            folder: folder.clone(),
            why,
        })?;
        let (view, _) = Store::open(&folder).map_err(|why| JoinError::View {
            folder: folder.clone(),
            why,
        })?;
        let (cluster, bridge) = (member.cluster.clone(), member.bridge.clone());
        let fed = bridge.run(super::runs::feed_view(cluster.clone(), view.clone()));
        let unread = |what| move |cause| JoinError::Unread { what, cause };
        match tokio::time::timeout(STORE_WAIT, fed).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e)) | Err(e)) => return Err(unread("runs")(e)),
            Err(_) => tracing::warn!(
                "cluster: the view of the cluster's runs is still being read; going on"
            ),
        }
        let pauses = follow(&bridge, cluster.records.pauses.clone())
            .await
            .map_err(unread("pauses"))?;
        let approvals = follow(&bridge, cluster.approval_records())
            .await
            .map_err(unread("approvals"))?;
        let store = Arc::new(MemberStore {
            local,
            view,
            pauses,
            approvals,
            mirror: Mirror::start(cluster.clone(), &bridge),
            cluster,
            bridge,
            leases: Mutex::new(HashMap::new()),
            in_flight: std::sync::RwLock::new(None),
        });
        store.republish(recovered)?;
        Ok(store)
    }

    /// Tells the store how to ask whether one of this daemon's runs is in flight: a key it
    /// holds for a run that is not (the run ended in an error, the server gone meanwhile)
    /// is its own leftover, settled when the key is wanted again.
    pub fn set_in_flight(&self, in_flight: InFlight) {
        *self.in_flight.write().unwrap_or_else(|p| p.into_inner()) = Some(in_flight);
    }

    /// Writes to the cluster what this state folder knows better than the runs bucket: the
    /// runs `recovered` as interrupted at this start, and the newest runs whose last
    /// record a crash kept from the bucket (the writer sends after a moment) — or which
    /// another daemon, seeing this folder's last daemon gone, recorded interrupted.
    fn republish(&self, recovered: &[String]) -> Result<()> {
        let mut runs: Vec<RunRecord> = Vec::new();
        for id in recovered {
            runs.extend(self.local.run(id)?);
        }
        runs.extend(self.local.run_page(&RunQuery {
            limit: REPUBLISH,
            ..Default::default()
        })?);
        for run in runs {
            let known = self.view.run(&run.run_id)?;
            if known.is_some_and(|k| k.state == run.state && k.ended_at == run.ended_at) {
                continue;
            }
            self.view.put_run(&run)?;
            self.mirror.send(run);
        }
        Ok(())
    }

    /// Returns once this daemon's run records are in the cluster's bucket, or after
    /// `limit` (the server away: the next start on this state folder writes them).
    pub async fn written(&self, limit: Duration) {
        let mirror = self.mirror.clone();
        let done = self.bridge.run(async move { mirror.written().await });
        if tokio::time::timeout(limit, done).await.is_err() {
            tracing::warn!("cluster: the last run records are not in the cluster yet; the next start here writes them");
        }
    }

    /// Records as interrupted the runs the view shows running on daemons no longer
    /// `alive` (gone without a word: killed, cut off): their keys and slots were freed,
    /// and a restart on the same state folder says the same of them. Any daemon may do
    /// it; two write the same.
    pub fn settle_gone_runs(&self, alive: &[String]) {
        let query = crate::store::RunQuery {
            state: Some(RunState::Running),
            limit: 1000,
            ..Default::default()
        };
        let running = match self.view.run_page(&query) {
            Ok(runs) => runs,
            Err(e) => return tracing::warn!("cluster: cannot read the view's runs: {e}"),
        };
        for mut run in running {
            let Some(daemon) = run.daemon.clone() else {
                continue;
            };
            if daemon == self.cluster.daemon || alive.contains(&daemon) {
                continue;
            }
            run.state = RunState::Interrupted;
            run.reason = format!(
                "its daemon {daemon} was gone (its heartbeat stopped) before the run ended"
            );
            run.ended_at = Some(Utc::now());
            if let Err(e) = self.view.put_run(&run) {
                tracing::warn!(run = %run.run_id, "cluster: cannot record a gone daemon's run interrupted: {e}");
                continue;
            }
            tracing::warn!(run = %run.run_id, workflow = %run.workflow, daemon = %daemon, "cluster: a gone daemon's run recorded interrupted");
            self.mirror.send(run);
        }
    }

    fn running(&self, run_id: &str) -> bool {
        self.in_flight
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|f| f(run_id))
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Lease>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, workflow: &str, key: &str) {
        self.leases()
            .remove(&(workflow.to_string(), key.to_string()));
    }

    /// Runs `op` on the cluster's runtime, trying again while the server cannot be
    /// reached, for at most [`STORE_WAIT`]. Each try is safe to repeat: a key's move that
    /// took effect but whose answer was lost is recognised as this daemon's own. The
    /// daemon's runtime thread hands its other work on while it waits.
    fn call<T, F, Fut>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Cluster) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, super::ClusterError>>
            + Send
            + 'static,
    {
        self.call_within(STORE_WAIT, op)
    }

    /// [`MemberStore::call`], waiting for the server at most `limit`: what alerting keeps
    /// is not worth holding a run for long ([`OWED_WAIT`]).
    fn call_within<T, F, Fut>(&self, limit: Duration, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Cluster) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, super::ClusterError>>
            + Send
            + 'static,
    {
        let wait = || {
            let deadline = std::time::Instant::now() + limit;
            let mut pause = Duration::from_millis(50);
            loop {
                match self.bridge.block(op(self.cluster.clone())) {
                    Err(super::ClusterError::Store(why))
                        if std::time::Instant::now() + pause < deadline =>
                    {
                        tracing::debug!("cluster store unreachable ({why}); trying again");
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                    done => return done.map_err(shared),
                }
            }
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            _ => wait(),
        }
    }

    /// [`MemberStore::call`] with one name (a run id, a workflow) handed to each try.
    fn named<T, F, Fut>(&self, name: &str, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Cluster, String) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, super::ClusterError>>
            + Send
            + 'static,
    {
        let name = name.to_string();
        self.call(move |c| op(c, name.clone()))
    }

    /// What holds a key now, and at which revision.
    fn held(&self, workflow: &str, key: &str) -> Result<Option<(super::keys::HeldKey, u64)>> {
        let (w, k) = (workflow.to_string(), key.to_string());
        self.call(move |c| {
            let (w, k) = (w.clone(), k.clone());
            async move { c.held_key(&w, &k).await }
        })
    }

    /// The lease to move a key with: this daemon's own, or (for an operator's settling of
    /// a key another daemon left) the key's current revision.
    fn lease_or_current(&self, workflow: &str, key: &str) -> Result<Option<Lease>> {
        if let Some(lease) = self
            .leases()
            .get(&(workflow.to_string(), key.to_string()))
            .cloned()
        {
            return Ok(Some(lease));
        }
        Ok(self.held(workflow, key)?.map(|(_, revision)| Lease {
            workflow: workflow.to_string(),
            key: key.to_string(),
            revision,
        }))
    }

    fn reserve(
        &self,
        workflow: &str,
        key: &str,
        run_id: &str,
    ) -> Result<std::result::Result<Lease, super::keys::HeldKey>> {
        let (w, k, r) = (workflow.to_string(), key.to_string(), run_id.to_string());
        self.call(move |c| {
            let (w, k, r) = (w.clone(), k.clone(), r.clone());
            async move { c.reserve_key(&w, &k, &r).await }
        })
    }

    fn advance(
        &self,
        lease: Lease,
        run_id: &str,
        phase: KeyPhase,
    ) -> Result<std::result::Result<Lease, super::keys::Fenced>> {
        let r = run_id.to_string();
        self.call(move |c| {
            let (lease, r) = (lease.clone(), r.clone());
            async move { c.advance_key(&lease, &r, phase).await }
        })
    }

    fn release(&self, lease: Lease) -> Result<std::result::Result<(), super::keys::Fenced>> {
        self.call(move |c| {
            let lease = lease.clone();
            async move { c.release_key(&lease).await }
        })
    }

    /// A key this daemon holds for a run of its own that is no longer in flight: freed if
    /// its commit had not begun (true), put in doubt if it had (false).
    fn settle_leftover(&self, held: &KeyRecord) -> Result<bool> {
        let Some((now, revision)) = self.held(&held.workflow, &held.key)? else {
            return Ok(true);
        };
        if now.daemon != self.cluster.daemon || now.record.run_id != held.run_id {
            return Ok(false);
        }
        self.forget(&held.workflow, &held.key);
        let lease = Lease {
            workflow: held.workflow.clone(),
            key: held.key.clone(),
            revision,
        };
        match now.record.phase {
            KeyPhase::Reserved => Ok(self.release(lease)?.is_ok()),
            KeyPhase::Committing => {
                let _ = self.advance(lease, &held.run_id, KeyPhase::InDoubt)?;
                tracing::warn!(workflow = %held.workflow, key = %held.key, run = %held.run_id, "cluster: this daemon's run ended in an error during its commit: key in doubt, see `steward in-doubt list`");
                Ok(false)
            }
            _ => Ok(false),
        }
    }
}

/// `records` followed in memory ([`super::records::Cached`]), once read whole; an error
/// when that takes longer than [`STORE_WAIT`] (a daemon must not start blind to them).
async fn follow(
    bridge: &Bridge,
    records: super::records::Records,
) -> std::result::Result<super::records::Cached, super::ClusterError> {
    let read = bridge.run(async move { super::records::Cached::follow(&records).await });
    match tokio::time::timeout(STORE_WAIT, read).await {
        Ok(done) => done?,
        Err(_) => Err(super::ClusterError::Store(format!(
            "not read within {}",
            humantime::format_duration(STORE_WAIT)
        ))),
    }
}

/// The `what` (an approval, a pause) of `workflow` that `records` keeps in memory.
fn cached<T: serde::de::DeserializeOwned>(
    records: &super::records::Cached,
    what: &str,
    workflow: &str,
) -> Result<Option<T>> {
    let Some(bytes) = records.get(workflow) else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::Shared(format!("the cluster's {what} of `{workflow}`: {e}")))
}

fn shared(e: super::ClusterError) -> StoreError {
    StoreError::Shared(e.to_string())
}

fn fenced(workflow: &str, key: &str, now: Option<&super::keys::HeldKey>) -> StoreError {
    StoreError::Shared(match now {
        Some(h) => format!(
            "idempotency key `{key}` of `{workflow}` moved on without this daemon: it is {} by {} for run {}; not committing",
            serde_json::to_value(h.record.phase).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            h.daemon,
            h.record.run_id
        ),
        None => format!(
            "idempotency key `{key}` of `{workflow}` was freed while this daemon held it (cut off past its heartbeat?); not committing"
        ),
    })
}

mod backend;
