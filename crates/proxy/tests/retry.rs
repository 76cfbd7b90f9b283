//! Per-route timeouts and retries (`timeouts` and `retry` on a route), on real sockets:
//! which timeout a route's requests get, which failed tries are sent again and where, what
//! the upstreams saw, and how retries show in the metrics and the access log.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use tailguard_proxy::{Config, Server};
use tailguard_test_support::{RecordingUpstream, TestBody, Upstream, h2c_client, http1_client};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::support::{self, empty, metrics_text, start, within};

/// Upstream `up` over `endpoints` (with `upstream_fields` in its table) and routes given as
/// whole `[[routes]]` tables, then `rest`.
fn config(endpoints: &[SocketAddr], upstream_fields: &str, routes: &str, rest: &str) -> Config {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    support::with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\n{upstream_fields}\nendpoints = [{}]\n\n{routes}\n{rest}",
        eps.join(", ")
    ))
}

/// One catch-all route `all` with `fields`.
fn all(fields: &str) -> String {
    format!("[[routes]]\nid = \"all\"\nupstream = \"up\"\n{fields}\n")
}

/// A port bound and never listened on: a connect to it is refused, and no other test takes
/// it while the socket lives.
fn refusing() -> (socket2::Socket, SocketAddr) {
    let s =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind 127.0.0.1:0");
    let addr = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("an IPv4 address");
    (s, addr)
}

/// The value of one series in a scrape (0 when it is absent).
fn series(server: &Server, line_prefix: &str) -> u64 {
    metrics_text(server)
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix)?.strip_prefix(' '))
        .map_or(0, |v| v.parse().expect("a counter value"))
}

fn retries(server: &Server, reason: &str) -> u64 {
    series(
        server,
        &format!("tailguard_upstream_retries_total{{route=\"all\",reason=\"{reason}\"}}"),
    )
}

fn skipped(server: &Server, reason: &str) -> u64 {
    series(
        server,
        &format!("tailguard_upstream_retries_skipped_total{{route=\"all\",reason=\"{reason}\"}}"),
    )
}

/// A body of exactly 20 bytes naming `tag` and `i`, so each request's body is its own.
fn twenty(tag: &str, i: usize) -> String {
    let body = format!("{:-<20}", format!("{tag}-{i}-"));
    assert_eq!(body.len(), 20);
    body
}

/// A body with its length announced (`Content-Length`).
fn full(body: impl Into<Bytes>) -> TestBody {
    Full::new(body.into()).boxed()
}

/// A body of these frames without an announced length: HTTP/1.1 sends it chunked.
fn chunked(chunks: &[&str]) -> TestBody {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c.as_bytes()))))
        .collect();
    StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

/// Sends `method` with `body` on `client` and returns the status (the body read whole).
async fn send_on(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        TestBody,
    >,
    url: &str,
    method: &str,
    body: TestBody,
) -> u16 {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .body(body)
        .expect("a request");
    let resp = within(client.request(req)).await.expect("an answer");
    let status = resp.status().as_u16();
    resp.into_body().collect().await.expect("the body");
    status
}

async fn send(url: &str, method: &str, body: TestBody) -> u16 {
    send_on(&http1_client(), url, method, body).await
}

/// Every complete request a recording upstream received, as (request line, body), sorted.
fn recorded(upstream: &RecordingUpstream) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = upstream
        .connections()
        .iter()
        .flat_map(|c| c.requests.iter())
        .map(|r| (r.line(), String::from_utf8_lossy(&r.body).into_owned()))
        .collect();
    all.sort();
    all
}

async fn status_of(url: &str, method: &str) -> u16 {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .body(empty())
        .expect("a request");
    let resp = within(http1_client().request(req))
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    resp.into_body().collect().await.expect("the body");
    status
}

