//! etcd's user/password authentication against a real etcd with `auth enable`: calls with
//! a token, each refusal told apart (wrong password, no permission, no credentials), and a token that
//! expires (`--auth-token-ttl`) renewed without ending an open watch.

use std::time::Duration;

use tailguard_etcd::{Client, ConnectOptions, Refusal, WatchCreateRequest};
use tailguard_test_support::etcd::EtcdServer;

const PASSWORD: &str = "s3cret";

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("etcd answered within 20 s")
}

async fn client(url: &str, credentials: Option<(&str, &str)>) -> Client {
    let mut options = ConnectOptions::new();
    if let Some((user, password)) = credentials {
        options = options.with_credentials(user, password);
    }
    Client::connect(&[url], &options).await.expect("client")
}

/// A `root` user with `PASSWORD`, then `auth enable` (etcd requires the root user first).
async fn enable_auth(url: &str) {
    let mut c = client(url, None).await;
    bounded(c.user_add("root", PASSWORD))
        .await
        .expect("user add");
    bounded(c.user_grant_role("root", "root"))
        .await
        .expect("grant root");
    bounded(c.auth_enable()).await.expect("auth enable");
}

#[tokio::test]
async fn calls_carry_a_token_and_a_wrong_or_missing_password_is_refused_by_name() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let url = etcd.url();
    // Credentials given before etcd enables authentication are not an error (as with
    // etcd's own client): requests go without a token.
    let mut early = client(&url, Some(("root", PASSWORD))).await;
    bounded(early.put("/k", "before")).await.expect("put");
    enable_auth(&url).await;

    let mut root = client(&url, Some(("root", PASSWORD))).await;
    let revision = bounded(root.put("/k", "v")).await.expect("put").revision();
    let kv = bounded(root.get("/k"))
        .await
        .expect("get")
        .into_first()
        .expect("key");
    assert_eq!(
        (kv.value.as_slice(), kv.mod_revision),
        (&b"v"[..], revision)
    );
    assert_eq!(root.authentications(), 1, "one token for both calls");
    // The early client finds out authentication is on, and authenticates.
    let kv = bounded(early.get("/k"))
        .await
        .expect("get")
        .into_first()
        .expect("key");
    assert_eq!(kv.value, b"v");

    let e = bounded(client(&url, Some(("root", "wrong"))).await.get("/k"))
        .await
        .expect_err("wrong password");
    assert_eq!(e.refusal(), Some(Refusal::WrongPassword), "{e}");
    assert!(e.to_string().contains("wrong user name or password"), "{e}");
    let e = bounded(client(&url, Some(("nobody", PASSWORD))).await.get("/k"))
        .await
        .expect_err("no such user");
    assert_eq!(e.refusal(), Some(Refusal::WrongPassword), "{e}");

    // A user with no role may not read.
    bounded(root.user_add("nobody-much", PASSWORD))
        .await
        .expect("user add");
    let e = bounded(
        client(&url, Some(("nobody-much", PASSWORD)))
            .await
            .get("/k"),
    )
    .await
    .expect_err("no permission");
    assert_eq!(e.refusal(), Some(Refusal::PermissionDenied), "{e}");

    let mut anonymous = client(&url, None).await;
    let e = bounded(anonymous.get("/k"))
        .await
        .expect_err("no credentials");
    assert_eq!(e.refusal(), Some(Refusal::AuthenticationRequired), "{e}");
    let e = bounded(anonymous.watch(WatchCreateRequest {
        key: b"/k".to_vec(),
        ..Default::default()
    }))
    .await
    .expect_err("a watch without credentials");
    assert_eq!(e.refusal(), Some(Refusal::AuthenticationRequired), "{e}");
}

/// Waits past the token's TTL without using it (a simple token's TTL restarts at each
/// use), then runs `call`, until a call needed a new token: etcd drops expired tokens on a
/// 1 s tick, so the wait is retried rather than trusted.
async fn after_token_expiry(c: &Client, ttl: Duration, mut call: impl AsyncFnMut()) {
    let before = c.authentications();
    for attempt in 1..=5u32 {
        tokio::time::sleep(ttl * (attempt + 1)).await;
        call().await;
        if c.authentications() > before {
            return;
        }
    }
    panic!("the token never expired");
}

#[tokio::test]
async fn an_expired_token_is_renewed_and_the_open_watch_keeps_delivering() {
    let Some(etcd) = EtcdServer::builder()
        .arg("--auth-token=simple")
        .arg("--auth-token-ttl=1")
        .start()
    else {
        return;
    };
    let url = etcd.url();
    enable_auth(&url).await;
    let mut writer = client(&url, Some(("root", PASSWORD))).await;
    let mut watcher = client(&url, Some(("root", PASSWORD))).await;
    let start = bounded(watcher.get("/k")).await.expect("get").revision();
    let mut stream = bounded(watcher.watch(WatchCreateRequest {
        key: b"/k".to_vec(),
        start_revision: start + 1,
        ..Default::default()
    }))
    .await
    .expect("watch");
    let created = bounded(stream.message())
        .await
        .expect("message")
        .expect("open");
    assert!(created.created && !created.canceled, "{created:?}");

    // The watcher's token expires while its watch is open; a read renews it.
    let ttl = Duration::from_secs(1);
    let mut reader = watcher.clone();
    after_token_expiry(&watcher, ttl, async || {
        bounded(reader.get("/k"))
            .await
            .expect("a read with a renewed token");
    })
    .await;
    assert!(watcher.authentications() >= 2);

    // The watch opened with the old token still delivers, in order.
    for value in ["one", "two"] {
        let revision = bounded(writer.put("/k", value))
            .await
            .expect("put")
            .revision();
        let response = bounded(stream.message())
            .await
            .expect("message")
            .expect("open");
        let kv = response.events[0].kv.as_ref().expect("kv");
        assert_eq!(
            (kv.value.as_slice(), kv.mod_revision),
            (value.as_bytes(), revision)
        );
    }

    // A watch created with an expired token is created again with a new one.
    let authentications = watcher.authentications();
    let mut creator = watcher.clone();
    let mut again = None;
    after_token_expiry(&watcher, ttl, async || {
        let stream = bounded(creator.watch(WatchCreateRequest {
            key: b"/k".to_vec(),
            ..Default::default()
        }))
        .await
        .expect("watch with a renewed token");
        again = Some(stream);
    })
    .await;
    assert!(watcher.authentications() > authentications);
    let mut again = again.expect("watch");
    let created = bounded(again.message())
        .await
        .expect("message")
        .expect("open");
    assert!(created.created && !created.canceled, "{created:?}");
    let revision = bounded(writer.put("/k", "three"))
        .await
        .expect("put")
        .revision();
    let response = bounded(again.message())
        .await
        .expect("message")
        .expect("open");
    assert_eq!(
        response.events[0].kv.as_ref().expect("kv").mod_revision,
        revision
    );
}
