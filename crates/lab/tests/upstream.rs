//! The built-in upstream: fixed body, 5xx rate, CPU burn, and h2c as well as HTTP/1.1.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard_lab::upstream::UpstreamConfig;

use crate::support;

async fn get(addr: std::net::SocketAddr, h2: bool) -> (u16, Bytes, &'static str) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = Request::builder()
        .uri(format!("http://{addr}/"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = if h2 {
        let (mut s, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        s.send_request(req).await.unwrap()
    } else {
        let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        s.send_request(req).await.unwrap()
    };
    let version = if resp.version() == hyper::Version::HTTP_2 {
        "h2"
    } else {
        "http/1.1"
    };
    let status = resp.status().as_u16();
    (
        status,
        resp.into_body().collect().await.unwrap().to_bytes(),
        version,
    )
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn serves_a_fixed_body_over_http1_and_h2c() {
    let server = support::upstream(UpstreamConfig {
        body_bytes: 1000,
        ..UpstreamConfig::default()
    });
    let (status, body, version) = block_on(get(server.addr, false));
    assert_eq!((status, body.len(), version), (200, 1000, "http/1.1"));
    let (status, body, version) = block_on(get(server.addr, true));
    assert_eq!((status, body.len(), version), (200, 1000, "h2"));
}

#[test]
fn error_rate_one_answers_500() {
    let server = support::upstream(UpstreamConfig {
        error_rate: 1.0,
        ..UpstreamConfig::default()
    });
    for _ in 0..5 {
        assert_eq!(block_on(get(server.addr, false)).0, 500);
    }
}

#[test]
fn cpu_burn_and_latency_take_at_least_their_time() {
    // CPU time can only pass as fast as wall time, so a 30 ms burn takes >= 30 ms on any
    // machine; this is a lower bound, not a speed target.
    let server = support::upstream(UpstreamConfig {
        cpu_ns: 30_000_000,
        ..UpstreamConfig::default()
    });
    let t = Instant::now();
    assert_eq!(block_on(get(server.addr, false)).0, 200);
    assert!(t.elapsed() >= Duration::from_millis(30));
    let server = support::upstream(UpstreamConfig {
        latency: Duration::from_millis(40),
        ..UpstreamConfig::default()
    });
    let t = Instant::now();
    assert_eq!(block_on(get(server.addr, false)).0, 200);
    assert!(t.elapsed() >= Duration::from_millis(40));
}

#[test]
fn burn_cpu_consumes_thread_cpu_time() {
    let before = tailguard_lab::clock::thread_cpu_ns();
    tailguard_lab::clock::burn_cpu(5_000_000);
    assert!(tailguard_lab::clock::thread_cpu_ns() - before >= 5_000_000);
}