#[tokio::test]
async fn a_route_request_timeout_overrides_the_global_one_both_ways() {
    let slow = Upstream::builder()
        .delay(Duration::from_millis(400))
        .start()
        .await;
    let routes = "[[routes]]\nid = \"long\"\nupstream = \"up\"\npath = { prefix = \"/long\" }\n\
         timeouts = { request_ms = 20000 }\n\n\
         [[routes]]\nid = \"off\"\nupstream = \"up\"\npath = { prefix = \"/off\" }\n\
         timeouts = { request_ms = 0 }\n\n\
         [[routes]]\nid = \"short\"\nupstream = \"up\"\npath = { prefix = \"/short\" }\n\
         timeouts = { request_ms = 50 }\n\n\
         [[routes]]\nid = \"global\"\nupstream = \"up\"\n";
    let (_server, url) = start(config(
        &[slow.addr],
        "",
        routes,
        "[timeouts]\nrequest_ms = 100\n",
    ));
    assert_eq!(status_of(&format!("{url}/long"), "GET").await, 200);
    assert_eq!(
        status_of(&format!("{url}/off"), "GET").await,
        200,
        "0 disables"
    );
    assert_eq!(status_of(&format!("{url}/short"), "GET").await, 504);
    assert_eq!(status_of(&format!("{url}/other"), "GET").await, 504);
}

#[tokio::test]
async fn a_route_connect_timeout_overrides_the_global_one() {
    // Accepts and never answers: a TLS handshake to it hangs, and the handshake is part of
    // the connect.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let (_server, url) = start(config(
        &[addr],
        "tls = { verify = false }",
        &all("timeouts = { connect_ms = 100 }"),
        "[timeouts]\nconnect_ms = 60000\n",
    ));
    // Bounded well under the global 60 s: only the route's 100 ms gets an answer in time.
    let req = http1_client().request(support::get(&url));
    let resp = tokio::time::timeout(Duration::from_secs(15), req)
        .await
        .expect("the route's connect timeout applied, not the global one")
        .unwrap();
    assert_eq!(resp.status(), 504);
    held.abort();
}

#[tokio::test]
async fn a_route_read_timeout_overrides_the_global_one() {
    // Sends the head and part of the body, then nothing.
    let stalling = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = stalling.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((mut s, _)) = stalling.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\nabc")
                .await;
            open.push(s);
        }
    });
    let (_server, url) = start(config(
        &[addr],
        "",
        &all("timeouts = { read_ms = 100 }"),
        "[timeouts]\nread_ms = 60000\n",
    ));
    let resp = within(http1_client().request(support::get(&url)))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the head went out");
    let body = tokio::time::timeout(Duration::from_secs(15), resp.into_body().collect())
        .await
        .expect("the route's read timeout cut the body, not the global one");
    assert!(body.is_err(), "a body cut short is an error to the client");
    held.abort();
}

#[tokio::test]
async fn a_503_is_retried_on_the_other_endpoint_and_logged_with_both() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let failing = Upstream::builder().status(503).start().await;
    let healthy = Upstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 1 }"),
        &format!(
            "[access_log]\npath = \"{}\"\n\
             template = \"$upstream_addr|$upstream_status|$upstream_tries|$status\"\n",
            log.display()
        ),
    ));
    for _ in 0..8 {
        assert_eq!(status_of(&url, "GET").await, 200);
    }
    // Every request ended on the healthy endpoint; the failing one saw exactly the tries
    // that were retried, each counted once.
    assert_eq!(healthy.requests(), 8);
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(retries(&server, "503"), failing.requests() as u64);
    assert!(server.shutdown(Duration::from_secs(10)).await);
    let written = std::fs::read_to_string(&log).unwrap();
    let retried = format!("{}, {}|503, 200|2|200", failing.addr, healthy.addr);
    let direct = format!("{}|200|1|200", healthy.addr);
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.len(), 8, "{written}");
    assert_eq!(
        lines.iter().filter(|l| **l == retried).count(),
        failing.requests(),
        "{written}"
    );
    assert!(
        lines.iter().all(|l| *l == retried || *l == direct),
        "{written}"
    );
}

#[tokio::test]
async fn a_post_is_never_retried() {
    let failing = Upstream::builder().status(503).start().await;
    let healthy = Upstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        &all("retry = { attempts = 3, on = [\"connect\", \"503\"], backoff_ms = 0 }"),
        "",
    ));
    let mut unavailable = 0;
    for _ in 0..8 {
        if status_of(&url, "POST").await == 503 {
            unavailable += 1;
        }
    }
    assert_eq!(failing.requests() + healthy.requests(), 8, "one try each");
    assert_eq!(
        unavailable,
        failing.requests(),
        "its 503 went to the client as is"
    );
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(retries(&server, "503"), 0);
}

