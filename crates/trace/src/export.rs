//! The transports to the collector: OTLP over HTTP/protobuf (hyper, one keep-alive
//! connection, TLS by rustls) and over gRPC (tonic), each attempt's answer sorted into
//! accepted, worth retrying (with the collector's requested delay), or not.
//!
//! Retryable, as the OTLP spec lists them: HTTP 429, 502, 503 and 504 (honouring
//! `Retry-After`, in seconds or as an HTTP date), and any transport failure; gRPC `CANCELLED`,
//! `DEADLINE_EXCEEDED`, `ABORTED`, `OUT_OF_RANGE`, `UNAVAILABLE`, `DATA_LOSS`, and
//! `RESOURCE_EXHAUSTED` only when the status carries a `RetryInfo` (its delay honoured).

use std::collections::VecDeque;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE, HOST, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Uri};
use http_body_util::{BodyExt as _, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::{ExportConfig, Protocol, TlsFiles};
use crate::error::Error;

/// How one attempt ended badly.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Worth another attempt, after `after` if the collector asked for it.
    Retryable {
        after: Option<Duration>,
        reason: String,
    },
    /// Not worth another attempt (400, a bad certificate ...): the batch is dropped.
    Permanent(String),
}

/// The collector's answer to an accepted export: spans it rejected (partial success).
pub(crate) type Rejected = u64;

pub(crate) enum Transport {
    Http(Box<HttpTransport>),
    Grpc(Box<GrpcTransport>),
}

impl Transport {
    pub(crate) fn new(config: &ExportConfig) -> Result<Transport, Error> {
        match config.protocol {
            Protocol::HttpProtobuf => Ok(Transport::Http(Box::new(HttpTransport::new(config)?))),
            Protocol::Grpc => Ok(Transport::Grpc(Box::new(GrpcTransport::new(config)?))),
        }
    }

    /// An encoded export request as this transport sends it, every attempt: gzipped once
    /// here for OTLP/HTTP when configured (gRPC compresses its own frames).
    pub(crate) fn body(&self, request: Parts) -> Parts {
        match self {
            Transport::Http(h) if h.gzip => {
                Parts::new([Bytes::from(gzip(&request))].into_iter().collect())
            }
            _ => request,
        }
    }

    /// One attempt to deliver `body` (from [`Transport::body`]).
    pub(crate) async fn send(&mut self, body: &Parts) -> Result<Rejected, Failure> {
        match self {
            Transport::Http(h) => h.send(body).await,
            Transport::Grpc(g) => g.send(body).await,
        }
    }
}

fn endpoint_error(endpoint: &str, reason: impl Into<String>) -> Error {
    Error::Endpoint {
        endpoint: endpoint.to_owned(),
        reason: reason.into(),
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))
}

fn certificates(pem: &[u8], path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!(
            "{}: no certificate found",
            path.display()
        )));
    }
    Ok(certs)
}

