//! What the exporter is told: where the collector is, how to speak to it, and the bounds
//! (batch, queue, retries) that keep a slow collector from costing memory or requests.

use std::path::PathBuf;
use std::time::Duration;

use crate::encode::Resource;

/// OTLP's transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Protobuf over HTTP: `POST {endpoint}/v1/traces` (`http/protobuf`, port 4318).
    #[default]
    HttpProtobuf,
    /// gRPC (`grpc`, port 4317).
    Grpc,
}

/// TLS to the collector: the CA its certificate is checked against (none: the system's
/// roots) and an optional client certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM CA certificates.
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

/// How failed exports are retried (the OTLP spec's retryable answers only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts after the first.
    pub max_retries: u32,
    /// The first backoff; doubled each retry, with jitter.
    pub initial_backoff: Duration,
    /// The longest backoff (and the longest `Retry-After` honoured).
    pub max_backoff: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        // 3 retries, 100 ms doubling to 2 s at most: a collector that restarts within a
        // second or two loses nothing; a dead one costs a batch ~1-3 s of waiting, during
        // which new spans drop once the queue is full instead of piling up.
        Retry {
            max_retries: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// [`ExportConfig::batch_max_bytes`]'s default: 4 MiB, the OpenTelemetry Collector's
/// default limit on a gRPC message it receives (its HTTP receiver takes up to 20 MiB).
pub const DEFAULT_BATCH_MAX_BYTES: usize = 4 << 20;

/// The exporter's settings.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The collector's base URL, `http://` or `https://` (e.g. `http://127.0.0.1:4318`).
    pub endpoint: String,
    /// For HTTP: the full URL spans are posted to, as `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// gives it; none: `{endpoint}/v1/traces`.
    pub traces_url: Option<String>,
    /// Transport.
    pub protocol: Protocol,
    /// Extra headers on every export (a vendor's API key).
    pub headers: Vec<(String, String)>,
    /// One export attempt's limit.
    pub timeout: Duration,
    /// gzip each export (`OTEL_EXPORTER_OTLP_COMPRESSION=gzip`). Off by default, as in
    /// the OTLP exporter spec: compressing costs the machine CPU (~6,500 instructions per
    /// span here) to save bytes that usually cross a loopback or a local network.
    pub gzip: bool,
    /// Spans per export request.
    pub batch_max_spans: usize,
    /// An export request's encoded bytes (before gzip), at most: a batch closes before the
    /// span that would pass it, so that no request is refused for its size. The default,
    /// [`DEFAULT_BATCH_MAX_BYTES`], is the OpenTelemetry Collector's (and tonic's) default
    /// limit on a gRPC message. A span that does not fit beside the request's header on its
    /// own (only a bound near [`MAX_SPAN_BYTES`](crate::MAX_SPAN_BYTES) or below allows one)
    /// goes alone.
    pub batch_max_bytes: usize,
    /// Export at least this often when spans are waiting (and collect idle threads'
    /// buffers this often).
    pub batch_interval: Duration,
    /// Spans recorded and not yet exported, at most: the memory bound.
    pub queue_max_spans: usize,
    /// Spans per thread buffer.
    pub buffer_spans: usize,
    /// Retries.
    pub retry: Retry,
    /// TLS files (for `https://`).
    pub tls: TlsFiles,
    /// The resource spans are exported under.
    pub resource: Resource,
    /// How long a shutdown may spend exporting what is left.
    pub shutdown_timeout: Duration,
}

impl ExportConfig {
    /// Defaults for a collector at `endpoint`, exporting as `service_name`.
    pub fn new(endpoint: impl Into<String>, service_name: impl Into<String>) -> ExportConfig {
        ExportConfig {
            endpoint: endpoint.into(),
            traces_url: None,
            protocol: Protocol::HttpProtobuf,
            headers: Vec::new(),
            // OTLP exporters' default.
            timeout: Duration::from_secs(10),
            gzip: false,
            // The OpenTelemetry SDK's BatchSpanProcessor defaults: 512 per export, every
            // 5 s, 2048 queued.
            batch_max_spans: 512,
            batch_max_bytes: DEFAULT_BATCH_MAX_BYTES,
            batch_interval: Duration::from_secs(5),
            queue_max_spans: 2048,
            // 64 spans (~60 KiB) per thread buffer: the pool's lock is taken once per 64
            // spans, and a 2048-span queue still has 32 buffers to spread over threads.
            buffer_spans: 64,
            retry: Retry::default(),
            tls: TlsFiles::default(),
            resource: Resource::new(service_name),
            shutdown_timeout: Duration::from_secs(5),
        }
    }

    /// The URL HTTP exports are posted to.
    pub fn http_url(&self) -> String {
        match &self.traces_url {
            Some(url) => url.clone(),
            None => format!("{}/v1/traces", self.endpoint.trim_end_matches('/')),
        }
    }
}
