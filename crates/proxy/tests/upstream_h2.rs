//! Upstream HTTP/2 (`protocol = "h2c"`) and gRPC through the gateway: a real tonic service
//! behind it and a tonic client in front (unary, server, client and bidirectional streams,
//! statuses, deadlines), plain HTTP/1.1 and HTTP/2 clients to an h2c upstream, the stream
//! bound per connection, and the gRPC status in the metrics and the access log.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tailguard_proxy::{Config, Server};
use tailguard_test_support::grpc::{GrpcClient, GrpcUpstream, Msg, frame, unframe};
use tailguard_test_support::{
    IssuedCert, TestBody, TestCa, TlsUpstream, Upstream, free_port, h2c_client, http1_client,
};
use tonic::Code;

use crate::support::{self, within};

/// A gateway config: one listener, upstream `up` speaking h2c to `addr` (with `fields`
/// added to its table), a catch-all route `all`, then `rest`.
fn h2c_to(addr: SocketAddr, fields: &str, rest: &str) -> Config {
    support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\n{fields}\n\
         endpoints = [{{ address = \"{addr}\" }}]\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n\n{rest}"
    ))
}

async fn grpc_client(url: &str) -> GrpcClient {
    within(GrpcClient::connect(url)).await
}

/// A gRPC call written by hand over a plain HTTP/2 client, so the test sees exactly what
/// the gateway answers (a tonic client would enforce its deadline itself).
fn raw_call(url: &str, method: &str, msg: &Msg, timeout: Option<&str>) -> Request<TestBody> {
    let mut req = Request::post(format!("{url}/test.Echo/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = timeout {
        req = req.header("grpc-timeout", t);
    }
    req.body(Full::new(frame(msg)).boxed()).expect("request")
}

#[tokio::test]
async fn a_unary_grpc_call_passes_its_message_metadata_and_status() {
    let upstream = GrpcUpstream::start().await;
    let (server, url) = support::start(h2c_to(upstream.addr, "", ""));
    let mut client = grpc_client(&url).await;

    let resp = within(client.unary(Msg::new("hello", 7), None))
        .await
        .expect("the call succeeds");
    assert_eq!(resp.get_ref(), &Msg::new("hello", 7));
    assert_eq!(
        resp.metadata().get("x-echo").map(|v| v.to_str().ok()),
        Some(Some("yes")),
        "the upstream's response metadata crossed"
    );
    assert_eq!(upstream.calls(), 1);
    drop(server);
}

#[tokio::test]
async fn server_client_and_bidirectional_streams_cross_message_by_message() {
    let upstream = GrpcUpstream::start().await;
    let (_server, url) = support::start(h2c_to(upstream.addr, "", ""));
    let mut client = grpc_client(&url).await;

    let mut stream = within(client.server_stream(Msg::new("s", 5)))
        .await
        .expect("server stream starts");
    let mut got = Vec::new();
    while let Some(m) = within(stream.message()).await.expect("stream message") {
        got.push(m.text);
    }
    assert_eq!(got, ["s-0", "s-1", "s-2", "s-3", "s-4"]);

    let joined =
        within(client.client_stream(vec![Msg::new("a", 0), Msg::new("b", 0), Msg::new("c", 0)]))
            .await
            .expect("client stream");
    assert_eq!(joined, Msg::new("a,b,c", 3));

    // Each reply comes back before the next message is sent: nothing along the way waits
    // for more of either stream than it has.
    let (tx, mut replies) = within(client.bidi()).await.expect("bidi starts");
    for i in 0..4 {
        tx.send(Msg::new(format!("m{i}"), i)).await.expect("send");
        let reply = within(replies.message())
            .await
            .expect("a reply")
            .expect("not the end yet");
        assert_eq!(reply, Msg::new(format!("m{i}"), i + 1));
    }
    drop(tx);
    assert_eq!(within(replies.message()).await.expect("clean end"), None);
}

#[tokio::test]
async fn upstream_error_statuses_and_messages_pass_through() {
    let upstream = GrpcUpstream::start().await;
    let (_server, url) = support::start(h2c_to(upstream.addr, "", ""));
    let mut client = grpc_client(&url).await;

    for (code, message) in [(Code::NotFound, "no such user"), (Code::Internal, "boom")] {
        let status = within(client.unary(Msg::new(format!("fail:{message}"), code as u32), None))
            .await
            .expect_err("the call fails");
        assert_eq!((status.code(), status.message()), (code, message));
    }
}

#[tokio::test]
async fn grpc_timeout_is_forwarded_and_enforced_by_the_gateway() {
    let upstream = GrpcUpstream::start().await;
    let (_server, url) = support::start(h2c_to(upstream.addr, "", ""));
    let mut client = grpc_client(&url).await;

    // The upstream sees the deadline the client set.
    let seen = within(client.unary(Msg::new("timeout", 0), Some(Duration::from_secs(5))))
        .await
        .expect("the call succeeds");
    assert_ne!(
        seen.get_ref().text,
        "none",
        "grpc-timeout did not reach the upstream"
    );

    // Past the deadline the gateway answers as gRPC does: HTTP 200, grpc-status 4 in a head
    // that ends the stream. (A plain HTTP/2 client: a tonic client would give up at its
    // own deadline first, with CANCELLED.)
    let h2 = h2c_client();
    let started = Instant::now();
    let resp = within(h2.request(raw_call(
        &url,
        "Unary",
        &Msg::new("sleep", 3_000),
        Some("200m"),
    )))
    .await
    .expect("an answer");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["grpc-status"], "4");
    assert_eq!(resp.headers()["content-type"], "application/grpc");
    assert!(
        started.elapsed() < Duration::from_millis(2_000),
        "answered after {:?}, not at the deadline",
        started.elapsed()
    );

    // A stream past its deadline ends with DEADLINE_EXCEEDED after what it had sent.
    let started = Instant::now();
    let resp = within(h2.request(raw_call(
        &url,
        "ServerStream",
        &Msg::new("tick", 50),
        Some("400m"),
    )))
    .await
    .expect("an answer");
    assert_eq!(resp.status(), 200);
    let body = within(resp.into_body().collect())
        .await
        .expect("the body ends");
    let trailers = body.trailers().cloned().expect("trailers end the stream");
    assert_eq!(trailers["grpc-status"], "4");
    let ticks = unframe(&body.to_bytes());
    assert!(
        ticks.len() >= 2,
        "only {} messages before the deadline",
        ticks.len()
    );
    assert!(started.elapsed() < Duration::from_millis(2_000));
}

#[tokio::test]
async fn a_tonic_client_past_the_request_timeout_sees_deadline_exceeded() {
    let upstream = GrpcUpstream::start().await;
    // `timeouts.request_ms` is the earlier deadline here: the gateway's answer comes first.
    let (_server, url) =
        support::start(h2c_to(upstream.addr, "", "[timeouts]\nrequest_ms = 200\n"));
    let mut client = grpc_client(&url).await;
    let started = Instant::now();
    let status = within(client.unary(Msg::new("sleep", 3_000), Some(Duration::from_secs(5))))
        .await
        .expect_err("the call times out");
    assert_eq!(
        (status.code(), status.message()),
        (Code::DeadlineExceeded, "upstream timed out")
    );
    assert!(started.elapsed() < Duration::from_millis(2_000));
}

#[tokio::test]
async fn a_long_quiet_stream_is_not_cut_by_the_http_read_timeout() {
    let upstream = GrpcUpstream::start().await;
    // A message every 300 ms, past a 100 ms read timeout meant for plain HTTP bodies.
    let (_server, url) = support::start(h2c_to(upstream.addr, "", "[timeouts]\nread_ms = 100\n"));
    let mut client = grpc_client(&url).await;
    let mut stream = within(client.server_stream(Msg::new("tick", 300)))
        .await
        .expect("stream starts");
    for i in 0..4 {
        let m = within(stream.message())
            .await
            .expect("the stream goes on")
            .expect("a message");
        assert_eq!(m, Msg::new("tick", i));
    }
}

#[tokio::test]
async fn a_stream_the_upstream_breaks_ends_with_unavailable_not_a_reset() {
    let upstream = GrpcUpstream::start().await;
    let (_server, url) = support::start(h2c_to(upstream.addr, "", ""));
    let mut client = grpc_client(&url).await;
    let mut stream = within(client.server_stream(Msg::new("tick", 20)))
        .await
        .expect("stream starts");
    for i in 0..2 {
        let m = within(stream.message()).await.expect("a message");
        assert_eq!(m, Some(Msg::new("tick", i)));
    }
    // The upstream process goes away mid-stream.
    drop(upstream);
    let status = loop {
        match within(stream.message()).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended as if complete"),
            Err(status) => break status,
        }
    };
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, "upstream connection failed")
    );
}