/// The rustls client config for `https://` over HTTP.
fn rustls_config(tls: &TlsFiles) -> Result<rustls::ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(path) => {
            for cert in certificates(&read(path)?, path)? {
                roots
                    .add(cert)
                    .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let builder = builder.with_root_certificates(roots);
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain = certificates(&read(cert)?, cert)?;
            let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
                .map_err(|e| Error::Tls(format!("{}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| Error::Tls(e.to_string()))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(Error::Tls("`cert` and `key` go together".to_owned())),
    }
}

fn extra_headers(config: &ExportConfig) -> Result<HeaderMap, Error> {
    let mut map = HeaderMap::new();
    for (name, value) in &config.headers {
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| Error::Header(name.clone()))?;
        let v = HeaderValue::from_str(value).map_err(|_| Error::Header(name.clone()))?;
        map.append(n, v);
    }
    Ok(map)
}

/// An export request as it is sent: its parts one after another (the header, then slices
/// of the recorder's buffers), sent as they are over OTLP/HTTP, never gathered into one
/// buffer: hyper writes them with `writev`, at most 16 a call (a batch of 2048 spans, 32
/// buffers and the header, takes three calls: `strace` of the exporter). A retry sends a
/// clone: reference counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Parts {
    parts: VecDeque<Bytes>,
    len: u64,
}

impl Parts {
    pub(crate) fn new(parts: VecDeque<Bytes>) -> Parts {
        let len = parts.iter().map(|p| p.len() as u64).sum();
        Parts { parts, len }
    }

    fn iter(&self) -> impl Iterator<Item = &Bytes> {
        self.parts.iter()
    }
}

impl http_body::Body for Parts {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let next = self.parts.pop_front();
        if let Some(part) = &next {
            self.len -= part.len() as u64;
        }
        std::task::Poll::Ready(next.map(|part| Ok(http_body::Frame::data(part))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.len)
    }
}

/// OTLP/HTTP with protobuf bodies.
pub(crate) struct HttpTransport {
    uri: Uri,
    authority: HeaderValue,
    host: String,
    port: u16,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    headers: HeaderMap,
    gzip: bool,
    conn: Option<SendRequest<Parts>>,
}

impl HttpTransport {
    fn new(config: &ExportConfig) -> Result<HttpTransport, Error> {
        let url = config.http_url();
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| endpoint_error(&url, e.to_string()))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(endpoint_error(&url, "expected http:// or https://")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| endpoint_error(&url, "no host"))?
            .clone();
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let name = ServerName::try_from(host.clone())
                .map_err(|e| endpoint_error(&url, e.to_string()))?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(rustls_config(&config.tls)?));
            Some((connector, name))
        } else {
            None
        };
        Ok(HttpTransport {
            authority: HeaderValue::from_str(authority.as_str())
                .map_err(|e| endpoint_error(&url, e.to_string()))?,
            uri,
            host,
            port,
            tls,
            headers: extra_headers(config)?,
            gzip: config.gzip,
            conn: None,
        })
    }

    async fn connect(&self) -> Result<SendRequest<Parts>, Failure> {
        let retryable = |reason: String| Failure::Retryable {
            after: None,
            reason,
        };
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| retryable(format!("connect {}:{}: {e}", self.host, self.port)))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some((connector, name)) => {
                let stream = connector.connect(name.clone(), tcp).await.map_err(|e| {
                    let reason = format!("TLS handshake: {e}");
                    // A certificate either side refuses will be refused again in a moment:
                    // this batch is dropped; the next one tries afresh.
                    if certificate_refused(&e) {
                        Failure::Permanent(reason)
                    } else {
                        retryable(reason)
                    }
                })?;
                handshake(stream).await.map_err(retryable)
            }
            None => handshake(tcp).await.map_err(retryable),
        }
    }

    async fn send(&mut self, body: &Parts) -> Result<Rejected, Failure> {
        let mut sender = match self.conn.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        let mut req = Request::post(self.uri.clone())
            .header(HOST, self.authority.clone())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(body.clone())
            .map_err(|e| Failure::Permanent(e.to_string()))?;
        if self.gzip {
            req.headers_mut()
                .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        for (name, value) in &self.headers {
            req.headers_mut().append(name.clone(), value.clone());
        }
        let transport = |e: hyper::Error| Failure::Retryable {
            after: None,
            reason: e.to_string(),
        };
        sender.ready().await.map_err(transport)?;
        let response = sender.send_request(req).await.map_err(transport)?;
        let status = response.status();
        let after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| retry_after(v, std::time::SystemTime::now()));
        // Collectors answer with a few bytes; a bigger answer is not read to the end.
        let body = Limited::new(response.into_body(), 64 * 1024)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        self.conn = Some(sender);
        if status.is_success() {
            let rejected = ExportTraceServiceResponse::decode(body)
                .ok()
                .and_then(|r| r.partial_success)
                .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0));
            return Ok(rejected);
        }
        let reason = format!("HTTP {status}");
        match status.as_u16() {
            429 | 502 | 503 | 504 => Err(Failure::Retryable { after, reason }),
            _ => Err(Failure::Permanent(reason)),
        }
    }
}

