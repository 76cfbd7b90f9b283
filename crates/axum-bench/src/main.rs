//! The targets of `tailguard lab axum-scrape`: one axum hello-world, bare or with a metrics
//! middleware at its defaults, each with N dummy series so a scrape has that size.
//!
//! - `--middleware none`: the bare app (the CPU-per-request baseline).
//! - `--middleware axum-prometheus`: `PrometheusMetricLayer::pair()` on the router and its
//!   `/metrics` route on the app's own listener, as axum-prometheus's README shows: the
//!   exposition is rendered by `PrometheusHandle::render` inside a handler, on the runtime
//!   that serves requests.
//! - `--middleware tailguard`: `RequestMetrics::layer` on the router (route by axum's
//!   `MatchedPath`) and the tailguard-metrics `Exporter` at its defaults (its own thread at
//!   nice 19, its own listener: `--metrics-listen`).
//!
//! The app runs one tokio worker thread (the lab pins the process to one core). It prints
//! `listening on ADDR` when it accepts.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::MatchedPath;
use axum::routing::get;
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Middleware {
    /// No metrics at all.
    None,
    /// axum-prometheus 0.10 at its defaults.
    AxumPrometheus,
    /// tailguard-metrics' layer and exporter thread at their defaults.
    Tailguard,
}

/// An axum hello-world with a metrics middleware and N dummy series.
#[derive(Debug, Parser)]
struct Args {
    /// Where the app listens.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where tailguard's exporter listens (axum-prometheus serves `/metrics` on `--listen`).
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_listen: SocketAddr,
    /// The metrics middleware.
    #[arg(long, value_enum, default_value = "none")]
    middleware: Middleware,
    /// Dummy series created at start (`bench_dummy_total{id="..."}`); the gateway's flag
    /// name, so the lab's `--quick` caps it the same way.
    #[arg(long, default_value_t = 0)]
    synthetic_series: usize,
}

fn matched_path(extensions: &http_ext::Extensions) -> Option<&str> {
    extensions.get::<MatchedPath>().map(MatchedPath::as_str)
}

mod http_ext {
    pub(crate) use axum::http::Extensions;
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let hello = Router::new()
        .route("/", get(|| async { "hello, world\n" }))
        // The lab waits for a 200 here before it sends load.
        .route("/healthz", get(|| async { "ok\n" }));
    // Kept alive for the life of the process.
    let mut _exporter = None;
    let app = match args.middleware {
        Middleware::None => hello,
        Middleware::AxumPrometheus => {
            let (layer, handle) = axum_prometheus::PrometheusMetricLayer::pair();
            for id in 0..args.synthetic_series {
                metrics::counter!("bench_dummy_total", "id" => id.to_string()).increment(1);
            }
            hello
                .route("/metrics", get(move || async move { handle.render() }))
                .layer(layer)
        }
        Middleware::Tailguard => {
            let registry = tailguard_metrics::Registry::new();
            let requests = Arc::new(tailguard_metrics::RequestMetrics::register(
                &registry,
                "axum_http",
            )?);
            let dummy = registry.counter("bench_dummy", "Dummy series.", &["id"])?;
            for id in 0..args.synthetic_series {
                dummy.get_or_create(&[&id.to_string()])?.inc();
            }
            _exporter = Some(tailguard_metrics::Exporter::spawn(
                registry,
                tailguard_metrics::ExporterConfig {
                    listen: args.metrics_listen,
                    ..Default::default()
                },
            )?);
            hello.layer(requests.layer(matched_path))
        }
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