#[tokio::test]
async fn retries_stop_at_the_upstream_budget() {
    let a = Upstream::builder().status(503).start().await;
    let b = Upstream::builder().status(503).start().await;
    let (server, url) = start(config(
        &[a.addr, b.addr],
        "",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }"),
        "",
    ));
    for _ in 0..60 {
        assert_eq!(status_of(&url, "GET").await, 503, "the last try's answer");
    }
    // The budget: 3 retries a second over its 10 s window (30) plus 10 % of the requests.
    let retried = retries(&server, "503");
    assert!((30..=36).contains(&retried), "{retried} retries");
    assert_eq!((a.requests() + b.requests()) as u64, 60 + retried);
    // Every first try met `503`: those the budget did not retry are counted as such.
    assert_eq!(skipped(&server, "retry_budget"), 60 - retried);
}

#[tokio::test]
async fn a_refused_connect_is_retried_elsewhere() {
    let (dead, dead_addr) = refusing();
    let live = Upstream::start().await;
    let (server, url) = start(config(
        &[dead_addr, live.addr],
        "",
        &all("retry = { attempts = 2, on = [\"connect\"], backoff_ms = 0 }"),
        "",
    ));
    for _ in 0..6 {
        assert_eq!(status_of(&url, "GET").await, 200);
    }
    assert_eq!(live.requests(), 6);
    let picked_dead = series(
        &server,
        &format!("tailguard_balancer_picks_total{{upstream=\"up\",endpoint=\"{dead_addr}\"}}"),
    );
    assert!(picked_dead >= 1, "round robin picked it");
    assert_eq!(retries(&server, "connect"), picked_dead);
    drop(dead);
}

#[tokio::test]
async fn without_a_retry_block_a_refused_connect_is_retried_once_and_counted() {
    let (dead, dead_addr) = refusing();
    let live = Upstream::start().await;
    let (server, url) = start(config(&[dead_addr, live.addr], "", &all(""), ""));
    for _ in 0..6 {
        assert_eq!(status_of(&url, "GET").await, 200);
    }
    assert_eq!(live.requests(), 6);
    assert!(retries(&server, "connect") >= 1);
    drop(dead);
}

#[tokio::test]
async fn a_try_past_its_request_timeout_is_retried_on_the_other_endpoint() {
    let slow = Upstream::builder()
        .delay(Duration::from_secs(20))
        .start()
        .await;
    let fast = Upstream::start().await;
    let (server, url) = start(config(
        &[slow.addr, fast.addr],
        "",
        &all("timeouts = { request_ms = 1000 }\n\
             retry = { attempts = 2, on = [\"timeout\"], backoff_ms = 0 }"),
        "",
    ));
    for _ in 0..4 {
        assert_eq!(status_of(&url, "GET").await, 200);
    }
    assert_eq!(fast.requests(), 4);
    let timed_out = retries(&server, "timeout");
    assert!(timed_out >= 1, "round robin picked the slow one");
    assert_eq!(slow.requests() as u64, timed_out);
}

#[tokio::test]
async fn attempts_count_every_try_and_the_last_answer_goes_to_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let ups = [
        Upstream::builder().status(503).start().await,
        Upstream::builder().status(503).start().await,
        Upstream::builder().status(503).start().await,
        Upstream::builder().status(503).start().await,
    ];
    let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
    let (server, url) = start(config(
        &addrs,
        "",
        &all("retry = { attempts = 3, on = [\"503\"], backoff_ms = 1 }"),
        &format!(
            "[access_log]\npath = \"{}\"\ntemplate = \"$upstream_status|$upstream_tries\"\n",
            log.display()
        ),
    ));
    assert_eq!(status_of(&url, "GET").await, 503);
    assert_eq!(ups.iter().map(Upstream::requests).sum::<usize>(), 3);
    assert!(
        ups.iter().all(|u| u.requests() <= 1),
        "each retry went to another endpoint"
    );
    assert_eq!(retries(&server, "503"), 2);
    assert!(server.shutdown(Duration::from_secs(10)).await);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "503, 503, 503|3\n");
}

