//! Tracing end to end (issue 24): requests through the built gateway, their spans read back
//! from a real Jaeger v2, what the upstream received, the access log's ids, and collectors
//! that are down, failing or stalled.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tailguard_test_support::free_port;
use tailguard_test_support::jaeger::{Jaeger, Span, Trace};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpListener;

use crate::support::Gateway;

/// How long a span may take to reach Jaeger: the gateway exports every 100 ms here
/// (`batch_interval_ms`), Jaeger's batch processor stores within 200 ms; the rest is slack
/// for a loaded machine.
const EXPORTED_WITHIN: Duration = Duration::from_secs(30);

/// One request as an upstream received it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    /// Field names in lower case.
    headers: HashMap<String, String>,
    /// What it answered.
    status: u16,
}

/// An HTTP/1.1 upstream that answers the first request for each path `503` and every later
/// one `200`, recording every request: a retry of the first try succeeds.
struct FlakyUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FlakyUpstream {
    async fn start() -> FlakyUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut read = BufReader::new(read);
                    while let Some((path, headers)) = read_head(&mut read).await {
                        let status = {
                            let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                            let status = if log.iter().any(|s| s.path == path) {
                                200
                            } else {
                                503
                            };
                            log.push(Seen {
                                path,
                                headers,
                                status,
                            });
                            status
                        };
                        let answer = if status == 200 {
                            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n"
                        } else {
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
                        };
                        if write.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FlakyUpstream { addr, seen }
    }

    fn seen(&self, path: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|s| s.path == path)
            .cloned()
            .collect()
    }
}

/// A request head (a `GET`: no body), or `None` at the end of the connection.
async fn read_head<R: tokio::io::AsyncBufRead + Unpin>(
    read: &mut R,
) -> Option<(String, HashMap<String, String>)> {
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let path = line.split(' ').nth(1)?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut field = String::new();
        if read.read_line(&mut field).await.ok()? == 0 {
            return None;
        }
        let field = field.trim_end();
        if field.is_empty() {
            break;
        }
        let (name, value) = field.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    read.read_exact(&mut body).await.ok()?;
    Some((path, headers))
}

/// A gateway config in `dir`: route `all` to `upstream` with `retry`, tracing to
/// `endpoint` (exports every 100 ms) with `tracing_extra` in `[tracing]`; its path.
fn config(
    dir: &std::path::Path,
    upstream: SocketAddr,
    retry: &str,
    endpoint: &str,
    tracing_extra: &str,
) -> String {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"flaky\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"flaky\"\npath = {{ prefix = \"/\" }}\n\
         retry = {retry}\n\n\
         [tracing]\nendpoint = \"{endpoint}\"\nbatch_interval_ms = 100\n{tracing_extra}\n"
    );
    let path = dir.join("gateway.toml");
    std::fs::write(&path, text).expect("write the config");
    path.display().to_string()
}

/// Retry a `503` once.
const RETRY_503: &str = "{ attempts = 2, on = [\"503\"] }";
/// No retry at all.
const NO_RETRY: &str = "{ attempts = 1 }";

/// `tailguard run` with `config`, a JSON access log in `dir`, the exporter on a free port.
fn gateway(config: &str, dir: &std::path::Path) -> Gateway {
    let log = dir.join("access.json");
    Gateway::run(&[
        "--config",
        config,
        "--threads",
        "1",
        "--access-log",
        log.to_str().expect("utf-8 path"),
        "--access-log-format",
        "json",
        "--metrics-listen",
        "127.0.0.1:0",
    ])
}

