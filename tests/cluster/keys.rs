//! Idempotency keys in the cluster: reserved once, moved at their revision, freed or put in doubt when their daemon is gone.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_reserved_once_and_moves_only_at_its_revision() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    beat(&a).await;
    beat(&b).await;
    let lease = a
        .reserve_key("fetch", "item/1 ü", "run-a")
        .await
        .unwrap()
        .unwrap();
    let taken = b
        .reserve_key("fetch", "item/1 ü", "run-b")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (taken.daemon.as_str(), taken.record.run_id.as_str()),
        ("a", "run-a")
    );
    let committing = a
        .advance_key(&lease, "run-a", KeyPhase::Committing)
        .await
        .unwrap()
        .unwrap();
    // The old lease is stale now: its revision moved on.
    let stale = a
        .advance_key(&lease, "run-a", KeyPhase::Committed)
        .await
        .unwrap();
    assert_eq!(
        stale.unwrap_err().now.unwrap().record.phase,
        KeyPhase::Committing
    );
    a.advance_key(&committing, "run-a", KeyPhase::Committed)
        .await
        .unwrap()
        .unwrap();
    let (held, _) = b.held_key("fetch", "item/1 ü").await.unwrap().unwrap();
    assert_eq!(held.record.phase, KeyPhase::Committed);
    assert_eq!(held.record.key, "item/1 ü");
    // A released key may be reserved again.
    let other = a
        .reserve_key("fetch", "item/2", "run-a2")
        .await
        .unwrap()
        .unwrap();
    a.release_key(&other).await.unwrap().unwrap();
    assert!(b
        .reserve_key("fetch", "item/2", "run-b2")
        .await
        .unwrap()
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_daemons_unstarted_commits_are_released_and_started_ones_left_in_doubt() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "1s").await;
    let b = daemon(&server, "b", "1s").await;
    beat(&a).await;
    beat(&b).await;
    let reserved = a
        .reserve_key("fetch", "k1", "run-1")
        .await
        .unwrap()
        .unwrap();
    let started = a
        .reserve_key("fetch", "k2", "run-2")
        .await
        .unwrap()
        .unwrap();
    a.advance_key(&started, "run-2", KeyPhase::Committing)
        .await
        .unwrap()
        .unwrap();
    // While a beats, b frees nothing of a's.
    assert_eq!(b.reap_gone().await.unwrap(), Default::default());

    // a stops beating: the server drops its entry after the heartbeat (1 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    while a_alive(&b).await {
        assert!(Instant::now() < deadline, "a's heartbeat never expired");
        beat(&b).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    beat(&b).await;
    let reaped = b.reap_gone().await.unwrap();
    let keys = |list: &[steward::store::KeyRecord]| -> Vec<String> {
        list.iter().map(|r| r.key.clone()).collect()
    };
    assert_eq!(keys(&reaped.released), ["k1"]);
    assert_eq!(keys(&reaped.in_doubt), ["k2"]);
    assert_eq!(keys(&b.keys_in_doubt().await.unwrap()), ["k2"]);
    let doubt = &reaped.in_doubt[0];
    assert_eq!(doubt.found_in, Some(KeyPhase::Committing));
    // Reaping again changes nothing.
    assert_eq!(b.reap_gone().await.unwrap(), Default::default());
    // a, back, is fenced from both keys; the freed one runs again elsewhere.
    assert!(a
        .advance_key(&reserved, "run-1", KeyPhase::Committing)
        .await
        .unwrap()
        .is_err());
    assert!(b
        .reserve_key("fetch", "k1", "run-1b")
        .await
        .unwrap()
        .is_ok());
}

/// An item redelivered before the reaper came round: the gone daemon's reservation is
/// freed on the spot; a live daemon's, or a commit begun, is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reserved_by_a_gone_daemon_is_taken_over_at_once_unless_its_commit_began() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    beat(&b).await;
    // a never beat: gone.
    let stale = a.reserve_key("fetch", "k", "run-a").await.unwrap().unwrap();
    let begun = a
        .reserve_key("fetch", "k2", "run-a2")
        .await
        .unwrap()
        .unwrap();
    a.advance_key(&begun, "run-a2", KeyPhase::Committing)
        .await
        .unwrap()
        .unwrap();
    let lease = b.reserve_key("fetch", "k", "run-b").await.unwrap().unwrap();
    assert_eq!(
        b.held_key("fetch", "k").await.unwrap().unwrap().0.daemon,
        "b"
    );
    assert!(a
        .advance_key(&stale, "run-a", KeyPhase::Committing)
        .await
        .unwrap()
        .is_err());
    let held = b
        .reserve_key("fetch", "k2", "run-b2")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(held.record.phase, KeyPhase::Committing);
    // b is alive: a third daemon does not take b's key.
    let c = daemon(&server, "c", "5s").await;
    assert!(c.reserve_key("fetch", "k", "run-c").await.unwrap().is_err());
    b.release_key(&lease).await.unwrap().unwrap();
}
