//! Bounds a client cannot push past (issue 45): streams per HTTP/2 connection, in-flight
//! requests per client address, request bodies waited for before an upstream is chosen,
//! the receive buffer of upstream connections, and responses that cannot go out.
//!
//! The upstream here ([`HeldUpstream`]) accepts and reads, and answers nothing: what it
//! accepted says what the gateway forwarded, and a request to it stays in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tailguard_proxy::Server;
use tailguard_test_support::h2_frames::{H2Client, StreamEnd, data_frame, frame, headers_frame};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{self, within};

/// RST_STREAM's code for a stream the server did not process (RFC 9113 §8.7).
const REFUSED_STREAM: u32 = 0x7;

/// An upstream that accepts, reads everything, and never answers.
pub(crate) struct HeldUpstream {
    pub(crate) addr: SocketAddr,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    /// Request bytes read so far, all connections together.
    bytes: Arc<AtomicUsize>,
}

impl HeldUpstream {
    pub(crate) async fn start() -> HeldUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let bytes = Arc::new(AtomicUsize::new(0));
        tokio::spawn({
            let (accepted, bytes) = (Arc::clone(&accepted), Arc::clone(&bytes));
            async move {
                while let Ok((mut s, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let bytes = Arc::clone(&bytes);
                    tokio::spawn(async move {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n @ 1..) = s.read(&mut buf).await {
                            bytes.fetch_add(n, Ordering::SeqCst);
                        }
                    });
                }
            }
        });
        HeldUpstream {
            addr,
            accepted,
            bytes,
        }
    }

    pub(crate) fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    /// Waits (bounded by the caller's `within`) until `n` connections were accepted.
    pub(crate) async fn until_accepted(&self, n: usize) {
        while self.accepted() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A GET's HEADERS frame, ending the stream.
fn get(stream: u32, path: &str) -> Vec<u8> {
    headers_frame(
        stream,
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "gateway.test"),
            (":path", path),
        ],
        true,
    )
}

/// The value of a series of the rendered exposition, by its exact name and labels.
pub(crate) fn series(server: &Server, name_and_labels: &str) -> Option<i64> {
    support::metrics_text(server).lines().find_map(|line| {
        let value = line.strip_prefix(name_and_labels)?.strip_prefix(' ')?;
        value.parse().ok()
    })
}

/// `tailguard_downstream_refused_total` for `reason`.
pub(crate) fn refused(server: &Server, reason: &str) -> Option<i64> {
    series(
        server,
        &format!("tailguard_downstream_refused_total{{reason=\"{reason}\"}}"),
    )
}

/// A gateway (one serving thread) in front of `upstream` with these `[limits]`.
fn gateway(upstream: &HeldUpstream, limits: &str) -> Server {
    let config = support::proxy_to(&[upstream.addr], &format!("[limits]\n{limits}\n"));
    Server::start(config, 1).expect("gateway")
}

/// SETTINGS_MAX_CONCURRENT_STREAMS of the server's first SETTINGS frame.
async fn max_concurrent_streams(client: &mut H2Client) -> Option<u32> {
    let settings = within(client.next_frame()).await.expect("server SETTINGS");
    assert_eq!(settings.kind, 0x4, "the server opens with SETTINGS");
    settings.payload.chunks(6).find_map(|e| {
        (u16::from_be_bytes([e[0], e[1]]) == 0x3)
            .then(|| u32::from_be_bytes([e[2], e[3], e[4], e[5]]))
    })
}

#[tokio::test]
async fn a_stream_over_http2_max_streams_is_refused() {
    let upstream = HeldUpstream::start().await;
    let server = gateway(&upstream, "http2_max_streams = 2\nclient_requests = 0");
    let mut client = H2Client::connect(server.local_addrs()[0]).await;
    assert_eq!(max_concurrent_streams(&mut client).await, Some(2));
    client.send(&[get(1, "/a"), get(3, "/b")].concat()).await;
    within(upstream.until_accepted(2)).await;
    client.send(&get(5, "/c")).await;
    assert_eq!(
        within(client.end_of(5)).await,
        StreamEnd::Reset(REFUSED_STREAM)
    );
    assert_eq!(
        upstream.accepted(),
        2,
        "the refused stream was not forwarded"
    );
    within(server.shutdown(Duration::from_millis(100))).await;
}