#[tokio::test]
async fn an_h2c_upstream_503_is_retried_on_the_other_endpoint() {
    let failing = Upstream::builder().status(503).start().await;
    let healthy = Upstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "protocol = \"h2c\"",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }"),
        "",
    ));
    for client in [http1_client(), h2c_client()] {
        for _ in 0..4 {
            let resp = within(client.request(support::get(&url))).await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
        }
    }
    assert_eq!(healthy.requests(), 8);
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(retries(&server, "503"), failing.requests() as u64);
}

#[tokio::test]
async fn a_put_and_a_delete_with_a_body_are_retried_and_the_next_endpoint_gets_the_exact_body() {
    let failing = Upstream::builder()
        .status(503)
        .record_bodies()
        .start()
        .await;
    let healthy = RecordingUpstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }"),
        "",
    ));
    let mut sent = Vec::new();
    for i in 0..4 {
        for method in ["PUT", "DELETE"] {
            let body = twenty(method, i);
            assert_eq!(send(&url, method, full(body.clone())).await, 200);
            sent.push((format!("{method} / HTTP/1.1"), body));
        }
    }
    sent.sort();
    assert_eq!(
        recorded(&healthy),
        sent,
        "every request ended there, body whole"
    );
    for request in healthy
        .connections()
        .iter()
        .flat_map(|c| c.requests.clone())
    {
        assert_eq!(request.header_values("content-length"), ["20"]);
    }
    // The failing endpoint saw whole bodies too (it read them before its 503), and each
    // of its answers was retried.
    assert!(failing.requests() >= 1, "round robin picked it");
    for (method, body) in failing.bodies() {
        let line = format!("{method} / HTTP/1.1");
        let body = String::from_utf8_lossy(&body).into_owned();
        assert!(sent.contains(&(line, body.clone())), "{method} {body}");
    }
    assert_eq!(retries(&server, "503"), failing.requests() as u64);
    assert_eq!(skipped(&server, "body_too_large"), 0);
}

#[tokio::test]
async fn a_chunked_put_under_buffer_bytes_is_retried_with_its_exact_body() {
    let failing = Upstream::builder()
        .status(503)
        .record_bodies()
        .start()
        .await;
    let healthy = RecordingUpstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }"),
        "",
    ));
    let mut sent = Vec::new();
    for i in 0..4 {
        let tag = format!("{i}:");
        let chunks = [tag.as_str(), "chunk one|", "chunk two|", "chunk three"];
        assert_eq!(send(&url, "PUT", chunked(&chunks)).await, 200);
        sent.push(("PUT / HTTP/1.1".to_owned(), chunks.concat()));
    }
    sent.sort();
    assert_eq!(recorded(&healthy), sent);
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(retries(&server, "503"), failing.requests() as u64);
}

#[tokio::test]
async fn a_put_with_a_body_over_buffer_bytes_is_not_retried_and_counted() {
    let failing = Upstream::builder()
        .status(503)
        .record_bodies()
        .start()
        .await;
    let healthy = Upstream::builder().record_bodies().start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0, buffer_bytes = 1024 }"),
        "",
    ));
    let big = "b".repeat(2048);
    let half = &big[..1024];
    let mut unavailable = 0;
    for i in 0..6 {
        // Declared over the bound, or chunked and found over it as it streams.
        let body = if i % 2 == 0 {
            full(big.clone())
        } else {
            chunked(&[half, half])
        };
        match send(&url, "PUT", body).await {
            503 => unavailable += 1,
            status => assert_eq!(status, 200),
        }
    }
    assert_eq!(failing.requests() + healthy.requests(), 6, "one try each");
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(
        unavailable,
        failing.requests(),
        "its 503 went to the client"
    );
    assert_eq!(retries(&server, "503"), 0);
    assert_eq!(
        skipped(&server, "body_too_large"),
        failing.requests() as u64
    );
    // Each try got the whole body all the same: it streamed, only not kept.
    let bodies = [failing.bodies(), healthy.bodies()].concat();
    assert!(bodies.iter().all(|(_, b)| b.len() == 2048), "{bodies:?}");
    // A body of exactly `buffer_bytes` is kept, and retried. (Four: a new connection may
    // land on either serving thread, and each thread's round robin has its own turn.)
    for _ in 0..4 {
        assert_eq!(send(&url, "PUT", full(half.to_owned())).await, 200);
    }
    assert!(retries(&server, "503") >= 1);
}

