//! Traces through the real gateway: the `traceparent` each upstream try receives, the spans
//! a real OTLP receiver gets (server span, one client span per try, their parents), the
//! tail rule, malformed incoming context, `tracing = false`, a dead collector, a reload, a
//! collector over TLS, a shed request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tailguard_test_support::otlp::{OtlpReceiver, OtlpSpan, attr_int, attr_str};
use tailguard_test_support::{TestBody, TestCa, http1_client};

type TestClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    TestBody,
>;

use crate::support::{config, metrics_text, start};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";
const WAIT: Duration = Duration::from_secs(10);

/// An upstream that answers `status` and keeps every `traceparent` it receives.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Option<String>>>>,
    heads: Arc<Mutex<Vec<hyper::HeaderMap>>>,
}

async fn recorder(status: u16) -> Recorder {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (s, h) = (Arc::clone(&seen), Arc::clone(&heads));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (s, h) = (Arc::clone(&s), Arc::clone(&h));
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    h.lock().expect("lock").push(req.headers().clone());
                    // Every `traceparent` line, joined: a second one (the caller's left
                    // beside the gateway's) fails the tests' parse of the value.
                    let lines: Vec<&str> = req
                        .headers()
                        .get_all("traceparent")
                        .iter()
                        .map(|v| v.to_str().expect("ascii"))
                        .collect();
                    let tp = (!lines.is_empty()).then(|| lines.join(", "));
                    s.lock().expect("lock").push(tp);
                    async move {
                        let mut r = hyper::Response::new(Full::new(Bytes::from_static(b"ok")));
                        *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
                        Ok::<_, hyper::Error>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Recorder { addr, seen, heads }
}

impl Recorder {
    fn seen(&self) -> Vec<Option<String>> {
        self.seen.lock().expect("lock").clone()
    }

    fn heads(&self) -> Vec<hyper::HeaderMap> {
        self.heads.lock().expect("lock").clone()
    }
}

fn gateway_config(
    endpoints: &[SocketAddr],
    route_extra: &str,
    tracing_extra: &str,
    collector: &str,
) -> String {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{}]\n\n\
         [[routes]]\nid = \"api\"\nupstream = \"up\"\n{route_extra}\n\n\
         [tracing]\nendpoint = \"{collector}\"\nbatch_interval_ms = 20\n{tracing_extra}\n",
        eps.join(", ")
    )
}

async fn send(url: &str, traceparent: Option<&str>) -> u16 {
    send_with(&http1_client(), url, traceparent).await
}

