//! Response compression on real sockets, over HTTP/1.1 and HTTP/2 (h2c) downstream: each
//! coding's body decompressed and compared byte for byte with the upstream's (its length
//! known and not), q-value negotiation, every skip rule, `Vary` merged, a strong `ETag`
//! made weak, a listener's `compress` and a route's own, an event stream flushed per event,
//! an HTTP/2 upstream, and the config's errors with file:line:column.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard_test_support::{TestBody, h2c_client, http1_client};

use crate::support::{self, empty, within};

/// The upstream's bodies: the lab's JSON, cycled to the length asked.
const JSON: &[u8] = include_bytes!("../../../lab/compress/64k.json");

fn body_of(n: usize) -> Bytes {
    JSON.iter()
        .copied()
        .cycle()
        .take(n)
        .collect::<Vec<u8>>()
        .into()
}

/// A body sent in pieces as they come from a channel (no length announced).
struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// What the upstream's answer to `/r?..` is made of, from its query: `n` bytes of body
/// (`chunked=1`: in 10 KiB pieces, no length), `status`, and the fields `ct`
/// (Content-Type, default `application/json`), `ce`, `cc`, `etag`, `vary`, `cr`
/// (Content-Range). `/sse` sends one event, waits for the test's signal, sends another.
async fn answer(
    req: Request<hyper::body::Incoming>,
    next_event: Arc<tokio::sync::Notify>,
) -> Result<Response<TestBody>, Infallible> {
    if req.uri().path() == "/sse" {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            let _ = tx.send(Bytes::from_static(b"data: one\n\n")).await;
            next_event.notified().await;
            let _ = tx.send(Bytes::from_static(b"data: two\n\n")).await;
        });
        let resp = Response::builder()
            .header("content-type", "text/event-stream")
            .body(Channel(rx).boxed())
            .expect("response");
        return Ok(resp);
    }
    let q: HashMap<String, String> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.replace("%20", " ").replace("%22", "\"")))
        .collect();
    let n: usize = q.get("n").and_then(|n| n.parse().ok()).unwrap_or(0);
    let mut resp = Response::builder().status(
        q.get("status")
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or(200),
    );
    resp = resp.header(
        "content-type",
        q.get("ct").map_or("application/json", String::as_str),
    );
    for (key, name) in [
        ("ce", "content-encoding"),
        ("cc", "cache-control"),
        ("etag", "etag"),
        ("vary", "vary"),
        ("cr", "content-range"),
    ] {
        if let Some(v) = q.get(key) {
            resp = resp.header(name, v.as_str());
        }
    }
    let body = body_of(n);
    let body = if q.get("chunked").is_some_and(|c| c == "1") {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            for piece in body.chunks(10 * 1024) {
                if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                    return;
                }
            }
        });
        Channel(rx).boxed()
    } else {
        http_body_util::Full::new(body)
            .map_err(|e| match e {})
            .boxed()
    };
    Ok(resp.body(body).expect("response"))
}

/// The upstream (HTTP/1.1 or h2c, whichever the gateway speaks) and the notify that lets
/// `/sse` send its second event.
async fn upstream() -> (SocketAddr, Arc<tokio::sync::Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let notify = Arc::new(tokio::sync::Notify::new());
    let next = Arc::clone(&notify);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(req, Arc::clone(&next)));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, notify)
}

/// Route `api` with `compress = {route}` (none when empty), route `sse` for `/sse` listing
/// the event stream, and `plain` for `/plain` with no `compress` of its own, under a
/// listener with `compress = {listener}` (none when empty); `protocol` of the upstream.
fn gateway(
    upstream: SocketAddr,
    protocol: &str,
    listener: &str,
    route: &str,
) -> (tailguard_proxy::Server, String) {
    let listener = if listener.is_empty() {
        String::new()
    } else {
        format!("compress = {listener}")
    };
    let route = if route.is_empty() {
        String::new()
    } else {
        format!("compress = {route}")
    };
    support::start(support::config(&format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
{listener}

[[upstreams]]
name = "up"
protocol = "{protocol}"
endpoints = [{{ address = "{upstream}" }}]

[[routes]]
id = "sse"
upstream = "up"
path = {{ exact = "/sse" }}
compress = {{ algorithms = ["gzip"], types = ["text/event-stream"] }}

[[routes]]
id = "plain"
upstream = "up"
path = {{ prefix = "/plain" }}

[[routes]]
id = "api"
upstream = "up"
path = {{ prefix = "/r" }}
{route}
"#
    )))
}