#[tokio::test]
async fn a_grpc_call_no_route_matches_gets_unimplemented() {
    let upstream = GrpcUpstream::start().await;
    let (_server, url) = support::start(support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\n\
         endpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"other\"\nupstream = \"up\"\npath = {{ prefix = \"/other.Service\" }}\n",
        upstream.addr
    )));
    let mut client = grpc_client(&url).await;
    let status = within(client.unary(Msg::new("hi", 0), None))
        .await
        .expect_err("no route");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unimplemented, "no route")
    );
    assert_eq!(upstream.calls(), 0);
}

#[tokio::test]
async fn a_dead_endpoint_gives_grpc_clients_unavailable() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = dead.local_addr().expect("addr");
    drop(dead);
    let (_server, url) = support::start(h2c_to(addr, "", ""));

    let mut client = grpc_client(&url).await;
    let status = within(client.unary(Msg::new("hi", 0), None))
        .await
        .expect_err("nothing listens");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "upstream connect failed");

    let resp = within(h2c_client().request(raw_call(&url, "Unary", &Msg::new("hi", 0), None)))
        .await
        .expect("an answer");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["grpc-status"], "14");
    let body = within(resp.into_body().collect()).await.expect("body");
    assert!(
        body.to_bytes().is_empty(),
        "a trailers-only answer has no body"
    );

    // A plain HTTP request to the same upstream still gets a plain 502.
    let (status, _) = within(tailguard_test_support::get(
        &http1_client(),
        &format!("{url}/x"),
    ))
    .await;
    assert_eq!(status, 502);
}