#[tokio::test]
async fn a_post_and_a_patch_with_a_body_are_never_retried() {
    let failing = Upstream::builder()
        .status(503)
        .record_bodies()
        .start()
        .await;
    let healthy = Upstream::builder().record_bodies().start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        &all("retry = { attempts = 3, on = [\"connect\", \"503\"], backoff_ms = 0 }"),
        "",
    ));
    let mut unavailable = 0;
    for i in 0..4 {
        for method in ["POST", "PATCH"] {
            if send(&url, method, full(twenty(method, i))).await == 503 {
                unavailable += 1;
            }
        }
    }
    assert_eq!(failing.requests() + healthy.requests(), 8, "one try each");
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(unavailable, failing.requests());
    assert_eq!(retries(&server, "503"), 0);
    assert_eq!(skipped(&server, "method"), failing.requests() as u64);
}

/// The upstream answers before it reads the body (as it may to `Expect: 100-continue`), and
/// the client sends its body only after that: the next try still sends the whole body,
/// read on from the client where the first try stopped.
#[tokio::test]
async fn a_put_answered_503_before_its_body_arrived_is_retried_with_the_whole_body() {
    // Reads no body: it answers on the head alone.
    let failing = Upstream::builder().status(503).start().await;
    let healthy = RecordingUpstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        // Streamed: the head goes upstream before the body (which this client sends only
        // once it is there), as it does by default only once the body has started.
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }\nstream_request = true"),
        "",
    ));
    let addr = url.trim_start_matches("http://");
    let mut expected = Vec::new();
    // Round robin: within two requests one goes to the failing endpoint first.
    for i in 0..4 {
        if failing.requests() >= 1 && i >= 2 {
            break;
        }
        let before = (failing.requests(), recorded_heads(&healthy));
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client
            .write_all(
                b"PUT /slow HTTP/1.1\r\nhost: a\r\ncontent-length: 20\r\n\
                  expect: 100-continue\r\n\r\n",
            )
            .await
            .unwrap();
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n\r\n") {
            assert!(support::read_more(&mut client, &mut got).await, "open");
        }
        assert_eq!(got, b"HTTP/1.1 100 Continue\r\n\r\n");
        // The head went upstream: to the failing endpoint (which answers it at once), or
        // straight to the healthy one.
        let deadline = Instant::now() + Duration::from_secs(10);
        while failing.requests() == before.0 && recorded_heads(&healthy) == before.1 {
            assert!(
                Instant::now() < deadline,
                "the head never reached an upstream"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let body = twenty("late", i);
        client.write_all(body.as_bytes()).await.unwrap();
        expected.push(("PUT /slow HTTP/1.1".to_owned(), body));
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\nok") {
            assert!(
                support::read_more(&mut client, &mut answer).await,
                "{}",
                String::from_utf8_lossy(&answer)
            );
        }
        assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
    }
    expected.sort();
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(recorded(&healthy), expected);
    assert_eq!(retries(&server, "503"), failing.requests() as u64);
}

