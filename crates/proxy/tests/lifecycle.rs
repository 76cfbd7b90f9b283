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
