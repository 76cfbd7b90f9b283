//! Spans as OTLP protobuf bytes: each written by a [`SpanWriter`] straight into a thread's
//! buffer as it is built (a `ScopeSpans.spans` field), then copied as they are into a
//! batch, whose front is kept for the `ExportTraceServiceRequest`'s header so that the
//! request needs no copy.
//!
//! Writing on the serving thread, as the span is built, replaced a fixed-size [`Span`]
//! filled in by the serving thread and read back and encoded by the exporter: the
//! 912-byte value was written and read again for every span, and the exporter's encoding
//! was a fifth of the tracer's work (`docs/benchmarks/2026-11-27-trace/`, ninth pass).
//!
//! Written by hand rather than through `opentelemetry-proto`'s prost types because those
//! own every string and list: one span became ~20 allocations (a `String` per attribute
//! key and value, a `Vec` per id and attribute list) and as many frees, and building,
//! encoding and dropping them was ~8,000 instructions per span on the exporter thread,
//! which shares the machine with the serving threads. The wire format used here is six
//! messages of OTLP's `trace.proto`; the tests decode what is written with
//! `opentelemetry-proto` and compare it field by field, so the two cannot drift apart.

use bytes::Bytes;

use crate::context::SpanContext;
use crate::id::SpanId;
use crate::span::{Span, SpanKind, Status, Value, cut_utf8};

/// The resource every span is exported under (OTel semantic conventions: `service.name`,
/// `service.instance.id`, `host.name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// `service.name`.
    pub service_name: String,
    /// `service.instance.id`: unique per process (default: a random UUID-like id).
    pub instance_id: String,
    /// `host.name`.
    pub host_name: String,
}

impl Resource {
    /// `service_name` on this host, with a random instance id.
    pub fn new(service_name: impl Into<String>) -> Resource {
        let id = crate::id::TraceId::random().to_hex();
        let id = String::from_utf8_lossy(&id).into_owned();
        // UUID layout (8-4-4-4-12), as the spec recommends for the instance id.
        let instance_id = format!(
            "{}-{}-{}-{}-{}",
            &id[0..8],
            &id[8..12],
            &id[12..16],
            &id[16..20],
            &id[20..32]
        );
        Resource {
            service_name: service_name.into(),
            instance_id,
            host_name: host_name(),
        }
    }
}

