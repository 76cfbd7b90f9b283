//! A span's context as it crosses a process boundary: its trace, its id, whether it is
//! sampled, and the vendors' `tracestate` riding along.

use http::HeaderValue;

use crate::id::{SpanId, TraceId};

/// The identity of a span, what `traceparent` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    /// The trace the span belongs to.
    pub trace_id: TraceId,
    /// The span's own id.
    pub span_id: SpanId,
    /// The `sampled` flag: the caller recorded (or will record) its span.
    pub sampled: bool,
}

impl SpanContext {
    /// A context with both ids valid.
    pub fn is_valid(&self) -> bool {
        self.trace_id.is_valid() && self.span_id.is_valid()
    }

    /// A sampled context with random ids (for the crate's tests).
    #[cfg(test)]
    pub(crate) fn random() -> SpanContext {
        SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled: true,
        }
    }
}

/// The current server span of a request, handed to the application as a request
/// extension by [`crate::TraceLayer`] so it can propagate the trace to its own calls
/// ([`crate::inject`]).
#[derive(Debug, Clone)]
pub struct CurrentSpan {
    /// The server span's context (its id is the parent of the app's own calls).
    pub context: SpanContext,
    /// The `tracestate` received, passed on unchanged.
    pub tracestate: Option<HeaderValue>,
}
