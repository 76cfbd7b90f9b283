//! TLS to the collector: the exporter against real OTLP receivers (HTTP and gRPC) served over
//! TLS with certificates from a fresh test CA. Trusted through `tls.ca`, spans arrive; a
//! collector signed by another CA gets nothing and the failures are counted; a collector that
//! requires a client certificate gets the one in `tls.cert`/`tls.key`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tailguard_metrics::{Format, Registry};
use tailguard_test_support::TestCa;
use tailguard_test_support::otlp::{OtlpReceiver, attr_str};
use tailguard_trace::{
    DropReason, ExportConfig, Exporter, Protocol, Retry, Span, SpanContext, SpanId, SpanKind,
    TlsFiles, TraceId, TraceMetrics,
};

const WAIT: Duration = Duration::from_secs(10);

/// Retries after the first attempt, in every test here: a refused batch costs three attempts.
const RETRIES: u32 = 2;

fn span(i: i64) -> Span {
    let ctx = SpanContext {
        trace_id: TraceId::random(),
        span_id: SpanId::random(),
        sampled: true,
    };
    let mut s = Span::new(SpanKind::Server, &ctx, None);
    s.set_name("GET");
    s.start_unix_nanos = 1_000;
    s.end_unix_nanos = 2_000;
    s.int("n", i);
    s.bytes("url.path", b"/tls");
    s
}

fn config(receiver: &OtlpReceiver, protocol: Protocol, tls: TlsFiles) -> ExportConfig {
    let mut c = ExportConfig::new(receiver.endpoint(), "tls-test");
    c.protocol = protocol;
    c.tls = tls;
    c.batch_interval = Duration::from_millis(50);
    // Generous: a debug build's handshake on a busy machine must not time out.
    c.timeout = Duration::from_secs(5);
    c.retry = Retry {
        max_retries: RETRIES,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
    };
    c
}

/// A server certificate for 127.0.0.1 (the endpoint's host) from `ca`.
fn server_config(ca: &TestCa, client_ca: Option<&TestCa>) -> rustls::ServerConfig {
    ca.issue(&["127.0.0.1"]).server_config(client_ca)
}

fn write_ca(ca: &TestCa, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    ca.write(&path);
    path
}

/// Trace metrics in a registry of their own, and the registry to render them from.
fn metrics() -> (TraceMetrics, Registry) {
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .expect("a registry");
    let metrics = TraceMetrics::register(&registry).expect("the trace families register");
    (metrics, registry)
}

fn text(registry: &Registry) -> String {
    String::from_utf8(registry.render(Format::Text)).expect("the text exposition is UTF-8")
}

/// Records three spans, flushes, and checks they arrived whole at `receiver`, with no
/// export error and no failed handshake on the way.
async fn three_spans_arrive(receiver: &OtlpReceiver, c: ExportConfig) {
    let failures = receiver.tls_failures();
    let (metrics, registry) = metrics();
    let exporter = Exporter::start(c, metrics.clone()).expect("starts");
    let sent: Vec<Span> = (0..3).map(span).collect();
    for s in &sent {
        exporter.tracer().record(s);
    }
    exporter.flush().await;
    let spans = receiver.wait_for(WAIT, |s| s.len() == 3).await;
    for s in &sent {
        let got = spans
            .iter()
            .find(|p| p.span_id == s.span_id.0)
            .expect("every span arrives");
        assert_eq!(got.trace_id, s.trace_id.0);
        assert_eq!(got.name, "GET");
        assert_eq!(attr_str(got, "url.path").as_deref(), Some("/tls"));
    }
    assert_eq!(metrics.exported_total(), 3);
    let text = text(&registry);
    assert!(
        text.lines()
            .any(|l| l == "tailguard_trace_export_errors_total 0"),
        "{text}"
    );
    assert_eq!(receiver.tls_failures(), failures, "no handshake failed");
    exporter.shutdown();
}

#[tokio::test]
async fn http_export_over_tls_reaches_a_collector_trusted_through_tls_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("collector ca");
    let receiver = OtlpReceiver::http_tls(server_config(&ca, None)).await;
    assert!(receiver.endpoint().starts_with("https://127.0.0.1:"));
    let tls = TlsFiles {
        ca: Some(write_ca(&ca, dir.path(), "ca.pem")),
        ..TlsFiles::default()
    };
    three_spans_arrive(&receiver, config(&receiver, Protocol::HttpProtobuf, tls)).await;
    assert_eq!(
        receiver.client_certs(),
        0,
        "no client certificate configured"
    );
}

#[tokio::test]
async fn grpc_export_over_tls_reaches_a_collector_trusted_through_tls_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("collector ca");
    let receiver = OtlpReceiver::grpc_tls(server_config(&ca, None)).await;
    let tls = TlsFiles {
        ca: Some(write_ca(&ca, dir.path(), "ca.pem")),
        ..TlsFiles::default()
    };
    three_spans_arrive(&receiver, config(&receiver, Protocol::Grpc, tls)).await;
    assert_eq!(
        receiver.client_certs(),
        0,
        "no client certificate configured"
    );
}

/// The value of the unlabelled counter `name` in `registry`.
fn counter(registry: &Registry, name: &str) -> u64 {
    let text = text(registry);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in:\n{text}"))
}

