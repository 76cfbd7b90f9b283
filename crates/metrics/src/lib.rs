//! Prometheus metrics recorded in nanoseconds on per-thread shards, rendered and served off
//! the request path.
//!
//! # How the pieces fit
//!
//! - A [`Registry`] holds [`Family`]s (a name, HELP text, label names, and for histograms
//!   fixed buckets). [`Family::get_or_create`] is the cold path: it renders the label set
//!   to its exposition bytes once, finds or creates the series, and returns a handle.
//! - A handle ([`Counter`], [`Gauge`], [`FloatGauge`], [`FloatCounter`], [`Histogram`]) is
//!   the hot path: `inc`/`add`/`set`/`observe` is one relaxed atomic add into the calling
//!   thread's own shard of the series. No lock, no allocation, no hashing, and no cache line
//!   written by two threads (while threads do not outnumber shards).
//! - A scrape takes a [`Snapshot`] (a pointer copy per family and per chunk of series) and a
//!   [`Render`] walks it in creation order, copying pre-rendered names and labels and
//!   formatting only the numbers. Creating a series never waits for a scrape: series live in
//!   append-only chunks whose addresses never change.
//! - The [`Exporter`] serves the exposition from its own OS thread and listener (default
//!   `127.0.0.1:9091/metrics`): text 0.0.4 or OpenMetrics 1.0.0 by `Accept`, gzip by
//!   `Accept-Encoding`, streamed in bounded pieces, concurrent scrapes coalesced, each scrape
//!   bounded by `X-Prometheus-Scrape-Timeout-Seconds`.
//! - [`RequestMetrics`] gives any hyper/axum service per-route request metrics as a tower
//!   layer: [`RequestMetrics::layer`] for a whole router, naming each request's route from
//!   its extensions (axum's `MatchedPath`, see `examples/axum.rs`), or
//!   [`RouteMetrics::layer`] fixed to one route. [`register_process_metrics`] adds
//!   `process_*` from `/proc`.
//! - Beside the exposition the exporter serves any [`Page`] it is given (the gateway's status
//!   page), on its own thread; a page reads values back from a [`Snapshot`]
//!   ([`Snapshot::family`]), summing the same shards a scrape sums.
//!
//! # Why this is hand-written
//!
//! The metrics registry is the product: the project exists to show that a gateway's
//! metrics can cost its requests nothing, and no existing crate does that (see
//! `research/metrics-anchors.md`). `prometheus` and `metrics` look labels up (hash, lock,
//! clone) on every call and sort or copy every series at each scrape (135-180 ms per 100k
//! series); `prometheus-client` holds a family's lock for the whole encode, so creating a
//! series waits for the scrape (p99 12-15 ms), and puts a mutex in every histogram
//! observation; `measured` comes closest but has no per-thread shards, cardinality cap, TTL
//! or off-path exporter. Everything that is not the product comes from crates: HTTP
//! (hyper), the runtime (tokio), gzip (flate2), number formatting (itoa, ryu).
//!
//! # Example
//!
//! ```
//! use tailguard_metrics::{Format, Registry};
//!
//! let registry = Registry::builder().self_metrics_prefix(None).build()?;
//! let requests = registry.counter("http_requests", "Requests served.", &["route", "status"])?;
//! let latency = registry.histogram("http_latency_seconds", "Latency.", &[], &[0.1, 1.0])?;
//!
//! // Cold path, once per route: resolve the handles.
//! let ok = requests.get_or_create(&["/users", "200"])?;
//! let latency = latency.get_or_create(&[])?;
//!
//! // Hot path, per request.
//! ok.inc();
//! ok.inc();
//! latency.observe(0.25);
//!
//! let text = String::from_utf8(registry.render(Format::Text)).unwrap();
//! assert_eq!(text, "\
//! ## HELP http_requests_total Requests served.
//! ## TYPE http_requests_total counter
//! http_requests_total{route=\"/users\",status=\"200\"} 2
//! ## HELP http_latency_seconds Latency.
//! ## TYPE http_latency_seconds histogram
//! http_latency_seconds_bucket{le=\"0.1\"} 0
//! http_latency_seconds_bucket{le=\"1.0\"} 1
//! http_latency_seconds_bucket{le=\"+Inf\"} 1
//! http_latency_seconds_sum 0.25
//! http_latency_seconds_count 1
//! ");
//! # Ok::<(), tailguard_metrics::MetricsError>(())
//! ```

// The README's example compiles (it serves forever, so it is not run).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod chunk;
mod config;
mod error;
mod exporter;
mod family;
mod layer;
mod metric;
mod negotiate;
mod page;
mod process;
mod read;
mod registry;
mod render;
mod shard;
mod text;

pub use config::{Listen, MetricsConfig};
pub use error::MetricsError;
pub use exporter::{Exporter, ExporterConfig, Priority, set_thread_priority};
pub use family::{Desc, Family, LATENCY_BUCKETS, OVERFLOW_LABEL_VALUE};
pub use layer::{
    InFlight, RequestMetrics, RequestMetricsLayer, RequestMetricsService, ResponseFuture,
    RouteMetrics, RouteOf, StatusCounters, UNMATCHED_ROUTE,
};
pub use metric::{Counter, FloatCounter, FloatGauge, Gauge, Histogram, Metric};
pub use negotiate::{accepts_gzip, negotiate_format, scrape_budget};
pub use page::{Page, Pages};
pub use process::register_process_metrics;
pub use read::{FamilyReading, SeriesReading};
pub use registry::{Registry, RegistryBuilder};
pub use render::{Format, Render, Snapshot};
pub use shard::use_shared_shard;
