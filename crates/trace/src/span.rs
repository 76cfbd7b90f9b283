//! A span as a fixed-size value with no pointer to the heap, for a span built over a
//! request's life and recorded at its end (the tower layer's): building one allocates
//! nothing, and [`Tracer::record`](crate::Tracer::record) writes it out as a
//! [`SpanWriter`](crate::SpanWriter) would have. A span built all at once is written with the
//! writer directly, with no value in between.
//!
//! Attribute keys are `&'static str` (semantic-convention names are known at compile
//! time); values are integers, booleans, `&'static str`, or short byte strings copied into
//! the span's own arena ([`ARENA_BYTES`]). What does not fit is cut (a string) or dropped
//! and counted in the span's `dropped_attributes_count` (an attribute), never allocated.

use crate::context::SpanContext;
use crate::id::{SpanId, TraceId};

/// Attributes a span holds inline. 16: the HTTP server span's stable semantic conventions
/// use 8, gRPC adds 4, and tailguard's own add 2-3.
pub const MAX_ATTRIBUTES: usize = 16;

/// Bytes of copied strings (name, path, addresses) a span holds inline. 192: a span name,
/// a path and two addresses of typical length; a longer path is cut.
pub const ARENA_BYTES: usize = 192;

/// What a span stands for (OTLP `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside the process.
    Internal,
    /// Serving a request from a caller.
    Server,
    /// A request to another service.
    Client,
}

/// How a span ended (OTLP `Status.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not set: the default; HTTP servers leave 4xx unset.
    Unset,
    /// Explicitly fine.
    Ok,
    /// Failed (5xx, a transport error ...).
    Error,
}

/// An attribute's value, as stored.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stored {
    Int(i64),
    Bool(bool),
    Static(&'static str),
    Arena { at: u16, len: u16 },
}

/// An attribute's value, as read back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string (copied bytes are read as UTF-8, lossily, when encoded).
    Str(&'a [u8]),
}

#[derive(Debug, Clone, Copy)]
struct Attr {
    key: &'static str,
    value: Stored,
}

const EMPTY: Attr = Attr {
    key: "",
    value: Stored::Int(0),
};

/// One span, fixed-size. Build it on the stack (or hold it in a request's state), then hand
/// it to [`Tracer::record`](crate::Tracer::record).
#[derive(Debug, Clone)]
pub struct Span {
    /// The trace.
    pub trace_id: TraceId,
    /// This span.
    pub span_id: SpanId,
    /// The parent span; [`SpanId::INVALID`] for a root.
    pub parent_span_id: SpanId,
    /// Kind.
    pub kind: SpanKind,
    /// Status.
    pub status: Status,
    /// Start, nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_unix_nanos: u64,
    name: Stored,
    attrs: [Attr; MAX_ATTRIBUTES],
    len: u8,
    dropped: u8,
    arena: [u8; ARENA_BYTES],
    arena_len: u16,
}

impl Span {
    /// A span of `kind` with the ids of `ctx`, child of `parent` (or a root).
    pub fn new(kind: SpanKind, ctx: &SpanContext, parent: Option<SpanId>) -> Span {
        Span {
            trace_id: ctx.trace_id,
            span_id: ctx.span_id,
            parent_span_id: parent.unwrap_or(SpanId::INVALID),
            kind,
            status: Status::Unset,
            start_unix_nanos: 0,
            end_unix_nanos: 0,
            name: Stored::Static(""),
            attrs: [EMPTY; MAX_ATTRIBUTES],
            len: 0,
            dropped: 0,
            arena: [0; ARENA_BYTES],
            arena_len: 0,
        }
    }

    /// A static name.
    pub fn set_name(&mut self, name: &'static str) {
        self.name = Stored::Static(name);
    }

