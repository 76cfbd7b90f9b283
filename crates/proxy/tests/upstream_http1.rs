//! The gateway's upstream HTTP/1.1 client against a raw upstream that answers with exactly
//! the bytes a test scripts: each response framing of RFC 9112 §6.3, interim responses,
//! broken heads, and an upstream that answers before it has read the request body.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::{Method, Request};
use http_body_util::{BodyExt, Empty, Full};
use tailguard_test_support::{Source, TestBody, http1_client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{self, read_more, within};

/// What the scripted upstream does with one request head.
struct Answer {
    bytes: Vec<u8>,
    /// Close the connection after writing.
    close: bool,
    /// Write the answer before reading the request body (which is then read and dropped).
    early: bool,
}

fn answer(bytes: &[u8]) -> Answer {
    Answer {
        bytes: bytes.to_vec(),
        close: false,
        early: false,
    }
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    TestBody,
>;

type Script = dyn Fn(&str) -> Answer + Send + Sync;

/// A raw HTTP/1.1 upstream: reads each request head (and its body, by `Content-Length` or
/// chunked), answers with the bytes `script` gives for the head, and counts connections.
struct Scripted {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Scripted {
    async fn start(script: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let (a, h, b) = (
            Arc::clone(&accepted),
            Arc::clone(&heads),
            Arc::clone(&bodies),
        );
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                a.fetch_add(1, Ordering::SeqCst);
                let (script, h, b) = (Arc::clone(&script), Arc::clone(&h), Arc::clone(&b));
                tokio::spawn(serve(stream, script, h, b));
            }
        });
        Scripted {
            addr,
            accepted,
            heads,
            bodies,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn serve(
    mut stream: TcpStream,
    script: Arc<Script>,
    heads: Arc<Mutex<Vec<String>>>,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            if !read_more(&mut stream, &mut buf).await {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        heads.lock().expect("heads").push(head.clone());
        let reply = script(&head);
        if reply.early && stream.write_all(&reply.bytes).await.is_err() {
            return;
        }
        let lower = head.to_ascii_lowercase();
        let body = if let Some(n) = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
        {
            while buf.len() < n {
                if !read_more(&mut stream, &mut buf).await {
                    return;
                }
            }
            buf.drain(..n).collect()
        } else if lower.contains("transfer-encoding: chunked") {
            // The raw chunked bytes, up to and with the last chunk.
            loop {
                if let Some(end) = buf.windows(5).position(|w| w == b"0\r\n\r\n") {
                    break buf.drain(..end + 5).collect();
                }
                if !read_more(&mut stream, &mut buf).await {
                    return;
                }
            }
        } else {
            Vec::new()
        };
        bodies.lock().expect("bodies").push(body);
        if !reply.early && stream.write_all(&reply.bytes).await.is_err() {
            return;
        }
        if reply.close {
            return;
        }
    }
}

/// Sends a bodiless request on `client` (one client keeps one downstream connection, so its
/// requests land on one serving thread and its upstream pool slot).
async fn send(client: &Client, url: &str, method: Method) -> (u16, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(format!("{url}/"))
        .body(Empty::new().boxed())
        .expect("request");
    let resp = within(client.request(req)).await.expect("response head");
    let status = resp.status().as_u16();
    let body = within(resp.into_body().collect())
        .await
        .expect("whole body")
        .to_bytes();
    (status, body.to_vec())
}

#[tokio::test]
async fn a_chunked_response_is_decoded_and_its_connection_reused() {
    let upstream = Scripted::start(|_| {
        answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-digest: 1\r\n\r\n")
    })
    .await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let client = http1_client();
    for i in 0..3 {
        let (status, body) = send(&client, &url, Method::GET).await;
        assert_eq!(
            (status, body.as_slice()),
            (200, &b"hello world"[..]),
            "request {i}"
        );
    }
    assert_eq!(
        upstream.accepted(),
        1,
        "the connection went back to the pool each time"
    );
}

#[tokio::test]
async fn a_response_delimited_by_close_arrives_whole_and_its_connection_is_not_reused() {
    let upstream = Scripted::start(|_| Answer {
        bytes: b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end".to_vec(),
        close: true,
        early: false,
    })
    .await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let client = http1_client();
    for _ in 0..2 {
        let (status, body) = send(&client, &url, Method::GET).await;
        assert_eq!((status, body.as_slice()), (200, &b"until the end"[..]));
    }
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn head_204_and_304_answers_have_no_body_and_keep_the_connection() {
    let upstream = Scripted::start(|head| {
        answer(if head.starts_with("HEAD") {
            b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n"
        } else if head.starts_with("DELETE") {
            b"HTTP/1.1 204 No Content\r\n\r\n"
        } else if head.starts_with("PUT") {
            b"HTTP/1.1 304 Not Modified\r\ncontent-length: 12\r\n\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        })
    })
    .await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let client = http1_client();
    let (status, body) = send(&client, &url, Method::HEAD).await;
    assert_eq!((status, body.len()), (200, 0));
    let (status, body) = send(&client, &url, Method::DELETE).await;
    assert_eq!((status, body.len()), (204, 0));
    let (status, body) = send(&client, &url, Method::PUT).await;
    assert_eq!((status, body.len()), (304, 0));
    let (status, body) = send(&client, &url, Method::GET).await;
    assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));
    assert_eq!(
        upstream.accepted(),
        1,
        "no body was waited for on any of them"
    );
    let heads = upstream.heads.lock().expect("heads").clone();
    assert!(
        heads[2].to_ascii_lowercase().contains("content-length: 0"),
        "a PUT without a body says so: {}",
        heads[2]
    );
}

#[tokio::test]
async fn interim_responses_are_skipped() {
    let upstream = Scripted::start(|_| {
        answer(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </s.css>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 4\r\nx-final: 1\r\n\r\ndone")
    })
    .await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let req = Request::post(format!("{url}/"))
        .body(Full::new(bytes::Bytes::from_static(b"abc")).boxed())
        .expect("request");
    let resp = within(http1_client().request(req)).await.expect("response");
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["x-final"], "1");
    assert!(!resp.headers().contains_key("link"));
    let body = within(resp.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(&body[..], b"done");
    assert_eq!(upstream.bodies.lock().expect("bodies")[0], b"abc");
}

#[tokio::test]
async fn broken_response_heads_are_502() {
    let huge = format!(
        "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 0\r\n\r\n",
        "y".repeat(70 * 1024)
    );
    let upstream = Scripted::start(move |head| {
        let mut a = answer(if head.contains("/garbage") {
            b"HTTP/1.1 2x0 Nope\r\n\r\n"
        } else if head.contains("/conflict") {
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd"
        } else {
            huge.as_bytes()
        });
        a.close = true;
        a
    })
    .await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let client = http1_client();
    for path in ["/garbage", "/conflict", "/huge"] {
        let (status, body) = within(tailguard_test_support::get(
            &client,
            &format!("{url}{path}"),
        ))
        .await;
        assert_eq!(
            (status, body.as_str()),
            (502, "upstream connection failed\n"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_body_cut_short_by_the_upstream_is_an_error_downstream_not_a_short_success() {
    let upstream = Scripted::start(|_| Answer {
        bytes: b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this".to_vec(),
        close: true,
        early: false,
    })
    .await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let req = Request::get(format!("{url}/"))
        .body(Empty::new().boxed())
        .expect("request");
    // The head may or may not have left before the gateway saw the body break; either way
    // the client must not see a complete response.
    match within(http1_client().request(req)).await {
        Ok(resp) => assert!(
            within(resp.into_body().collect()).await.is_err(),
            "the client must see the body end early, not a complete 9-byte body"
        ),
        // The connection closed before a whole head: also not a success.
        Err(e) => assert!(!e.is_connect(), "{e}"),
    }
}

/// An upstream that refuses every request by its head, before it reads the body (then reads
/// and drops the body, keeping its connection).
async fn refusing_upstream() -> Scripted {
    Scripted::start(|_| Answer {
        bytes: b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\n\r\ntoo big\n".to_vec(),
        close: false,
        early: true,
    })
    .await
}

#[tokio::test]
async fn an_answer_before_the_request_body_is_read_comes_through() {
    // The upstream refuses at once (as a server that checks the head does), then reads and
    // drops the body; the gateway keeps sending the body while it relays the answer. The
    // client (hyper) sends its whole body before it looks at the answer: the gateway's
    // closing connection lingers, reading and dropping what remains of the 8 MiB, instead
    // of resetting it (a `BrokenPipe` at the client, its 413 unread: issue 22).
    let upstream = refusing_upstream().await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let n = 8 * 1024 * 1024;
    let req = Request::post(format!("{url}/"))
        .body(Source::new(n).boxed())
        .expect("request");
    let resp = within(http1_client().request(req)).await.expect("response");
    assert_eq!(resp.status(), 413);
    let body = within(resp.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(&body[..], b"too big\n");
}

#[tokio::test]
async fn an_early_answer_is_read_whole_by_a_client_that_goes_on_sending_after_it() {
    // In order, whatever the buffer sizes: the answer is read to the gateway's end of stream
    // first, and only then does the client send 8 MiB more of its body; the gateway takes
    // it all (lingering) and closes once the client does.
    let upstream = refusing_upstream().await;
    let (server, _) = support::start(support::proxy_to(&[upstream.addr], ""));
    let answer = within(support::upload_past_an_early_answer(
        server.local_addrs()[0],
        12 << 20,
        8 << 20,
    ))
    .await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\ntoo big\n"), "{answer}");
}

#[tokio::test]
async fn hop_by_hop_response_fields_are_removed_for_http1_and_http2_clients() {
    // Without `Connection`, or with one naming only fixed hop-by-hop fields (nginx's
    // `keep-alive`), the fields go to an HTTP/1.1 client as the upstream's lines; with one
    // naming more, and to HTTP/2 clients, through a map. All drop the same fields; `close`
    // names a `Close` field when there is one.
    for (connection, secret_named) in [
        ("", false),
        ("Connection: X-Secret\r\n", true),
        ("Connection: keep-alive\r\n", false),
        ("Connection: close\r\nClose: 1\r\n", false),
        ("Connection: keep-alive, X-Secret\r\n", true),
    ] {
        let head = format!(
            "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n\
             TE: trailers\nUpgrade: h2c\r\n{connection}X-Secret: 1\r\nX-Kept:  yes \r\n\
             Content-Length: 2\r\n\r\nok"
        );
        let upstream = Scripted::start(move |_| answer(head.as_bytes())).await;
        let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
        for client in [http1_client(), tailguard_test_support::h2c_client()] {
            let req = Request::get(format!("{url}/"))
                .body(support::empty())
                .expect("request");
            let resp = within(client.request(req)).await.expect("response");
            let version = resp.version();
            assert_eq!(resp.status(), 200, "{version:?}");
            let h = resp.headers().clone();
            assert_eq!(h["x-kept"], "yes", "{version:?}: {h:?}");
            assert_eq!(h["via"], "1.1 tailguard", "{version:?}");
            for gone in [
                "keep-alive",
                "proxy-connection",
                "te",
                "upgrade",
                "connection",
                "close",
            ] {
                assert!(!h.contains_key(gone), "{version:?}: {gone} passed: {h:?}");
            }
            assert_eq!(
                h.contains_key("x-secret"),
                !secret_named,
                "{version:?}: a field `Connection` names is hop-by-hop, others pass: {h:?}"
            );
            assert_eq!(support::text(resp).await, "ok");
        }
    }
}

#[tokio::test]
async fn a_request_body_of_unknown_length_goes_upstream_chunked() {
    let upstream =
        Scripted::start(|_| answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")).await;
    let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
    let n = 200_000;
    let req = Request::post(format!("{url}/"))
        .body(Source::chunked(n).boxed())
        .expect("request");
    let resp = within(http1_client().request(req)).await.expect("response");
    assert_eq!(resp.status(), 200);
    let head = upstream.heads.lock().expect("heads")[0].to_ascii_lowercase();
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    // Decode what arrived: the chunks must add up to the body exactly.
    let raw = upstream.bodies.lock().expect("bodies")[0].clone();
    let (mut at, mut total) = (0, 0);
    loop {
        let line_end = at
            + raw[at..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("size line");
        let size = usize::from_str_radix(std::str::from_utf8(&raw[at..line_end]).expect("hex"), 16)
            .expect("size");
        at = line_end + 2;
        if size == 0 {
            break;
        }
        assert!(raw[at..at + size].iter().all(|&b| b == b'x'));
        at += size;
        assert_eq!(&raw[at..at + 2], b"\r\n");
        at += 2;
        total += size;
    }
    assert_eq!(total as u64, n);
}

/// Sends `GET /` on a raw connection to the gateway and reads until the gateway closes it,
/// for at most 10 s (a stalled body must end long before: `read_ms` is 300 ms here, and the
/// default of 60 s would fail this). Returns the response head and the raw body bytes.
async fn get_raw_until_closed(url: &str) -> (String, Vec<u8>) {
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        get_raw_until_closed_after(url, ""),
    )
    .await
    .expect("the gateway closed the connection within 10 s of a stalled body")
}

/// Decodes a chunked body: its data, and whether the last (zero) chunk arrived.
fn dechunk(mut raw: &[u8]) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    loop {
        let Some(line_end) = raw.windows(2).position(|w| w == b"\r\n") else {
            return (data, false);
        };
        let size = std::str::from_utf8(&raw[..line_end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or(""), 16).ok())
            .expect("a chunk size line");
        raw = &raw[line_end + 2..];
        if size == 0 {
            return (data, true);
        }
        if raw.len() < size {
            data.extend_from_slice(raw);
            return (data, false);
        }
        data.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or(&[]);
    }
}

#[tokio::test]
async fn a_body_that_stalls_after_its_head_is_cut_short_after_read_ms() {
    // The upstream promises 100 bytes, sends 10 and then nothing, keeping the socket open.
    let upstream =
        Scripted::start(|_| answer(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789"))
            .await;
    let (_server, url) = support::start(support::proxy_to(
        &[upstream.addr],
        "[timeouts]\nread_ms = 300\n",
    ));
    let (head, body) = get_raw_until_closed(&url).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-length: 100\r\n"), "{head}");
    assert_eq!(
        body, b"0123456789",
        "the bytes sent before the stall, then the end: a short body, never a complete one"
    );
    // The stalled connection was closed, not pooled: the next request opens another.
    let (_, body) = get_raw_until_closed(&url).await;
    assert_eq!(body, b"0123456789");
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn a_chunked_body_that_stalls_arrives_without_its_last_chunk() {
    let upstream = Scripted::start(|_| {
        answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\n0123456789\r\n")
    })
    .await;
    let (_server, url) = support::start(support::proxy_to(
        &[upstream.addr],
        "[timeouts]\nread_ms = 300\n",
    ));
    let (head, raw) = get_raw_until_closed(&url).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    let (data, complete) = dechunk(&raw);
    assert_eq!(data, b"0123456789", "{:?}", String::from_utf8_lossy(&raw));
    assert!(
        !complete,
        "no last chunk: the client sees a cut body, {:?}",
        String::from_utf8_lossy(&raw)
    );
}

#[tokio::test]
async fn a_body_that_trickles_with_gaps_shorter_than_read_ms_arrives_whole() {
    // 5 chunks 100 ms apart: 500 ms in total, over `read_ms` (400), but never a gap as
    // long: the limit is between two reads, not on the whole body.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut buf = Vec::new();
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            if !read_more(&mut stream, &mut buf).await {
                return;
            }
        }
        let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        if stream.write_all(head).await.is_err() {
            return;
        }
        for i in 0..5u8 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let chunk = format!("2\r\n{i}{i}\r\n");
            if stream.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
        }
        let _ = stream.write_all(b"0\r\n\r\n").await;
        // Held open until the gateway closes it (it never sends another request here).
        let _ = read_more(&mut stream, &mut buf).await;
    });
    let (_server, url) = support::start(support::proxy_to(&[addr], "[timeouts]\nread_ms = 400\n"));
    let (status, body) = send(&http1_client(), &url, Method::GET).await;
    assert_eq!((status, body.as_slice()), (200, &b"0011223344"[..]));
}

#[tokio::test]
async fn a_response_is_framed_by_its_body_never_by_a_length_the_upstream_wrote() {
    // Content-Length beside chunked (the body is 10 bytes, chunked), and a list of equal
    // lengths: copied as written, either would frame the client's next read wrongly or
    // ambiguously. The client gets exactly one framing field, the gateway's own.
    let cases: [(&[u8], &str); 3] = [
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\na\r\n0123456789\r\n0\r\n\r\n",
            "0123456789",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\nconnection: close\r\n\r\nhello",
            "hello",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\nx-a: 1\r\n\r\nhello",
            "hello",
        ),
    ];
    for (wire, body) in cases {
        let upstream = Scripted::start(move |_| Answer {
            close: true,
            ..answer(wire)
        })
        .await;
        let (_server, url) = support::start(support::proxy_to(&[upstream.addr], ""));
        let (head, raw) = within(get_raw_until_closed_after(&url, "connection: close\r\n")).await;
        let lengths = head.matches("content-length:").count();
        let chunked = head.matches("transfer-encoding:").count();
        assert_eq!(lengths + chunked, 1, "one framing field: {head}");
        let got = if chunked == 1 {
            let (data, done) = dechunk(&raw);
            assert!(done, "{head}");
            data
        } else {
            assert!(
                head.contains(&format!("content-length: {}\r\n", body.len())),
                "{head}"
            );
            raw
        };
        assert_eq!(String::from_utf8_lossy(&got), body, "{head}");
    }
}

/// [`get_raw_until_closed`] with extra request fields.
async fn get_raw_until_closed_after(url: &str, fields: &str) -> (String, Vec<u8>) {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(format!("GET / HTTP/1.1\r\nhost: frame.test\r\n{fields}\r\n").as_bytes())
        .await
        .expect("request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .unwrap_or_else(|| panic!("a whole head: {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    (head, raw[end..].to_vec())
}