/// Exports five spans, then one, to a collector whose certificate `tls` does not let the
/// exporter accept (or that refuses the exporter's): nothing arrives, each attempt counts
/// as an export error, each batch is dropped as `export_failed` once its attempts are
/// spent (one to `1 + RETRIES`: whether the failure is worth a retry is the exporter's
/// choice, and over gRPC a refused client certificate surfaces as one status or another),
/// and the exporter goes on. Returns the export errors counted.
async fn refused(receiver: &OtlpReceiver, c: ExportConfig) -> u64 {
    let (metrics, registry) = metrics();
    let exporter =
        Exporter::start(c, metrics.clone()).expect("a collector's certificate is no start error");
    for i in 0..5 {
        exporter.tracer().record(&span(i));
    }
    // The flush ends once the batch is dropped after its attempts.
    exporter.flush().await;
    assert_eq!(receiver.attempts(), 0, "no export request got through");
    assert!(receiver.spans().is_empty());
    assert_eq!(metrics.exported_total(), 0);
    assert_eq!(metrics.dropped_total(DropReason::ExportFailed), 5);
    assert_eq!(metrics.queued(), 0, "the dropped spans left the queue");
    let text = text(&registry);
    for line in [
        "tailguard_trace_spans_dropped_total{reason=\"export_failed\"} 5",
        "tailguard_trace_spans_exported_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    let attempts = 1..=u64::from(RETRIES) + 1;
    let first = counter(&registry, "tailguard_trace_export_errors_total");
    assert!(attempts.contains(&first), "{first} export errors");
    // The exporter is still there: the next batch is tried (and refused) too.
    exporter.tracer().record(&span(9));
    exporter.flush().await;
    assert_eq!(metrics.dropped_total(DropReason::ExportFailed), 6);
    assert_eq!(metrics.exported_total(), 0);
    let errors = counter(&registry, "tailguard_trace_export_errors_total");
    assert!(
        attempts.contains(&(errors - first)),
        "{} export errors for the second batch",
        errors - first
    );
    exporter.shutdown();
    errors
}

#[tokio::test]
async fn http_export_to_a_collector_of_another_ca_is_refused_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trusted = TestCa::new("trusted ca");
    let other = TestCa::new("another ca");
    let receiver = OtlpReceiver::http_tls(server_config(&other, None)).await;
    let tls = TlsFiles {
        ca: Some(write_ca(&trusted, dir.path(), "ca.pem")),
        ..TlsFiles::default()
    };
    let errors = refused(&receiver, config(&receiver, Protocol::HttpProtobuf, tls)).await;
    assert_eq!(
        errors, 2,
        "a certificate the exporter refuses is not retried: one attempt per batch"
    );
    // Each attempt was one connection whose handshake the exporter broke off.
    let errors = usize::try_from(errors).expect("a small count");
    receiver.wait_for_tls_failures(errors, WAIT).await;
    assert_eq!(receiver.tls_failures(), errors);
}

#[tokio::test]
async fn grpc_export_to_a_collector_of_another_ca_is_refused_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trusted = TestCa::new("trusted ca");
    let other = TestCa::new("another ca");
    let receiver = OtlpReceiver::grpc_tls(server_config(&other, None)).await;
    let tls = TlsFiles {
        ca: Some(write_ca(&trusted, dir.path(), "ca.pem")),
        ..TlsFiles::default()
    };
    refused(&receiver, config(&receiver, Protocol::Grpc, tls)).await;
    receiver.wait_for_tls_failures(1, WAIT).await;
}

/// A collector that requires a client certificate from `client_ca`; the exporter trusts the
/// collector's CA and presents a certificate `client_ca` issued.
async fn mutual_tls(protocol: Protocol) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("collector ca");
    let client_ca = TestCa::new("client ca");
    let config_tls = server_config(&ca, Some(&client_ca));
    let receiver = match protocol {
        Protocol::HttpProtobuf => OtlpReceiver::http_tls(config_tls).await,
        Protocol::Grpc => OtlpReceiver::grpc_tls(config_tls).await,
    };
    let ca_path = write_ca(&ca, dir.path(), "ca.pem");
    let (cert, key) = client_ca.issue(&["gateway"]).write(dir.path(), "client");

    // Without a client certificate the collector refuses the handshake.
    let anonymous = TlsFiles {
        ca: Some(ca_path.clone()),
        ..TlsFiles::default()
    };
    refused(&receiver, config(&receiver, protocol, anonymous)).await;
    receiver.wait_for_tls_failures(1, WAIT).await;
    assert_eq!(receiver.client_certs(), 0);

    // With it, spans arrive, over connections that presented it.
    let with_cert = TlsFiles {
        ca: Some(ca_path),
        cert: Some(cert),
        key: Some(key),
    };
    three_spans_arrive(&receiver, config(&receiver, protocol, with_cert)).await;
    assert!(receiver.client_certs() >= 1);
}

#[tokio::test]
async fn http_export_presents_its_client_certificate_to_a_collector_that_requires_one() {
    mutual_tls(Protocol::HttpProtobuf).await;
}

#[tokio::test]
async fn grpc_export_presents_its_client_certificate_to_a_collector_that_requires_one() {
    mutual_tls(Protocol::Grpc).await;
}