/// `spans` as one OTLP `ExportTraceServiceRequest` under `resource`: the bytes the
/// exporter sends (before gzip), for a transport of one's own or a test. The exporter
/// itself sends the same bytes in parts: the request's header, then the recorder's buffers
/// as the serving threads wrote them.
pub fn encode_request(resource: &Resource, spans: &[Span]) -> Bytes {
    let encoder = Encoder::new(resource);
    let mut encoded = Vec::with_capacity(spans.len() * 256);
    for s in spans {
        encoder.span(s, &mut encoded);
    }
    encoder.request(&encoded)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Protobuf wire types used here.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

/// Encodes spans as `ScopeSpans.spans` fields, and wraps a batch of them into one export
/// request under the process's resource and this crate's instrumentation scope.
#[derive(Debug)]
pub(crate) struct Encoder {
    /// `ResourceSpans.resource` (field 1), encoded once.
    resource_field: Vec<u8>,
    /// `ScopeSpans.scope` (field 1), encoded once.
    scope_field: Vec<u8>,
}

impl Encoder {
    pub(crate) fn new(resource: &Resource) -> Encoder {
        let mut attrs = Vec::new();
        for (key, value) in [
            ("service.name", &resource.service_name),
            ("service.instance.id", &resource.instance_id),
            ("host.name", &resource.host_name),
        ] {
            let value = Value::Str(value.as_bytes());
            append(&mut attrs, field_len(key_value_len(key, value)), |w| {
                w.key_value(1, key, value);
            });
        }
        let mut resource_field = Vec::new();
        bytes(&mut resource_field, 1, &attrs);
        let mut scope = Vec::new();
        bytes(&mut scope, 1, b"tailguard-trace");
        bytes(&mut scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
        let mut scope_field = Vec::new();
        bytes(&mut scope_field, 1, &scope);
        Encoder {
            resource_field,
            scope_field,
        }
    }

    /// Appends `s` to `out` as one `ScopeSpans.spans` field (field 2), through a
    /// [`SpanWriter`] (so within [`MAX_SPAN_BYTES`]).
    pub(crate) fn span(&self, s: &Span, out: &mut Vec<u8>) {
        SpanWriter::append(out, s.kind, &s.context(true), Some(s.parent_span_id), |w| {
            w.replay(s)
        });
    }

    /// The export request of `spans` (`ScopeSpans.spans` fields, as [`Encoder::span`] and
    /// the recorder write them) in one buffer: [`Encoder::header`]'s bytes, then the spans.
    pub(crate) fn request(&self, spans: &[u8]) -> Bytes {
        let mut out = self.header_vec(spans.len());
        out.extend_from_slice(spans);
        Bytes::from(out)
    }

    /// The export request's bytes before `spans_len` bytes of spans: the header of a
    /// request sent as this and the spans' own buffers, one after the other.
    pub(crate) fn header(&self, spans_len: usize) -> Bytes {
        Bytes::from(self.header_vec(spans_len))
    }

    /// [`Encoder::header`]'s bytes in a `Vec`, for a caller to append the spans to.
    fn header_vec(&self, spans_len: usize) -> Vec<u8> {
        let mut header = vec![0; self.header_len(spans_len)];
        self.write_header(spans_len, &mut header);
        header
    }

    /// The `ResourceSpans` and `ScopeSpans` lengths around `spans_len` bytes of spans.
    fn lens(&self, spans_len: usize) -> (usize, usize) {
        let scope_spans_len = self.scope_field.len() + spans_len;
        let resource_spans_len = self.resource_field.len() + field_len(scope_spans_len);
        (resource_spans_len, scope_spans_len)
    }

    /// The header's length: the two fields' tags and lengths, and the fixed fields after
    /// each.
    pub(crate) fn header_len(&self, spans_len: usize) -> usize {
        let (resource_spans_len, scope_spans_len) = self.lens(spans_len);
        1 + varint_len(resource_spans_len as u64)
            + self.resource_field.len()
            + 1
            + varint_len(scope_spans_len as u64)
            + self.scope_field.len()
    }

    /// Writes the header ([`Encoder::header_len`] bytes) into `out`.
    fn write_header(&self, spans_len: usize, out: &mut [u8]) {
        let (resource_spans_len, scope_spans_len) = self.lens(spans_len);
        let mut w = Cursor { out, at: 0 };
        // ExportTraceServiceRequest.resource_spans (1): ResourceSpans.
        w.tag(1, LEN);
        w.varint(resource_spans_len as u64);
        w.raw(&self.resource_field);
        // ResourceSpans.scope_spans (2): ScopeSpans; its spans follow.
        w.tag(2, LEN);
        w.varint(scope_spans_len as u64);
        w.raw(&self.scope_field);
        debug_assert_eq!(w.at, out.len(), "the header's length as measured");
    }
}

/// The most bytes one span takes in a buffer, its field's tag and length included. A span
/// is written into a window of this size: what would not fit is cut (a string, on a
/// character boundary) or dropped and counted (an attribute, in the span's
/// `dropped_attributes_count`). The gateway's server span takes ~320 bytes and a client
/// span ~200; the fixed-size [`Span`] takes 912 in memory.
pub const MAX_SPAN_BYTES: usize = 1024;

/// Before a span's body: its field's tag and a 2-byte length (every body is under 16 KiB).
const SPAN_HEAD: usize = 3;

/// Kept at the window's end for what is written when the span ends: its start and end
/// (2 x 9 bytes), the dropped-attribute count (up to 6) and the status (up to 4).
const SPAN_TAIL: usize = 2 * 9 + 6 + 4;

/// One attribute's framing besides its key and value, at its longest in a 1 KiB window:
/// the field's tag, the `KeyValue`'s length, the key's tag and length, the `AnyValue`'s tag
/// and length, its member's tag and length (every length at most 2 bytes).
const ATTR_FRAMING: usize = 1 + 2 + 1 + 2 + 1 + 2 + 1 + 2;

/// One span written as OTLP protobuf (a `ScopeSpans.spans` field) straight into a buffer
/// as the caller sets it, from [`Recording::start`](crate::Recording::start): no
/// fixed-size value is filled in and read back, and the exporter sends the bytes as they
/// are. Its ids and kind are written when it starts, each name and attribute when it is
/// set; its times, status and length when it is dropped. Protobuf takes a message's
/// fields in any order.
///
/// The span lives in a window of [`MAX_SPAN_BYTES`]: a string that does not fit is cut on a
/// character boundary, an attribute with no room left is dropped and counted. Bytes that
/// are not UTF-8 are repaired as `String::from_utf8_lossy` does (protobuf strings are
/// UTF-8), without allocating. Setting the name twice keeps the last.
pub struct SpanWriter<'a> {
    /// The span's window, [`MAX_SPAN_BYTES`] long.
    window: &'a mut [u8],
    /// The buffer's tally, to which the span is added when it ends.
    tally: &'a mut Tally,
    /// The next byte to write in the window.
    pos: usize,
    dropped: u32,
    /// How the span ended; written when it is dropped.
    pub status: Status,
    /// Start, nanoseconds since the Unix epoch; written when the span is dropped.
    pub start_unix_nanos: u64,
    /// End, nanoseconds since the Unix epoch (at least the start); written when the span is
    /// dropped.
    pub end_unix_nanos: u64,
}

/// What a buffer of spans holds: its bytes in use and the spans in them. A span is added
/// when its writer is dropped, so one never ended (a writer forgotten) is not counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) bytes: usize,
    pub(crate) spans: usize,
}