#[tokio::test]
async fn a_client_over_client_requests_is_refused_a_stream_and_answered_429() {
    let upstream = HeldUpstream::start().await;
    let server = gateway(&upstream, "client_requests = 2");
    let addr = server.local_addrs()[0];
    let mut client = H2Client::connect(addr).await;
    assert_eq!(max_concurrent_streams(&mut client).await, Some(100));
    client.send(&[get(1, "/a"), get(3, "/b")].concat()).await;
    within(upstream.until_accepted(2)).await;
    // Its third request in flight, on the same connection: refused, never forwarded.
    client.send(&get(5, "/c")).await;
    assert_eq!(
        within(client.end_of(5)).await,
        StreamEnd::Reset(REFUSED_STREAM)
    );
    // The same address on another connection, over HTTP/1.1: 429.
    let mut h1 = TcpStream::connect(addr).await.expect("connect");
    h1.write_all(b"GET /d HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        assert!(within(support::read_more(&mut h1, &mut answer)).await);
    }
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 429 "), "{answer}");
    assert!(answer.contains("retry-after: 1\r\n"), "{answer}");
    assert_eq!(refused(&server, "client_requests"), Some(2));
    assert_eq!(
        upstream.accepted(),
        2,
        "neither refusal reached the upstream"
    );
    // The client gives up one request (RST_STREAM CANCEL): its place is free again.
    client.send(&frame(0x3, 0, 1, &0x8u32.to_be_bytes())).await;
    within(async {
        let mut id = 7;
        loop {
            client.send(&get(id, "/e")).await;
            // Refused while the cancel is still on its way through the gateway; then
            // forwarded.
            tokio::select! {
                end = client.end_of(id) => assert_eq!(end, StreamEnd::Reset(REFUSED_STREAM)),
                () = upstream.until_accepted(3) => break,
            }
            id += 2;
        }
    })
    .await;
    within(server.shutdown(Duration::from_millis(100))).await;
}

/// A POST's HEADERS frame; its body (if any) follows in DATA frames.
fn post(stream: u32, path: &str, end_stream: bool) -> Vec<u8> {
    headers_frame(
        stream,
        &[
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", "gateway.test"),
            (":path", path),
        ],
        end_stream,
    )
}

/// A gateway whose `stream` route streams request bodies, the rest waiting for them.
fn body_gateway(upstream: &HeldUpstream, body_ms: u64) -> Server {
    let config = support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"stream\"\nupstream = \"up\"\npath = {{ prefix = \"/stream\" }}\n\
         stream_request = true\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n\n\
         [timeouts]\nbody_ms = {body_ms}\n",
        upstream.addr
    ));
    Server::start(config, 1).expect("gateway")
}

#[tokio::test]
async fn a_request_whose_body_never_comes_gets_408_and_never_reaches_an_upstream() {
    let upstream = HeldUpstream::start().await;
    let server = body_gateway(&upstream, 200);
    let addr = server.local_addrs()[0];
    // HTTP/2: HEADERS without END_STREAM, then nothing (an empty DATA frame is nothing).
    let mut client = H2Client::connect(addr).await;
    client
        .send(&[post(1, "/up", false), data_frame(1, b"", false)].concat())
        .await;
    assert_eq!(within(client.end_of(1)).await, StreamEnd::Status(408));
    // HTTP/1.1: a declared body that never comes.
    let mut h1 = TcpStream::connect(addr).await.expect("connect");
    h1.write_all(b"POST /up HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 5\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        assert!(within(support::read_more(&mut h1, &mut answer)).await);
    }
    assert!(answer.starts_with(b"HTTP/1.1 408 "), "{answer:?}");
    assert_eq!(upstream.accepted(), 0, "no upstream connection for either");
    assert_eq!(refused(&server, "body_timeout"), Some(2));
    within(server.shutdown(Duration::from_millis(100))).await;
}

