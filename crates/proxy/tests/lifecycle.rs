//! Reload under load and graceful shutdown, in process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tailguard_test_support::{Upstream, http1_client};

use crate::support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_constant_load_fails_no_request() {
    let a = Upstream::builder().body("a").start().await;
    let b = Upstream::builder().body("b").start().await;
    let (server, url) = support::start(support::proxy_to(&[a.addr], ""));
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (stop, failures, done, url) =
            (stop.clone(), failures.clone(), done.clone(), url.clone());
        clients.push(tokio::spawn(async move {
            let client = http1_client();
            while !stop.load(Ordering::Relaxed) {
                match client.request(support::get(&format!("{url}/"))).await {
                    Ok(r) if r.status() == 200 => {
                        let _ = support::text(r).await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        if failures.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("failed: {other:?}");
                        }
                    }
                }
            }
        }));
    }
    // Reload back and forth between the two upstreams while the clients keep going; the
    // last reload (an even round) points at b.
    for round in 0..7 {
        while a.requests() + b.requests() < (round + 1) * 50 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let target = if round % 2 == 0 { b.addr } else { a.addr };
        server.reload(support::proxy_to(&[target], "")).unwrap();
    }
    let before = b.requests();
    while b.requests() < before + 50 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    assert!(done.load(Ordering::Relaxed) >= 350);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let upstream = Upstream::start().await;
    let (server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let addr = server.local_addrs()[0];
    let mut in_flight = Vec::new();
    for _ in 0..10 {
        let url = url.clone();
        in_flight.push(tokio::spawn(async move {
            tailguard_test_support::get(&http1_client(), &format!("{url}/delay/300")).await
        }));
    }
    while upstream.requests() < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // An idle keep-alive connection must not hold the drain up.
    let idle = http1_client();
    assert_eq!(
        tailguard_test_support::get(&idle, &format!("{url}/"))
            .await
            .0,
        200
    );

    let drained = server.shutdown(Duration::from_secs(10)).await;
    assert!(drained, "all connections finished before the deadline");
    for r in in_flight {
        assert_eq!(r.await.unwrap(), (200, "ok".to_owned()));
    }
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn idle_keep_alive_connection_is_closed_after_idle_ms() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start().await;
    let (server, _) = support::start(support::proxy_to(
        &[upstream.addr],
        "[timeouts]\nidle_ms = 200\n",
    ));
    let mut s = tokio::net::TcpStream::connect(server.local_addrs()[0])
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The response, then (after 200 ms idle) EOF; 10 s bounds the test, not the behaviour.
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "idle connection still open after 10 s");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200 OK"));
}

#[tokio::test]
async fn connections_over_the_limit_wait_until_one_closes() {
    let upstream = Upstream::start().await;
    let config = support::proxy_to(&[upstream.addr], "[limits]\nconnections = 1\n");
    let server = tailguard_proxy::Server::start(config, 1).unwrap();
    let url = format!("http://{}", server.local_addrs()[0]);
    // The first client holds the only slot with an idle keep-alive connection.
    let first = http1_client();
    assert_eq!(
        tailguard_test_support::get(&first, &format!("{url}/"))
            .await
            .0,
        200
    );
    let second = tokio::spawn({
        let url = url.clone();
        async move { tailguard_test_support::get(&http1_client(), &format!("{url}/")).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "a second connection was served beyond the limit"
    );
    assert_eq!(upstream.requests(), 1);
    drop(first); // closes its pooled connection, freeing the slot
    let got = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("served once the slot is free");
    assert_eq!(got.unwrap().0, 200);
}

/// A snapshot replaced by a reload lives while a request from before the reload holds it,
/// and is freed (by the reaper thread, not the serving thread that finishes the last such
/// request) once none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_snapshot_is_freed_once_its_last_request_ends() {
    // 8 MiB: more than the sockets' buffers hold, so the answer stays in flight while the
    // client reads none of it.
    let upstream = Upstream::builder().body(vec![b'x'; 8 << 20]).start().await;
    let config = || support::proxy_to(&[upstream.addr], "");
    let (server, url) = support::start(config());
    let client = http1_client();
    let response = client
        .request(support::get(&format!("{url}/")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    server.reload(config()).unwrap();
    let gateway = server.gateway();
    assert_eq!(
        gateway.retired_snapshots(),
        1,
        "the replaced snapshot is kept"
    );
    // The unread answer still holds it: several reaper rounds (one a second) pass without
    // freeing it.
    for _ in 0..25 {
        assert_eq!(
            gateway.retired_snapshots(),
            1,
            "freed while a request holds it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(response);
    drop(client);
    // 30 s bounds the test, not the behaviour (the connection's close, one reaper round).
    let freed = tokio::time::timeout(Duration::from_secs(30), async {
        while gateway.retired_snapshots() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(freed.is_ok(), "the replaced snapshot is never freed");
}