const DEFAULT: &str = "{}";

fn clients() -> [(&'static str, Client<HttpConnector, TestBody>); 2] {
    [("HTTP/1.1", http1_client()), ("HTTP/2", h2c_client())]
}

/// Sends `method url` with `fields`; the status, fields and raw (still encoded) body.
async fn send(
    client: &Client<HttpConnector, TestBody>,
    method: Method,
    url: &str,
    fields: &[(&str, &str)],
) -> (u16, HeaderMap, Bytes) {
    let mut req = Request::builder().method(method).uri(url);
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let resp = within(client.request(req.body(empty()).expect("request")))
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = within(resp.into_body().collect())
        .await
        .expect("the body")
        .to_bytes();
    (status, headers, body)
}

fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ascii"))
        .collect()
}

/// The body decoded by its `Content-Encoding` (none: as it is).
fn decode(headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match headers.get("content-encoding").map(|v| v.as_bytes()) {
        None => out.extend_from_slice(body),
        Some(b"gzip") => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .expect("gzip");
        }
        Some(b"br") => {
            brotli::Decompressor::new(body, 4096)
                .read_to_end(&mut out)
                .expect("br");
        }
        Some(b"zstd") => out = zstd::stream::decode_all(body).expect("zstd"),
        Some(other) => panic!("unknown coding {other:?}"),
    }
    out
}

#[tokio::test]
async fn each_coding_decompresses_to_the_upstreams_bytes() {
    let (up, _) = upstream().await;
    let (_server, url) = gateway(up, "http1", "", DEFAULT);
    for (proto, client) in clients() {
        for coding in ["gzip", "br", "zstd"] {
            for (n, chunked) in [(2_000, 0), (64 * 1024, 0), (300_000, 1), (700_000, 0)] {
                let (status, h, body) = send(
                    &client,
                    Method::GET,
                    &format!("{url}/r?n={n}&chunked={chunked}"),
                    &[("accept-encoding", coding)],
                )
                .await;
                let what = format!("{proto} {coding} {n} chunked={chunked}");
                assert_eq!(status, 200, "{what}");
                assert_eq!(values(&h, "content-encoding"), [coding], "{what}");
                assert!(h.get("content-length").is_none(), "{what}");
                assert_eq!(values(&h, "vary"), ["Accept-Encoding"], "{what}");
                assert!(body.len() < n / 2, "{what}: {} bytes", body.len());
                assert!(decode(&h, &body) == body_of(n), "{what}: the bytes differ");
            }
        }
    }
}

#[tokio::test]
async fn an_http2_upstreams_body_is_compressed_too() {
    let (up, _) = upstream().await;
    let (_server, url) = gateway(up, "h2c", "", DEFAULT);
    for (proto, client) in clients() {
        let (_, h, body) = send(
            &client,
            Method::GET,
            &format!("{url}/r?n=100000"),
            &[("accept-encoding", "gzip")],
        )
        .await;
        assert_eq!(values(&h, "content-encoding"), ["gzip"], "{proto}");
        assert!(decode(&h, &body) == body_of(100_000), "{proto}");
    }
}