    /// A name made of `parts` joined by a space (e.g. `GET /users/{id}`), copied.
    pub fn set_name_parts(&mut self, parts: &[&[u8]]) {
        let at = self.arena_len;
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                self.copy(b" ");
            }
            self.copy(part);
        }
        self.name = Stored::Arena {
            at,
            len: self.arena_len - at,
        };
    }

    /// The name.
    pub fn name(&self) -> &[u8] {
        self.read(self.name)
    }

    /// An integer attribute.
    pub fn int(&mut self, key: &'static str, value: i64) {
        self.push(key, Stored::Int(value));
    }

    /// A boolean attribute.
    pub fn bool(&mut self, key: &'static str, value: bool) {
        self.push(key, Stored::Bool(value));
    }

    /// A static string attribute.
    pub fn str(&mut self, key: &'static str, value: &'static str) {
        self.push(key, Stored::Static(value));
    }

    /// A string attribute copied into the span (cut to the arena's room, on a UTF-8
    /// boundary when `value` is UTF-8).
    pub fn bytes(&mut self, key: &'static str, value: &[u8]) {
        if usize::from(self.len) >= MAX_ATTRIBUTES {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        let at = self.arena_len;
        self.copy(value);
        let stored = Stored::Arena {
            at,
            len: self.arena_len - at,
        };
        self.push(key, stored);
    }

    /// The attributes, in the order they were set.
    pub fn attributes(&self) -> impl Iterator<Item = (&'static str, Value<'_>)> {
        self.attributes_for_encoding()
            .map(|(key, value, _)| (key, value))
    }

    /// The attributes for the encoder, saying which strings are `&'static str` (UTF-8
    /// already, so not checked again).
    pub(crate) fn attributes_for_encoding(
        &self,
    ) -> impl Iterator<Item = (&'static str, Value<'_>, bool)> {
        self.attrs[..usize::from(self.len)]
            .iter()
            .map(|a| match a.value {
                Stored::Int(i) => (a.key, Value::Int(i), true),
                Stored::Bool(b) => (a.key, Value::Bool(b), true),
                Stored::Static(s) => (a.key, Value::Str(s.as_bytes()), true),
                arena @ Stored::Arena { .. } => (a.key, Value::Str(self.read(arena)), false),
            })
    }

    /// The name for the encoder, and whether it is a `&'static str`.
    pub(crate) fn name_for_encoding(&self) -> (&[u8], bool) {
        (self.read(self.name), matches!(self.name, Stored::Static(_)))
    }

    /// Attributes that did not fit.
    pub fn dropped_attributes(&self) -> u32 {
        u32::from(self.dropped)
    }

    /// The span's own context (for a child's parent, or for `traceparent`).
    pub fn context(&self, sampled: bool) -> SpanContext {
        SpanContext {
            trace_id: self.trace_id,
            span_id: self.span_id,
            sampled,
        }
    }

    fn push(&mut self, key: &'static str, value: Stored) {
        match self.attrs.get_mut(usize::from(self.len)) {
            Some(slot) => {
                *slot = Attr { key, value };
                self.len += 1;
            }
            None => self.dropped = self.dropped.saturating_add(1),
        }
    }

    fn copy(&mut self, bytes: &[u8]) {
        let at = usize::from(self.arena_len);
        // Cut on a character boundary, so a cut string stays UTF-8.
        let cut = cut_utf8(bytes, ARENA_BYTES - at);
        let n = cut.len();
        self.arena[at..at + n].copy_from_slice(cut);
        self.arena_len += u16::try_from(n).expect("n <= ARENA_BYTES, which fits a u16");
    }

    fn read(&self, v: Stored) -> &[u8] {
        match v {
            Stored::Static(s) => s.as_bytes(),
            Stored::Arena { at, len } => {
                &self.arena[usize::from(at)..usize::from(at) + usize::from(len)]
            }
            Stored::Int(_) | Stored::Bool(_) => &[],
        }
    }
}

/// `value` cut to at most `max` bytes on a character boundary (when `value` is UTF-8, what
/// is kept is too): a span's copied strings and the writer's both.
#[inline]
pub(crate) fn cut_utf8(value: &[u8], max: usize) -> &[u8] {
    if value.len() <= max {
        return value;
    }
    let mut n = max;
    while n > 0 && (value[n] & 0xc0) == 0x80 {
        n -= 1;
    }
    &value[..n]
}

/// A server span of a new trace, with no parent and nothing set (for the crate's tests).
#[cfg(test)]
pub(crate) fn root_server_span() -> Span {
    let ctx = SpanContext::random();
    Span::new(SpanKind::Server, &ctx, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span() -> Span {
        root_server_span()
    }

    #[test]
    fn attributes_read_back_in_order() {
        let mut s = span();
        s.set_name_parts(&[b"GET", b"/users"]);
        s.str("http.request.method", "GET");
        s.int("http.response.status_code", 200);
        s.bytes("url.path", b"/users/7");
        s.bool("tailguard.kept", true);
        assert_eq!(s.name(), b"GET /users");
        let attrs: Vec<_> = s.attributes().collect();
        assert_eq!(
            attrs,
            [
                ("http.request.method", Value::Str(b"GET")),
                ("http.response.status_code", Value::Int(200)),
                ("url.path", Value::Str(b"/users/7")),
                ("tailguard.kept", Value::Bool(true)),
            ]
        );
    }

    #[test]
    fn overflow_is_cut_or_counted_never_allocated() {
        let mut s = span();
        let long = "é".repeat(200);
        s.bytes("url.path", long.as_bytes());
        let Some((_, Value::Str(cut))) = s.attributes().next() else {
            panic!("an attribute");
        };
        assert!(cut.len() <= ARENA_BYTES);
        assert!(std::str::from_utf8(cut).is_ok(), "cut on a char boundary");
        s.bytes("server.address", b"10.0.0.1");
        assert_eq!(
            s.attributes().nth(1),
            Some(("server.address", Value::Str(b"")))
        );
        for _ in 0..MAX_ATTRIBUTES {
            s.int("n", 1);
        }
        assert_eq!(s.attributes().count(), MAX_ATTRIBUTES);
        assert_eq!(s.dropped_attributes(), 2);
    }
}