/// Whether a failed TLS handshake failed on a certificate: ours refusing the collector's,
/// or the collector refusing ours (or its absence).
fn certificate_refused(e: &std::io::Error) -> bool {
    use rustls::AlertDescription as Alert;
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return false;
    };
    matches!(
        tls,
        rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::AlertReceived(
                Alert::BadCertificate
                    | Alert::UnsupportedCertificate
                    | Alert::CertificateRevoked
                    | Alert::CertificateExpired
                    | Alert::CertificateUnknown
                    | Alert::UnknownCA
                    | Alert::CertificateRequired
            )
    )
}

async fn handshake<I>(io: I) -> Result<SendRequest<Parts>, String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
    tokio::spawn(async move {
        // The connection ends when the collector closes it; the next export reconnects.
        let _ = conn.await;
    });
    Ok(sender)
}

fn gzip(body: &Parts) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(usize::try_from(body.len / 4).unwrap_or(0) + 64),
        // Fast: the exporter's CPU is the machine's too.
        flate2::Compression::fast(),
    );
    body.iter()
        .try_for_each(|part| enc.write_all(part))
        .and_then(|()| enc.finish())
        .expect("writing into a Vec cannot fail")
}

/// OTLP/gRPC: tonic's client, sending the request as encoded here.
pub(crate) struct GrpcTransport {
    client: tonic::client::Grpc<Channel>,
    headers: HeaderMap,
}

/// The gRPC method OTLP exports traces to.
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// A tonic codec whose requests are already-encoded protobuf (this crate's encoder) and
/// whose answers are OTLP's `ExportTraceServiceResponse`.
#[derive(Debug, Clone, Copy, Default)]
struct EncodedCodec;

impl tonic::codec::Codec for EncodedCodec {
    type Encode = Parts;
    type Decode = ExportTraceServiceResponse;
    type Encoder = EncodedCodec;
    type Decoder = EncodedCodec;

    fn encoder(&mut self) -> EncodedCodec {
        EncodedCodec
    }

    fn decoder(&mut self) -> EncodedCodec {
        EncodedCodec
    }
}

impl tonic::codec::Encoder for EncodedCodec {
    type Item = Parts;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Parts,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut as _;
        for part in item.parts {
            dst.put(part);
        }
        Ok(())
    }
}

impl tonic::codec::Decoder for EncodedCodec {
    type Item = ExportTraceServiceResponse;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<ExportTraceServiceResponse>, tonic::Status> {
        ExportTraceServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("a bad ExportTraceServiceResponse: {e}")))
    }
}

impl GrpcTransport {
    fn new(config: &ExportConfig) -> Result<GrpcTransport, Error> {
        let url = config.endpoint.clone();
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| endpoint_error(&url, e.to_string()))?
            .timeout(config.timeout)
            .connect_timeout(config.timeout);
        if url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new();
            tls = match &config.tls.ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca)?)),
                None => tls.with_native_roots(),
            };
            match (&config.tls.cert, &config.tls.key) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
                }
                (None, None) => {}
                _ => return Err(Error::Tls("`cert` and `key` go together".to_owned())),
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| Error::Tls(e.to_string()))?;
        } else if !url.starts_with("http://") {
            return Err(endpoint_error(&url, "expected http:// or https://"));
        }
        let mut client = tonic::client::Grpc::new(endpoint.connect_lazy());
        if config.gzip {
            client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
        }
        Ok(GrpcTransport {
            client,
            headers: extra_headers(config)?,
        })
    }

    async fn send(&mut self, body: &Parts) -> Result<Rejected, Failure> {
        let mut req = tonic::Request::new(body.clone());
        for (name, value) in &self.headers {
            if let Ok(v) = tonic::metadata::MetadataValue::try_from(value.as_bytes())
                && let Ok(k) = tonic::metadata::MetadataKey::from_bytes(name.as_str().as_bytes())
            {
                req.metadata_mut().append(k, v);
            }
        }
        if let Err(e) = self.client.ready().await {
            return Err(Failure::Retryable {
                after: None,
                reason: format!("gRPC channel: {e}"),
            });
        }
        let path = http::uri::PathAndQuery::from_static(EXPORT_PATH);
        match self.client.unary(req, path, EncodedCodec).await {
            Ok(resp) => Ok(resp
                .into_inner()
                .partial_success
                .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0))),
            Err(status) => Err(classify_grpc(&status)),
        }
    }
}