#[tokio::test]
async fn a_body_s_first_bytes_release_its_request_and_a_streaming_route_forwards_at_once() {
    let upstream = HeldUpstream::start().await;
    // No body timeout: only the first bytes can release the request.
    let server = body_gateway(&upstream, 0);
    let mut client = H2Client::connect(server.local_addrs()[0]).await;
    client.send(&post(1, "/up", false)).await;
    // The streaming route's request, sent after it, is forwarded while the first waits.
    client.send(&post(3, "/stream", false)).await;
    within(upstream.until_accepted(1)).await;
    within(async {
        while upstream.bytes() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(
        upstream.accepted(),
        1,
        "the waiting request is not forwarded"
    );
    client.send(&data_frame(1, b"hello", false)).await;
    within(upstream.until_accepted(2)).await;
    assert_eq!(refused(&server, "body_timeout"), Some(0));
    within(server.shutdown(Duration::from_millis(100))).await;
}

/// `SO_RCVBUF` of each socket of this process (the gateway runs in it) connected to `peer`:
/// each socket is borrowed through a pidfd of this process (`pidfd_getfd`, a duplicate the
/// test closes), so no `unsafe` is needed to read another part's descriptor.
fn receive_buffers_to(peer: SocketAddr) -> Vec<usize> {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
    let pidfd = pidfd_open(getpid(), PidfdFlags::empty()).expect("pidfd_open");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let Ok(entry) = entry else { continue };
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !socket {
            continue;
        }
        let Ok(dup) = pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()) else {
            continue;
        };
        let sock = socket2::SockRef::from(&dup);
        if sock.peer_addr().ok().and_then(|a| a.as_socket()) == Some(peer) {
            found.push(sock.recv_buffer_size().expect("SO_RCVBUF"));
        }
    }
    found
}

#[tokio::test]
async fn a_stalled_upstream_connection_s_receive_buffer_stays_at_its_bound() {
    // 8 MiB: far more than the client's window (64 KiB) and the bound together.
    let upstream = tailguard_test_support::Upstream::builder()
        .body(vec![b'x'; 8 << 20])
        .start()
        .await;
    let config = support::proxy_to(
        &[upstream.addr],
        "[limits]\nupstream_receive_buffer_bytes = 65536\n",
    );
    let server = Server::start(config, 1).expect("gateway");
    let mut client = H2Client::connect(server.local_addrs()[0]).await;
    // The client takes the response head and never opens its window past the default.
    client.send(&get(1, "/big")).await;
    assert_eq!(within(client.end_of(1)).await, StreamEnd::Status(200));
    // Linux reports twice the size set (the other half is its bookkeeping, socket(7)), and
    // a size set before connect is never autotuned past it.
    assert_eq!(receive_buffers_to(upstream.addr), vec![2 * 65536]);
    within(server.shutdown(Duration::from_millis(100))).await;
}

#[tokio::test]
async fn a_connection_whose_responses_wait_on_the_client_for_send_ms_is_closed() {
    let body = vec![b'x'; 8 << 20];
    let upstream = tailguard_test_support::Upstream::builder()
        .body(body.clone())
        .start()
        .await;
    let config = support::proxy_to(&[upstream.addr], "[timeouts]\nsend_ms = 1000\n");
    let server = Server::start(config, 1).expect("gateway");
    let addr = server.local_addrs()[0];
    // A client that reads its answer whole is never cut, however long it takes.
    let client = tailguard_test_support::h2c_client();
    let (status, got) = within(tailguard_test_support::get(
        &client,
        &format!("http://{addr}/big"),
    ))
    .await;
    assert_eq!((status, got.len()), (200, body.len()));
    // One that takes the head and never opens its windows is closed.
    let mut slow = H2Client::connect(addr).await;
    slow.send(&get(1, "/big")).await;
    assert_eq!(within(slow.end_of(1)).await, StreamEnd::Status(200));
    within(async { while slow.next_frame().await.is_some() {} }).await;
    assert_eq!(refused(&server, "send_timeout"), Some(1));
    within(server.shutdown(Duration::from_millis(100))).await;
}