#[tokio::test]
async fn accept_encoding_q_values_pick_the_coding_and_ties_go_to_the_configured_order() {
    let (up, _) = upstream().await;
    let (_server, url) = gateway(up, "http1", "", DEFAULT);
    for (proto, client) in clients() {
        for (accept, want) in [
            ("gzip, deflate, br, zstd", Some("zstd")),
            ("gzip, br", Some("br")),
            ("gzip;q=0.5, br;q=0.4", Some("gzip")),
            ("br;q=0.9, zstd;q=0.8", Some("br")),
            ("*;q=0.1, zstd;q=0", Some("br")),
            ("x-gzip", Some("gzip")),
            ("identity;q=0", None),
            ("gzip;q=0, br;q=0, zstd;q=0", None),
            ("deflate", None),
        ] {
            let (status, h, body) = send(
                &client,
                Method::GET,
                &format!("{url}/r?n=5000"),
                &[("accept-encoding", accept)],
            )
            .await;
            let what = format!("{proto} {accept:?}");
            assert_eq!(status, 200, "{what}");
            match want {
                Some(c) => assert_eq!(values(&h, "content-encoding"), [c], "{what}"),
                // Refusing everything, `identity;q=0` included, gets the body as it is.
                None => {
                    assert!(h.get("content-encoding").is_none(), "{what}");
                    assert_eq!(body, body_of(5000), "{what}");
                    assert_eq!(values(&h, "content-length"), ["5000"], "{what}");
                }
            }
            assert_eq!(values(&h, "vary"), ["Accept-Encoding"], "{what}");
        }
        // No `Accept-Encoding` at all: as it is, but the response still varies by it.
        let (_, h, body) = send(&client, Method::GET, &format!("{url}/r?n=5000"), &[]).await;
        assert!(h.get("content-encoding").is_none(), "{proto}");
        assert_eq!(body, body_of(5000), "{proto}");
        assert_eq!(values(&h, "vary"), ["Accept-Encoding"], "{proto}");
    }
}

#[tokio::test]
async fn every_skip_rule_sends_the_response_as_the_upstream_sent_it() {
    let (up, _) = upstream().await;
    let (_server, url) = gateway(up, "http1", "", DEFAULT);
    let accept = ("accept-encoding", "gzip, br, zstd");
    for (proto, client) in clients() {
        for (what, method, query, extra) in [
            ("HEAD", Method::HEAD, "n=5000", None),
            ("204", Method::GET, "status=204", None),
            ("304", Method::GET, "status=304&etag=%22v1%22", None),
            (
                "206",
                Method::GET,
                "status=206&n=5000&cr=bytes%200-4999/9000",
                None,
            ),
            ("already encoded", Method::GET, "n=5000&ce=br", None),
            ("no-transform", Method::GET, "n=5000&cc=no-transform", None),
            (
                "a request's no-transform",
                Method::GET,
                "n=5000",
                Some(("cache-control", "no-transform")),
            ),
            ("image/png", Method::GET, "n=5000&ct=image/png", None),
            ("gRPC", Method::GET, "n=5000&ct=application/grpc", None),
            (
                "event stream",
                Method::GET,
                "n=5000&ct=text/event-stream",
                None,
            ),
            ("under min_bytes", Method::GET, "n=1023", None),
        ] {
            let mut fields = vec![accept];
            fields.extend(extra);
            let (status, h, body) = send(
                &client,
                method.clone(),
                &format!("{url}/r?{query}"),
                &fields,
            )
            .await;
            let what = format!("{proto} {what}");
            assert!(status < 300 || status == 304, "{what}: {status}");
            assert_eq!(
                values(&h, "content-encoding"),
                if query.contains("ce=br") {
                    vec!["br"]
                } else {
                    vec![]
                },
                "{what}"
            );
            assert!(h.get("vary").is_none(), "{what}: nothing to vary");
            if method == Method::GET && status == 200 {
                let n: usize = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("n="))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                assert_eq!(body, body_of(n), "{what}");
            }
            if status == 304 {
                assert_eq!(values(&h, "etag"), ["\"v1\""], "{what}");
            }
        }
        // A short body of unknown length is compressed: its length is known only at its end.
        let (_, h, body) = send(
            &client,
            Method::GET,
            &format!("{url}/r?n=100&chunked=1"),
            &[("accept-encoding", "gzip")],
        )
        .await;
        assert_eq!(values(&h, "content-encoding"), ["gzip"], "{proto}");
        assert!(decode(&h, &body) == body_of(100), "{proto}");
    }
}

