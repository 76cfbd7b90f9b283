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
    /// One span's body while it is written (its length prefixes it).
    scratch: Vec<u8>,
}

impl Encoder {
    pub(crate) fn new(resource: &Resource) -> Encoder {
        let mut attrs = Vec::new();
        for (key, value) in [
            ("service.name", &resource.service_name),
            ("service.instance.id", &resource.instance_id),
            ("host.name", &resource.host_name),
        ] {
            key_value(&mut attrs, 1, key, Value::Str(value.as_bytes()), true);
        }
        let mut resource_field = Vec::new();
        bytes(&mut resource_field, 1, &attrs);
        let mut scope = Vec::new();
        string(&mut scope, 1, b"tailguard-trace");
        string(&mut scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
        let mut scope_field = Vec::new();
        bytes(&mut scope_field, 1, &scope);
        Encoder {
            resource_field,
            scope_field,
            scratch: Vec::with_capacity(1024),
        }
    }

    /// Appends `s` to `out` as one `ScopeSpans.spans` field (field 2).
    pub(crate) fn span(&mut self, s: &Span, out: &mut Vec<u8>) {
        let b = &mut self.scratch;
        b.clear();
        // Room for a typical span up front: the writes below then rarely check capacity
        // twice.
        b.reserve(512);
        bytes(b, 1, &s.trace_id.0);
        bytes(b, 2, &s.span_id.0);
        if s.parent_span_id.is_valid() {
            bytes(b, 4, &s.parent_span_id.0);
        }
        let (name, known_utf8) = s.name_for_encoding();
        if known_utf8 {
            bytes(b, 5, name);
        } else {
            string(b, 5, name);
        }
        let kind = match s.kind {
            SpanKind::Internal => 1,
            SpanKind::Server => 2,
            SpanKind::Client => 3,
        };
        tag(b, 6, VARINT);
        varint(b, kind);
        tag(b, 7, FIXED64);
        b.extend_from_slice(&s.start_unix_nanos.to_le_bytes());
        tag(b, 8, FIXED64);
        b.extend_from_slice(&s.end_unix_nanos.max(s.start_unix_nanos).to_le_bytes());
        for (key, value, known_utf8) in s.attributes_for_encoding() {
            key_value(b, 9, key, value, known_utf8);
        }
        if s.dropped_attributes() > 0 {
            tag(b, 10, VARINT);
            varint(b, u64::from(s.dropped_attributes()));
        }
        // `Status { code }` (field 15; code is its field 3), present even when unset, as
        // the SDKs send it.
        let code = match s.status {
            Status::Unset => 0,
            Status::Ok => 1,
            Status::Error => 2,
        };
        tag(b, 15, LEN);
        if code == 0 {
            varint(b, 0);
        } else {
            varint(b, 2);
            tag(b, 3, VARINT);
            varint(b, code);
        }
        out.reserve(b.len() + 4);
        bytes(out, 2, b);
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
        let resource_spans_len =
            self.resource_field.len() + 1 + varint_len(scope_spans_len as u64) + scope_spans_len;
        let mut header = Vec::with_capacity(room);
        // ExportTraceServiceRequest.resource_spans (1): ResourceSpans.
        tag(&mut header, 1, LEN);
        varint(&mut header, resource_spans_len as u64);
        header.extend_from_slice(&self.resource_field);
        // ResourceSpans.scope_spans (2): ScopeSpans; its spans follow in the buffer.
        tag(&mut header, 2, LEN);
        varint(&mut header, scope_spans_len as u64);
        header.extend_from_slice(&self.scope_field);
        let start = room - header.len();
        batch[start..room].copy_from_slice(&header);
        Bytes::from(batch).slice(start..)
    }
}

/// `KeyValue { key (1), value (2): AnyValue }` as field `field` of `out`.
/// `known_utf8`: a string value needs no check (a `&'static str`).
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: Value<'_>, known_utf8: bool) {
    // AnyValue: string_value (1), bool_value (2), int_value (3). A oneof member is written
    // even when it holds its type's default. int64 is the value's two's complement as a
    // varint.
    let any = match value {
        Value::Str(v) if known_utf8 => Any::Text(std::borrow::Cow::Borrowed(v)),
        Value::Str(v) => Any::Text(utf8(v)),
        Value::Int(v) => Any::Int(v as u64),
        Value::Bool(v) => Any::Bool(v),
    };
    let any_len = match &any {
        Any::Text(t) => 1 + varint_len(t.len() as u64) + t.len(),
        Any::Int(v) => 1 + varint_len(*v),
        Any::Bool(_) => 2,
    };
    let kv_len =
        1 + varint_len(key.len() as u64) + key.len() + 1 + varint_len(any_len as u64) + any_len;
    out.reserve(kv_len + 4);
    tag(out, field, LEN);
    varint(out, kv_len as u64);
    bytes(out, 1, key.as_bytes());
    tag(out, 2, LEN);
    varint(out, any_len as u64);
    match any {
        Any::Text(t) => bytes(out, 1, &t),
        Any::Bool(v) => {
            tag(out, 2, VARINT);
            out.push(u8::from(v));
        }
        Any::Int(v) => {
            tag(out, 3, VARINT);
            varint(out, v);
        }
    }
}

/// An attribute's value as `AnyValue` carries it.
enum Any<'a> {
    Text(std::borrow::Cow<'a, [u8]>),
    /// An int64's two's complement.
    Int(u64),
    Bool(bool),
}

/// `bytes` as protobuf `string` content: as is when UTF-8 (always, for what the gateway
/// records; checked with `from_utf8`, which is fast on ASCII), else with each bad sequence
/// replaced, as `String::from_utf8_lossy` does.
fn utf8(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    // ASCII (paths, addresses, route ids) is checked a word at a time, cheaper still.
    if bytes.is_ascii() {
        return std::borrow::Cow::Borrowed(bytes);
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => std::borrow::Cow::Borrowed(bytes),
        Err(_) => std::borrow::Cow::Owned(String::from_utf8_lossy(bytes).into_owned().into_bytes()),
    }
}

// The writers below push byte by byte where a field is a few bytes (tags, varints): a
// `memcpy` call per tiny slice cost more than the bytes themselves.

#[inline]
fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

#[inline]
fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    tag(out, field, LEN);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

#[inline]
fn string(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    let value = utf8(value);
    bytes(out, field, &value);
}

#[inline]
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
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
            let mut out = Vec::new();
            varint(&mut out, v as u64);
            assert_eq!(out.len(), varint_len(v as u64), "{v}");
        }
    }
}
