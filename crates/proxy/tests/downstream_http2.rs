//! HTTP/2 requests forwarded to HTTP/1.1 upstreams (the downgrade): a request whose framing
//! could turn ambiguous in HTTP/1.1 (a `content-length` that disagrees with its DATA, a
//! connection-specific field, `transfer-encoding`) is a stream error and never reaches the
//! upstream complete; the rest is forwarded with exactly one framing header.
//!
//! The client writes raw frames ([`h2_frames`]: a real client refuses to send most of
//! these), and the upstream records every byte of every connection ([`RecordingUpstream`]);
//! each test shuts the gateway down before reading the records, so they are final.
//!
//! Who enforces what: the `h2` crate under hyper rejects every case here before the gateway
//! sees the request, except a `content-length` that the DATA contradicts after the gateway
//! already forwarded the head, where `h2` fails the body and the gateway drops that upstream
//! connection (`docs/http2.md`, "HTTP/2 to HTTP/1.1").

use std::time::Duration;

use tailguard_proxy::Server;
use tailguard_test_support::RecordingUpstream;
use tailguard_test_support::h2_frames::{
    H2Client, PROTOCOL_ERROR, StreamEnd, data_frame, headers_frame,
};

use crate::support::{self, within};

/// An HTTP/1.1 request hidden in a body: forwarded as the bytes of an ambiguous message, the
/// upstream would read it as a second request (what downgrade smuggling aims for).
const SMUGGLED: &[u8] = b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n";

/// A POST's HEADERS frame: the four pseudo-fields, then `fields`.
fn post(stream: u32, path: &str, fields: &[(&str, &str)], end_stream: bool) -> Vec<u8> {
    let mut all = vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "gateway.test"),
        (":path", path),
    ];
    all.extend_from_slice(fields);
    headers_frame(stream, &all, end_stream)
}

fn concat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

/// A gateway (one serving thread) in front of a recording upstream.
async fn gateway() -> (Server, RecordingUpstream) {
    let upstream = RecordingUpstream::start().await;
    let server = Server::start(support::proxy_to(&[upstream.addr], ""), 1).expect("gateway");
    (server, upstream)
}

/// Stops the gateway, so every upstream connection closes and the records are final.
async fn finish(server: Server, upstream: &RecordingUpstream) {
    within(server.shutdown(Duration::from_secs(5))).await;
    within(upstream.all_closed()).await;
}

/// Everything the upstream received, all connections together; the good request that
/// followed is among it (so the record is known to work).
fn all_bytes(upstream: &RecordingUpstream) -> Vec<u8> {
    let seen: Vec<u8> = upstream
        .connections()
        .into_iter()
        .flat_map(|c| c.bytes)
        .collect();
    assert!(contains(&seen, b"POST /good HTTP/1.1\r\n"), "{seen:?}");
    seen
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Sends `frames` (stream 1) in one write and returns how stream 1 ended; then proves the
/// gateway still serves: a good request on stream 3 (or, after a GOAWAY, on a new
/// connection) gets its `200`.
async fn send_then_a_good_one(server: &Server, frames: &[u8]) -> StreamEnd {
    let addr = server.local_addrs()[0];
    let mut client = H2Client::connect(addr).await;
    client.send(frames).await;
    let end = within(client.end_of(1)).await;
    let (mut client, id) = match end {
        StreamEnd::Status(_) | StreamEnd::Reset(_) => (client, 3),
        StreamEnd::GoAway(_) | StreamEnd::Closed => (H2Client::connect(addr).await, 1),
    };
    client.send(&post(id, "/good", &[], true)).await;
    assert_eq!(within(client.end_of(id)).await, StreamEnd::Status(200));
    end
}

#[tokio::test]
async fn framing_the_data_contradicts_is_a_stream_error_and_never_reaches_the_upstream() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "content-length above the DATA",
            concat(&[
                post(1, "/bad", &[("content-length", "100")], false),
                data_frame(1, SMUGGLED, true),
            ]),
        ),
        (
            "content-length below the DATA",
            concat(&[
                post(1, "/bad", &[("content-length", "5")], false),
                data_frame(1, SMUGGLED, true),
            ]),
        ),
        (
            "content-length below the sum of two DATA frames",
            concat(&[
                post(1, "/bad", &[("content-length", "5")], false),
                data_frame(1, b"abc", false),
                data_frame(1, b"def", true),
            ]),
        ),
        (
            "content-length with END_STREAM on the HEADERS",
            post(1, "/bad", &[("content-length", "5")], true),
        ),
        (
            "two content-lengths that differ",
            concat(&[
                post(
                    1,
                    "/bad",
                    &[("content-length", "5"), ("content-length", "38")],
                    false,
                ),
                data_frame(1, SMUGGLED, true),
            ]),
        ),
        (
            "a content-length list",
            concat(&[
                post(1, "/bad", &[("content-length", "38, 38")], false),
                data_frame(1, SMUGGLED, true),
            ]),
        ),
        (
            "a signed content-length",
            concat(&[
                post(1, "/bad", &[("content-length", "+38")], false),
                data_frame(1, SMUGGLED, true),
            ]),
        ),
    ];
    for (case, frames) in cases {
        let (server, upstream) = gateway().await;
        let end = send_then_a_good_one(&server, &frames).await;
        finish(server, &upstream).await;
        assert_eq!(end, StreamEnd::Reset(PROTOCOL_ERROR), "{case}");
        let seen = all_bytes(&upstream);
        assert!(
            !contains(&seen, b"/bad") && !contains(&seen, b"smuggled"),
            "{case}: the upstream received {:?}",
            String::from_utf8_lossy(&seen)
        );
    }
}

