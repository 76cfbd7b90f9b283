//! Reads, writes, conditional writes and deletes of one key, and what a client of a member
//! that does not answer gets.

use std::time::Duration;

use tailguard_etcd::{Client, ConnectOptions, Error};
use tailguard_test_support::etcd::{EtcdServer, free_port};

async fn client(url: &str) -> Client {
    Client::connect(&[url], &ConnectOptions::new())
        .await
        .expect("client")
}

/// A call bounded in time, so a test never hangs on a server that does not answer.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("etcd answered within 20 s")
}

#[tokio::test]
async fn a_put_is_read_back_with_its_revisions() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    // A bare host:port is plain HTTP.
    let mut c = client(&format!("127.0.0.1:{}", etcd.client_port)).await;
    let missing = bounded(c.get("/k")).await.expect("get");
    assert!(missing.kvs.is_empty());
    assert!(missing.revision() >= 1, "{missing:?}");

    let r1 = bounded(c.put("/k", "one")).await.expect("put").revision();
    assert!(r1 > missing.revision());
    let kv = bounded(c.get("/k"))
        .await
        .expect("get")
        .into_first()
        .expect("the key");
    assert_eq!(
        (kv.key.as_slice(), kv.value.as_slice()),
        (&b"/k"[..], &b"one"[..])
    );
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (r1, r1, 1)
    );

    let r2 = bounded(c.put("/k", "two")).await.expect("put").revision();
    let got = bounded(c.get("/k")).await.expect("get");
    assert_eq!(got.revision(), r2);
    let kv = got.into_first().expect("the key");
    assert_eq!(kv.value, b"two");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (r1, r2, 2)
    );
}

/// A config document of 100,000 routes is about 7 MiB: over tonic's default 4 MiB answer,
/// which refused the get ("decoded message length too large"), and over etcd's default
/// 1.5 MiB request, which a cluster for such a table raises.
#[tokio::test]
async fn a_document_of_100000_routes_is_stored_and_read_back() {
    let Some(etcd) = EtcdServer::builder()
        .arg("--max-request-bytes=33554432")
        .start()
    else {
        return;
    };
    let document: String = (0..100_000)
        .map(|i| format!("[[routes]]\nid = \"r{i}\"\nupstream = \"u\"\npath = {{ prefix = \"/t{i}/api\" }}\n\n"))
        .collect();
    assert!(document.len() > 6 << 20, "{}", document.len());
    let mut c = client(&etcd.url()).await;
    bounded(c.put("/big", document.clone())).await.expect("put");
    let kv = bounded(c.get("/big"))
        .await
        .expect("get")
        .into_first()
        .expect("the key");
    assert!(
        kv.value == document.as_bytes(),
        "the document came back changed"
    );
}

#[tokio::test]
async fn put_if_mod_revision_writes_only_at_the_expected_revision() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let mut c = client(&etcd.url()).await;
    // 0: only if the key does not exist.
    let created = bounded(c.put_if_mod_revision("/k", "one", 0))
        .await
        .expect("txn");
    assert!(created.succeeded);
    let r1 = created.revision();

    let refused = bounded(c.put_if_mod_revision("/k", "two", 0))
        .await
        .expect("txn");
    assert!(!refused.succeeded);
    assert_eq!(refused.revision(), r1, "nothing written");
    let kv = &refused
        .first_range()
        .expect("the failure branch's read")
        .kvs[0];
    assert_eq!((kv.mod_revision, kv.value.as_slice()), (r1, &b"one"[..]));

    let refused = bounded(c.put_if_mod_revision("/k", "two", r1 + 5))
        .await
        .expect("txn");
    assert!(!refused.succeeded);

    let updated = bounded(c.put_if_mod_revision("/k", "two", r1))
        .await
        .expect("txn");
    assert!(updated.succeeded);
    assert!(updated.revision() > r1);
    let kv = bounded(c.get("/k")).await.expect("get").into_first();
    assert_eq!(kv.map(|kv| kv.value), Some(b"two".to_vec()));
}

#[tokio::test]
async fn delete_removes_the_key() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let mut c = client(&etcd.url()).await;
    let r1 = bounded(c.put("/k", "v")).await.expect("put").revision();
    bounded(c.put("/other", "v")).await.expect("put");
    let deleted = bounded(c.delete("/k")).await.expect("delete");
    assert_eq!(deleted.deleted, 1);
    assert!(deleted.revision() > r1);
    assert!(bounded(c.get("/k")).await.expect("get").kvs.is_empty());
    assert_eq!(bounded(c.get("/other")).await.expect("get").kvs.len(), 1);
    assert_eq!(bounded(c.delete("/k")).await.expect("delete").deleted, 0);
}

#[tokio::test]
async fn with_a_member_down_calls_fail_fast_and_a_retried_call_gets_through() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let options = ConnectOptions::new().with_connect_timeout(Duration::from_millis(500));

    let mut dead = Client::connect(&[nowhere.as_str()], &options)
        .await
        .expect("connects lazily");
    let outcome = tokio::time::timeout(Duration::from_secs(2), dead.get("/k")).await;
    assert!(
        !matches!(outcome, Ok(Ok(_))),
        "no answer from a port nobody listens on: {outcome:?}"
    );

    let mut both = Client::connect(&[nowhere, etcd.url()], &options)
        .await
        .expect("client");
    // The channel balances over both members, the dead one included (as etcd-client's
    // does): a call sent there fails at once, and a caller that retries gets through.
    let mut ok = 0;
    for _ in 0..40 {
        if bounded(both.put("/k", "v")).await.is_ok() {
            ok += 1;
        }
    }
    assert!(ok > 0, "no call of 40 reached the live member");
}

#[tokio::test]
async fn malformed_endpoints_are_refused_before_any_connection() {
    let options = ConnectOptions::new();
    let none: [&str; 0] = [];
    assert!(matches!(
        Client::connect(&none, &options).await,
        Err(Error::NoEndpoints)
    ));
    let e = Client::connect(&["ftp://127.0.0.1:2379"], &options)
        .await
        .expect_err("not http");
    assert!(
        e.to_string()
            .contains("expected http://host:port or https://host:port"),
        "{e}"
    );
    let e = Client::connect(&["http://bad host:1"], &options)
        .await
        .expect_err("not a URL");
    assert!(matches!(e, Error::Endpoint { .. }), "{e}");
}