/// Keeping a body for a retry does not hold it back: the first try gets each part as the
/// client sends it (a client that waits for its upstream to see the first half would wait
/// for ever otherwise), by length or chunked.
#[tokio::test]
async fn a_kept_body_streams_to_the_first_try_as_it_arrives() {
    let upstream = RecordingUpstream::start().await;
    let (_server, url) = start(config(
        &[upstream.addr],
        "",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }"),
        "",
    ));
    let addr = url.trim_start_matches("http://");
    let framings: [(&str, [&str; 2]); 2] = [
        ("content-length: 20\r\n", ["first-half", "other-half"]),
        (
            "transfer-encoding: chunked\r\n",
            ["a\r\nfirst-half\r\n", "a\r\nother-half\r\n0\r\n\r\n"],
        ),
    ];
    for (framing, [first, rest]) in framings {
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!("PUT /stream HTTP/1.1\r\nhost: a\r\n{framing}\r\n{first}");
        client.write_all(head.as_bytes()).await.unwrap();
        let seen = |conns: &[tailguard_test_support::ConnectionLog]| {
            conns
                .iter()
                .map(|c| c.bytes.windows(10).filter(|w| *w == b"first-half").count())
                .sum::<usize>()
        };
        let before = seen(&upstream.connections());
        within(upstream.wait_until(|conns| seen(conns) > before)).await;
        client.write_all(rest.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\nok") {
            assert!(support::read_more(&mut client, &mut answer).await, "open");
        }
        assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"));
    }
    let bodies: Vec<(String, String)> = recorded(&upstream);
    assert_eq!(
        bodies,
        [
            (
                "PUT /stream HTTP/1.1".to_owned(),
                "first-halfother-half".to_owned()
            ),
            (
                "PUT /stream HTTP/1.1".to_owned(),
                "first-halfother-half".to_owned()
            ),
        ]
    );
}

/// Request heads a recording upstream has seen so far (complete requests or not).
fn recorded_heads(upstream: &RecordingUpstream) -> usize {
    upstream
        .connections()
        .iter()
        .map(|c| c.bytes.windows(4).filter(|w| *w == b"PUT ").count())
        .sum()
}

#[tokio::test]
async fn an_h2c_upstream_503_to_a_put_with_a_body_is_retried_with_the_exact_body() {
    let failing = Upstream::builder()
        .status(503)
        .record_bodies()
        .start()
        .await;
    let healthy = Upstream::builder().record_bodies().start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "protocol = \"h2c\"",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }"),
        "",
    ));
    let mut sent = Vec::new();
    for (name, client) in [("h1", http1_client()), ("h2", h2c_client())] {
        for i in 0..3 {
            let body = twenty(name, i);
            assert_eq!(send_on(&client, &url, "PUT", full(body.clone())).await, 200);
            sent.push(("PUT".to_owned(), body));
            let chunks = [name, "-chunked-", "body"];
            assert_eq!(send_on(&client, &url, "PUT", chunked(&chunks)).await, 200);
            sent.push(("PUT".to_owned(), chunks.concat()));
        }
    }
    let mut got: Vec<(String, String)> = healthy
        .bodies()
        .into_iter()
        .map(|(m, b)| (m, String::from_utf8_lossy(&b).into_owned()))
        .collect();
    got.sort();
    sent.sort();
    assert_eq!(got, sent);
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(retries(&server, "503"), failing.requests() as u64);
}