impl std::fmt::Debug for SpanWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanWriter")
            .field("bytes", &self.pos)
            .field("dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

impl<'a> SpanWriter<'a> {
    /// A span of `kind` with the ids of `ctx`, child of `parent` (or a root), written into
    /// `window` (its first [`MAX_SPAN_BYTES`]; what was there is overwritten, nothing is
    /// zeroed first). When the writer is dropped the span's field takes the window's first
    /// bytes, and the span is added to `tally`.
    pub(crate) fn start(
        window: &'a mut [u8],
        tally: &'a mut Tally,
        kind: SpanKind,
        ctx: &SpanContext,
        parent: Option<SpanId>,
    ) -> SpanWriter<'a> {
        let window = &mut window[..MAX_SPAN_BYTES];
        let mut w = Cursor {
            out: &mut *window,
            at: SPAN_HEAD,
        };
        w.bytes(1, &ctx.trace_id.0);
        w.bytes(2, &ctx.span_id.0);
        if let Some(parent) = parent.filter(SpanId::is_valid) {
            w.bytes(4, &parent.0);
        }
        w.tag(6, VARINT);
        w.byte(span_kind(kind));
        let pos = w.at;
        SpanWriter {
            window,
            tally,
            pos,
            dropped: 0,
            status: Status::Unset,
            start_unix_nanos: 0,
            end_unix_nanos: 0,
        }
    }

    /// [`SpanWriter::start`] at the end of `out`, which grows by a window and shrinks back
    /// to the span when `write` has run (for spans written outside a thread's buffer).
    pub(crate) fn append(
        out: &mut Vec<u8>,
        kind: SpanKind,
        ctx: &SpanContext,
        parent: Option<SpanId>,
        write: impl FnOnce(&mut SpanWriter<'_>),
    ) {
        let at = out.len();
        out.resize(at + MAX_SPAN_BYTES, 0);
        let mut tally = Tally::default();
        write(&mut SpanWriter::start(
            &mut out[at..],
            &mut tally,
            kind,
            ctx,
            parent,
        ));
        out.truncate(at + tally.bytes);
    }

    /// A static name.
    pub fn set_name(&mut self, name: &'static str) {
        self.name(&[name.as_bytes()], true);
    }

    /// A name made of `parts` joined by a space (e.g. `GET /users/{id}`).
    pub fn set_name_parts(&mut self, parts: &[&[u8]]) {
        self.name(parts, false);
    }

    /// An integer attribute.
    pub fn int(&mut self, key: &'static str, value: i64) {
        self.scalar(key, Value::Int(value));
    }

    /// A boolean attribute.
    pub fn bool(&mut self, key: &'static str, value: bool) {
        self.scalar(key, Value::Bool(value));
    }

    /// A static string attribute.
    pub fn str(&mut self, key: &'static str, value: &'static str) {
        self.string(key, value.as_bytes(), true);
    }

    /// A string attribute (cut to the room left, UTF-8 repaired).
    pub fn bytes(&mut self, key: &'static str, value: &[u8]) {
        self.string(key, value, false);
    }

    /// Attributes dropped so far for want of room.
    pub fn dropped_attributes(&self) -> u32 {
        self.dropped
    }

    /// Writes what `s` holds but its ids and kind (given to [`SpanWriter::start`]).
    pub(crate) fn replay(&mut self, s: &Span) {
        let (name, known_utf8) = s.name_for_encoding();
        if !name.is_empty() {
            self.name(&[name], known_utf8);
        }
        for (key, value, known_utf8) in s.attributes_for_encoding() {
            match value {
                Value::Str(v) => self.string(key, v, known_utf8),
                scalar => self.scalar(key, scalar),
            }
        }
        self.dropped = self.dropped.saturating_add(s.dropped_attributes());
        self.status = s.status;
        self.start_unix_nanos = s.start_unix_nanos;
        self.end_unix_nanos = s.end_unix_nanos;
    }

    /// Bytes left for names and attributes (the tail is kept for the end).
    #[inline]
    fn room(&self) -> usize {
        MAX_SPAN_BYTES - SPAN_TAIL - self.pos
    }

    /// The window from the next byte to the tail, its position held in a register.
    #[inline]
    fn cursor(&mut self) -> Cursor<'_> {
        Cursor {
            out: &mut self.window[..MAX_SPAN_BYTES - SPAN_TAIL],
            at: self.pos,
        }
    }

    fn drop_one(&mut self) {
        self.dropped = self.dropped.saturating_add(1);
    }

    #[inline]
    fn scalar(&mut self, key: &str, value: Value<'_>) {
        if ATTR_FRAMING + key.len() + 10 > self.room() {
            self.drop_one();
            return;
        }
        let mut w = self.cursor();
        w.key_value(9, key, value);
        self.pos = w.at;
    }

    #[inline]
    fn string(&mut self, key: &str, value: &[u8], known_utf8: bool) {
        let Some(room) = self.room().checked_sub(ATTR_FRAMING + key.len()) else {
            self.drop_one();
            return;
        };
        if known_utf8 || is_utf8(value) {
            let value = cut_utf8(value, room);
            let mut w = self.cursor();
            w.key_value(9, key, Value::Str(value));
            self.pos = w.at;
        } else {
            self.string_repaired(key, value, room);
        }
    }

    /// [`SpanWriter::string`] for bytes that are not UTF-8: apart, so that the common path
    /// carries no 1 KiB scratch in its frame and stays small enough to inline.
    #[cold]
    #[inline(never)]
    fn string_repaired(&mut self, key: &str, value: &[u8], room: usize) {
        let mut scratch = [0u8; MAX_SPAN_BYTES];
        let n = repair_into(&[value], room, &mut scratch);
        let mut w = self.cursor();
        w.key_value(9, key, Value::Str(&scratch[..n]));
        self.pos = w.at;
    }

    /// `Span.name` (field 5): `parts` joined by a space, cut to the room left.
    fn name(&mut self, parts: &[&[u8]], known_utf8: bool) {
        // The field's tag and a length of at most 2 bytes.
        let Some(room) = self.room().checked_sub(3) else {
            return;
        };
        let joined = parts.iter().map(|p| p.len()).sum::<usize>() + parts.len().saturating_sub(1);
        if joined <= room && (known_utf8 || parts.iter().all(|p| is_utf8(p))) {
            let mut w = self.cursor();
            w.tag(5, LEN);
            w.varint(joined as u64);
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    w.byte(b' ');
                }
                w.raw(part);
            }
            self.pos = w.at;
        } else {
            self.name_repaired(parts, room);
        }
    }

    /// [`SpanWriter::name`] cut or with bytes that are not UTF-8, apart as
    /// [`SpanWriter::string_repaired`] is.
    #[cold]
    #[inline(never)]
    fn name_repaired(&mut self, parts: &[&[u8]], room: usize) {
        let mut scratch = [0u8; MAX_SPAN_BYTES];
        let n = repair_into(parts, room, &mut scratch);
        let mut w = self.cursor();
        w.bytes(5, &scratch[..n]);
        self.pos = w.at;
    }
}

