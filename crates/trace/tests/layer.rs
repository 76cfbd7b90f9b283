//! `TraceLayer` on a tower service: the incoming context continued, the handler handed its
//! span, the span exported when the body ends, failed requests kept by the tail rule.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt as _, Full};
use tailguard_test_support::otlp::{OtlpReceiver, attr_int, attr_str};
use tailguard_trace::{
    ContextHeader, CurrentSpan, ExportConfig, Exporter, Sampler, TraceLayer, TraceMetrics,
};
use tower::{Layer as _, Service as _, ServiceExt as _};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn handler(req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let span = req
        .extensions()
        .get::<CurrentSpan>()
        .cloned()
        .expect("the layer adds it");
    let status = if req.uri().path() == "/fail" {
        503
    } else {
        200
    };
    let mut resp = Response::new(Full::new(Bytes::from(span.context.trace_id.to_string())));
    *resp.status_mut() = http::StatusCode::from_u16(status).expect("status");
    Ok(resp)
}

#[tokio::test]
async fn the_layer_continues_the_trace_and_exports_a_server_span() {
    let receiver = OtlpReceiver::http().await;
    let mut config = ExportConfig::new(receiver.endpoint(), "layer-test");
    config.batch_interval = Duration::from_millis(50);
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(config, metrics.clone()).expect("starts");
    // New traces are never sampled: only the caller's flag and the tail rule export.
    let layer = TraceLayer::new(exporter.tracer()).sampler(Sampler::parent_based(0.0));
    let mut svc = layer.layer(tower::service_fn(handler));

    let req = Request::builder()
        .uri("/users/7")
        .header("host", "api.example.com:8080")
        .header("traceparent", PARENT)
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = svc
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect("response");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(
        &body[..],
        b"4bf92f3577b34da6a3ce929d0e0e4736",
        "the handler saw the trace"
    );

    // Unsampled and fine: not exported. Unsampled and failed: exported (tail rule).
    let req = |path: &str| {
        Request::builder()
            .uri(path)
            .header("traceparent", PARENT.replace("-01", "-00"))
            .body(Full::new(Bytes::new()))
            .expect("request")
    };
    for path in ["/ok", "/fail"] {
        let resp = svc
            .ready()
            .await
            .expect("ready")
            .call(req(path))
            .await
            .expect("response");
        resp.into_body().collect().await.expect("body");
    }
    // A malformed header starts a new trace and is counted.
    let bad = Request::builder()
        .uri("/ok")
        .header("traceparent", "00-zzzz")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = svc
        .ready()
        .await
        .expect("ready")
        .call(bad)
        .await
        .expect("response");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_ne!(&body[..], b"4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(metrics.context_invalid_total(ContextHeader::Traceparent), 1);

    exporter.flush().await;
    let spans = receiver
        .wait_for(Duration::from_secs(10), |s| s.len() == 2)
        .await;
    let ok = spans
        .iter()
        .find(|s| attr_str(s, "url.path").as_deref() == Some("/users/7"))
        .expect("the sampled request's span");
    assert_eq!(
        ok.parent_span_id,
        [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
    );
    assert_eq!(ok.kind, 2, "SERVER");
    assert_eq!(attr_str(ok, "http.request.method").as_deref(), Some("GET"));
    assert_eq!(
        attr_str(ok, "server.address").as_deref(),
        Some("api.example.com")
    );
    assert_eq!(attr_int(ok, "http.response.status_code"), Some(200));
    let failed = spans
        .iter()
        .find(|s| attr_str(s, "url.path").as_deref() == Some("/fail"))
        .expect("the failed request's span, kept by the tail rule");
    assert_eq!(attr_str(failed, "error.type").as_deref(), Some("503"));
    assert_eq!(failed.status.as_ref().map(|s| s.code), Some(2), "ERROR");
    exporter.shutdown();
}