/// One serving thread keeps at most 8 MiB of bodies: with eight 1 MiB bodies waiting on an
/// upstream, a ninth is forwarded without being kept, and its 503 is not retried.
#[tokio::test]
async fn a_body_past_the_thread_budget_is_forwarded_and_not_retried() {
    // Reads each body whole, then holds its 503 until the gate opens.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (gate, opened) = tokio::sync::watch::channel(false);
    let read_whole = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&read_whole);
    let holder = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (opened, counted) = (opened.clone(), Arc::clone(&counted));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (mut opened, counted) = (opened.clone(), Arc::clone(&counted));
                    async move {
                        let body = req.into_body().collect().await;
                        assert_eq!(body.map(|b| b.to_bytes().len()).ok(), Some(1 << 20));
                        counted.fetch_add(1, Ordering::SeqCst);
                        let _ = opened.wait_for(|open| *open).await;
                        let mut resp = Response::new(Full::new(Bytes::from_static(b"busy")));
                        *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let route =
        all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0, buffer_bytes = 1048576 }");
    let server = Server::start(config(&[addr], "", &route, ""), 1).expect("gateway starts");
    let url = format!("http://{}", server.local_addrs()[0]);
    let megabyte = Bytes::from(vec![b'm'; 1 << 20]);
    let put =
        |url: String, body: Bytes| tokio::spawn(async move { send(&url, "PUT", full(body)).await });
    let held: Vec<_> = (0..8).map(|_| put(url.clone(), megabyte.clone())).collect();
    let wait_read = |n: usize| {
        let read_whole = Arc::clone(&read_whole);
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while read_whole.load(Ordering::SeqCst) < n {
                assert!(
                    Instant::now() < deadline,
                    "the upstream never got {n} bodies"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    // Eight bodies kept: the budget is full.
    wait_read(8).await;
    let ninth = put(url.clone(), megabyte.clone());
    wait_read(9).await;
    gate.send(true).unwrap();
    for request in held {
        assert_eq!(request.await.unwrap(), 503, "retried once, then answered");
    }
    assert_eq!(ninth.await.unwrap(), 503);
    assert_eq!(retries(&server, "503"), 8, "the kept ones were retried");
    assert_eq!(skipped(&server, "body_budget"), 1, "the ninth was not");
    assert_eq!(read_whole.load(Ordering::SeqCst), 17);
    holder.abort();
}

#[test]
fn retry_and_route_timeouts_are_checked_with_their_position() {
    let head = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\
                [[upstreams]]\nname = \"u\"\nendpoints = [{ address = \"127.0.0.1:1\" }]\n";
    let route =
        |fields: &str| format!("{head}[[routes]]\nid = \"r\"\nupstream = \"u\"\n{fields}\n");
    assert_eq!(
        crate::support::config_errors(&route("retry = { on = [\"connect\", \"500\"] }")),
        [
            "gw.toml:9:28: routes[0].retry.on[1]: `500` is not a retry condition; expected one \
          of `connect`, `502`, `503`, `504`, `timeout`"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route("retry = { attempts = 0 }")),
        [
            "gw.toml:9:22: routes[0].retry.attempts: 0 is outside 1..=10 (tries in all, the \
          first included)"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route("retry = { backoff_ms = 60000 }")),
        ["gw.toml:9:24: routes[0].retry.backoff_ms: 60000 ms is above the 10000 ms ceiling"]
    );
    assert_eq!(
        crate::support::config_errors(&route("retry = { buffer_bytes = 2000000 }")),
        [
            "gw.toml:9:26: routes[0].retry.buffer_bytes: 2000000 is above the 1048576 ceiling \
             (1 MiB: a larger body is an upload, not retried)"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route("retry = { on = [] }")),
        [
            "gw.toml:9:16: routes[0].retry.on: names no condition; for no retries at all, set \
          `attempts = 1`"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route(
            "timeouts = { request_ms = 0 }\nretry = { on = [\"timeout\"] }"
        )),
        [
            "gw.toml:10:17: routes[0].retry.on[0]: `timeout` needs a request timeout, and \
          `request_ms` is 0 (disabled)"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route("timeouts = { connect = 5 }")),
        [
            "gw.toml:9:14: routes[0]: unknown field `connect`, expected one of `connect_ms`, \
          `request_ms`, `read_ms`"
        ]
    );
    // The same route with valid blocks parses.
    Config::parse(
        &route(
            "timeouts = { connect_ms = 100, request_ms = 500, read_ms = 0 }\n\
             retry = { attempts = 3, on = [\"connect\", \"502\", \"503\", \"504\", \"timeout\"], \
             backoff_ms = 50, buffer_bytes = 0 }",
        ),
        "gw.toml",
        std::path::Path::new("."),
    )
    .expect("valid");
}

/// An HTTP/1.1 upstream that answers the first request on each connection, keeping it
/// alive, and closes it without reading the next one as soon as that one arrives: the
/// keep-alive race made certain, not left to timing (the gateway takes an idle connection
/// that is open when taken; its request meets the close). The close finds that request
/// unread, so the gateway sees a reset and no byte of an answer.
struct RaceUpstream {
    addr: SocketAddr,
    /// The bodies of the requests it read (and answered), in order.
    bodies: Arc<std::sync::Mutex<Vec<String>>>,
    /// Connections it closed on a request it never read.
    raced: Arc<AtomicUsize>,
}

impl RaceUpstream {
    /// `interim`: instead, answer the next request `100 Continue` and then close: an answer
    /// began, so the upstream may have read the request (no race).
    async fn start(interim: bool) -> RaceUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let raced = Arc::new(AtomicUsize::new(0));
        let (b, r) = (bodies.clone(), raced.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (bodies, raced) = (b.clone(), r.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // One request: the head, then its Content-Length body.
                    let body = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                            let length: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .map_or(0, |v| v.trim().parse().expect("a length"));
                            if buf.len() >= end + 4 + length {
                                break buf[end + 4..end + 4 + length].to_vec();
                            }
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    bodies
                        .lock()
                        .expect("bodies lock")
                        .push(String::from_utf8_lossy(&body).into_owned());
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                    // The next request arrives: close with it unread (a reset).
                    if stream.readable().await.is_ok() {
                        let mut peek = [0u8; 1];
                        if matches!(stream.peek(&mut peek).await, Ok(1)) {
                            raced.fetch_add(1, Ordering::SeqCst);
                            if interim {
                                let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
                                let _ = stream.read(&mut chunk).await;
                            }
                        }
                    }
                });
            }
        });
        RaceUpstream {
            addr,
            bodies,
            raced,
        }
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().expect("bodies lock").clone()
    }
}

