//! The upstream connection pool against a raw TCP upstream that counts its open connections
//! and can close idle ones, as real upstreams do when their keep-alive timeout passes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tailguard_test_support::http1_client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{self, read_more, within};

/// What the raw upstream answers each request head with.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// `200` with a body of this many bytes.
    Bytes(usize),
    /// `200` with a body that never ends: it declares a terabyte and is written until a
    /// write fails, that is until the gateway closes the connection. No socket buffer of any
    /// size holds it, so the gateway never reads it to its end.
    Endless,
}

/// A keep-alive HTTP/1.1 upstream written on raw sockets: answers every request head as
/// its [`Answer`] says, closes a connection that stays idle for `idle_close`, and counts
/// connections accepted and open.
struct RawUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

impl RawUpstream {
    async fn start(body_bytes: usize, idle_close: Option<Duration>) -> RawUpstream {
        RawUpstream::answering(Answer::Bytes(body_bytes), idle_close).await
    }

    async fn answering(answer: Answer, idle_close: Option<Duration>) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (a, o) = (Arc::clone(&accepted), Arc::clone(&open));
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                a.fetch_add(1, Ordering::SeqCst);
                o.fetch_add(1, Ordering::SeqCst);
                let o = Arc::clone(&o);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let declared = match answer {
                        Answer::Bytes(n) => n,
                        Answer::Endless => 1 << 40,
                    };
                    let response = {
                        let mut r =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {declared}\r\n\r\n")
                                .into_bytes();
                        if let Answer::Bytes(n) = answer {
                            r.resize(r.len() + n, b'x');
                        }
                        r
                    };
                    loop {
                        let read = match idle_close {
                            Some(limit) if buf.is_empty() => {
                                match tokio::time::timeout(limit, stream.read(&mut chunk)).await {
                                    Ok(r) => r,
                                    Err(_) => break, // idle too long: close, as upstreams do
                                }
                            }
                            _ => stream.read(&mut chunk).await,
                        };
                        let n = match read {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let mut written = stream.write_all(&response).await;
                            if let Answer::Endless = answer {
                                let chunk = [b'x'; 64 * 1024];
                                while written.is_ok() {
                                    written = stream.write_all(&chunk).await;
                                }
                            }
                            if written.is_err() {
                                o.fetch_sub(1, Ordering::SeqCst);
                                return;
                            }
                        }
                    }
                    o.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        RawUpstream {
            addr,
            accepted,
            open,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// Polls `f` every 20 ms for up to 10 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_not_used_again() {
    let upstream = RawUpstream::start(5, Some(Duration::from_millis(50))).await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let client = http1_client();
    for i in 1..=5 {
        let (status, body) = tailguard_test_support::get(&client, &format!("{url}/")).await;
        assert_eq!((status, body.as_str()), (200, "xxxxx"), "request {i}");
        // The upstream closes the pooled connection; the gateway must notice, not send on it.
        eventually("the upstream closed its idle connection", || {
            upstream.open() == 0
        })
        .await;
    }
    assert_eq!(upstream.accepted(), 5, "one new connection per request");
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let upstream = RawUpstream::start(5, None).await;
    let (_server, url) = support::start(support::proxy_to(
        &[upstream.addr],
        "[timeouts]\nidle_ms = 300\n",
    ));
    let client = http1_client();
    for _ in 0..3 {
        let (status, _) = tailguard_test_support::get(&client, &format!("{url}/")).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        upstream.open(),
        1,
        "sequential requests share a pooled connection"
    );
    // The reaper runs every second; the connection is past 300 ms idle by its next round.
    eventually("the gateway closed its idle upstream connection", || {
        upstream.open() == 0
    })
    .await;
    let (status, _) = tailguard_test_support::get(&client, &format!("{url}/")).await;
    assert_eq!(status, 200);
    assert_eq!(
        upstream.accepted(),
        2,
        "a new connection after the idle one closed"
    );
}

#[tokio::test]
async fn a_response_abandoned_mid_body_closes_its_upstream_connection() {
    // What the gateway does with a response whose client left before its end: it reads an
    // upstream body only to forward it, so it closes the connection, whatever of the rest
    // is already in its socket buffer or still on the way; it does not drain the rest to
    // keep the connection (nginx closes too, unless told to ignore the client's abort).
    // The body never ends, so this holds whatever the buffer sizes: the gateway can neither
    // have read it to its end nor drain it.
    let upstream = RawUpstream::answering(Answer::Endless, None).await;
    let (server, _) = support::start(support::proxy_to(&[upstream.addr], ""));
    let gateway = server.local_addrs()[0];
    within(async {
        let mut c = TcpStream::connect(gateway).await.expect("connect");
        c.write_all(b"GET /endless HTTP/1.1\r\nHost: gw.test\r\n\r\n")
            .await
            .expect("request");
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            assert!(read_more(&mut c, &mut got).await, "the response head");
        }
        assert!(got.starts_with(b"HTTP/1.1 200 "));
        // The client leaves mid-body.
    })
    .await;
    // The upstream's writes fail once the gateway closed its side: the connection was not
    // pooled (its unread rest would be taken for the next response).
    eventually("the abandoned upstream connection closed", || {
        upstream.open() == 0
    })
    .await;
    assert_eq!(upstream.accepted(), 1);
    // The next request gets a connection of its own.
    within(async {
        let mut c = TcpStream::connect(gateway).await.expect("connect");
        c.write_all(b"GET /again HTTP/1.1\r\nHost: gw.test\r\n\r\n")
            .await
            .expect("request");
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            assert!(read_more(&mut c, &mut got).await, "the response head");
        }
        assert!(got.starts_with(b"HTTP/1.1 200 "));
    })
    .await;
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn a_reload_that_keeps_an_endpoint_keeps_its_warm_connections() {
    let upstream = RawUpstream::start(5, None).await;
    let config = support::proxy_to(&[upstream.addr], "");
    let (server, url) = support::start(config.clone());
    let client = http1_client();
    let (status, _) = tailguard_test_support::get(&client, &format!("{url}/")).await;
    assert_eq!(status, 200);
    server.reload(config).expect("same config reloads");
    for _ in 0..3 {
        let (status, _) = tailguard_test_support::get(&client, &format!("{url}/")).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        upstream.accepted(),
        1,
        "the reload kept the pooled connection"
    );

    // A reload that drops the endpoint closes its idle connection at once.
    let other = RawUpstream::start(5, None).await;
    server
        .reload(support::proxy_to(&[other.addr], ""))
        .expect("reload to another endpoint");
    eventually("the removed endpoint's idle connection closed", || {
        upstream.open() == 0
    })
    .await;
    let (status, _) = tailguard_test_support::get(&client, &format!("{url}/")).await;
    assert_eq!(status, 200);
    assert_eq!(other.accepted(), 1);
}

