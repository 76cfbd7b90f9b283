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
    let before = tailguard_loadgen::clock::thread_cpu_ns();
    tailguard_loadgen::clock::burn_cpu(5_000_000);
    assert!(tailguard_loadgen::clock::thread_cpu_ns() - before >= 5_000_000);
}

/// Sends one GET per `starts` entry, each on its own connection opened beforehand, the i-th
/// written `starts[i]` after a common start; returns each one's completion time from that start.
async fn timed_gets(addr: std::net::SocketAddr, starts: &[Duration]) -> Vec<Duration> {
    let mut senders = Vec::new();
    for _ in starts {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        senders.push(s);
    }
    let t0 = tokio::time::Instant::now();
    let tasks: Vec<_> = senders
        .into_iter()
        .zip(starts.iter().copied())
        .map(|(mut s, at)| {
            tokio::spawn(async move {
                tokio::time::sleep_until(t0 + at).await;
                let req = Request::builder()
                    .uri(format!("http://{addr}/"))
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let resp = s.send_request(req).await.unwrap();
                assert_eq!(resp.status(), 200);
                resp.into_body().collect().await.unwrap();
                t0.elapsed()
            })
        })
        .collect();
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    done
}

#[test]
fn two_workers_of_50ms_answer_six_requests_in_three_waves() {
    let server = support::upstream(UpstreamConfig {
        workers: Some(2),
        hold: Duration::from_millis(50),
        ..UpstreamConfig::default()
    });
    let mut done = block_on(timed_gets(server.addr, &[Duration::ZERO; 6]));
    done.sort();
    let ms: Vec<u128> = done.iter().map(Duration::as_millis).collect();
    // Wave k (0, 1, 2) cannot finish before (k + 1) x 50 ms: only two requests hold a worker
    // at a time. Both requests of a wave are held side by side, so they finish together;
    // with one worker they would finish at least 50 ms apart. Only these relations are
    // asserted, not an upper bound on each wave's time: a busy machine delays every wave
    // (one run here saw [69, 69, 142, 142, 185, 185]), and a delay must not fail the test.
    for (i, t) in ms.iter().enumerate() {
        let wave = i as u128 / 2;
        assert!(*t >= 50 * (wave + 1), "request {i} done at {t} ms: {ms:?}");
    }
    for pair in ms.chunks(2) {
        assert!(
            pair[1] - pair[0] < 50,
            "a wave's two requests were not held side by side: {ms:?}"
        );
    }
}

#[test]
fn waiting_requests_get_a_worker_in_arrival_order() {
    let server = support::upstream(UpstreamConfig {
        workers: Some(1),
        hold: Duration::from_millis(100),
        ..UpstreamConfig::default()
    });
    // Written 40 ms apart while the one worker is busy: each must wait for all earlier ones.
    // The gap is what keeps the arrival order the order of the writes on a loaded machine
    // (5 ms apart, a run under a full test suite and builds saw the third request arrive
    // after the fourth); the server cannot tell the client when a request has arrived.
    let starts: Vec<Duration> = (0..5).map(|i| Duration::from_millis(40 * i)).collect();
    let done = block_on(timed_gets(server.addr, &starts));
    assert!(done.windows(2).all(|w| w[0] < w[1]), "{done:?}");
    assert!(done[4] >= Duration::from_millis(500), "{done:?}");
}

#[test]
fn the_worker_hold_is_a_sleep_not_cpu() {
    // 20 requests of 50 ms each on 20 workers take ~50 ms of wall time on one runtime thread:
    // they sleep side by side; a CPU hold would take a second.
    let server = support::upstream(UpstreamConfig {
        workers: Some(20),
        hold: Duration::from_millis(50),
        ..UpstreamConfig::default()
    });
    let done = block_on(timed_gets(server.addr, &[Duration::ZERO; 20]));
    let last = done.iter().max().unwrap();
    assert!(*last < Duration::from_millis(400), "{done:?}");
}