/// [`send`] on `client`: one client's requests share a keep-alive connection, so they are
/// served by the same gateway thread.
async fn send_with(client: &TestClient, url: &str, traceparent: Option<&str>) -> u16 {
    let mut req = http::Request::get(format!("{url}/x")).header("host", "api.example.com");
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let resp = client
        .request(req.body(crate::support::empty()).expect("request"))
        .await
        .expect("a response");
    let status = resp.status().as_u16();
    let _ = crate::support::text(resp).await;
    status
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `00-{trace}-{span}-{flags}` into its parts.
fn parts(tp: &str) -> (String, String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "{tp}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

fn by_kind(spans: &[OtlpSpan], kind: i32) -> Vec<&OtlpSpan> {
    spans.iter().filter(|s| s.kind == kind).collect()
}

const SERVER: i32 = 2;
const CLIENT: i32 = 3;

#[tokio::test]
async fn the_upstream_gets_the_incoming_trace_with_the_client_span_as_parent() {
    let receiver = OtlpReceiver::http().await;
    let up = recorder(200).await;
    let (server, url) = start(config(&gateway_config(
        &[up.addr],
        "",
        "",
        &receiver.endpoint(),
    )));
    let incoming = format!("00-{TRACE}-{PARENT_SPAN}-01");
    assert_eq!(send(&url, Some(&incoming)).await, 200);

    let seen = up.seen();
    let (trace, parent, flags) = parts(seen[0].as_deref().expect("a traceparent upstream"));
    assert_eq!(trace, TRACE, "the incoming trace continues");
    assert_ne!(
        parent, PARENT_SPAN,
        "the parent is the gateway's client span"
    );
    assert_eq!(flags, "01");

    let spans = receiver.wait_for(WAIT, |s| s.len() == 2).await;
    let server_span = by_kind(&spans, SERVER)[0];
    let client_span = by_kind(&spans, CLIENT)[0];
    assert_eq!(hex(&server_span.trace_id), TRACE);
    assert_eq!(
        hex(&server_span.parent_span_id),
        PARENT_SPAN,
        "the caller's span is the parent"
    );
    assert_eq!(client_span.parent_span_id, server_span.span_id);
    assert_eq!(
        hex(&client_span.span_id),
        parent,
        "the upstream's parent is the client span"
    );
    assert_eq!(server_span.name, "GET api");
    assert_eq!(
        attr_str(server_span, "http.request.method").as_deref(),
        Some("GET")
    );
    assert_eq!(attr_str(server_span, "http.route").as_deref(), Some("api"));
    assert_eq!(attr_str(server_span, "url.path").as_deref(), Some("/x"));
    assert_eq!(
        attr_str(server_span, "server.address").as_deref(),
        Some("api.example.com")
    );
    assert_eq!(
        attr_str(server_span, "client.address").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        attr_str(server_span, "network.protocol.version").as_deref(),
        Some("1.1")
    );
    assert_eq!(
        attr_int(server_span, "http.response.status_code"),
        Some(200)
    );
    assert_eq!(
        attr_str(server_span, "tailguard.outcome").as_deref(),
        Some("forwarded")
    );
    assert_eq!(
        attr_str(client_span, "server.address").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        attr_int(client_span, "server.port"),
        Some(i64::from(up.addr.port()))
    );
    assert_eq!(attr_int(client_span, "tailguard.try"), Some(1));
    assert_eq!(
        attr_int(client_span, "http.response.status_code"),
        Some(200)
    );
    assert!(server_span.start_time_unix_nano <= client_span.start_time_unix_nano);
    assert!(client_span.end_time_unix_nano <= server_span.end_time_unix_nano);
    drop(server);
}

#[tokio::test]
async fn each_try_gets_its_own_client_span_and_traceparent() {
    let receiver = OtlpReceiver::http().await;
    let (a, b) = (recorder(503).await, recorder(503).await);
    let (server, url) = start(config(&gateway_config(
        &[a.addr, b.addr],
        "retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }",
        "",
        &receiver.endpoint(),
    )));
    let incoming = format!("00-{TRACE}-{PARENT_SPAN}-01");
    assert_eq!(send(&url, Some(&incoming)).await, 503);

    let seen: Vec<String> = a
        .seen()
        .into_iter()
        .chain(b.seen())
        .map(|t| t.expect("traceparent"))
        .collect();
    assert_eq!(seen.len(), 2, "one try on each endpoint");
    let (t1, p1, _) = parts(&seen[0]);
    let (t2, p2, _) = parts(&seen[1]);
    assert_eq!((t1.as_str(), t2.as_str()), (TRACE, TRACE));
    assert_ne!(p1, p2, "a new parent span id per try");

    let spans = receiver.wait_for(WAIT, |s| s.len() == 3).await;
    let server_span = by_kind(&spans, SERVER)[0];
    let mut clients = by_kind(&spans, CLIENT);
    clients.sort_by_key(|s| attr_int(s, "tailguard.try"));
    assert_eq!(clients.len(), 2);
    let ids: Vec<String> = clients.iter().map(|s| hex(&s.span_id)).collect();
    assert!(
        ids.contains(&p1) && ids.contains(&p2),
        "{ids:?} vs {p1}, {p2}"
    );
    for c in &clients {
        assert_eq!(c.parent_span_id, server_span.span_id);
        assert_eq!(attr_int(c, "http.response.status_code"), Some(503));
        assert_eq!(
            c.status.as_ref().map(|s| s.code),
            Some(2),
            "a 503 try is an error"
        );
    }
    assert_eq!(attr_int(clients[1], "tailguard.try"), Some(2));
    assert_eq!(
        attr_str(clients[1], "tailguard.retry_reason").as_deref(),
        Some("503")
    );
    assert_eq!(attr_int(server_span, "tailguard.tries"), Some(2));
    drop(server);
}

#[tokio::test]
async fn the_upstream_gets_one_traceparent_the_callers_tracestate_and_no_b3() {
    let receiver = OtlpReceiver::http().await;
    let up = recorder(200).await;
    let (server, url) = start(config(&gateway_config(
        &[up.addr],
        "",
        "",
        &receiver.endpoint(),
    )));
    let incoming = format!("00-{TRACE}-{PARENT_SPAN}-01");
    let req = http::Request::get(format!("{url}/x"))
        .header("host", "api.example.com")
        .header("traceparent", &incoming)
        .header("tracestate", "vendor=opaque,other=1")
        .header("b3", format!("{TRACE}-{PARENT_SPAN}-1"))
        .body(crate::support::empty())
        .expect("request");
    let resp = http1_client().request(req).await.expect("a response");
    assert_eq!(resp.status(), 200);
    let _ = crate::support::text(resp).await;

    let heads = up.heads();
    let head = &heads[0];
    let parents: Vec<_> = head.get_all("traceparent").iter().collect();
    assert_eq!(parents.len(), 1, "exactly one traceparent: {parents:?}");
    let (trace, parent, _) = parts(parents[0].to_str().expect("ascii"));
    assert_eq!(trace, TRACE);
    assert_ne!(parent, PARENT_SPAN, "the caller's own line does not go on");
    assert_eq!(
        head.get_all("tracestate").iter().collect::<Vec<_>>(),
        ["vendor=opaque,other=1"],
        "tracestate passes through as received"
    );
    assert!(
        head.get("b3").is_none(),
        "b3 would name a span the upstream never saw"
    );
    drop(server);
}

/// Regression (issue 44): `tracestate` keys by Trace Context Level 2 (`@` anywhere after
/// the first character, a digit first, up to 256 characters), and a forbidden member dropped
/// alone: Level 1's `tenant@system` check dropped the whole header, members beside included.
#[tokio::test]
async fn tracestate_keys_of_level_2_go_on_and_a_forbidden_member_is_dropped_alone() {
    let receiver = OtlpReceiver::http().await;
    let up = recorder(200).await;
    let (server, url) = start(config(&gateway_config(
        &[up.addr],
        "",
        "",
        &receiver.endpoint(),
    )));
    let long = format!("{}@v", "t".repeat(242));
    let send_state = |fields: Vec<String>| {
        let url = url.clone();
        async move {
            let mut req = http::Request::get(format!("{url}/x"))
                .header("host", "api.example.com")
                .header("traceparent", format!("00-{TRACE}-{PARENT_SPAN}-01"));
            for f in fields {
                req = req.header("tracestate", f);
            }
            let req = req.body(crate::support::empty()).expect("request");
            let resp = http1_client().request(req).await.expect("a response");
            assert_eq!(resp.status(), 200);
            let _ = crate::support::text(resp).await;
        }
    };
    let invalid = |server: &tailguard_proxy::Server| {
        metrics_text(server)
            .lines()
            .find_map(|l| {
                l.strip_prefix("tailguard_trace_context_invalid_total{header=\"tracestate\"} ")
            })
            .map(str::to_owned)
    };

    // Every key valid by Level 2 (none by Level 1's form): on as received, none counted.
    send_state(vec![
        "foo@=1,a@b@c=2".to_owned(),
        format!("0abc=3,{long}=4"),
    ])
    .await;
    // A forbidden member beside valid ones: only it is dropped, and the header is counted.
    send_state(vec![
        "foo@=1, Bad=2 ,a@b@c=3".to_owned(),
        format!("{long}=4,@x=5"),
    ])
    .await;
    let heads = up.heads();
    let states: Vec<Vec<&str>> = heads
        .iter()
        .map(|h| {
            h.get_all("tracestate")
                .iter()
                .map(|v| v.to_str().expect("ascii"))
                .collect()
        })
        .collect();
    assert_eq!(
        states,
        [
            vec![format!("foo@=1,a@b@c=2,0abc=3,{long}=4").as_str()],
            vec![format!("foo@=1,a@b@c=3,{long}=4").as_str()],
        ]
    );
    assert_eq!(invalid(&server).as_deref(), Some("1"));
}

#[tokio::test]
async fn a_malformed_traceparent_starts_a_new_trace_and_is_counted() {
    let receiver = OtlpReceiver::http().await;
    let up = recorder(200).await;
    let (server, url) = start(config(&gateway_config(
        &[up.addr],
        "",
        "",
        &receiver.endpoint(),
    )));
    let uppercase = format!("00-{}-{PARENT_SPAN}-01", TRACE.to_uppercase());
    assert_eq!(send(&url, Some(&uppercase)).await, 200);
    let (trace, _, flags) = parts(up.seen()[0].as_deref().expect("a traceparent"));
    assert_ne!(trace, TRACE.to_lowercase());
    assert_eq!(
        flags, "01",
        "a new trace, sampled (sample_ratio defaults to 1.0)"
    );
    let spans = receiver.wait_for(WAIT, |s| s.len() == 2).await;
    assert!(
        by_kind(&spans, SERVER)[0].parent_span_id.is_empty(),
        "a root span"
    );
    assert!(
        metrics_text(&server)
            .contains("tailguard_trace_context_invalid_total{header=\"traceparent\"} 1"),
        "{}",
        metrics_text(&server)
    );
}

#[tokio::test]
async fn a_route_with_tracing_off_passes_the_incoming_traceparent_unchanged() {
    let receiver = OtlpReceiver::http().await;
    let up = recorder(200).await;
    let text = gateway_config(&[up.addr], "tracing = false", "", &receiver.endpoint());
    let (server, url) = start(config(&text));
    let incoming = format!("00-{TRACE}-{PARENT_SPAN}-01");
    assert_eq!(send(&url, Some(&incoming)).await, 200);
    assert_eq!(send(&url, None).await, 200);
    assert_eq!(up.seen(), [Some(incoming), None]);
    server.gateway().flush_traces().await;
    assert_eq!(receiver.spans().len(), 0, "no span for an untraced route");
}

#[tokio::test]
async fn a_route_with_its_own_ratio_samples_by_it() {
    // New traces: none sampled by the tracing table's ratio, all by the route's own.
    let receiver = OtlpReceiver::http().await;
    let up = recorder(200).await;
    let text = gateway_config(
        &[up.addr],
        "tracing = { sample_ratio = 1.0 }",
        "sample_ratio = 0.0",
        &receiver.endpoint(),
    );
    let (server, url) = start(config(&text));
    assert_eq!(send(&url, None).await, 200);
    let (_, _, flags) = parts(up.seen()[0].as_deref().expect("a traceparent"));
    assert_eq!(flags, "01", "the route's ratio sampled it");
    let spans = receiver.wait_for(WAIT, |s| s.len() == 2).await;
    assert_eq!(by_kind(&spans, SERVER).len(), 1);

    // And the other way round, on the same gateway after a reload.
    let text = gateway_config(
        &[up.addr],
        "tracing = { sample_ratio = 0.0 }",
        "sample_ratio = 1.0",
        &receiver.endpoint(),
    );
    server.reload(config(&text)).expect("reload");
    assert_eq!(send(&url, None).await, 200);
    let (_, _, flags) = parts(up.seen()[1].as_deref().expect("a traceparent"));
    assert_eq!(flags, "00", "the route's ratio did not sample it");
    server.gateway().flush_traces().await;
    assert_eq!(receiver.spans().len(), 2, "no span more");
}

#[tokio::test]
async fn unsampled_requests_are_exported_only_when_they_fail() {
    let receiver = OtlpReceiver::http().await;
    let ok = recorder(200).await;
    let (server, url) = start(config(&gateway_config(
        &[ok.addr],
        "",
        "sample_ratio = 0.0",
        &receiver.endpoint(),
    )));
    // New traces are not sampled; the upstream is told so.
    assert_eq!(send(&url, None).await, 200);
    let (_, _, flags) = parts(ok.seen()[0].as_deref().expect("a traceparent"));
    assert_eq!(flags, "00");
    server.gateway().flush_traces().await;
    assert_eq!(receiver.spans().len(), 0);

    // The same gateway with a failing upstream (a reload keeps the exporter and its
    // queue): the 503 is kept by the tail rule although the head said no.
    let failing = recorder(503).await;
    server
        .reload(config(&gateway_config(
            &[failing.addr],
            "",
            "sample_ratio = 0.0",
            &receiver.endpoint(),
        )))
        .expect("reload");
    assert_eq!(send(&url, None).await, 503);
    let (_, _, flags) = parts(failing.seen()[0].as_deref().expect("a traceparent"));
    assert_eq!(flags, "00", "the upstream was told not sampled");
    let spans = receiver.wait_for(WAIT, |s| s.len() == 2).await;
    let server_span = by_kind(&spans, SERVER)[0];
    assert_eq!(server_span.status.as_ref().map(|s| s.code), Some(2));
    assert_eq!(attr_str(server_span, "error.type").as_deref(), Some("503"));
}

#[tokio::test]
async fn a_rate_limited_request_gets_a_server_span_that_says_why() {
    let receiver = OtlpReceiver::http().await;
    let up = recorder(200).await;
    let (server, url) = start(config(&gateway_config(
        &[up.addr],
        "rate_limit = { rate = 1, per = \"hour\", burst = 1, key = \"route\" }",
        "sample_ratio = 0.0",
        &receiver.endpoint(),
    )));
    // One connection: the limited request is served by the thread that served the first,
    // right after it (when traces were boxes the thread reused, it got the first one's box;
    // that request's try must not come back as a span of this one).
    let client = http1_client();
    assert_eq!(send_with(&client, &url, None).await, 200);
    assert_eq!(send_with(&client, &url, None).await, 429);
    let spans = receiver.wait_for(WAIT, |s| !s.is_empty()).await;
    assert_eq!(
        spans.len(),
        1,
        "only the limited request, kept by the tail rule, and no try of the request before"
    );
    assert_eq!(spans[0].kind, SERVER);
    assert_eq!(
        attr_str(&spans[0], "tailguard.outcome").as_deref(),
        Some("rate_limited")
    );
    assert_eq!(attr_int(&spans[0], "http.response.status_code"), Some(429));
    drop(server);
}

#[tokio::test]
async fn a_dead_collector_leaves_requests_unaffected_and_counts_the_drops() {
    // A port bound and never listened on: every export's connect is refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let up = recorder(200).await;
    let (server, url) = start(config(&gateway_config(
        &[up.addr],
        "",
        "queue_max_spans = 64\nbatch_max_spans = 16",
        &format!("http://{dead_addr}"),
    )));
    for _ in 0..200 {
        assert_eq!(send(&url, None).await, 200);
    }
    server.gateway().flush_traces().await;
    let text = metrics_text(&server);
    let dropped: u64 = text
        .lines()
        .filter(|l| l.starts_with("tailguard_trace_spans_dropped_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(dropped, 400, "every span dropped and counted:\n{text}");
    assert!(
        text.contains("tailguard_trace_spans_exported_total 0"),
        "{text}"
    );
}

#[tokio::test]
async fn a_grpc_call_gets_rpc_attributes_and_its_status() {
    use tailguard_test_support::grpc::{GrpcClient, GrpcUpstream, Msg};
    let receiver = OtlpReceiver::http().await;
    let upstream = GrpcUpstream::start().await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\n\
         endpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"grpc\"\nupstream = \"up\"\n\n\
         [tracing]\nendpoint = \"{}\"\nbatch_interval_ms = 20\n",
        upstream.addr,
        receiver.endpoint()
    );
    let (server, url) = start(config(&text));
    let mut client = tokio::time::timeout(WAIT, GrpcClient::connect(&url))
        .await
        .expect("connects");
    let resp = tokio::time::timeout(WAIT, client.unary(Msg::new("hello", 1), None))
        .await
        .expect("within the deadline")
        .expect("the call succeeds");
    assert_eq!(resp.get_ref(), &Msg::new("hello", 1));
    let spans = receiver.wait_for(WAIT, |s| s.len() == 2).await;
    let server_span = by_kind(&spans, SERVER)[0];
    assert_eq!(attr_str(server_span, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attr_str(server_span, "rpc.service").as_deref(),
        Some("test.Echo")
    );
    assert_eq!(
        attr_str(server_span, "rpc.method").as_deref(),
        Some("Unary")
    );
    assert_eq!(attr_int(server_span, "rpc.grpc.status_code"), Some(0));
    assert_eq!(
        attr_str(server_span, "network.protocol.version").as_deref(),
        Some("2")
    );
    let client_span = by_kind(&spans, CLIENT)[0];
    assert_eq!(client_span.parent_span_id, server_span.span_id);
    drop(server);
}

/// Sends one request through a gateway whose `[tracing]` exports to a TLS collector over
/// `protocol`, trusting it through `tls = { ca = ... }`: the request's spans arrive.
async fn spans_reach_a_tls_collector(protocol: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("collector ca");
    let ca_path = dir.path().join("collector-ca.pem");
    ca.write(&ca_path);
    let server_tls = ca.issue(&["127.0.0.1"]).server_config(None);
    let receiver = match protocol {
        "grpc" => OtlpReceiver::grpc_tls(server_tls).await,
        _ => OtlpReceiver::http_tls(server_tls).await,
    };
    let collector = receiver.endpoint();
    assert!(collector.starts_with("https://"), "{collector}");
    let up = recorder(200).await;
    let (server, url) = start(config(&gateway_config(
        &[up.addr],
        "",
        &format!(
            "protocol = \"{protocol}\"\ntls = {{ ca = \"{}\" }}",
            ca_path.display()
        ),
        &collector,
    )));
    let incoming = format!("00-{TRACE}-{PARENT_SPAN}-01");
    assert_eq!(send(&url, Some(&incoming)).await, 200);

    let spans = receiver.wait_for(WAIT, |s| s.len() == 2).await;
    let server_span = by_kind(&spans, SERVER)[0];
    assert_eq!(hex(&server_span.trace_id), TRACE);
    assert_eq!(server_span.name, "GET api");
    assert_eq!(
        attr_str(server_span, "tailguard.outcome").as_deref(),
        Some("forwarded")
    );
    assert_eq!(by_kind(&spans, CLIENT).len(), 1);
    assert_eq!(receiver.tls_failures(), 0);
    // The exporter counts an export once the collector's answer is read: after the flush.
    server.gateway().flush_traces().await;
    let text = metrics_text(&server);
    for line in [
        "tailguard_trace_spans_exported_total 2",
        "tailguard_trace_export_errors_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    drop(server);
}

#[tokio::test]
async fn spans_reach_an_https_collector_trusted_through_tracing_tls_ca() {
    spans_reach_a_tls_collector("http/protobuf").await;
}

#[tokio::test]
async fn spans_reach_a_grpc_collector_over_tls_trusted_through_tracing_tls_ca() {
    spans_reach_a_tls_collector("grpc").await;
}

/// An upstream that holds every request until [`Held::release`], counting arrivals.
struct Held {
    addr: SocketAddr,
    arrived: Arc<AtomicUsize>,
    arrival: Arc<tokio::sync::Notify>,
    release: tokio::sync::watch::Sender<bool>,
}

async fn held() -> Held {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let arrived = Arc::new(AtomicUsize::new(0));
    let arrival = Arc::new(tokio::sync::Notify::new());
    let (release, released) = tokio::sync::watch::channel(false);
    let (a, n) = (Arc::clone(&arrived), Arc::clone(&arrival));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (a, n, released) = (Arc::clone(&a), Arc::clone(&n), released.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
                    a.fetch_add(1, Ordering::SeqCst);
                    n.notify_waiters();
                    let mut released = released.clone();
                    async move {
                        let _ = released.wait_for(|r| *r).await;
                        Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::from_static(
                            b"ok",
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Held {
        addr,
        arrived,
        arrival,
        release,
    }
}

impl Held {
    fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    fn release(&self) {
        let _ = self.release.send(true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_request_gets_a_server_span_that_says_why() {
    let receiver = OtlpReceiver::http().await;
    let up = held().await;
    // The route group's shedder alone (no CPU trigger, no upstream limit, no breaker), the
    // route in the low class (half the cap): it sheds once in-flight passes its cap, at the
    // latest past twice the cap, whatever the timing. Nothing is sampled at the head.
    let (server, url) = start(config(&gateway_config(
        &[up.addr],
        "",
        "sample_ratio = 0.0\n\n\
         [overload]\nmode = \"adaptive\"\ncpu_trigger = false\nupstream_limit = false\n\
         breaker = false\n\n[overload.classes]\napi = \"low\"",
        &receiver.endpoint(),
    )));
    let snapshot = server.gateway().snapshot();
    let shedder = snapshot.overload.shedder().expect("shedding is on");
    let group = shedder.group("api");
    // Until the sampler's first ticks the cap is infinite; with no history then C = 10.
    let until = tokio::time::Instant::now() + WAIT;
    while group.snapshot(Duration::ZERO).capacity != 10.0 {
        assert!(
            tokio::time::Instant::now() < until,
            "the shedder never ticked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // At the latest past twice the low class's cap (`hard_cap·C + cores`, halved).
    let capacity = group.snapshot(Duration::ZERO).capacity;
    let cfg = shedder.config();
    let low_cap = (cfg.hard_cap * capacity + shedder.cores()) * cfg.multipliers[0];
    let bound = (2.0 * low_cap) as usize + 2;

    // One request at a time, each held by the upstream once admitted, until one is shed.
    let mut admitted = Vec::new();
    let shed_at = 'sending: loop {
        assert!(
            admitted.len() < bound,
            "{bound} requests in flight and none shed"
        );
        let url = url.clone();
        let mut request = tokio::spawn(async move { send(&url, None).await });
        let until = tokio::time::Instant::now() + WAIT;
        loop {
            let arrival = up.arrival.notified();
            if up.arrived() > admitted.len() {
                admitted.push(request);
                break;
            }
            tokio::select! {
                status = &mut request => {
                    assert_eq!(status.expect("the request task"), 503, "refused by the shedder");
                    break 'sending admitted.len();
                }
                () = arrival => {}
                () = tokio::time::sleep_until(until) => {
                    panic!("request {} neither arrived nor was answered", admitted.len());
                }
            }
        }
    };
    assert_eq!(
        up.arrived(),
        shed_at,
        "the shed request never reached the upstream"
    );
    up.release();
    for r in admitted {
        assert_eq!(r.await.expect("the request task"), 200);
    }

    server.gateway().flush_traces().await;
    let spans = receiver.wait_for(WAIT, |s| !s.is_empty()).await;
    assert_eq!(
        spans.len(),
        1,
        "only the shed request, kept by the tail rule: {spans:#?}"
    );
    let span = &spans[0];
    assert_eq!(span.kind, SERVER);
    assert_eq!(span.name, "GET api");
    assert_eq!(attr_str(span, "http.route").as_deref(), Some("api"));
    assert_eq!(attr_str(span, "tailguard.outcome").as_deref(), Some("shed"));
    assert_eq!(attr_int(span, "http.response.status_code"), Some(503));
    assert_eq!(
        span.status.as_ref().map(|s| s.code),
        Some(2),
        "status Error"
    );
    assert_eq!(attr_str(span, "error.type").as_deref(), Some("overloaded"));
    assert_eq!(attr_int(span, "tailguard.tries"), None, "no upstream try");
    let text = metrics_text(&server);
    for line in [
        "tailguard_overload_shed_total{group=\"api\",class=\"low\"} 1.0",
        // Counted under the route it was shed from, not as a request that matched none.
        "tailguard_requests_total{route=\"api\",method=\"GET\",status=\"503\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    drop(server);
}
