//! The Jaeger harness against a real Jaeger: what an OTLP export stores comes back through
//! the query API as the tree that was sent, and a dropped harness leaves no process behind.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tailguard_test_support::jaeger::{self, Jaeger};

/// A trace id whose first byte is zero: Jaeger prints it without its leading zeros.
const TRACE_ID: &str = "00a1b2c3d4e5f60718293a4b5c6d7e8f";
const PARENT: &str = "00f067aa0ba902b7";
const SERVER: &str = "1111111111111111";
const CLIENT: &str = "2222222222222222";

/// An OTLP/JSON export: a server span whose parent is not in the export (a caller's), and a
/// client span under it.
fn export(trace_id: &str, service: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    let span = |id: &str, parent: &str, name: &str, kind: u8, attrs: &str| {
        format!(
            r#"{{"traceId":"{trace_id}","spanId":"{id}","parentSpanId":"{parent}","name":"{name}",
               "kind":{kind},"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",
               "attributes":[{attrs}]}}"#,
            start = now - 2_000_000,
            end = now,
        )
    };
    let server = span(
        SERVER,
        PARENT,
        "GET /users",
        2,
        r#"{"key":"http.request.method","value":{"stringValue":"GET"}},
           {"key":"http.response.status_code","value":{"intValue":"200"}}"#,
    );
    let client = span(
        CLIENT,
        SERVER,
        "GET",
        3,
        r#"{"key":"tailguard.try","value":{"intValue":"2"}}"#,
    );
    format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[
             {{"key":"service.name","value":{{"stringValue":"{service}"}}}},
             {{"key":"host.name","value":{{"stringValue":"test-host"}}}}]}},
           "scopeSpans":[{{"scope":{{"name":"harness"}},"spans":[{server},{client}]}}]}}]}}"#
    )
}

#[tokio::test]
async fn an_otlp_export_comes_back_as_the_tree_that_was_sent() {
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    assert_eq!(jaeger.trace(TRACE_ID).await.map(|t| t.spans.len()), None);
    let (status, body) = jaeger::post(
        jaeger.otlp_http,
        "/v1/traces",
        "application/json",
        export(TRACE_ID, "harness-test").as_bytes(),
    )
    .await
    .expect("export to jaeger");
    assert_eq!(status, 200, "{body}");

    let trace = jaeger
        .wait_trace(TRACE_ID, Duration::from_secs(20), |t| t.spans.len() == 2)
        .await;
    assert_eq!(trace.trace_id, TRACE_ID, "leading zeros put back");
    let server = trace.span(SERVER).expect("the server span");
    assert_eq!(server.trace_id, TRACE_ID);
    assert_eq!(server.parent_span_id.as_deref(), Some(PARENT));
    assert_eq!(server.kind.as_deref(), Some("server"));
    assert_eq!(server.name, "GET /users");
    assert_eq!(server.service, "harness-test");
    assert_eq!(server.tag("http.request.method").as_deref(), Some("GET"));
    assert_eq!(
        server.tag("http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(
        server
            .process_tags
            .get("host.name")
            .and_then(|v| v.as_str()),
        Some("test-host")
    );
    assert_eq!(server.duration_us, 2000);
    let clients = trace.spans_of_kind("client");
    assert_eq!(clients.len(), 1, "{trace:#?}");
    assert_eq!(clients[0].span_id, CLIENT);
    assert_eq!(clients[0].parent_span_id.as_deref(), Some(SERVER));
    assert_eq!(clients[0].tag("tailguard.try").as_deref(), Some("2"));

    assert!(
        jaeger.services().await.iter().any(|s| s == "harness-test"),
        "{:?}",
        jaeger.services().await
    );
    let found = jaeger.traces("harness-test", 10).await;
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].trace_id, TRACE_ID);
    assert!(jaeger.traces("nobody", 10).await.is_empty());
}

#[tokio::test]
async fn two_jaegers_run_side_by_side_and_a_dropped_one_is_gone() {
    let Some(first) = Jaeger::start().await else {
        return;
    };
    let Some(second) = Jaeger::start().await else {
        return;
    };
    // Each keeps its own spans: nothing on a fixed port is shared.
    let other = "0123456789abcdef0123456789abcdef";
    let (status, _) = jaeger::post(
        second.otlp_http,
        "/v1/traces",
        "application/json",
        export(other, "second").as_bytes(),
    )
    .await
    .expect("export");
    assert_eq!(status, 200);
    second
        .wait_trace(other, Duration::from_secs(20), |t| t.spans.len() == 2)
        .await;
    assert!(first.trace(other).await.is_none());

    let pid = second.pid().expect("running");
    let query = second.query;
    drop(second);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "jaeger {pid} was killed and reaped on drop"
    );
    assert!(jaeger::get(query, "/api/services").await.is_err());
}
