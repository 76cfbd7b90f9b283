//! The `Watch` stream: created, events in order, history from a past revision, a compacted
//! start revision, and a dead or silent etcd ending the stream.

use std::time::Duration;

use tailguard_etcd::{Client, ConnectOptions, EventType, WatchCreateRequest, WatchStream};
use tailguard_test_support::etcd::EtcdServer;

async fn client(etcd: &EtcdServer) -> Client {
    let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(5));
    Client::connect(&[etcd.url()], &options)
        .await
        .expect("client")
}

async fn watch(c: &mut Client, start_revision: i64) -> WatchStream {
    let create = WatchCreateRequest {
        key: b"/k".to_vec(),
        start_revision,
        ..Default::default()
    };
    tokio::time::timeout(Duration::from_secs(20), c.watch(create))
        .await
        .expect("etcd answered within 20 s")
        .expect("watch")
}

/// The events the stream delivers until there are `n`: (type, mod revision, value).
async fn events(stream: &mut WatchStream, n: usize) -> Vec<(EventType, i64, Vec<u8>)> {
    let mut out = Vec::new();
    while out.len() < n {
        let response = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("an event within 20 s")
            .expect("the stream")
            .expect("not closed");
        assert!(!response.canceled, "{response:?}");
        for e in response.events {
            let kv = e.kv.clone().expect("kv");
            out.push((e.r#type(), kv.mod_revision, kv.value));
        }
    }
    out
}

#[tokio::test]
async fn a_watch_is_created_then_sends_each_change_in_order() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let mut c = client(&etcd).await;
    let r1 = c.put("/k", "one").await.expect("put").revision();
    let mut stream = watch(&mut c, r1 + 1).await;
    let created = stream.message().await.expect("stream").expect("created");
    assert!(created.created && !created.canceled, "{created:?}");
    assert_eq!(created.compact_revision, 0);

    c.put("/other", "x").await.expect("put");
    let r2 = c.put("/k", "two").await.expect("put").revision();
    let r3 = c.delete("/k").await.expect("delete").revision();
    assert_eq!(
        events(&mut stream, 2).await,
        [
            (EventType::Put, r2, b"two".to_vec()),
            (EventType::Delete, r3, Vec::new())
        ]
    );
}

#[tokio::test]
async fn a_watch_from_a_past_revision_replays_the_history_since() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let mut c = client(&etcd).await;
    let r1 = c.put("/k", "one").await.expect("put").revision();
    let r2 = c.put("/k", "two").await.expect("put").revision();
    let mut stream = watch(&mut c, r1).await;
    assert_eq!(
        events(&mut stream, 2).await,
        [
            (EventType::Put, r1, b"one".to_vec()),
            (EventType::Put, r2, b"two".to_vec())
        ]
    );
}

#[tokio::test]
async fn a_watch_at_a_compacted_revision_is_cancelled_with_the_compact_revision() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let mut c = client(&etcd).await;
    let r1 = c.put("/k", "one").await.expect("put").revision();
    c.put("/k", "two").await.expect("put");
    let r3 = c.put("/k", "three").await.expect("put").revision();
    let compacted = c.compact(r3).await.expect("compact");
    assert!(compacted.revision() >= r3);

    let mut stream = watch(&mut c, r1).await;
    loop {
        let response = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("an answer within 20 s")
            .expect("the stream")
            .expect("not closed");
        assert!(
            response.events.is_empty(),
            "no compacted history: {response:?}"
        );
        if response.compact_revision > 0 {
            assert_eq!(response.compact_revision, r3);
            assert!(response.canceled, "{response:?}");
            break;
        }
        assert!(response.created, "{response:?}");
    }
}

#[tokio::test]
async fn a_watch_ends_with_an_error_when_etcd_dies() {
    let Some(mut etcd) = EtcdServer::start() else {
        return;
    };
    let mut c = client(&etcd).await;
    let mut stream = watch(&mut c, 0).await;
    assert!(
        stream
            .message()
            .await
            .expect("stream")
            .expect("created")
            .created
    );
    etcd.kill();
    let end = tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("the stream ends within 20 s");
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}

#[tokio::test]
async fn keep_alive_pings_end_a_watch_on_a_silent_etcd() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    // Pings every 500 ms, 500 ms to answer: without them a watch on a frozen etcd (its TCP
    // connection open, nothing answering) would wait forever.
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_millis(500), Duration::from_millis(500));
    let mut pinged = Client::connect(&[etcd.url()], &options)
        .await
        .expect("client");
    let mut unpinged = client(&etcd).await;
    let mut stream = watch(&mut pinged, 0).await;
    let mut control = watch(&mut unpinged, 0).await;
    for s in [&mut stream, &mut control] {
        assert!(s.message().await.expect("stream").expect("created").created);
    }
    etcd.freeze(true);
    let end = tokio::time::timeout(Duration::from_secs(20), stream.message()).await;
    // Without pings, nothing tells the other watch that etcd is gone.
    let control_end = tokio::time::timeout(Duration::from_millis(100), control.message()).await;
    etcd.freeze(false);
    let end = end.expect("the stream ends within 20 s, not waits forever");
    assert!(end.is_err(), "{end:?}");
    assert!(control_end.is_err(), "{control_end:?}");
}