#[tokio::test]
async fn connection_specific_fields_are_a_stream_error_and_never_reach_the_upstream() {
    let reset = StreamEnd::Reset(PROTOCOL_ERROR);
    let fields: &[((&str, &str), StreamEnd)] = &[
        (("connection", "keep-alive"), reset),
        (("keep-alive", "timeout=5"), reset),
        (("proxy-connection", "keep-alive"), reset),
        (("transfer-encoding", "chunked"), reset),
        (("upgrade", "websocket"), reset),
        (("te", "gzip"), reset),
        (("te", "trailers, gzip"), reset),
        // An uppercase name is malformed in HTTP/2 (RFC 9113 §8.2.1); `h2` fails the
        // connection for it, not just the stream.
        (
            ("Transfer-Encoding", "chunked"),
            StreamEnd::GoAway(PROTOCOL_ERROR),
        ),
    ];
    for (field, expected) in fields {
        let (server, upstream) = gateway().await;
        let frames = concat(&[
            post(1, "/bad", &[*field], false),
            data_frame(1, SMUGGLED, true),
        ]);
        let end = send_then_a_good_one(&server, &frames).await;
        finish(server, &upstream).await;
        assert_eq!(end, *expected, "{field:?}");
        let seen = all_bytes(&upstream);
        assert!(
            !contains(&seen, b"/bad") && !contains(&seen, b"smuggled"),
            "{field:?}: the upstream received {:?}",
            String::from_utf8_lossy(&seen)
        );
    }
}

#[tokio::test]
async fn a_field_value_with_crlf_never_becomes_a_field_line_upstream() {
    // Not a valid field value in HTTP/2 (RFC 9113 §8.2.1); written out in HTTP/1.1 it would
    // be a `transfer-encoding` line. `h2` refuses it while decoding HPACK, as a connection
    // error (GOAWAY), so the good request goes on a new connection.
    let (server, upstream) = gateway().await;
    let frames = concat(&[
        post(
            1,
            "/bad",
            &[("x-a", "1\r\ntransfer-encoding: chunked")],
            false,
        ),
        data_frame(1, SMUGGLED, true),
    ]);
    let end = send_then_a_good_one(&server, &frames).await;
    finish(server, &upstream).await;
    assert_eq!(end, StreamEnd::GoAway(PROTOCOL_ERROR));
    let seen = all_bytes(&upstream);
    assert!(
        !contains(&seen, b"/bad") && !contains(&seen, b"smuggled"),
        "the upstream received {:?}",
        String::from_utf8_lossy(&seen)
    );
}