fn classify_grpc(status: &tonic::Status) -> Failure {
    use tonic::Code;
    let reason = format!("gRPC {:?}: {}", status.code(), status.message());
    let delay = retry_delay(status.details());
    match status.code() {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Failure::Retryable {
            after: delay,
            reason,
        },
        Code::ResourceExhausted if delay.is_some() => Failure::Retryable {
            after: delay,
            reason,
        },
        _ => Failure::Permanent(reason),
    }
}

/// `google.rpc.Status` and the one detail OTLP reads from it, `google.rpc.RetryInfo`,
/// declared here (four small messages) rather than pulling a crate of Google's types.
mod rpc {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Status {
        #[prost(int32, tag = "1")]
        pub(super) code: i32,
        #[prost(string, tag = "2")]
        pub(super) message: String,
        #[prost(message, repeated, tag = "3")]
        pub(super) details: Vec<Any>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Any {
        #[prost(string, tag = "1")]
        pub(super) type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub(super) value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct RetryInfo {
        #[prost(message, optional, tag = "1")]
        pub(super) retry_delay: Option<Duration>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Duration {
        #[prost(int64, tag = "1")]
        pub(super) seconds: i64,
        #[prost(int32, tag = "2")]
        pub(super) nanos: i32,
    }
}

/// The delay a `Retry-After` value asks for at `now`: delta-seconds, or an HTTP date (RFC
/// 9110 §10.2.3; a date already past asks for none). `None` for anything else, which the
/// backoff then decides alone.
fn retry_after(value: &HeaderValue, now: std::time::SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(text).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

fn retry_delay(details: &[u8]) -> Option<Duration> {
    let status = rpc::Status::decode(details).ok()?;
    let info = status
        .details
        .iter()
        .find(|a| a.type_url.ends_with("google.rpc.RetryInfo"))?;
    let delay = rpc::RetryInfo::decode(info.value.as_slice())
        .ok()?
        .retry_delay?;
    Some(
        Duration::from_secs(u64::try_from(delay.seconds).ok()?)
            + Duration::from_nanos(u64::try_from(delay.nanos).ok()?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_as_seconds_or_as_an_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_785_000_000);
        let at = |v: &str| retry_after(&HeaderValue::from_str(v).expect("a value"), now);
        assert_eq!(at("2"), Some(Duration::from_secs(2)));
        assert_eq!(at(" 120 "), Some(Duration::from_secs(120)));
        let in_90s = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(at(&in_90s), Some(Duration::from_secs(90)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(5));
        assert_eq!(
            at(&past),
            Some(Duration::ZERO),
            "a date past asks for no wait"
        );
        // The two older date formats RFC 9110 still has recipients accept.
        assert_eq!(
            at("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(Duration::ZERO),
            "RFC 850"
        );
        assert_eq!(
            at("Sun Nov  6 08:49:37 1994"),
            Some(Duration::ZERO),
            "asctime"
        );
        assert_eq!(at("soon"), None);
        assert_eq!(at("-1"), None);
    }

    #[test]
    fn grpc_statuses_are_sorted_as_the_otlp_spec_says() {
        let retry = |s: tonic::Status| matches!(classify_grpc(&s), Failure::Retryable { .. });
        assert!(retry(tonic::Status::unavailable("down")));
        assert!(retry(tonic::Status::deadline_exceeded("slow")));
        assert!(!retry(tonic::Status::invalid_argument("bad")));
        assert!(!retry(tonic::Status::resource_exhausted("no retry info")));
        let info = rpc::RetryInfo {
            retry_delay: Some(rpc::Duration {
                seconds: 2,
                nanos: 0,
            }),
        };
        let status = rpc::Status {
            code: 8,
            message: "slow down".into(),
            details: vec![rpc::Any {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: info.encode_to_vec(),
            }],
        };
        let s = tonic::Status::with_details(
            tonic::Code::ResourceExhausted,
            "slow down",
            Bytes::from(status.encode_to_vec()),
        );
        match classify_grpc(&s) {
            Failure::Retryable { after, .. } => assert_eq!(after, Some(Duration::from_secs(2))),
            Failure::Permanent(r) => panic!("retryable with RetryInfo: {r}"),
        }
    }
}