/// A bound socket that does not listen: connecting to it is refused, and no other test can
/// take its port while it lives.
fn refusing_endpoint() -> (socket2::Socket, SocketAddr) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    let addr = socket
        .local_addr()
        .expect("addr")
        .as_socket()
        .expect("inet");
    (socket, addr)
}

#[tokio::test]
async fn a_refused_connect_is_retried_on_another_endpoint_for_idempotent_requests_only() {
    let (_dead_socket, dead) = refusing_endpoint();
    let live = RawUpstream::start(5, None).await;
    let (_server, url) = support::start(support::proxy_to(&[dead, live.addr], ""));
    let client = http1_client();
    // Round robin sends every other request to the dead endpoint first: each of those is
    // retried on the live one (within the budget's floor of a few retries per second).
    for i in 0..6 {
        let (status, body) = tailguard_test_support::get(&client, &format!("{url}/{i}")).await;
        assert_eq!((status, body.as_str()), (200, "xxxxx"), "GET {i}");
    }
    // A POST with a body is not retried: the one that lands on the dead endpoint gets 502.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let req = http::Request::post(format!("{url}/post"))
            .body(http_body_util::BodyExt::boxed(http_body_util::Full::new(
                bytes::Bytes::from_static(b"payload"),
            )))
            .expect("request");
        statuses.push(
            client
                .request(req)
                .await
                .expect("response")
                .status()
                .as_u16(),
        );
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 502]);
}