#[tokio::test]
async fn http1_and_http2_clients_reach_an_h2c_upstream() {
    let upstream = Upstream::start().await;
    let (server, url) = support::start(h2c_to(upstream.addr, "", ""));
    let gw = server.local_addrs()[0];

    // HTTP/1.1 in, HTTP/2 out: the Host became :authority.
    let (status, body) = within(tailguard_test_support::get(
        &http1_client(),
        &format!("{url}/echo"),
    ))
    .await;
    assert_eq!(status, 200);
    let first = body.lines().next().unwrap_or_default();
    assert_eq!(first, format!("GET http://{gw}/echo HTTP/2.0"), "{body}");
    assert!(body.contains("x-forwarded-for: 127.0.0.1"), "{body}");
    assert!(
        !body.contains("\nhost:"),
        "HTTP/2 says the host in :authority\n{body}"
    );

    // A request body streams up, a large response body streams down.
    let upload = vec![b'u'; 100_000];
    let resp = within(
        http1_client().request(
            Request::post(format!("{url}/sink"))
                .body(Full::new(Bytes::from(upload)).boxed())
                .expect("request"),
        ),
    )
    .await
    .expect("an answer");
    assert_eq!(support::text(resp).await, "100000");
    let resp = within(http1_client().request(support::get(&format!("{url}/source/300000"))))
        .await
        .expect("an answer");
    let body = within(resp.into_body().collect()).await.expect("body");
    assert_eq!(body.to_bytes().len(), 300_000);

    // HTTP/2 in, HTTP/2 out.
    let (status, body) = within(tailguard_test_support::get(
        &h2c_client(),
        &format!("{url}/echo"),
    ))
    .await;
    assert_eq!(status, 200);
    assert!(
        body.starts_with(&format!("GET http://{gw}/echo HTTP/2.0")),
        "{body}"
    );
    assert_eq!(upstream.requests(), 4);
}

#[tokio::test]
async fn a_streamed_body_over_the_limit_is_refused_with_413() {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(h2c_to(upstream.addr, "", "[limits]\nbody_bytes = 1000\n"));
    // No declared length (a stream of frames): the limit is found while forwarding.
    let chunks: Vec<Result<http_body::Frame<Bytes>, std::convert::Infallible>> = (0..5)
        .map(|_| Ok(http_body::Frame::data(Bytes::from(vec![b'x'; 1000]))))
        .collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks)).boxed();
    let resp = within(
        h2c_client().request(
            Request::post(format!("{url}/sink"))
                .body(body)
                .expect("request"),
        ),
    )
    .await
    .expect("an answer");
    assert_eq!(resp.status(), 413);
}

