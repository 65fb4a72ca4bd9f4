//! Queue items in the work-queue stream: one daemon each, acked once, redelivered past the ack wait, dead-lettered past their attempts.

use super::*;

pub(crate) async fn a_alive(b: &Cluster) -> bool {
    b.is_alive("a").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_queue_item_goes_to_one_of_three_daemons_and_is_acked_once() {
    let server = NatsServer::start();
    let mut pullers = Vec::new();
    let mut daemons = Vec::new();
    for name in ["a", "b", "c"] {
        let d = daemon(&server, name, "5s").await;
        pullers.push(d.puller("inbox", 3).await.unwrap());
        daemons.push(d);
    }
    for i in 0..100 {
        daemons[i % 3]
            .enqueue(
                "inbox",
                &format!("item-{i}"),
                format!("{{\"n\": {i}}}").into_bytes(),
            )
            .await
            .unwrap();
    }
    // Another queue's items are not pulled here.
    daemons[0]
        .enqueue("other", "x", b"{}".to_vec())
        .await
        .unwrap();
    let pulls = pullers.into_iter().map(|mut p| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(d) = p.next(Duration::from_millis(500)).await.unwrap() {
                assert_eq!(d.attempt, 1);
                got.push(d.item_id.clone());
                assert!(d.ack().await.unwrap(), "a first delivery's ack was fenced");
            }
            got
        })
    });
    let mut all: Vec<String> = Vec::new();
    for got in futures_util::future::join_all(pulls).await {
        all.extend(got.unwrap());
    }
    all.sort();
    let mut want: Vec<String> = (0..100).map(|i| format!("item-{i}")).collect();
    want.sort();
    assert_eq!(all, want, "each item once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_held_past_its_ack_wait_goes_to_another_daemon_and_the_late_ack_is_fenced() {
    let server = NatsServer::start();
    let a = daemon_with(&server, "a", "5s", "1s").await;
    let b = daemon_with(&server, "b", "5s", "1s").await;
    let mut pa = a.puller("inbox", 5).await.unwrap();
    let mut pb = b.puller("inbox", 5).await.unwrap();
    a.enqueue("inbox", "only", b"{}".to_vec()).await.unwrap();
    let first = pa.next(Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(first.attempt, 1);
    // a stalls past the ack wait; the server hands the item to b.
    let second = pb
        .next(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("no redelivery");
    assert_eq!((second.item_id.as_str(), second.attempt), ("only", 2));
    assert!(!first.current().await.unwrap());
    assert!(!first.ack().await.unwrap(), "a's late ack went through");
    assert!(second.ack().await.unwrap());
    // Acknowledged by b: it never comes again.
    assert!(pa.next(Duration::from_secs(2)).await.unwrap().is_none());
    assert!(pb.next(Duration::from_millis(200)).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_progress_keeps_its_item_past_the_ack_wait() {
    let server = NatsServer::start();
    let a = daemon_with(&server, "a", "5s", "1s").await;
    let b = daemon_with(&server, "b", "5s", "1s").await;
    let mut pa = a.puller("inbox", 5).await.unwrap();
    let mut pb = b.puller("inbox", 5).await.unwrap();
    a.enqueue("inbox", "long", b"{}".to_vec()).await.unwrap();
    let held = pa.next(Duration::from_secs(5)).await.unwrap().unwrap();
    // Three ack waits long, with +WPI a third of one apart: b never gets it.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        held.in_progress().await.unwrap();
        assert!(pb.next(Duration::from_millis(300)).await.unwrap().is_none());
    }
    assert!(held.ack().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_past_its_attempts_goes_to_the_dead_letter_stream_with_its_context() {
    let server = NatsServer::start();
    let a = daemon_with(&server, "a", "5s", "1s").await;
    let mut pa = a.puller("inbox", 2).await.unwrap();
    a.enqueue("inbox", "poison", b"{\"bad\": true}".to_vec())
        .await
        .unwrap();
    for attempt in 1..=2 {
        let d = pa.next(Duration::from_secs(5)).await.unwrap().unwrap();
        assert_eq!(d.attempt, attempt);
        d.retry(Duration::ZERO).await.unwrap();
    }
    // The third delivery is past max_attempts: dead-lettered, not handed out.
    assert!(pa.next(Duration::from_secs(2)).await.unwrap().is_none());
    let dead = a.dead_items("inbox").await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].item_id, "poison");
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(dead[0].last_daemon, "a");
    assert_eq!(dead[0].payload, b"{\"bad\": true}");
    // And handed to the daemon, to be recorded as a dead-lettered run, once.
    let given_up = pa.given_up();
    assert_eq!(given_up.len(), 1);
    assert_eq!(
        (given_up[0].item_id.as_str(), given_up[0].attempts),
        ("poison", 2)
    );
    assert!(pa.given_up().is_empty());
    assert!(pa.next(Duration::from_secs(2)).await.unwrap().is_none());
}

// ---- real daemons -------------------------------------------------------------------
