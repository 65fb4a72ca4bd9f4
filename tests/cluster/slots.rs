//! Slots claimed once of three racing daemons, and taken over only from a gone one.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_slot_is_claimed_by_exactly_one_of_three_daemons() {
    let server = NatsServer::start();
    let mut daemons = Vec::new();
    for name in ["a", "b", "c"] {
        daemons.push(daemon(&server, name, "5s").await);
    }
    let first = Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, 0).unwrap();
    let mut won = [0usize; 3];
    for s in 0..60 {
        let slot = first + chrono::Duration::seconds(s);
        let claims =
            futures_util::future::join_all(daemons.iter().map(|d| d.claim_slot("tick", slot)))
                .await;
        let winners: Vec<usize> = claims
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| c.unwrap().map(|_| i))
            .collect();
        assert_eq!(winners.len(), 1, "slot {slot}: {winners:?}");
        won[winners[0]] += 1;
        // A later try (a restart, a catch-up) finds it claimed.
        for d in &daemons {
            assert_eq!(d.claim_slot("tick", slot).await.unwrap(), None);
        }
    }
    assert_eq!(won.iter().sum::<usize>(), 60);
    // Another workflow's slot at the same time is its own.
    assert!(daemons[0]
        .claim_slot("tock", first)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_over_from_a_gone_daemon_fences_the_first() {
    let server = NatsServer::start();
    let a = daemon(&server, "a", "5s").await;
    let b = daemon(&server, "b", "5s").await;
    let c = daemon(&server, "c", "5s").await;
    let slot = Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, 0).unwrap();
    let claim_a = a.claim_slot("tick", slot).await.unwrap().unwrap();
    assert!(a.holds(&claim_a).await.unwrap());
    let (holder, revision) = b.slot_holder("tick", slot).await.unwrap().unwrap();
    assert_eq!(holder.daemon, "a");
    assert_eq!(revision, claim_a.revision);
    // a never beat: it is gone, and b takes the slot over at a's revision.
    assert!(!b.is_alive("a").await.unwrap());
    let claim_b = b
        .take_over_slot("tick", slot, revision)
        .await
        .unwrap()
        .unwrap();
    assert!(!a.holds(&claim_a).await.unwrap(), "a's claim still stands");
    assert!(b.holds(&claim_b).await.unwrap());
    // c, too late with the same revision, does not get it.
    assert_eq!(
        c.take_over_slot("tick", slot, revision).await.unwrap(),
        None
    );
}
