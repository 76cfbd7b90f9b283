//! The tracer's own metrics: spans exported and dropped (by reason), export errors, the
//! queue's depth, and malformed incoming context headers.

use tailguard_metrics::{Counter, Family, Gauge, Registry};

use crate::error::Error;
use crate::propagation::ContextHeader;

/// Why spans were dropped (the `reason` label; a fixed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Every buffer was full or waiting for the exporter.
    QueueFull,
    /// The collector refused or did not answer, and the retries ran out.
    ExportFailed,
    /// The exporter had stopped.
    Shutdown,
}

impl DropReason {
    const ALL: [DropReason; 3] = [
        DropReason::QueueFull,
        DropReason::ExportFailed,
        DropReason::Shutdown,
    ];

    fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::ExportFailed => "export_failed",
            DropReason::Shutdown => "shutdown",
        }
    }
}

/// The tracer's metric handles, resolved once.
///
/// | name | type | labels | meaning |
/// |---|---|---|---|
/// | `tailguard_trace_spans_exported_total` | counter | | spans the collector accepted |
/// | `tailguard_trace_spans_dropped_total` | counter | `reason` = `queue_full`, `export_failed`, `shutdown` | spans never exported |
/// | `tailguard_trace_export_errors_total` | counter | | failed export attempts (each retry counts) |
/// | `tailguard_trace_queue_spans` | gauge | | spans handed to the exporter and not yet exported or dropped (a thread's buffer is handed off when full, or collected at the batch interval) |
/// | `tailguard_trace_context_invalid_total` | counter | `header` = `traceparent`, `tracestate`, `b3` | malformed incoming context headers |
#[derive(Debug, Clone)]
pub struct TraceMetrics {
    pub(crate) exported: Counter,
    dropped: [Counter; 3],
    pub(crate) export_errors: Counter,
    pub(crate) queue: Gauge,
    invalid: [Counter; 3],
}

impl TraceMetrics {
    /// Registers the families in `registry` and resolves every series.
    pub fn register(registry: &Registry) -> Result<TraceMetrics, Error> {
        let exported = registry
            .counter(
                "tailguard_trace_spans_exported",
                "Spans the OTLP collector accepted.",
                &[],
            )?
            .get_or_create(&[])?;
        let dropped: Family<Counter> = registry.counter(
            "tailguard_trace_spans_dropped",
            "Spans never exported, by reason.",
            &["reason"],
        )?;
        let export_errors = registry
            .counter(
                "tailguard_trace_export_errors",
                "Failed OTLP export attempts, each retry counted.",
                &[],
            )?
            .get_or_create(&[])?;
        let queue = registry
            .gauge(
                "tailguard_trace_queue_spans",
                "Spans handed to the exporter (a thread's buffer when full, or collected at the batch interval) and not yet exported or dropped.",
                &[],
            )?
            .get_or_create(&[])?;
        let invalid: Family<Counter> = registry.counter(
            "tailguard_trace_context_invalid",
            "Malformed incoming trace context headers (a new trace was started).",
            &["header"],
        )?;
        let d = |r: DropReason| dropped.get_or_create(&[r.label()]);
        let i = |h: ContextHeader| invalid.get_or_create(&[h.as_str()]);
        Ok(TraceMetrics {
            exported,
            dropped: [
                d(DropReason::ALL[0])?,
                d(DropReason::ALL[1])?,
                d(DropReason::ALL[2])?,
            ],
            export_errors,
            queue,
            invalid: [
                i(ContextHeader::ALL[0])?,
                i(ContextHeader::ALL[1])?,
                i(ContextHeader::ALL[2])?,
            ],
        })
    }

    /// Handles in a registry of their own, for a tracer whose metrics nobody reads.
    pub fn unregistered() -> TraceMetrics {
        TraceMetrics::register(
            &Registry::builder()
                .self_metrics_prefix(None)
                .build()
                .expect("a fresh registry"),
        )
        .expect("the names are valid and registered once in a fresh registry")
    }

    /// Counts `n` dropped spans.
    pub fn dropped(&self, reason: DropReason, n: u64) {
        self.dropped[reason as usize].add(n);
    }

    /// Counts a malformed incoming header.
    pub fn context_invalid(&self, header: ContextHeader) {
        self.invalid[header as usize].inc();
    }

    /// Spans dropped for `reason` so far.
    pub fn dropped_total(&self, reason: DropReason) -> u64 {
        self.dropped[reason as usize].get()
    }

    /// Spans handed to the exporter and not yet exported or dropped.
    pub fn queued(&self) -> i64 {
        self.queue.get()
    }

    /// `spans` handed to the exporter: into the queue gauge.
    pub(crate) fn queue_in(&self, spans: usize) {
        self.queue.add(i64::try_from(spans).unwrap_or(i64::MAX));
    }

    /// `spans` exported or dropped: out of the queue gauge.
    pub(crate) fn queue_out(&self, spans: u64) {
        self.queue.add(-i64::try_from(spans).unwrap_or(i64::MAX));
    }

    /// Malformed incoming `header`s counted so far.
    pub fn context_invalid_total(&self, header: ContextHeader) -> u64 {
        self.invalid[header as usize].get()
    }

    /// Spans exported so far.
    pub fn exported_total(&self) -> u64 {
        self.exported.get()
    }
}