/// Regression (issue 44): a POST written on a pooled connection that the upstream closed in
/// the same instant got a 502, though its body was kept (`retry.buffer_bytes`) and the
/// upstream never read it. It goes again on a new connection, once, within its try.
#[tokio::test]
async fn a_post_meeting_the_keep_alive_race_with_its_body_kept_goes_again_on_a_new_connection() {
    let upstream = RaceUpstream::start(false).await;
    let (server, url) = start(config(
        &[upstream.addr],
        "",
        &all("retry = { attempts = 2, on = [\"connect\", \"503\"], backoff_ms = 0 }"),
        "",
    ));
    // One downstream connection: one serving thread, one pool.
    let client = http1_client();
    for (i, method) in ["POST", "POST", "PATCH", "PUT"].into_iter().enumerate() {
        let status = send_on(&client, &url, method, full(twenty(method, i))).await;
        assert_eq!(status, 200, "{method} {i}");
    }
    // Each request after the first met the race, and its body reached the upstream once.
    assert_eq!(upstream.raced.load(Ordering::SeqCst), 3);
    assert_eq!(
        upstream.bodies(),
        [
            twenty("POST", 0),
            twenty("POST", 1),
            twenty("PATCH", 2),
            twenty("PUT", 3)
        ]
    );
    // Not a retry: none counted, none skipped.
    assert_eq!(retries(&server, "503") + retries(&server, "connect"), 0);
    assert_eq!(skipped(&server, "method"), 0);
}

/// The other side: without `retry` no body is kept, so the POST that meets the race gets a
/// 502 (it cannot be sent again), as before.
#[tokio::test]
async fn a_post_meeting_the_keep_alive_race_without_a_kept_body_gets_a_502() {
    let upstream = RaceUpstream::start(false).await;
    let (_server, url) = start(config(&[upstream.addr], "", &all(""), ""));
    let client = http1_client();
    assert_eq!(
        send_on(&client, &url, "POST", full(twenty("POST", 0))).await,
        200
    );
    assert_eq!(
        send_on(&client, &url, "POST", full(twenty("POST", 1))).await,
        502
    );
    assert_eq!(upstream.raced.load(Ordering::SeqCst), 1);
    assert_eq!(upstream.bodies(), [twenty("POST", 0)]);
}

/// Regression (issue 44): the race is only a close before any byte of an answer. An upstream
/// that answered `100 Continue` (an interim answer leaves nothing in the client's buffer)
/// and then closed may have read the request: the POST is not sent again, though its body
/// is kept.
#[tokio::test]
async fn a_post_whose_connection_closed_after_a_100_continue_is_not_sent_again() {
    let upstream = RaceUpstream::start(true).await;
    let (server, url) = start(config(
        &[upstream.addr],
        "",
        &all("retry = { attempts = 2, on = [\"connect\", \"503\"], backoff_ms = 0 }"),
        "",
    ));
    let client = http1_client();
    for (i, want) in [200, 502].into_iter().enumerate() {
        let status = send_on(&client, &url, "POST", full(twenty("POST", i))).await;
        assert_eq!(status, want, "POST {i}");
    }
    assert_eq!(upstream.raced.load(Ordering::SeqCst), 1);
    assert_eq!(upstream.bodies(), [twenty("POST", 0)]);
    assert_eq!(retries(&server, "503") + retries(&server, "connect"), 0);
}
