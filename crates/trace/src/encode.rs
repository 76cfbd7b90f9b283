//! Spans into OTLP protobuf bytes (`ExportTraceServiceRequest`), written directly from the
//! fixed-size [`Span`] into the buffer of its batch, whose front is kept for the request's
//! header so that the request needs no copy.
//!
//! Written by hand rather than through `opentelemetry-proto`'s prost types because those
//! own every string and list: one span became ~20 allocations (a `String` per attribute
//! key and value, a `Vec` per id and attribute list) and as many frees, and building,
//! encoding and dropping them was ~8,000 instructions per span on the exporter thread,
//! which shares the machine with the serving threads. The wire format used here is six
//! messages of OTLP's `trace.proto`; the tests decode what is written with
//! `opentelemetry-proto` and compare it field by field, so the two cannot drift apart.

use bytes::Bytes;

use crate::span::{Span, SpanKind, Status, Value};

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
/// itself keeps one encoder and writes each batch into a buffer sized for it.
pub fn encode_request(resource: &Resource, spans: &[Span]) -> Bytes {
    let encoder = Encoder::new(resource);
    let mut batch = encoder.batch_buffer(spans.len() * 256);
    for s in spans {
        encoder.span(s, &mut batch);
    }
    encoder.request(batch)
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

    /// Appends `s` to `out` as one `ScopeSpans.spans` field (field 2).
    ///
    /// One pass ([`Encoder::span_in_one_pass`]) for every span the gateway records; two
    /// ([`Encoder::span_in_two_passes`]) for a span with a string that is not UTF-8.
    pub(crate) fn span(&self, s: &Span, out: &mut Vec<u8>) {
        if !self.span_in_one_pass(s, out) {
            self.span_in_two_passes(s, out);
        }
    }

    /// [`Encoder::span`] in one pass: the body is written after room for the longest
    /// length it can have (3 bytes: a body is under 2 MiB), then its length is written and
    /// the body moved up to it when that length is shorter (a `memmove` of the body, ~300
    /// bytes; most bodies are over 127 bytes, so 2 bytes long, moved by one byte).
    ///
    /// The length pass of the two-pass encoder was ~40 % of the exporter's work per span:
    /// each attribute's lengths were worked out there and again as it was written, and each
    /// string checked for UTF-8. Here each is done once, as the attribute is written.
    /// Returns `false`, with `out` as it was, for a span that needs the other path: a string
    /// that is not UTF-8 (its repair changes its length), or a body of 2 MiB or more.
    fn span_in_one_pass(&self, s: &Span, out: &mut Vec<u8>) -> bool {
        /// The longest body whose length fits the 3 bytes kept for it.
        const MAX_BODY: usize = (1 << 21) - 1;
        let (name, name_known_utf8) = s.name_for_encoding();
        if !name_known_utf8 && !is_utf8(name) {
            return false;
        }
        // Room for the longest body: fixed fields, the name, and each attribute at its
        // longest (every length a 3-byte varint, an integer 10 bytes).
        let mut room = (2 + 16) + (2 + 8) + (2 + 8) + (4 + name.len()) + (2 + 9 + 9);
        for (key, value, _) in s.attributes_for_encoding() {
            room += 16
                + key.len()
                + match value {
                    Value::Str(v) => v.len(),
                    Value::Int(_) => 10,
                    Value::Bool(_) => 1,
                };
        }
        room += 11 + 4; // dropped count, status
        if room > MAX_BODY {
            return false;
        }
        let at = out.len();
        out.resize(at + 4 + room, 0);
        let mut w = Cursor {
            out: &mut out[at + 4..],
            at: 0,
        };
        w.span_head(s, name);
        for (key, value, known_utf8) in s.attributes_for_encoding() {
            if let Value::Str(v) = value
                && !known_utf8
                && !is_utf8(v)
            {
                out.truncate(at);
                return false;
            }
            w.key_value(9, key, value);
        }
        let dropped = u64::from(s.dropped_attributes());
        if dropped > 0 {
            w.tag(10, VARINT);
            w.varint(dropped);
        }
        w.status(s.status);
        let body = w.at;
        debug_assert!(body <= room, "the room measured holds what was written");
        // The tag and the length, written to end where the body begins; the body moved up
        // to them when the length takes fewer than its 3 bytes.
        let len_bytes = varint_len(body as u64);
        let mut head = Cursor {
            out: &mut out[at..at + 1 + len_bytes],
            at: 0,
        };
        head.tag(2, LEN);
        head.varint(body as u64);
        if len_bytes < 3 {
            out.copy_within(at + 4..at + 4 + body, at + 1 + len_bytes);
        }
        out.truncate(at + 1 + len_bytes + body);
        true
    }

    /// [`Encoder::span`] in two passes: the body's length first (arithmetic on lengths the
    /// span already knows, with the strings that are not UTF-8 repaired), then every byte
    /// written once into room reserved for exactly that, through a cursor held in registers.
    /// Writing through `Vec::push` cost ~190 instructions per attribute: a `u8` store may
    /// alias the `Vec`'s own length and pointer, so each push reloaded and stored them, and
    /// each varint was a loop of pushes.
    fn span_in_two_passes(&self, s: &Span, out: &mut Vec<u8>) {
        let (name, name_known_utf8) = s.name_for_encoding();
        let name = if name_known_utf8 {
            std::borrow::Cow::Borrowed(name)
        } else {
            utf8(name)
        };
        let parent = s.parent_span_id.is_valid();
        let dropped = u64::from(s.dropped_attributes());

        // Pass 1: lengths, and which strings are not UTF-8 (bit i: attribute i). Those
        // (never, for what the gateway records) are repaired here and again when written:
        // the repair changes their length.
        let mut repair = 0u32;
        let mut body = (2 + 16) + (2 + 8) + if parent { 2 + 8 } else { 0 };
        body += field_len(name.len());
        body += 2 + 9 + 9; // kind, start, end
        for (i, (key, value, known_utf8)) in s.attributes_for_encoding().enumerate() {
            let len = match value {
                Value::Str(v) if !known_utf8 && !is_utf8(v) => {
                    repair |= 1 << i;
                    key_value_len(key, Value::Str(&utf8(v)))
                }
                _ => key_value_len(key, value),
            };
            body += field_len(len);
        }
        if dropped > 0 {
            body += 1 + varint_len(dropped);
        }
        body += if s.status == Status::Unset { 2 } else { 4 }; // status
        let total = field_len(body);

        // Pass 2: the bytes. Written here rather than through `append`: its closure cost a
        // few dozen instructions a request more on this, the per-span path (callgrind).
        let at = out.len();
        out.resize(at + total, 0);
        let mut w = Cursor {
            out: &mut out[at..],
            at: 0,
        };
        w.tag(2, LEN);
        w.varint(body as u64);
        w.span_head(s, &name);
        for (i, (key, value, _)) in s.attributes_for_encoding().enumerate() {
            match value {
                Value::Str(v) if repair & (1 << i) != 0 => {
                    w.key_value(9, key, Value::Str(&utf8(v)));
                }
                _ => w.key_value(9, key, value),
            }
        }
        if dropped > 0 {
            w.tag(10, VARINT);
            w.varint(dropped);
        }
        w.status(s.status);
        debug_assert_eq!(w.at, total, "pass 1 measured what pass 2 wrote");
    }

    /// Bytes kept free at the front of a batch buffer for the request's header: the most
    /// its two length varints and the fixed resource and scope fields can take.
    fn header_room(&self) -> usize {
        2 * (1 + 10) + self.resource_field.len() + self.scope_field.len()
    }

    /// An empty batch buffer: [`Encoder::header_room`] bytes, then room for `spans_bytes`
    /// of spans ([`Encoder::span`] appends them), so that a batch of the expected size never
    /// grows its buffer (each growth copies it).
    pub(crate) fn batch_buffer(&self, spans_bytes: usize) -> Vec<u8> {
        let mut buf = Vec::with_capacity(self.header_room() + spans_bytes);
        buf.resize(self.header_room(), 0);
        buf
    }

    /// The export request for a batch buffer (from [`Encoder::batch_buffer`], spans
    /// appended): the header is written into the room before the spans, and the request is
    /// the buffer from the header's first byte, without a copy.
    pub(crate) fn request(&self, mut batch: Vec<u8>) -> Bytes {
        let room = self.header_room();
        let spans_len = batch.len().saturating_sub(room);
        let scope_spans_len = self.scope_field.len() + spans_len;
        let resource_spans_len = self.resource_field.len() + field_len(scope_spans_len);
        // The two fields' tags and lengths, and the fixed fields after each.
        let header_len = 1
            + varint_len(resource_spans_len as u64)
            + self.resource_field.len()
            + 1
            + varint_len(scope_spans_len as u64)
            + self.scope_field.len();
        let start = room - header_len;
        let mut w = Cursor {
            out: &mut batch[start..room],
            at: 0,
        };
        // ExportTraceServiceRequest.resource_spans (1): ResourceSpans.
        w.tag(1, LEN);
        w.varint(resource_spans_len as u64);
        w.raw(&self.resource_field);
        // ResourceSpans.scope_spans (2): ScopeSpans; its spans follow in the buffer.
        w.tag(2, LEN);
        w.varint(scope_spans_len as u64);
        w.raw(&self.scope_field);
        Bytes::from(batch).slice(start..)
    }
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

    /// A span's fields before its attributes: ids (the parent's only when it has one), name
    /// (UTF-8 already), kind, start and end.
    #[inline]
    fn span_head(&mut self, s: &Span, name: &[u8]) {
        self.bytes(1, &s.trace_id.0);
        self.bytes(2, &s.span_id.0);
        if s.parent_span_id.is_valid() {
            self.bytes(4, &s.parent_span_id.0);
        }
        self.bytes(5, name);
        self.tag(6, VARINT);
        self.byte(span_kind(s.kind));
        self.tag(7, FIXED64);
        self.raw(&s.start_unix_nanos.to_le_bytes());
        self.tag(8, FIXED64);
        self.raw(&s.end_unix_nanos.max(s.start_unix_nanos).to_le_bytes());
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

/// `bytes` as protobuf `string` content: as is when UTF-8 (always, for what the gateway
/// records; checked with `from_utf8`, which is fast on ASCII), else with each bad sequence
/// replaced, as `String::from_utf8_lossy` does.
fn utf8(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if is_utf8(bytes) {
        std::borrow::Cow::Borrowed(bytes)
    } else {
        std::borrow::Cow::Owned(String::from_utf8_lossy(bytes).into_owned().into_bytes())
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
    use crate::id::{SpanId, TraceId};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::trace::v1 as proto;
    use prost::Message as _;

    fn decode(encoder: &mut Encoder, spans: &[Span]) -> ExportTraceServiceRequest {
        let mut batch = encoder.batch_buffer(0);
        for s in spans {
            encoder.span(s, &mut batch);
        }
        let body = encoder.request(batch);
        ExportTraceServiceRequest::decode(body).expect("decodes as OTLP")
    }

    fn value(kv: &opentelemetry_proto::tonic::common::v1::KeyValue) -> Option<Any> {
        kv.value.as_ref().and_then(|v| v.value.clone())
    }

    #[test]
    fn what_is_written_decodes_as_otlp_with_every_field() {
        let ctx = SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled: true,
        };
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
        enum Set {
            Int(i64),
            Bool(bool),
            Bytes(Vec<u8>),
        }

        fn set() -> impl Strategy<Value = Set> {
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
            let ctx = SpanContext {
                trace_id: TraceId::random(),
                span_id: SpanId::random(),
                sampled: true,
            };
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

    mod paths {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// The one-pass path writes, byte for byte, what the two-pass path writes, for
            /// every span it takes (UTF-8 text of any length, any attributes), wherever its
            /// body's length puts the body.
            #[test]
            fn one_pass_writes_what_two_passes_write(
                name in "\\PC{0,200}",
                values in proptest::collection::vec(("\\PC{0,60}", any::<i64>(), 0u8..3), 0..20),
                parent in any::<bool>(),
                status in 0u8..3,
                before in proptest::collection::vec(any::<u8>(), 0..40),
            ) {
                let ctx = SpanContext { trace_id: TraceId::random(), span_id: SpanId::random(), sampled: true };
                let mut s = Span::new(SpanKind::Server, &ctx, parent.then(SpanId::random));
                s.set_name_parts(&[name.as_bytes()]);
                s.status = [Status::Unset, Status::Ok, Status::Error][usize::from(status)];
                for (text, int, which) in &values {
                    match which {
                        0 => s.bytes("text", text.as_bytes()),
                        1 => s.int("int", *int),
                        _ => s.str("static", "value"),
                    }
                }
                let encoder = Encoder::new(&Resource::new("gw"));
                let mut one = before.clone();
                prop_assert!(encoder.span_in_one_pass(&s, &mut one), "UTF-8: one pass");
                let mut two = before.clone();
                encoder.span_in_two_passes(&s, &mut two);
                prop_assert_eq!(one, two);
            }
        }

        #[test]
        fn a_body_whose_length_takes_all_three_bytes_is_written_in_place() {
            let mut s = crate::span::root_server_span();
            // A static name: the only unbounded part (20,000 bytes: a 3-byte length).
            s.set_name(String::leak("n".repeat(20_000)));
            s.str("k", "v");
            let encoder = Encoder::new(&Resource::new("gw"));
            let mut one = Vec::new();
            assert!(encoder.span_in_one_pass(&s, &mut one));
            let mut two = Vec::new();
            encoder.span_in_two_passes(&s, &mut two);
            assert_eq!(one, two);
            assert_eq!(one[1] & 0x80, 0x80, "a length of more than one byte");
            assert_eq!(one[2] & 0x80, 0x80, "and of three");
        }

        #[test]
        fn a_span_with_bytes_that_are_not_utf8_takes_the_two_pass_path_and_leaves_out_as_it_was() {
            let mut s = crate::span::root_server_span();
            s.bytes("ok", b"fine");
            s.bytes("bad", b"a\xffb");
            let encoder = Encoder::new(&Resource::new("gw"));
            let mut out = b"kept".to_vec();
            assert!(!encoder.span_in_one_pass(&s, &mut out));
            assert_eq!(out, b"kept");
        }
    }

    #[test]
    fn encode_request_is_the_exporters_request() {
        let spans = [
            crate::span::root_server_span(),
            crate::span::root_server_span(),
        ];
        let resource = Resource::new("gw");
        let body = encode_request(&resource, &spans);
        let mut encoder = Encoder::new(&resource);
        let expected = decode(&mut encoder, &spans);
        let got = ExportTraceServiceRequest::decode(body).expect("decodes as OTLP");
        assert_eq!(got, expected);
        assert_eq!(got.resource_spans[0].scope_spans[0].spans.len(), 2);
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
