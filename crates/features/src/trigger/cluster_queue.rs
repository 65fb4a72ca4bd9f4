//! A queue trigger in a cluster: items pulled from the cluster's work-queue stream (see
//! [`crate::cluster::queue`]) instead of the state folder's spool, one at a time, by every
//! daemon whose config has the workflow. While its run goes, an item is kept with `+WPI`
//! a third of an ack wait apart; when the run ends the item is acknowledged (unless a
//! later delivery superseded this one). A daemon that stops hands its item back at once;
//! one that is killed loses it to another daemon after the ack wait, and the item's
//! idempotency key keeps its commit single.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::cluster::queue::Delivery;
use crate::cluster::Member;
use crate::governed::Fire;
use crate::store::RunState;

/// How long one pull waits for an item before it looks at `cancel` again.
const PULL_WAIT: Duration = Duration::from_secs(1);
/// How long after an error the next pull is tried.
const PAUSE_AFTER_ERROR: Duration = Duration::from_secs(1);

/// Pulls `queue`'s items and runs each through `submit`, until `cancel`.
/// An item given up on (past its attempts) is handed to `given_up` with the fire it
/// would have been and why, to be recorded as a dead-lettered run.
pub async fn run<F, Fut>(
    member: Member,
    queue: String,
    max_attempts: u32,
    submit: F,
    given_up: impl Fn(Fire, String),
    cancel: CancellationToken,
) where
    F: Fn(Fire) -> Fut,
    Fut: std::future::Future<Output = Option<crate::store::RunRecord>>,
{
    let puller = loop {
        match member.puller(&queue, max_attempts).await {
            Ok(p) => break p,
            Err(e) => {
                tracing::warn!(
                    queue,
                    "cannot pull from the cluster's queue: {e}; trying again"
                );
                if pause(&cancel, PAUSE_AFTER_ERROR).await {
                    return;
                }
            }
        }
    };
    loop {
        if cancel.is_cancelled() {
            return;
        }
        let p = puller.clone();
        let next = member
            .bridge
            .run(async move {
                let mut p = p.lock().await;
                let next = p.next(PULL_WAIT).await;
                (next, p.given_up())
            })
            .await
            .map(|(next, dead)| {
                for item in dead {
                    let (fire, why) = dead_fire(&queue, item);
                    given_up(fire, why);
                }
                next
            });
        let delivery = match next {
            Ok(Ok(Some(d))) => Arc::new(d),
            Ok(Ok(None)) => continue,
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(queue, "cannot pull from the cluster's queue: {e}");
                if pause(&cancel, PAUSE_AFTER_ERROR).await {
                    return;
                }
                continue;
            }
        };
        let payload = match crate::trigger::queue::decode_item(&delivery.payload) {
            Ok(p) => p,
            Err(reason) => {
                tracing::warn!(queue, item = %delivery.item_id, "item refused: {reason}; taken off the queue");
                settle(&member, &delivery, Settle::Reject).await;
                continue;
            }
        };
        let keeping = keep_in_progress(&member, &delivery);
        let fire = Fire::new(
            "queue",
            None,
            json!({ "queue": queue, "item_id": delivery.item_id, "payload": payload, "attempt": delivery.attempt }),
        );
        let rec = submit(fire).await;
        keeping.cancel();
        // Its key held by a run still in flight elsewhere (a daemon killed with it, whose
        // heartbeat has not yet run out): not done with; back a quarter heartbeat later,
        // by when that daemon may be known gone and its key freed.
        if let Some(r) = rec.as_ref().filter(|r| r.state == RunState::Blocked) {
            if key_in_flight(&member, r).await {
                let wait = member.cluster.settings.heartbeat / 4;
                settle(&member, &delivery, Settle::Retry(wait)).await;
                continue;
            }
        }
        match rec.map(|r| r.state) {
            // The daemon stops: hand the item back now rather than after the ack wait.
            None | Some(RunState::Interrupted) if cancel.is_cancelled() => {
                settle(&member, &delivery, Settle::Retry(Duration::ZERO)).await;
                return;
            }
            // Not carried out (the store could not be reached, say): not done with the
            // item, which comes back for another try.
            None | Some(RunState::Interrupted) => {
                settle(&member, &delivery, Settle::Retry(PAUSE_AFTER_ERROR)).await;
            }
            // Overlap or a pause kept it from running: offer it again a little later.
            Some(RunState::Skipped) => {
                settle(&member, &delivery, Settle::Retry(Duration::from_secs(1))).await
            }
            Some(_) => settle(&member, &delivery, Settle::Ack).await,
        }
    }
}

/// Whether the run's idempotency key is held by a run in flight (reserved or
/// committing), on this daemon or another.
async fn key_in_flight(member: &Member, rec: &crate::store::RunRecord) -> bool {
    let Some(key) = rec.idempotency_key.clone() else {
        return false;
    };
    let cluster = member.cluster.clone();
    let workflow = rec.workflow.clone();
    let held = member
        .bridge
        .run(async move { cluster.held_key(&workflow, &key).await })
        .await;
    matches!(
        held,
        Ok(Ok(Some((h, _)))) if matches!(h.record.phase, crate::store::KeyPhase::Reserved | crate::store::KeyPhase::Committing)
    )
}

enum Settle {
    Ack,
    Retry(Duration),
    Reject,
}

async fn settle(member: &Member, delivery: &Arc<Delivery>, how: Settle) {
    let d = delivery.clone();
    let done = member
        .bridge
        .run(async move {
            match how {
                Settle::Ack => d.ack().await.map(|current| {
                    if !current {
                        tracing::warn!(item = %d.item_id, "cluster: this delivery was superseded (past its ack wait); the item is left to the daemon that has it now");
                    }
                }),
                Settle::Retry(delay) => d.retry(delay).await,
                Settle::Reject => d.reject().await,
            }
        })
        .await;
    if let Ok(Err(e)) | Err(e) = done {
        tracing::warn!(item = %delivery.item_id, "cluster: cannot settle the item: {e}; the server hands it out again after the ack wait");
    }
}

/// Sends `+WPI` for `delivery` a third of an ack wait apart until the returned token is
/// cancelled.
fn keep_in_progress(member: &Member, delivery: &Arc<Delivery>) -> CancellationToken {
    let stop = CancellationToken::new();
    let every = member.cluster.settings.ack_wait / 3;
    let d = delivery.clone();
    let s = stop.clone();
    member.bridge.spawn(async move {
        loop {
            tokio::select! {
                _ = s.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = d.in_progress().await {
                tracing::warn!(item = %d.item_id, "cluster: cannot extend the item's ack deadline: {e}");
            }
        }
    });
    stop
}

/// Sleeps `d`; true when `cancel` came first.
async fn pause(cancel: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// The fire an item given up on would have been, and why it never ran to its end.
fn dead_fire(queue: &str, item: crate::cluster::queue::DeadItem) -> (Fire, String) {
    let payload = crate::trigger::queue::decode_item(&item.payload).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&item.payload).into_owned())
    });
    let fire = Fire::new(
        "queue",
        None,
        json!({ "queue": queue, "item_id": item.item_id, "payload": payload, "attempt": item.attempts }),
    );
    let why = format!(
        "queue item delivered {} time(s) without a run ending (its daemon gone each time, or its key held by a run in flight; the last to {}): given up; `steward dead-letter retry` runs it again",
        item.attempts,
        if item.last_daemon.is_empty() { "an unknown daemon" } else { &item.last_daemon }
    );
    (fire, why)
}