impl Drop for SpanWriter<'_> {
    /// Ends the span: its times, dropped count and status, then its length before it.
    fn drop(&mut self) {
        let mut w = Cursor {
            out: &mut *self.window,
            at: self.pos,
        };
        w.tag(7, FIXED64);
        w.raw(&self.start_unix_nanos.to_le_bytes());
        w.tag(8, FIXED64);
        w.raw(&self.end_unix_nanos.max(self.start_unix_nanos).to_le_bytes());
        if self.dropped > 0 {
            w.tag(10, VARINT);
            w.varint(u64::from(self.dropped));
        }
        w.status(self.status);
        let body = w.at - SPAN_HEAD;
        // ScopeSpans.spans (2). A body under 128 bytes has a 1-byte length and moves down
        // by one; every span the gateway records is longer.
        let out = &mut *self.window;
        out[0] = (2 << 3) | LEN;
        let field = if body < 0x80 {
            out[1] = body as u8;
            out.copy_within(SPAN_HEAD..SPAN_HEAD + body, 2);
            2 + body
        } else {
            debug_assert!(body < 1 << 14, "a window's body has a 2-byte length");
            out[1] = (body as u8) | 0x80;
            out[2] = (body >> 7) as u8;
            SPAN_HEAD + body
        };
        self.tally.bytes += field;
        self.tally.spans += 1;
    }
}

/// How much of `fields` (spans as [`SpanWriter`] writes them, one after the other) a batch
/// with room for `max_spans` spans and `max_bytes` bytes takes: the first spans, as many as
/// fit both bounds, and their byte length (where the batch cuts). A span is never cut.
pub(crate) fn spans_within(fields: &[u8], max_spans: usize, max_bytes: usize) -> (usize, usize) {
    let mut at = 0;
    let mut spans = 0;
    while spans < max_spans && at < fields.len() {
        // The tag, then the length's varint.
        let mut end = at + 1;
        let mut len = 0usize;
        let mut shift = 0;
        while let Some(&b) = fields.get(end) {
            end += 1;
            len |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                break;
            }
        }
        let end = (end + len).min(fields.len());
        if end > max_bytes {
            break;
        }
        at = end;
        spans += 1;
    }
    (spans, at)
}

/// `parts` joined by a space as UTF-8 text, each bad sequence replaced by U+FFFD as
/// `String::from_utf8_lossy` does, cut to at most `max` bytes on a character boundary,
/// written into `out`; returns the length written. Allocates nothing: it is on the request
/// path, for a header that is not UTF-8.
fn repair_into(parts: &[&[u8]], max: usize, out: &mut [u8; MAX_SPAN_BYTES]) -> usize {
    let max = max.min(MAX_SPAN_BYTES);
    let mut n = 0;
    // Appends `text` whole, or as much of it as fits; false once something was cut.
    let mut put = |text: &str| {
        let fits = cut_utf8(text.as_bytes(), max - n);
        out[n..n + fits.len()].copy_from_slice(fits);
        n += fits.len();
        fits.len() == text.len()
    };
    for (i, part) in parts.iter().enumerate() {
        if i > 0 && !put(" ") {
            break;
        }
        for chunk in part.utf8_chunks() {
            if !put(chunk.valid()) || (!chunk.invalid().is_empty() && !put("\u{fffd}")) {
                return n;
            }
        }
    }
    n
}

/// OTLP's `SpanKind` number.
fn span_kind(kind: SpanKind) -> u8 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
    }
}

