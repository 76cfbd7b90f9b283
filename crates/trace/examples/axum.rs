//! An axum 0.8 service traced by `TraceLayer`, exporting to an OTLP/HTTP collector.
//!
//! ```text
//! OTLP=http://127.0.0.1:4318 cargo run -p tailguard-trace --example axum
//! curl -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' 127.0.0.1:3000/hello
//! ```
//!
//! The handler reads its span from the request (`CurrentSpan`) and shows the
//! `traceparent` it would send to a service it calls.

use axum::routing::get;
use axum::{Extension, Router};
use tailguard_trace::{CurrentSpan, ExportConfig, Exporter, TraceLayer, TraceMetrics, inject};

async fn hello(Extension(span): Extension<CurrentSpan>) -> String {
    // Propagate: the headers a call to another service would carry.
    let mut headers = http::HeaderMap::new();
    inject(&mut headers, &span.context, span.tracestate.as_ref());
    format!(
        "trace {} span {}\ntraceparent for the next hop: {:?}\n",
        span.context.trace_id, span.context.span_id, headers["traceparent"]
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::var("OTLP").unwrap_or_else(|_| "http://127.0.0.1:4318".to_owned());
    let registry = tailguard_metrics::Registry::new();
    let exporter = Exporter::start(
        ExportConfig::new(endpoint, "axum-example"),
        TraceMetrics::register(&registry)?,
    )?;
    let app = Router::new()
        .route("/hello", get(hello))
        .layer(TraceLayer::new(exporter.tracer()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Export what is left before exiting.
    exporter.shutdown();
    Ok(())
}