/// Runs 12 requests of 300 ms at once over one HTTP/2 client connection (one serving
/// thread) after a first one, and returns the connections the upstream accepted.
async fn connections_for_a_burst(fields: &str) -> usize {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(h2c_to(upstream.addr, fields, ""));
    let client = h2c_client();
    let (status, _) = within(tailguard_test_support::get(&client, &format!("{url}/"))).await;
    assert_eq!(status, 200);
    let burst: Vec<_> = (0..12)
        .map(|_| {
            let client = client.clone();
            let url = format!("{url}/delay/300");
            tokio::spawn(async move { tailguard_test_support::get(&client, &url).await.0 })
        })
        .collect();
    let started = Instant::now();
    for call in burst {
        assert_eq!(within(call).await.expect("task"), 200);
    }
    // At once, not one after the other (12 x 300 ms).
    assert!(
        started.elapsed() < Duration::from_millis(2_000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(upstream.requests(), 13);
    upstream.connections()
}

#[tokio::test]
async fn concurrent_requests_share_a_connection_up_to_max_concurrent_streams() {
    // 12 at once with 4 streams per connection: exactly three connections, the first one
    // (idle again after the first request) included.
    assert_eq!(
        connections_for_a_burst("max_concurrent_streams = 4").await,
        3
    );
    // With the default bound of 100, one connection carries them all.
    assert_eq!(connections_for_a_burst("").await, 1);
}

/// The value of an unlabelled series in the gateway's metrics.
fn gauge(server: &Server, name: &str) -> f64 {
    let text = crate::support::metrics_text(server);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_replaced_and_a_reload_keeps_an_open_one() {
    // A port that stays free while the upstream is gone (see `free_port`).
    let upstream = GrpcUpstream::start_on(SocketAddr::from(([127, 0, 0, 1], free_port())))
        .await
        .expect("bind a free port");
    let addr = upstream.addr;
    let config = || h2c_to(addr, "", "");
    let (server, url) = support::start(config());
    let mut client = grpc_client(&url).await;
    within(client.unary(Msg::new("one", 1), None))
        .await
        .expect("first call");
    assert_eq!(upstream.connections(), 1);

    // A reload that keeps the endpoint keeps its connection.
    server.reload(config()).expect("reload");
    within(client.unary(Msg::new("two", 2), None))
        .await
        .expect("after the reload");
    assert_eq!(upstream.connections(), 1, "the reload kept the connection");

    // The upstream goes away (its connections with it) and comes back on the same port.
    drop(upstream);
    within(async {
        while gauge(&server, "tailguard_upstream_connections_open") > 0.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let upstream = GrpcUpstream::start_on(addr).await.expect("the same port");
    let back = within(client.unary(Msg::new("three", 3), None))
        .await
        .expect("a new connection serves the call");
    assert_eq!(back.get_ref(), &Msg::new("three", 3));
    assert_eq!(upstream.connections(), 1);
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let upstream = GrpcUpstream::start().await;
    let (server, url) = support::start(h2c_to(upstream.addr, "", "[timeouts]\nidle_ms = 200\n"));
    let mut client = grpc_client(&url).await;
    within(client.unary(Msg::new("one", 1), None))
        .await
        .expect("a call");
    assert_eq!(gauge(&server, "tailguard_upstream_connections_open"), 1.0);
    // Closed by the serving thread's eviction pass (about once a second).
    within(async {
        while gauge(&server, "tailguard_upstream_connections_open") > 0.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The next call opens a new one.
    within(client.unary(Msg::new("two", 2), None))
        .await
        .expect("a call");
    assert_eq!(upstream.connections(), 2);
}

#[tokio::test]
async fn health_checks_of_an_h2c_upstream_speak_http2_and_take_a_dead_endpoint_out() {
    let alive = GrpcUpstream::start().await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let (server, url) = support::start(support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\n\
         endpoints = [{{ address = \"{}\" }}, {{ address = \"{dead}\" }}]\n\
         health = {{ path = \"/grpc.health.v1.Health/Check\", interval_ms = 50, \
         timeout_ms = 500, unhealthy = 2, consecutive_failures = 0 }}\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n",
        alive.addr
    )));
    let up = |addr: SocketAddr| {
        gauge(
            &server,
            &format!("tailguard_upstream_endpoint_up{{upstream=\"up\",endpoint=\"{addr}\"}}"),
        )
    };
    within(async {
        while up(dead) > 0.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The gRPC server answers the checks' HTTP/2 (an HTTP/1.1 check would fail it too).
    assert_eq!(up(alive.addr), 1.0);
    let mut client = grpc_client(&url).await;
    for i in 0..10 {
        within(client.unary(Msg::new("hi", i), None))
            .await
            .expect("every call goes to the endpoint that is up");
    }
    assert_eq!(alive.calls(), 10);
}

#[tokio::test]
async fn grpc_status_is_counted_in_the_metrics_and_written_in_the_access_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let upstream = GrpcUpstream::start().await;
    let config = h2c_to(
        upstream.addr,
        "",
        &format!(
            "[access_log]\npath = \"{}\"\ntemplate = \"$request_uri $status $grpc_status\"\n",
            log.display()
        ),
    );
    let server = Server::start(config, 2).expect("gateway starts");
    let url = format!("http://{}", server.local_addrs()[0]);
    let mut client = grpc_client(&url).await;
    within(client.unary(Msg::new("ok", 0), None))
        .await
        .expect("ok");
    let status = within(client.unary(Msg::new("fail:gone", 5), None))
        .await
        .expect_err("fails");
    assert_eq!(status.code(), Code::NotFound);
    let (status, _) = within(tailguard_test_support::get(
        &http1_client(),
        &format!("{url}/plain"),
    ))
    .await;
    assert_eq!(status, 200);

    let text = crate::support::metrics_text(&server);
    for line in [
        "tailguard_grpc_requests_total{route=\"all\",grpc_status=\"0\"} 1",
        "tailguard_grpc_requests_total{route=\"all\",grpc_status=\"5\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("tailguard_grpc_requests_total{"))
            .count(),
        2,
        "a plain HTTP request is not a gRPC call"
    );

    drop(client);
    assert!(server.shutdown(Duration::from_secs(10)).await);
    let written = std::fs::read_to_string(&log).expect("the log");
    let mut lines: Vec<&str> = written.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "/plain 200 -",
            "/test.Echo/Unary 200 0",
            "/test.Echo/Unary 200 5"
        ],
        "{written}"
    );
}

#[test]
fn protocol_config_is_validated() {
    let parse = |fields: &str| {
        Config::parse(
            &format!(
                "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
                 [[upstreams]]\nname = \"up\"\n{fields}\n\
                 endpoints = [{{ address = \"127.0.0.1:1\" }}]\n\n\
                 [[routes]]\nid = \"all\"\nupstream = \"up\"\n"
            ),
            "gw.toml",
            std::path::Path::new("."),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    assert_eq!(parse("protocol = \"h2c\""), Ok(()));
    assert_eq!(parse("protocol = \"http1\""), Ok(()));
    assert_eq!(
        parse("protocol = \"h2\"").unwrap_err(),
        "gw.toml:6:12: upstreams[0].protocol: `h2` is HTTP/2 over TLS and needs \
         `[upstreams.tls]`; for plaintext HTTP/2 use `h2c`"
    );
    assert_eq!(
        parse("protocol = \"h2c\"\ntls = { verify = false }").unwrap_err(),
        "gw.toml:6:12: upstreams[0].protocol: `h2c` is plaintext HTTP/2; with \
         `[upstreams.tls]` use `h2`"
    );
    assert_eq!(parse("protocol = \"h2\"\ntls = { verify = false }"), Ok(()));
    assert!(
        parse("protocol = \"h3\"")
            .unwrap_err()
            .starts_with("gw.toml:6:12: upstreams[0]: unknown variant `h3`"),
    );
    assert_eq!(
        parse("protocol = \"h2c\"\nmax_concurrent_streams = 0").unwrap_err(),
        "gw.toml:7:26: upstreams[0].max_concurrent_streams: must be at least 1"
    );
}

/// A gateway (one serving thread) in front of upstream `up` at `addr` with `protocol = "h2"`
/// and `[upstreams.tls]` = `tls` (files relative to `dir`).
fn h2_over_tls(dir: &std::path::Path, addr: SocketAddr, tls: &str) -> (Server, String) {
    let config = Config::parse(
        &format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
             [[upstreams]]\nname = \"up\"\nprotocol = \"h2\"\n\
             endpoints = [{{ address = \"{addr}\" }}]\n\
             [upstreams.tls]\n{tls}\n\n\
             [[routes]]\nid = \"all\"\nupstream = \"up\"\n"
        ),
        "test.toml",
        dir,
    )
    .unwrap_or_else(|e| panic!("invalid test config:\n{e}"));
    let server = Server::start(config, 1).expect("gateway starts");
    let url = format!("http://{}", server.local_addrs()[0]);
    (server, url)
}

/// A TLS server config with `cert` (the gRPC service sets its ALPN to `h2`).
fn server_tls(cert: &IssuedCert) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate pem");
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("key pem");
    rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("server certificate")
}

#[tokio::test]
async fn grpc_over_h2_reaches_a_tls_upstream_with_every_kind_of_call_on_one_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    let upstream = GrpcUpstream::start_tls(server_tls(&ca.issue(&["127.0.0.1"]))).await;
    let (_server, url) = h2_over_tls(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    let mut client = grpc_client(&url).await;

    let resp = within(client.unary(Msg::new("hello", 7), None))
        .await
        .expect("unary over h2");
    assert_eq!(resp.get_ref(), &Msg::new("hello", 7));
    let mut stream = within(client.server_stream(Msg::new("s", 3)))
        .await
        .expect("server stream");
    let mut got = Vec::new();
    while let Some(m) = within(stream.message()).await.expect("message") {
        got.push(m.text);
    }
    assert_eq!(got, ["s-0", "s-1", "s-2"]);
    let joined = within(client.client_stream(vec![Msg::new("a", 0), Msg::new("b", 0)]))
        .await
        .expect("client stream");
    assert_eq!(joined, Msg::new("a,b", 2));
    let (tx, mut replies) = within(client.bidi()).await.expect("bidi");
    for i in 0..3 {
        tx.send(Msg::new(format!("m{i}"), i)).await.expect("send");
        let reply = within(replies.message()).await.expect("reply");
        assert_eq!(reply, Some(Msg::new(format!("m{i}"), i + 1)));
    }
    drop(tx);
    assert_eq!(within(replies.message()).await.expect("end"), None);
    let status = within(client.unary(Msg::new("fail:nope", 7), None))
        .await
        .expect_err("an error status");
    assert_eq!(
        (status.code(), status.message()),
        (Code::PermissionDenied, "nope")
    );

    // One serving thread, one TLS connection for every call.
    assert_eq!(upstream.connections(), 1);
    assert_eq!(upstream.calls(), 5);
}

#[tokio::test]
async fn an_untrusted_certificate_is_unavailable_to_grpc_and_nothing_reaches_the_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trusted = TestCa::new("trusted ca");
    trusted.write(&dir.path().join("ca.pem"));
    let other = TestCa::new("another ca");
    let upstream = GrpcUpstream::start_tls(server_tls(&other.issue(&["127.0.0.1"]))).await;
    let (_server, url) = h2_over_tls(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    let mut client = grpc_client(&url).await;
    let status = within(client.unary(Msg::new("hi", 0), None))
        .await
        .expect_err("the handshake fails");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, "upstream TLS handshake failed")
    );
    assert_eq!(upstream.calls(), 0);
}

#[tokio::test]
async fn an_http1_only_tls_endpoint_is_refused_for_h2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("test ca");
    ca.write(&dir.path().join("ca.pem"));
    // Offers ALPN `http/1.1` only.
    let upstream = TlsUpstream::builder(ca.issue(&["127.0.0.1"])).start().await;
    let (_server, url) = h2_over_tls(dir.path(), upstream.addr, "ca = \"ca.pem\"");
    let (status, _) = within(tailguard_test_support::get(
        &http1_client(),
        &format!("{url}/"),
    ))
    .await;
    assert_eq!(status, 502);
    assert_eq!(upstream.requests(), 0);
}