/// Appends `len` bytes to `out`, written by `write` through a [`Cursor`]: exactly `len`, which
/// the caller measured.
#[inline]
fn append(out: &mut Vec<u8>, len: usize, write: impl FnOnce(&mut Cursor<'_>)) {
    let at = out.len();
    out.resize(at + len, 0);
    let mut w = Cursor {
        out: &mut out[at..],
        at: 0,
    };
    write(&mut w);
    debug_assert_eq!(w.at, len, "the length measured is the length written");
}

/// A length-delimited field appended to `out`.
fn bytes(out: &mut Vec<u8>, field: u8, value: &[u8]) {
    append(out, field_len(value.len()), |w| w.bytes(field, value));
}

/// The bytes of a length-delimited field holding `len` bytes, its tag and length included
/// (tags here are all one byte: fields 1-15).
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// The length of the content of a `KeyValue`, as [`Cursor::key_value`] writes it (a
/// string value is UTF-8 already).
#[inline]
fn key_value_len(key: &str, value: Value<'_>) -> usize {
    field_len(key.len()) + field_len(any_len(value))
}

/// The length of an attribute's `AnyValue` content.
#[inline]
fn any_len(value: Value<'_>) -> usize {
    match value {
        Value::Str(v) => field_len(v.len()),
        Value::Int(v) => 1 + varint_len(v as u64),
        Value::Bool(_) => 2,
    }
}

/// Whether `bytes` is UTF-8, checked a word at a time for ASCII (paths, addresses, route
/// ids), which is cheaper still.
#[inline]
fn is_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

/// Writes into a slice sized beforehand: its position lives in a register, where a
/// `Vec`'s length, which a byte store may alias, is reloaded after every push. Writing past
/// the end is a bug in the length pass (it panics, in the exporter thread, never on the
/// request path), which the tests would catch: they decode every shape written.
struct Cursor<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Cursor<'_> {
    #[inline]
    fn byte(&mut self, b: u8) {
        self.out[self.at] = b;
        self.at += 1;
    }

    #[inline]
    fn raw(&mut self, bytes: &[u8]) {
        self.out[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    /// A tag of a field numbered 1-15 (one byte).
    #[inline]
    fn tag(&mut self, field: u8, wire: u8) {
        debug_assert!((1..16).contains(&field));
        self.byte((field << 3) | wire);
    }

    #[inline]
    fn varint(&mut self, mut v: u64) {
        if v < 0x80 {
            // Almost every length and small integer here.
            self.byte(v as u8);
            return;
        }
        while v >= 0x80 {
            self.byte((v as u8) | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    #[inline]
    fn bytes(&mut self, field: u8, value: &[u8]) {
        self.tag(field, LEN);
        self.varint(value.len() as u64);
        self.raw(value);
    }

    /// `Span.status` (field 15): `Status { code }` (code is its field 3), present even when
    /// unset, as the SDKs send it.
    #[inline]
    fn status(&mut self, status: Status) {
        let code = match status {
            Status::Unset => 0,
            Status::Ok => 1,
            Status::Error => 2,
        };
        self.tag(15, LEN);
        if code == 0 {
            self.byte(0);
        } else {
            self.byte(2);
            self.tag(3, VARINT);
            self.byte(code);
        }
    }

    /// `KeyValue { key (1), value (2): AnyValue }` as field `field`; a string value is
    /// UTF-8 already. Inlined into the span's loop, so that the cursor stays in registers.
    #[inline(always)]
    fn key_value(&mut self, field: u8, key: &str, value: Value<'_>) {
        // AnyValue: string_value (1), bool_value (2), int_value (3). A oneof member is
        // written even when it holds its type's default. int64 is the value's two's
        // complement as a varint.
        let any = any_len(value);
        let kv = field_len(key.len()) + field_len(any);
        if kv < 0x80 {
            // Every length is one byte: the fixed bytes go as 4-byte words, not one by one.
            self.raw(&[
                (field << 3) | LEN,
                kv as u8,
                (1 << 3) | LEN,
                key.len() as u8,
            ]);
            self.raw(key.as_bytes());
            match value {
                Value::Str(v) => {
                    self.raw(&[(2 << 3) | LEN, any as u8, (1 << 3) | LEN, v.len() as u8]);
                    self.raw(v);
                }
                Value::Bool(v) => self.raw(&[(2 << 3) | LEN, 2, 2 << 3, u8::from(v)]),
                Value::Int(v) => {
                    self.raw(&[(2 << 3) | LEN, any as u8, 3 << 3]);
                    self.varint(v as u64);
                }
            }
            return;
        }
        self.tag(field, LEN);
        self.varint(kv as u64);
        self.bytes(1, key.as_bytes());
        self.tag(2, LEN);
        self.varint(any as u64);
        match value {
            Value::Str(v) => self.bytes(1, v),
            Value::Bool(v) => {
                self.tag(2, VARINT);
                self.byte(u8::from(v));
            }
            Value::Int(v) => {
                self.tag(3, VARINT);
                self.varint(v as u64);
            }
        }
    }
}

#[inline]
fn varint_len(v: u64) -> usize {
    if v < 0x80 {
        return 1;
    }
    let bits = u64::BITS - (v | 1).leading_zeros();
    bits.div_ceil(7) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::SpanContext;
    use crate::id::SpanId;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::trace::v1 as proto;
    use prost::Message as _;

    fn decode(encoder: &mut Encoder, spans: &[Span]) -> ExportTraceServiceRequest {
        let mut encoded = Vec::new();
        for s in spans {
            encoder.span(s, &mut encoded);
        }
        let body = encoder.request(&encoded);
        ExportTraceServiceRequest::decode(body).expect("decodes as OTLP")
    }

    fn value(kv: &opentelemetry_proto::tonic::common::v1::KeyValue) -> Option<Any> {
        kv.value.as_ref().and_then(|v| v.value.clone())
    }

    #[test]
    fn what_is_written_decodes_as_otlp_with_every_field() {
        let ctx = SpanContext::random();
        let parent = SpanId::random();
        let mut client = Span::new(SpanKind::Client, &ctx, Some(parent));
        client.set_name("GET");
        client.start_unix_nanos = 1_700_000_000_123_456_789;
        client.end_unix_nanos = 1_700_000_000_223_456_789;
        client.status = Status::Error;
        client.int("server.port", 8080);
        client.int("negative", -3);
        client.int("zero", 0);
        client.bool("yes", true);
        client.bool("no", false);
        client.bytes("server.address", b"10.0.0.1");
        client.bytes("empty", b"");
        client.bytes("not utf-8", b"a\xffb");
        let long = "x".repeat(150);
        let mut server = Span::new(SpanKind::Server, &ctx, None);
        server.set_name_parts(&[b"GET", long.as_bytes()]);
        for _ in 0..20 {
            server.int("n", 1);
        }
        let resource = Resource::new("gw");
        let back = decode(&mut Encoder::new(&resource), &[client, server]);

        let rs = &back.resource_spans[0];
        let attrs = &rs.resource.as_ref().expect("resource").attributes;
        let keys: Vec<_> = attrs.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(keys, ["service.name", "service.instance.id", "host.name"]);
        assert_eq!(value(&attrs[0]), Some(Any::StringValue("gw".into())));
        assert_eq!(
            value(&attrs[1]),
            Some(Any::StringValue(resource.instance_id.clone()))
        );
        let scope = rs.scope_spans[0].scope.as_ref().expect("scope");
        assert_eq!(scope.name, "tailguard-trace");
        assert_eq!(scope.version, env!("CARGO_PKG_VERSION"));
        let spans = &rs.scope_spans[0].spans;
        assert_eq!(spans.len(), 2);

        let c = &spans[0];
        assert_eq!(c.trace_id, ctx.trace_id.0);
        assert_eq!(c.span_id, ctx.span_id.0);
        assert_eq!(c.parent_span_id, parent.0);
        assert_eq!(c.kind, proto::span::SpanKind::Client as i32);
        assert_eq!(c.name, "GET");
        assert_eq!(c.start_time_unix_nano, 1_700_000_000_123_456_789);
        assert_eq!(c.end_time_unix_nano, 1_700_000_000_223_456_789);
        assert_eq!(c.status.as_ref().map(|s| s.code), Some(2));
        let got: Vec<_> = c
            .attributes
            .iter()
            .map(|a| (a.key.as_str(), value(a)))
            .collect();
        assert_eq!(
            got,
            [
                ("server.port", Some(Any::IntValue(8080))),
                ("negative", Some(Any::IntValue(-3))),
                ("zero", Some(Any::IntValue(0))),
                ("yes", Some(Any::BoolValue(true))),
                ("no", Some(Any::BoolValue(false))),
                ("server.address", Some(Any::StringValue("10.0.0.1".into()))),
                ("empty", Some(Any::StringValue(String::new()))),
                ("not utf-8", Some(Any::StringValue("a\u{fffd}b".into()))),
            ]
        );
        assert_eq!(c.dropped_attributes_count, 0);

        let s = &spans[1];
        assert!(s.parent_span_id.is_empty(), "a root has no parent");
        assert_eq!(s.kind, proto::span::SpanKind::Server as i32);
        assert_eq!(s.name, format!("GET {long}"));
        assert_eq!(s.attributes.len(), crate::span::MAX_ATTRIBUTES);
        assert_eq!(s.dropped_attributes_count, 4);
        assert_eq!(s.status.as_ref().map(|s| s.code), Some(0));
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// An attribute to set: which setter, and its value.
        #[derive(Debug, Clone)]
        pub(super) enum Set {
            Int(i64),
            Bool(bool),
            Bytes(Vec<u8>),
        }

        pub(super) fn set() -> impl Strategy<Value = Set> {
            prop_oneof![
                any::<i64>().prop_map(Set::Int),
                any::<bool>().prop_map(Set::Bool),
                proptest::collection::vec(any::<u8>(), 0..200).prop_map(Set::Bytes),
                text(200).prop_map(Set::Bytes),
            ]
        }

        /// UTF-8 text of up to `max` characters (what the gateway records): the one-pass
        /// path. Any bytes are mostly not UTF-8: the two-pass path.
        fn text(max: usize) -> impl Strategy<Value = Vec<u8>> {
            proptest::collection::vec(any::<char>(), 0..max)
                .prop_map(|chars| chars.into_iter().collect::<String>().into_bytes())
        }

        fn name() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![proptest::collection::vec(any::<u8>(), 0..300), text(300)]
        }

        /// A span as the strategies describe it.
        fn build(name: &[u8], sets: &[Set], parent: bool, status: u8, start: u64) -> Span {
            let ctx = SpanContext::random();
            let mut s = Span::new(SpanKind::Client, &ctx, parent.then(SpanId::random));
            s.set_name_parts(&[name]);
            s.status = [Status::Unset, Status::Ok, Status::Error][usize::from(status)];
            s.start_unix_nanos = start;
            s.end_unix_nanos = start.wrapping_add(1);
            for set in sets {
                match set {
                    Set::Int(v) => s.int("an.int", *v),
                    Set::Bool(v) => s.bool("a.bool", *v),
                    Set::Bytes(v) => s.bytes("some.bytes", v),
                }
            }
            s
        }

        proptest! {
            /// Whatever the span holds (any integers, bytes that are not UTF-8, names and
            /// strings longer than the arena, more attributes than fit), the length pass
            /// and the write pass agree: the batch decodes, and every field reads back.
            #[test]
            fn every_span_decodes_as_it_was_recorded(
                name in name(),
                sets in proptest::collection::vec(set(), 0..24),
                parent in any::<bool>(),
                status in 0u8..3,
                start in any::<u64>(),
                spans in 1usize..4,
            ) {
                let s = build(&name, &sets, parent, status, start);
                let mut encoder = Encoder::new(&Resource::new("gw"));
                let batch: Vec<Span> = (0..spans).map(|_| s.clone()).collect();
                let back = decode(&mut encoder, &batch);
                let got = &back.resource_spans[0].scope_spans[0].spans;
                prop_assert_eq!(got.len(), spans);
                let one = &got[0];
                let want_name = String::from_utf8_lossy(s.name()).into_owned();
                prop_assert_eq!(&one.name, &want_name);
                prop_assert_eq!(one.parent_span_id.is_empty(), !parent);
                prop_assert_eq!(one.start_time_unix_nano, start);
                prop_assert_eq!(one.status.as_ref().map(|st| st.code), Some(i32::from(status)));
                prop_assert_eq!(one.dropped_attributes_count, s.dropped_attributes());
                let want: Vec<_> = s.attributes().map(|(k, v)| (k.to_owned(), match v {
                    Value::Int(i) => Any::IntValue(i),
                    Value::Bool(b) => Any::BoolValue(b),
                    Value::Str(b) => Any::StringValue(String::from_utf8_lossy(b).into_owned()),
                })).collect();
                let have: Vec<_> = one.attributes.iter().map(|a| (a.key.clone(), value(a).expect("a value"))).collect();
                prop_assert_eq!(have, want);
            }
        }
    }

    mod writer {
        use super::prop::{Set, set};
        use super::*;
        use proptest::prelude::*;

        fn written(parts: &[Vec<u8>], sets: &[Set], parent: bool) -> (Vec<u8>, u32) {
            let ctx = SpanContext::random();
            let mut out = b"before".to_vec();
            let mut dropped = 0;
            SpanWriter::append(
                &mut out,
                SpanKind::Server,
                &ctx,
                parent.then(SpanId::random),
                |w| {
                    let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                    w.set_name_parts(&parts);
                    w.status = Status::Error;
                    w.start_unix_nanos = 5;
                    w.end_unix_nanos = 7;
                    for one in sets {
                        match one {
                            Set::Int(v) => w.int("an.int", *v),
                            Set::Bool(v) => w.bool("a.bool", *v),
                            Set::Bytes(v) => w.bytes("some.bytes", v),
                        }
                    }
                    dropped = w.dropped_attributes();
                },
            );
            assert_eq!(&out[..6], b"before", "what was in the buffer stays");
            (out[6..].to_vec(), dropped)
        }

        proptest! {
            /// Whatever is set (any integers, bytes that are not UTF-8, more than fits), the
            /// span decodes; it fits its window; every attribute is there in order, as set
            /// or (a string) cut on a character boundary, or dropped and counted; and when
            /// the window had room to spare, nothing was cut or dropped.
            #[test]
            fn every_span_decodes_as_written_within_its_window(
                parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 1..4),
                sets in proptest::collection::vec(set(), 0..24),
                parent in any::<bool>(),
            ) {
                let (field, dropped) = written(&parts, &sets, parent);
                prop_assert!(field.len() <= MAX_SPAN_BYTES);
                prop_assert_eq!(spans_within(&field, 1, usize::MAX), (1, field.len()));
                let spans = proto::ScopeSpans::decode(field.as_slice()).expect("decodes").spans;
                prop_assert_eq!(spans.len(), 1);
                let one = &spans[0];
                prop_assert_eq!(one.parent_span_id.is_empty(), !parent);
                prop_assert_eq!((one.start_time_unix_nano, one.end_time_unix_nano), (5, 7));
                prop_assert_eq!(one.status.as_ref().map(|s| s.code), Some(2));
                prop_assert_eq!(one.dropped_attributes_count, dropped);
                let joined = parts.join(&b' ');
                let name = String::from_utf8_lossy(&joined);
                prop_assert!(name.starts_with(&one.name));
                let roomy = field.len() < MAX_SPAN_BYTES - 400;
                if roomy {
                    prop_assert_eq!(&one.name, &name);
                }
                let mut got = one.attributes.iter();
                let mut kept = 0u32;
                let mut next = got.next();
                for want in &sets {
                    let Some(have) = next else { break };
                    let matches = match (want, value(have)) {
                        (Set::Int(v), Some(Any::IntValue(h))) => have.key == "an.int" && *v == h,
                        (Set::Bool(v), Some(Any::BoolValue(h))) => have.key == "a.bool" && *v == h,
                        (Set::Bytes(v), Some(Any::StringValue(h))) => {
                            let full = String::from_utf8_lossy(v);
                            have.key == "some.bytes"
                                && if roomy { full == h } else { full.starts_with(&h) }
                        }
                        _ => false,
                    };
                    if matches {
                        kept += 1;
                        next = got.next();
                    }
                }
                prop_assert!(next.is_none(), "every attribute written was set, in order");
                prop_assert_eq!(kept + dropped, sets.len() as u32);
                if roomy {
                    prop_assert_eq!(dropped, 0);
                }
            }
        }

        #[test]
        fn a_short_span_moves_down_to_its_one_byte_length() {
            let (field, _) = written(&[b"n".to_vec()], &[], false);
            assert!(field.len() < 128);
            assert_eq!(usize::from(field[1]), field.len() - 2, "a 1-byte length");
            let spans = proto::ScopeSpans::decode(field.as_slice())
                .expect("decodes")
                .spans;
            assert_eq!(spans[0].name, "n");
        }

        #[test]
        fn a_long_string_is_cut_on_a_character_boundary_and_the_rest_dropped() {
            let long = "é".repeat(600);
            let (field, dropped) = written(
                &[b"GET".to_vec()],
                &[Set::Bytes(long.into_bytes()), Set::Int(1), Set::Bool(true)],
                false,
            );
            let spans = proto::ScopeSpans::decode(field.as_slice())
                .expect("decodes")
                .spans;
            let attrs = &spans[0].attributes;
            let Some(Any::StringValue(cut)) = value(&attrs[0]) else {
                panic!("the string first");
            };
            assert!(cut.len() < 1200 && cut.chars().all(|c| c == 'é'));
            assert_eq!(attrs.len() + dropped as usize, 3);
            assert!(field.len() <= MAX_SPAN_BYTES);
        }

        #[test]
        fn bytes_that_are_not_utf8_are_repaired_and_cut_without_splitting_a_replacement() {
            let mut out = [0u8; MAX_SPAN_BYTES];
            let n = repair_into(&[b"a\xffb", b"\xfe"], MAX_SPAN_BYTES, &mut out);
            assert_eq!(&out[..n], "a\u{fffd}b \u{fffd}".as_bytes());
            // Room for "a" and 2 of U+FFFD's 3 bytes: the replacement is left out whole.
            let n = repair_into(&[b"a\xffb"], 3, &mut out);
            assert_eq!(&out[..n], b"a");
        }

        #[test]
        fn a_batch_cuts_between_spans_by_count_and_by_bytes() {
            let mut out = Vec::new();
            let ctx = SpanContext::random();
            for name in [&b"first"[..], &[b'x'; 200][..], b"third"] {
                SpanWriter::append(&mut out, SpanKind::Client, &ctx, None, |w| {
                    w.set_name_parts(&[name]);
                });
            }
            let names = |fields: &[u8]| -> Vec<String> {
                proto::ScopeSpans::decode(fields)
                    .expect("decodes")
                    .spans
                    .into_iter()
                    .map(|s| s.name)
                    .collect()
            };
            let (spans, two) = spans_within(&out, 2, usize::MAX);
            assert_eq!(spans, 2);
            assert_eq!(names(&out[..two])[0], "first");
            assert_eq!(names(&out[..two]).len(), 2);
            assert_eq!(names(&out[two..]), ["third"]);
            assert_eq!(spans_within(&out, 3, usize::MAX), (3, out.len()));
            assert_eq!(spans_within(&out, 9, usize::MAX), (3, out.len()));

            // By bytes: the first two spans exactly, or a byte less (only the first), and
            // nothing when not even the first fits.
            assert_eq!(spans_within(&out, 9, two), (2, two));
            let (spans, one) = spans_within(&out, 9, two - 1);
            assert_eq!(spans, 1);
            assert_eq!(names(&out[..one]), ["first"]);
            assert_eq!(spans_within(&out, 9, one - 1), (0, 0));
            assert_eq!(spans_within(&out, 0, usize::MAX), (0, 0));
        }
    }

    #[test]
    fn a_request_sent_as_its_header_then_each_buffers_spans_decodes_as_otlp() {
        // The exporter sends the header, then each recorder buffer's spans as they were
        // written, one after another: the parts must add up to one valid request.
        let resource = Resource::new("gw");
        let encoder = Encoder::new(&resource);
        let spans = [
            crate::span::root_server_span(),
            crate::span::root_server_span(),
            crate::span::root_server_span(),
        ];
        let mut first_buffer = Vec::new();
        encoder.span(&spans[0], &mut first_buffer);
        encoder.span(&spans[1], &mut first_buffer);
        let mut second_buffer = Vec::new();
        encoder.span(&spans[2], &mut second_buffer);
        let mut sent = encoder
            .header(first_buffer.len() + second_buffer.len())
            .to_vec();
        sent.extend_from_slice(&first_buffer);
        sent.extend_from_slice(&second_buffer);
        let got = ExportTraceServiceRequest::decode(&sent[..]).expect("decodes as OTLP");
        let ids: Vec<_> = got.resource_spans[0].scope_spans[0]
            .spans
            .iter()
            .map(|s| s.span_id.clone())
            .collect();
        let sent_ids: Vec<_> = spans.iter().map(|s| s.span_id.0.to_vec()).collect();
        assert_eq!(ids, sent_ids, "every span, in order");
        let whole = ExportTraceServiceRequest::decode(encode_request(&resource, &spans))
            .expect("decodes as OTLP");
        assert_eq!(got, whole, "the same request as encoded in one buffer");
    }

    #[test]
    fn varint_lengths_match_what_is_written() {
        for v in [
            0usize,
            1,
            127,
            128,
            16_383,
            16_384,
            1 << 21,
            1 << 28,
            usize::MAX,
        ] {
            // usize::MAX as u64 is also a negative int64's 10-byte varint.
            let mut buf = [0u8; 10];
            let mut w = Cursor {
                out: &mut buf,
                at: 0,
            };
            w.varint(v as u64);
            assert_eq!(w.at, varint_len(v as u64), "{v}");
        }
    }
}
