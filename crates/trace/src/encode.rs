//! Spans into OTLP messages (`opentelemetry-proto`'s prost types): one request per batch,
//! with the process's resource and this crate's instrumentation scope.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1 as proto;

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

    fn to_proto(&self) -> ProtoResource {
        ProtoResource {
            attributes: vec![
                kv(
                    "service.name",
                    any_value::Value::StringValue(self.service_name.clone()),
                ),
                kv(
                    "service.instance.id",
                    any_value::Value::StringValue(self.instance_id.clone()),
                ),
                kv(
                    "host.name",
                    any_value::Value::StringValue(self.host_name.clone()),
                ),
            ],
            ..Default::default()
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

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// One span as OTLP.
pub(crate) fn span(s: &Span) -> proto::Span {
    let kind = match s.kind {
        SpanKind::Internal => proto::span::SpanKind::Internal,
        SpanKind::Server => proto::span::SpanKind::Server,
        SpanKind::Client => proto::span::SpanKind::Client,
    };
    let code = match s.status {
        Status::Unset => proto::status::StatusCode::Unset,
        Status::Ok => proto::status::StatusCode::Ok,
        Status::Error => proto::status::StatusCode::Error,
    };
    proto::Span {
        trace_id: s.trace_id.0.to_vec(),
        span_id: s.span_id.0.to_vec(),
        parent_span_id: if s.parent_span_id.is_valid() {
            s.parent_span_id.0.to_vec()
        } else {
            Vec::new()
        },
        name: String::from_utf8_lossy(s.name()).into_owned(),
        kind: kind as i32,
        start_time_unix_nano: s.start_unix_nanos,
        end_time_unix_nano: s.end_unix_nanos.max(s.start_unix_nanos),
        attributes: s
            .attributes()
            .map(|(k, v)| {
                kv(
                    k,
                    match v {
                        Value::Int(i) => any_value::Value::IntValue(i),
                        Value::Bool(b) => any_value::Value::BoolValue(b),
                        Value::Str(b) => {
                            any_value::Value::StringValue(String::from_utf8_lossy(b).into_owned())
                        }
                    },
                )
            })
            .collect(),
        dropped_attributes_count: s.dropped_attributes(),
        status: Some(proto::Status {
            code: code as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A batch as one export request.
pub(crate) fn request(resource: &Resource, spans: Vec<proto::Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![proto::ResourceSpans {
            resource: Some(resource.to_proto()),
            scope_spans: vec![proto::ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "tailguard-trace".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::SpanContext;
    use crate::id::{SpanId, TraceId};
    use prost::Message as _;

    #[test]
    fn a_span_encodes_and_decodes_with_its_attributes() {
        let ctx = SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled: true,
        };
        let parent = SpanId::random();
        let mut s = Span::new(SpanKind::Client, &ctx, Some(parent));
        s.set_name("GET");
        s.start_unix_nanos = 10;
        s.end_unix_nanos = 20;
        s.status = Status::Error;
        s.int("server.port", 8080);
        s.bytes("server.address", b"10.0.0.1");
        let req = request(&Resource::new("gw"), vec![span(&s)]);
        let bytes = req.encode_to_vec();
        let back = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decodes");
        let rs = &back.resource_spans[0];
        let attrs = &rs.resource.as_ref().expect("resource").attributes;
        assert_eq!(attrs[0].key, "service.name");
        let p = &rs.scope_spans[0].spans[0];
        assert_eq!(p.trace_id, ctx.trace_id.0);
        assert_eq!(p.parent_span_id, parent.0);
        assert_eq!(p.kind, proto::span::SpanKind::Client as i32);
        assert_eq!(p.name, "GET");
        assert_eq!(p.attributes.len(), 2);
        assert_eq!(
            p.attributes[1].value.as_ref().and_then(|v| v.value.clone()),
            Some(any_value::Value::StringValue("10.0.0.1".into()))
        );
        assert_eq!(p.status.as_ref().map(|s| s.code), Some(2));
    }
}