/// The exporter address the gateway logged.
fn metrics_addr(gateway: &Gateway) -> String {
    gateway.wait_for_log("/metrics", Duration::from_secs(20));
    gateway
        .log()
        .split("tailguard: metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .map(str::to_owned)
        .expect("metrics address in the log")
}

/// The sum of every series of `name` (any labels) whose labels contain `labels`.
fn metric(exposition: &str, name: &str, labels: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn scrape(addr: &str) -> String {
    let addr: SocketAddr = addr.parse().expect("exporter address");
    let (status, body) = tailguard_test_support::jaeger::get(addr, "/metrics")
        .await
        .expect("scrape the exporter");
    assert_eq!(status, 200, "{body}");
    body
}

/// The access log's JSON lines so far (the writer flushes idle buffers every second).
fn access_lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("access.json"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Waits for the access-log line of `path`.
async fn access_line(dir: &std::path::Path, path: &str) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(line) = access_lines(dir)
            .into_iter()
            .find(|l| l["request_uri"] == path)
        {
            return line;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no access-log line for {path}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET path` from the gateway at `addr` with extra header lines, on a connection of its
/// own (`Connection: close`); the status.
async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {text:?}"))
}

/// `traceparent`'s parts: trace id, parent id, flags.
fn traceparent(value: &str) -> (String, String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {value:?}");
    assert_eq!(parts[0], "00", "version 00: {value:?}");
    (
        parts[1].to_owned(),
        parts[2].to_owned(),
        parts[3].to_owned(),
    )
}

fn tag(span: &Span, key: &str) -> String {
    span.tag(key)
        .unwrap_or_else(|| panic!("span {} has no {key}: {:#?}", span.name, span.tags))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_is_one_server_span_with_a_client_span_per_try_under_its_caller() {
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    let upstream = FlakyUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(
        dir.path(),
        upstream.addr,
        RETRY_503,
        &jaeger.otlp_http_url(),
        "",
    );
    let gw = gateway(&config, dir.path());

    // The W3C example's caller, sampled.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let status = get_with(
        gw.addr,
        "/users/7?x=1",
        &[
            ("traceparent", &format!("00-{trace_id}-{caller}-01")),
            ("tracestate", "vendor=abc"),
        ],
    )
    .await;
    assert_eq!(status, 200, "the retry answered:\n{}", gw.log());

    let trace: Trace = jaeger
        .wait_trace(trace_id, EXPORTED_WITHIN, |t| t.spans.len() >= 3)
        .await;
    assert_eq!(trace.spans.len(), 3, "{trace:#?}");
    let servers = trace.spans_of_kind("server");
    assert_eq!(servers.len(), 1, "{trace:#?}");
    let server = servers[0];
    assert_eq!(
        server.parent_span_id.as_deref(),
        Some(caller),
        "the caller is the parent"
    );
    assert_eq!(server.service, "tailguard");
    assert_eq!(tag(server, "http.request.method"), "GET");
    assert_eq!(tag(server, "http.route"), "all");
    assert_eq!(tag(server, "http.response.status_code"), "200");
    assert_eq!(tag(server, "url.path"), "/users/7");
    assert_eq!(tag(server, "network.protocol.version"), "1.1");
    assert_eq!(tag(server, "client.address"), "127.0.0.1");
    assert!(!server.tags.contains_key("error.type"), "{server:#?}");
    for key in ["service.instance.id", "host.name"] {
        assert!(
            server.process_tags.contains_key(key),
            "resource {key}: {server:#?}"
        );
    }

    // One client span per try, both under the server span, in order.
    let clients = trace.spans_of_kind("client");
    assert_eq!(clients.len(), 2, "{trace:#?}");
    for client in &clients {
        assert_eq!(
            client.parent_span_id.as_deref(),
            Some(server.span_id.as_str())
        );
        assert_eq!(tag(client, "server.address"), "127.0.0.1");
        assert_eq!(tag(client, "server.port"), upstream.addr.port().to_string());
    }
    assert_eq!(tag(clients[0], "http.response.status_code"), "503");
    assert_eq!(tag(clients[0], "tailguard.try"), "1");
    assert!(!clients[0].tags.contains_key("tailguard.retry_reason"));
    assert_eq!(tag(clients[0], "error.type"), "503");
    assert_eq!(tag(clients[1], "http.response.status_code"), "200");
    assert_eq!(tag(clients[1], "tailguard.try"), "2");
    assert_eq!(tag(clients[1], "tailguard.retry_reason"), "503");
    assert_eq!(server.name, "GET all");
    assert_eq!(tag(server, "tailguard.tries"), "2");
    assert_eq!(tag(server, "tailguard.outcome"), "forwarded");

    // Each try's traceparent names that try's client span, same trace, still sampled; the
    // caller's tracestate goes along.
    let seen = upstream.seen("/users/7?x=1");
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert_eq!((seen[0].status, seen[1].status), (503, 200));
    for (try_, client) in seen.iter().zip(&clients) {
        let (tid, parent, flags) = traceparent(&try_.headers["traceparent"]);
        assert_eq!(tid, trace_id);
        assert_eq!(
            parent, client.span_id,
            "the try's parent is its client span"
        );
        assert_eq!(flags, "01");
        assert_eq!(
            try_.headers.get("tracestate").map(String::as_str),
            Some("vendor=abc")
        );
    }

    // The access log names the same trace and the server span.
    let line = access_line(dir.path(), "/users/7?x=1").await;
    assert_eq!(line["trace_id"], trace_id, "{line}");
    assert_eq!(line["span_id"], server.span_id.as_str(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_is_exported_even_when_the_head_decision_said_no() {
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    // Every path fails on its first try; without a retry the 503 goes to the client.
    let upstream = FlakyUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(
        dir.path(),
        upstream.addr,
        NO_RETRY,
        &jaeger.otlp_http_url(),
        "sample_ratio = 0.0",
    );
    let gw = gateway(&config, dir.path());

    // Warm the path: its first try is the 503; later ones are 200s, not sampled.
    assert_eq!(get_with(gw.addr, "/ok", &[]).await, 503);
    assert_eq!(get_with(gw.addr, "/ok", &[]).await, 200);
    // A caller that decided not to sample, and a new trace the ratio (0) leaves out: both
    // fail, so both are kept.
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let caller = "b7ad6b7169203331";
    assert_eq!(
        get_with(
            gw.addr,
            "/fails/1",
            &[("traceparent", &format!("00-{trace_id}-{caller}-00"))]
        )
        .await,
        503
    );
    assert_eq!(get_with(gw.addr, "/fails/2", &[]).await, 503);

    let kept = jaeger
        .wait_trace(trace_id, EXPORTED_WITHIN, |t| t.spans.len() >= 2)
        .await;
    let server = kept.spans_of_kind("server")[0].clone();
    assert_eq!(server.parent_span_id.as_deref(), Some(caller));
    assert_eq!(tag(&server, "http.response.status_code"), "503");
    assert_eq!(tag(&server, "error.type"), "503");
    // The upstream was told what the head decided (not sampled): it learns of the keep only
    // from the collector.
    let seen = upstream.seen("/fails/1");
    let (tid, parent, flags) = traceparent(&seen[0].headers["traceparent"]);
    assert_eq!((tid.as_str(), flags.as_str()), (trace_id, "00"));
    assert_eq!(
        Some(parent.as_str()),
        kept.spans_of_kind("client")
            .first()
            .map(|c| c.span_id.as_str())
    );

    let new_trace = access_line(dir.path(), "/fails/2").await;
    let new_trace = new_trace["trace_id"]
        .as_str()
        .expect("a trace id")
        .to_owned();
    jaeger
        .wait_trace(&new_trace, EXPORTED_WITHIN, |t| {
            !t.spans_of_kind("server").is_empty()
        })
        .await;

    // The successful, unsampled request was recorded before the failures on the one serving
    // thread, so it would have been exported with them or earlier: it was not.
    let ok_line = access_lines(dir.path())
        .into_iter()
        .find(|l| l["request_uri"] == "/ok" && l["status"] == 200)
        .expect("the 200's line");
    let ok_trace = ok_line["trace_id"].as_str().expect("a trace id");
    assert!(
        jaeger.trace(ok_trace).await.is_none(),
        "an unsampled 200 is not exported"
    );
}

/// How a collector that is not Jaeger misbehaves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Collector {
    /// Nothing listens on its port: every connect is refused.
    Down,
    /// Reads every export and answers `503 Service Unavailable` (retryable, per OTLP).
    Unavailable,
    /// Accepts and reads, never answers.
    Stalled,
}

/// Starts `kind` on 127.0.0.1 and returns its endpoint and the count of export requests it
/// read in full.
async fn bad_collector(kind: Collector) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    if kind == Collector::Down {
        // Reserved for this process and outside the ephemeral range: nothing binds it.
        return (format!("http://127.0.0.1:{}", free_port()), requests);
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let counter = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                while read_head(&mut read).await.is_some() {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if kind == Collector::Unavailable {
                        let answer =
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
                        if write.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    // Stalled: keep reading (the connection stays open), answer nothing.
                }
            });
        }
    });
    (format!("http://{addr}"), requests)
}

/// Requests through a gateway whose collector misbehaves: every one answered as without
/// tracing, the span queue within its bound throughout, and in the end every span counted as
/// dropped (none exported), the queue empty.
async fn requests_are_unaffected_by(kind: Collector) {
    const REQUESTS: usize = 300;
    // Four of the recorder's 64-span buffers; 600 spans are sent, more than fit. The bound
    // is the queue plus the one batch the exporter holds while it tries to send it.
    const QUEUE: f64 = 256.0;
    const BATCH: f64 = 64.0;
    // Always 200, no retry: a retry per request would soon meet the upstream's retry budget.
    let upstream = tailguard_test_support::Upstream::start().await;
    let (endpoint, exports) = bad_collector(kind).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(
        dir.path(),
        upstream.addr,
        NO_RETRY,
        &endpoint,
        "queue_max_spans = 256\nbatch_max_spans = 64\ntimeout_ms = 300",
    );
    let gw = gateway(&config, dir.path());
    let metrics = metrics_addr(&gw);

    for i in 0..REQUESTS {
        // A SERVER and a CLIENT span a request.
        let status = get_with(gw.addr, &format!("/r/{i}"), &[]).await;
        assert_eq!(
            status,
            200,
            "request {i} with the collector {kind:?}:\n{}",
            gw.log()
        );
        if i % 25 == 0 {
            let queue = metric(&scrape(&metrics).await, "tailguard_trace_queue_spans", "");
            assert!(
                queue <= QUEUE + BATCH,
                "{queue} spans queued, bound {QUEUE} + a batch of {BATCH}"
            );
        }
    }

    let spans = (REQUESTS * 2) as f64;
    let start = Instant::now();
    loop {
        let text = scrape(&metrics).await;
        let dropped = metric(&text, "tailguard_trace_spans_dropped_total", "");
        let exported = metric(&text, "tailguard_trace_spans_exported_total", "");
        let queue = metric(&text, "tailguard_trace_queue_spans", "");
        assert_eq!(
            exported, 0.0,
            "nothing reaches a {kind:?} collector:\n{text}"
        );
        if dropped == spans && queue == 0.0 {
            // Those whose export failed are among them (how many found no room in the queue
            // depends on how soon the exporter gives up a batch: not asserted).
            assert!(
                metric(
                    &text,
                    "tailguard_trace_spans_dropped_total",
                    "reason=\"export_failed\""
                ) > 0.0,
                "{text}"
            );
            assert!(
                metric(&text, "tailguard_trace_export_errors_total", "") > 0.0,
                "{text}"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "every span is dropped and counted in the end ({dropped} of {spans}, {queue} queued):\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if kind == Collector::Unavailable {
        // A 503 is retryable: each batch was tried more than once.
        let sent = exports.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent >= 2, "{sent} export requests");
    }
    if kind == Collector::Stalled {
        assert!(exports.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_the_requests_nothing() {
    requests_are_unaffected_by(Collector::Down).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_answers_503_costs_the_requests_nothing() {
    requests_are_unaffected_by(Collector::Unavailable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_stalls_costs_the_requests_nothing() {
    requests_are_unaffected_by(Collector::Stalled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_grpc_call_over_http2_is_kept_with_its_rpc_attributes() {
    use tailguard_test_support::grpc::{GrpcClient, GrpcUpstream, Msg};
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    let upstream = GrpcUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"grpc\"\nprotocol = \"h2c\"\n\
         endpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"echo\"\nupstream = \"grpc\"\npath = {{ prefix = \"/test.Echo\" }}\n\n\
         [tracing]\nendpoint = \"{}\"\nprotocol = \"grpc\"\nbatch_interval_ms = 100\n\
         sample_ratio = 0.0\n",
        upstream.addr,
        jaeger.otlp_grpc_url()
    );
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, text).expect("write the config");
    let gw = gateway(config.to_str().expect("utf-8"), dir.path());

    let mut client = GrpcClient::connect(&gw.url()).await;
    let ok = client.unary(Msg::new("hello", 1), None).await;
    assert!(ok.is_ok(), "{ok:?}");
    // UNAVAILABLE from the upstream: a failure the tail rule keeps at sample_ratio 0.
    let failed = client.unary(Msg::new("fail:down", 14), None).await;
    assert_eq!(failed.expect_err("the upstream's error").code() as i32, 14);

    let lines = {
        let start = Instant::now();
        loop {
            let lines: Vec<serde_json::Value> = access_lines(dir.path())
                .into_iter()
                .filter(|l| l["request_uri"] == "/test.Echo/Unary")
                .collect();
            if lines.len() == 2 {
                break lines;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "{lines:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let id_of = |code: u64| {
        lines
            .iter()
            .find(|l| l["grpc_status"] == code)
            .and_then(|l| l["trace_id"].as_str())
            .unwrap_or_else(|| panic!("the call that ended {code}: {lines:?}"))
            .to_owned()
    };
    let trace = jaeger
        .wait_trace(&id_of(14), EXPORTED_WITHIN, |t| t.spans.len() >= 2)
        .await;
    let server = trace.spans_of_kind("server")[0].clone();
    assert_eq!(tag(&server, "rpc.system"), "grpc");
    assert_eq!(tag(&server, "rpc.service"), "test.Echo");
    assert_eq!(tag(&server, "rpc.method"), "Unary");
    assert_eq!(tag(&server, "rpc.grpc.status_code"), "14");
    // A failed call ends with HTTP 200: the error's type is the gRPC status, by name.
    assert_eq!(tag(&server, "error.type"), "UNAVAILABLE");
    assert_eq!(tag(&server, "network.protocol.version"), "2");
    assert_eq!(tag(&server, "http.route"), "echo");
    assert_eq!(tag(&server, "otel.status_code"), "ERROR");
    let clients = trace.spans_of_kind("client");
    assert_eq!(clients.len(), 1, "{trace:#?}");
    assert_eq!(
        clients[0].parent_span_id.as_deref(),
        Some(server.span_id.as_str())
    );
    assert_eq!(
        tag(clients[0], "server.port"),
        upstream.addr.port().to_string()
    );

    // The call that succeeded was not sampled (ratio 0) and is not kept.
    assert!(jaeger.trace(&id_of(0)).await.is_none());
}
