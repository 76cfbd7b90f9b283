//! OpenTelemetry traces recorded in nanoseconds into per-thread buffers and exported over
//! OTLP by a thread that serves no traffic, bounded in memory, never waiting.
//!
//! # How the pieces fit
//!
//! - [`extract`] reads a request's `traceparent`/`tracestate` (W3C Trace Context;
//!   `tracestate` keys by Level 2) or `b3` (Zipkin's single header): the caller's
//!   [`SpanContext`], or none, and which headers were malformed (a new trace is then
//!   started, a forbidden `tracestate` member dropped alone, and the caller counts them with
//!   [`TraceMetrics::context_invalid`]). [`inject`] writes `traceparent` (and `tracestate`,
//!   as received less its forbidden members) for the next hop.
//! - [`TraceId::random`] and [`SpanId::random`] come from a per-thread generator.
//! - The [`Sampler`] takes the head decision (parent-based, a ratio of new traces decided
//!   from the trace id as OpenTelemetry's `TraceIdRatioBased` does); the [`TailRule`] keeps
//!   a request that failed or was slow even when the head said no. Spans are built for
//!   every traced request; only the export is decided at the end.
//! - A span is written as OTLP protobuf straight into the calling thread's buffer as it is
//!   built: [`Tracer::record_with`] hands out a [`SpanWriter`] per span, whose ids go in
//!   when it starts, each name and attribute when it is set (`&'static str` keys), and its
//!   times and status when it is dropped, all within [`MAX_SPAN_BYTES`]. A [`Span`] is the
//!   same span as a fixed-size value, for one built over a request's life (the tower
//!   layer's); [`Tracer::record`] writes it the same way.
//! - The [`Exporter`] runs on its own OS thread and current-thread runtime: full buffers
//!   arrive through a queue, idle ones are collected every `batch_interval`, their spans
//!   copied as they are into batches (gzipped when asked), and sent over OTLP/HTTP
//!   (protobuf) or OTLP/gRPC, with TLS and extra headers, retried with backoff and jitter on
//!   the statuses the OTLP spec calls retryable. A dead, failing or stalled collector drops
//!   spans and counts them; memory never exceeds `queue_max_spans` spans plus one batch.
//! - [`TraceLayer`] gives any tower/axum service a SERVER span per request, with the
//!   stable HTTP semantic conventions, and hands the handler a [`CurrentSpan`] to
//!   propagate.
//!
//! # Why not `fastrace` or the OpenTelemetry SDK's `BatchSpanProcessor`
//!
//! Both were read for this crate; the recorder borrows fastrace's shape (spans gathered
//! per thread, handed to a background collector in batches), and the exporter the SDK's
//! batching defaults and OTLP's retry rules. Neither is used, because:
//! - the OpenTelemetry SDK allocates per span (its `SpanData` holds `Vec<KeyValue>`
//!   attributes of owned strings, and a `Cow` name), locks the span's state on each
//!   update, and every thread's `on_end` sends into one bounded channel: one cache line
//!   written by every serving thread, the contention design rule 3 forbids. Its sampler
//!   decides before the span exists, so the "keep failed and slow requests" rule cannot
//!   be expressed without recording every span in full anyway.
//! - fastrace is built for in-process spans: its `RawSpan` keeps a `Cow<'static, str>`
//!   name and a heap vector of properties, and its collector is one process-wide global
//!   (`set_reporter` once), so two tracers (two gateways in a test, a reload changing the
//!   endpoint) cannot coexist; it reports through the OpenTelemetry SDK's exporter for
//!   OTLP, so the SDK's exporter costs come back.
//! - Here a span is written once, as the protobuf the collector reads, into a preallocated
//!   per-thread buffer (no allocation in the steady state, measured by
//!   `benches/record.rs`), the only shared
//!   write is once per buffer of spans, and the bounds (queue, batch, retries) are this
//!   crate's own config, so "a slow collector costs the requests nothing" is a property
//!   of the code, tested with real dead, failing and stalling collectors.
//!
//! # Example
//!
//! ```
//! use http::HeaderMap;
//! use tailguard_trace::{Sampler, SpanContext, SpanId, extract, inject};
//!
//! let mut incoming = HeaderMap::new();
//! incoming.insert(
//!     "traceparent",
//!     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap(),
//! );
//! let found = extract(&incoming);
//! let parent = found.parent.expect("a valid traceparent");
//! assert!(Sampler::default().sample(Some(&parent), None, parent.trace_id));
//!
//! // This hop's span, then the header for the next hop.
//! let mine = SpanContext { span_id: SpanId::random(), ..parent };
//! let mut outgoing = HeaderMap::new();
//! inject(&mut outgoing, &mine, found.tracestate.as_ref());
//! let sent = outgoing["traceparent"].to_str().unwrap();
//! assert!(sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
//! assert!(sent.ends_with("-01"));
//! ```
//!
//! The modules, as floors (each names only modules below it): `id`; `context`, `span`,
//! `error`; `propagation`, `sampler`, `config`; `metrics`, `encode`; `recorder`, `export`;
//! `exporter`; `layer`.

mod config;
mod context;
mod encode;
mod error;
mod export;
mod exporter;
mod id;
mod layer;
mod metrics;
mod prefetch;
mod propagation;
mod recorder;
mod sampler;
mod span;

pub use config::{DEFAULT_BATCH_MAX_BYTES, ExportConfig, Protocol, Retry, TlsFiles};
pub use context::{CurrentSpan, SpanContext};
pub use encode::{MAX_SPAN_BYTES, Resource, SpanWriter, encode_request};
pub use error::Error;
pub use exporter::{Exporter, Flusher};
pub use id::{SpanId, TraceId};
pub use layer::{
    ResponseFuture, TraceBody, TraceLayer, TraceService, host_without_port, method_name,
    protocol_version, unix_nanos,
};
pub use metrics::{DropReason, TraceMetrics};
pub use propagation::{
    B3, B3Value, ContextHeader, Extracted, TRACEPARENT, TRACEPARENT_LINE_LEN, TRACESTATE,
    TRACESTATE_MAX_BYTES, TRACESTATE_MAX_MEMBERS, extract, inject, inject_beside_line,
    inject_known, parse_b3, parse_traceparent, traceparent_line, traceparent_value,
};
pub use recorder::{Recording, Tracer};
pub use sampler::{Sampler, TailRule, ratio_decision};
pub use span::{ARENA_BYTES, MAX_ATTRIBUTES, Span, SpanKind, Status, Value};