/// RST_STREAM's and GOAWAY's code for a peer that may be generating excessive load.
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A rapid-reset connection (CVE-2023-44487): `n` GETs, each cancelled at once, in one write.
fn rapid_resets(n: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let stream = 1 + 2 * i;
            let mut pair = get(stream, "/");
            pair.extend(frame(0x3, 0, stream, &0x8u32.to_be_bytes()));
            pair
        })
        .collect()
}

/// Opens a rapid-reset connection and returns the code of the GOAWAY it ends with. Raw, and
/// written once: the client never writes after its burst (not even a SETTINGS ack), so the
/// server, having read all of it, closes with a FIN and the GOAWAY before it is read whole.
/// 100 resets: five times `h2`'s limit of resets before accept (20), in one 4 KiB segment.
async fn cut_for_resets(addr: SocketAddr) -> Option<u32> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut burst = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    burst.extend(frame(0x4, 0, 0, &[]));
    burst.extend(rapid_resets(100));
    let _ = s.write_all(&burst).await;
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got).await;
    let mut rest = &got[..];
    while rest.len() >= 9 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (kind, payload) = (rest[3], rest.get(9..9 + len)?);
        if kind == 0x7 {
            return Some(u32::from_be_bytes([
                payload[4], payload[5], payload[6], payload[7],
            ]));
        }
        rest = &rest[9 + len..];
    }
    None
}

/// Connects from `source` and reads until the server closes: the bytes it sent (none,
/// when the connection was closed at the accept). Writes and reads that fail count as
/// the close they are.
async fn bytes_from_server(source: &str, addr: SocketAddr) -> usize {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(source.parse().expect("ip"), 0))
        .expect("bind");
    let mut s = socket.connect(addr).await.expect("connect");
    let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    opening.extend(frame(0x4, 0, 0, &[]));
    let _ = s.write_all(&opening).await;
    let mut got = 0;
    let mut buf = [0u8; 4096];
    // A served connection sends SETTINGS at once; a held-off one closes without a byte.
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got += n,
        }
        if got > 0 {
            return got;
        }
    }
}

#[tokio::test]
async fn an_address_cut_for_rapid_reset_is_held_off_and_another_is_not() {
    let upstream = HeldUpstream::start().await;
    let server = gateway(&upstream, "client_requests = 0\nabuse_holdoff_ms = 600000");
    let addr = server.local_addrs()[0];
    assert_eq!(
        within(cut_for_resets(addr)).await,
        Some(ENHANCE_YOUR_CALM),
        "HTTP/2 cuts the connection for its resets"
    );
    // Its address is held off: closed at the accept, before a byte of HTTP/2, every time.
    for _ in 0..3 {
        assert_eq!(within(bytes_from_server("127.0.0.1", addr)).await, 0);
    }
    assert_eq!(refused(&server, "held_off"), Some(3));
    // Another address is served.
    assert!(within(bytes_from_server("127.0.0.2", addr)).await > 0);
    within(server.shutdown(Duration::from_millis(100))).await;
}

#[tokio::test]
async fn with_abuse_holdoff_ms_0_an_address_cut_for_rapid_reset_connects_again() {
    let upstream = HeldUpstream::start().await;
    let server = gateway(&upstream, "client_requests = 0\nabuse_holdoff_ms = 0");
    let addr = server.local_addrs()[0];
    assert_eq!(within(cut_for_resets(addr)).await, Some(ENHANCE_YOUR_CALM));
    assert!(within(bytes_from_server("127.0.0.1", addr)).await > 0);
    assert_eq!(refused(&server, "held_off"), Some(0));
    within(server.shutdown(Duration::from_millis(100))).await;
}