#[tokio::test]
async fn vary_is_merged_and_a_strong_etag_made_weak() {
    let (up, _) = upstream().await;
    let (_server, url) = gateway(up, "http1", "", DEFAULT);
    for (proto, client) in clients() {
        let (_, h, _) = send(
            &client,
            Method::GET,
            &format!("{url}/r?n=5000&vary=Origin&etag=%22v1%22"),
            &[("accept-encoding", "gzip")],
        )
        .await;
        assert_eq!(values(&h, "vary"), ["Origin", "Accept-Encoding"], "{proto}");
        assert_eq!(values(&h, "etag"), ["W/\"v1\""], "{proto}");
        // Named already (any case), or `*`: left alone; a weak tag stays as it is.
        for vary in ["accept-encoding", "*"] {
            let (_, h, _) = send(
                &client,
                Method::GET,
                &format!("{url}/r?n=5000&vary={vary}&etag=W/%22v1%22"),
                &[("accept-encoding", "gzip")],
            )
            .await;
            assert_eq!(values(&h, "vary"), [vary], "{proto}");
            assert_eq!(values(&h, "etag"), ["W/\"v1\""], "{proto}");
        }
    }
}

#[tokio::test]
async fn a_listeners_compress_serves_its_routes_and_a_routes_own_replaces_it() {
    let (up, _) = upstream().await;
    let (_server, url) = gateway(
        up,
        "http1",
        r#"{ algorithms = ["gzip"], level = 6 }"#,
        r#"{ algorithms = ["br"], min_bytes = 10 }"#,
    );
    let accept = [("accept-encoding", "gzip, br, zstd")];
    for (proto, client) in clients() {
        let (_, h, body) = send(
            &client,
            Method::GET,
            &format!("{url}/plain?n=5000"),
            &accept,
        )
        .await;
        assert_eq!(
            values(&h, "content-encoding"),
            ["gzip"],
            "{proto}: the listener's"
        );
        assert!(decode(&h, &body) == body_of(5000), "{proto}");
        let (_, h, body) = send(&client, Method::GET, &format!("{url}/r?n=500"), &accept).await;
        assert_eq!(
            values(&h, "content-encoding"),
            ["br"],
            "{proto}: the route's"
        );
        assert!(decode(&h, &body) == body_of(500), "{proto}");
    }
}

#[tokio::test]
async fn an_event_stream_listed_by_name_is_flushed_per_event() {
    let (up, next_event) = upstream().await;
    let (_server, url) = gateway(up, "http1", "", "");
    for (proto, client) in clients() {
        let req = Request::get(format!("{url}/sse"))
            .header("accept-encoding", "gzip")
            .body(empty())
            .expect("request");
        let resp = within(client.request(req)).await.expect("an answer");
        assert_eq!(
            values(resp.headers(), "content-encoding"),
            ["gzip"],
            "{proto}"
        );
        let mut body = resp.into_body();
        let mut decoder = flate2::write::GzDecoder::new(Vec::new());
        // The first event decodes whole before the upstream sends the second: the gateway
        // flushed it, it did not wait for more.
        while decoder.get_ref().len() < 11 {
            let frame = within(body.frame())
                .await
                .expect("a frame before the end")
                .expect("a frame");
            if let Some(d) = frame.data_ref() {
                decoder.write_all(d).expect("gzip");
                decoder.flush().expect("gzip");
            }
        }
        assert_eq!(decoder.get_ref().as_slice(), b"data: one\n\n", "{proto}");
        next_event.notify_one();
        let rest = within(body.collect()).await.expect("the rest").to_bytes();
        decoder.write_all(&rest).expect("gzip");
        let all = decoder.finish().expect("the gzip stream ends");
        assert_eq!(all.as_slice(), b"data: one\n\ndata: two\n\n", "{proto}");
    }
}

#[test]
fn compress_config_errors_have_file_line_and_field() {
    let text = r#"[[listeners]]
address = "127.0.0.1:0"
compress = { level = 12 }

[[upstreams]]
name = "up"
endpoints = [{ address = "127.0.0.1:1" }]

[[routes]]
id = "a"
upstream = "up"
compress = { algorithms = ["gzip", "deflate"], types = ["json"] }
"#;
    assert_eq!(
        support::config_errors(text),
        [
            "gw.toml:3:22: listeners[0].compress.level: 12 is not a br level: 0 to 11",
            "gw.toml:3:22: listeners[0].compress.level: 12 is not a gzip level: 1 to 9",
            "gw.toml:12:36: routes[0].compress.algorithms[1]: `deflate` is not a coding the \
             gateway applies: `zstd`, `br` or `gzip`",
            "gw.toml:12:57: routes[0].compress.types[0]: `json` is not a media type: expected \
             `type/subtype` or `type/*`, like `application/json`",
        ]
    );
}