/// The head of `/bad` went upstream with the first DATA (the gateway streams bodies); then
/// `last` contradicts the `content-length`. The upstream must never see the message
/// complete, nor anything after it on that connection (a later request read as its body).
async fn contradicted_after_the_head_went_upstream(last: Vec<u8>) {
    let (server, upstream) = gateway().await;
    let addr = server.local_addrs()[0];
    let mut client = H2Client::connect(addr).await;
    client
        .send(&concat(&[
            post(1, "/bad", &[("content-length", "10")], false),
            data_frame(1, b"12345", false),
        ]))
        .await;
    within(upstream.wait_until(|conns| conns.iter().any(|c| contains(&c.bytes, b"12345")))).await;
    client.send(&last).await;
    assert_eq!(
        within(client.end_of(1)).await,
        StreamEnd::Reset(PROTOCOL_ERROR)
    );
    client.send(&post(3, "/good", &[], true)).await;
    assert_eq!(within(client.end_of(3)).await, StreamEnd::Status(200));
    drop(client);
    finish(server, &upstream).await;

    let conns = upstream.connections();
    let bad = conns
        .iter()
        .find(|c| contains(&c.bytes, b"/bad"))
        .expect("the head went upstream");
    assert!(
        bad.bytes.ends_with(b"\r\n\r\n12345") && bad.requests.is_empty(),
        "the connection of /bad carried {:?}",
        String::from_utf8_lossy(&bad.bytes)
    );
    let good: Vec<_> = conns
        .iter()
        .flat_map(|c| &c.requests)
        .filter(|r| r.line() == "POST /good HTTP/1.1")
        .collect();
    assert_eq!(good.len(), 1, "{conns:?}");
}

#[tokio::test]
async fn data_beyond_the_content_length_after_the_head_went_upstream_closes_that_connection() {
    contradicted_after_the_head_went_upstream(data_frame(1, b"678901", true)).await;
}

#[tokio::test]
async fn data_short_of_the_content_length_after_the_head_went_upstream_closes_that_connection() {
    contradicted_after_the_head_went_upstream(data_frame(1, b"", true)).await;
}

/// Sends one request on stream 1, expects `200`, and returns the one request the upstream
/// received.
async fn forwarded(frames: &[u8]) -> tailguard_test_support::RecordedRequest {
    let (server, upstream) = gateway().await;
    let mut client = H2Client::connect(server.local_addrs()[0]).await;
    client.send(frames).await;
    assert_eq!(within(client.end_of(1)).await, StreamEnd::Status(200));
    drop(client);
    finish(server, &upstream).await;
    let mut requests: Vec<_> = upstream
        .connections()
        .into_iter()
        .flat_map(|c| c.requests)
        .collect();
    assert_eq!(requests.len(), 1, "{requests:?}");
    requests.remove(0)
}

#[tokio::test]
async fn a_content_length_that_matches_the_data_is_forwarded_once() {
    let got = forwarded(&concat(&[
        post(1, "/ok", &[("content-length", "11")], false),
        data_frame(1, b"hello ", false),
        data_frame(1, b"world", true),
    ]))
    .await;
    assert_eq!(got.line(), "POST /ok HTTP/1.1");
    assert_eq!(got.header_values("content-length"), ["11"]);
    assert!(got.header_values("transfer-encoding").is_empty());
    assert_eq!(got.body, b"hello world");
}

#[tokio::test]
async fn data_without_a_content_length_is_forwarded_chunked() {
    let got = forwarded(&concat(&[
        post(1, "/ok", &[], false),
        data_frame(1, b"hello ", false),
        data_frame(1, b"world", true),
    ]))
    .await;
    assert_eq!(got.header_values("transfer-encoding"), ["chunked"]);
    assert!(got.header_values("content-length").is_empty());
    assert_eq!(got.body, b"hello world");
}

#[tokio::test]
async fn te_trailers_is_accepted_and_not_forwarded() {
    // `te` is hop-by-hop (RFC 9110 §10.1.4): the gateway speaks for itself upstream.
    let got = forwarded(&concat(&[
        post(1, "/ok", &[("te", "trailers")], false),
        data_frame(1, b"hello", true),
    ]))
    .await;
    assert!(got.header_values("te").is_empty(), "{got:?}");
    assert_eq!(got.body, b"hello");
}

#[tokio::test]
async fn two_equal_content_lengths_are_forwarded_as_one() {
    // `h2` accepts repeated equal values (RFC 9110 §8.6 allows either that or a rejection);
    // an HTTP/1.1 upstream may refuse two `Content-Length` lines, so one goes out: the
    // upstream head's framing field is the gateway's own (`tailguard_http1::client`).
    let got = forwarded(&concat(&[
        post(
            1,
            "/ok",
            &[("content-length", "5"), ("content-length", "5")],
            false,
        ),
        data_frame(1, b"hello", true),
    ]))
    .await;
    assert_eq!(got.header_values("content-length"), ["5"]);
    assert_eq!(got.body, b"hello");
}
