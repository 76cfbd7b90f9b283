//! A real OTLP receiver on 127.0.0.1:0 for export tests: OTLP/HTTP (`POST /v1/traces`,
//! protobuf, gzip or not) and OTLP/gRPC, decoding every request with `opentelemetry-proto`
//! and keeping the spans. Its answer can be switched while a test runs: accept, a status
//! (503 with `Retry-After`, 400 ...), or a stall (never answer), to test a failing or
//! stalled collector. Either transport can be served over TLS (a [`rustls::ServerConfig`],
//! e.g. from [`crate::IssuedCert::server_config`]), counting failed handshakes and client
//! certificates, to test TLS to the collector.

use std::io::Read as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
pub use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::common::v1::any_value;
pub use opentelemetry_proto::tonic::trace::v1::Span as OtlpSpan;
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Accept (HTTP 200 / gRPC OK) and keep the spans.
    Accept,
    /// HTTP status (gRPC: 503 → `UNAVAILABLE`, else `INVALID_ARGUMENT`), spans not kept.
    Status(u16),
    /// Read the request, never answer.
    Stall,
}

const STALL: u16 = 1;
const ACCEPT: u16 = 0;

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Received>>,
    answer: AtomicU16,
    attempts: AtomicUsize,
    /// TLS handshakes that failed (a client that does not trust the certificate, or sent
    /// none where one is required).
    tls_failed: AtomicUsize,
    /// TLS handshakes in which the client presented a certificate (verified).
    client_certs: AtomicUsize,
    changed: Notify,
}

/// One accepted export request.
#[derive(Debug, Clone)]
pub struct Received {
    /// The decoded request.
    pub request: ExportTraceServiceRequest,
    /// The HTTP headers (or gRPC metadata) it came with, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The request's protobuf length: as received over HTTP (after gunzip); over gRPC, as
    /// prost encodes the decoded message again (tonic decodes before the service sees it).
    pub body_len: usize,
    /// Each span's field length (tag, length, span) in the order the spans came, measured
    /// the same way as `body_len`.
    pub span_lens: Vec<usize>,
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    /// Where it listens.
    pub addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for OtlpReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpReceiver")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl OtlpReceiver {
    /// OTLP/HTTP on 127.0.0.1:0.
    pub async fn http() -> OtlpReceiver {
        Self::serve_http(None).await
    }

    /// OTLP/HTTP over TLS on 127.0.0.1:0, presenting `config`'s certificate (its ALPN is
    /// set to `http/1.1` here).
    pub async fn http_tls(config: rustls::ServerConfig) -> OtlpReceiver {
        Self::serve_http(Some(tls_acceptor(config, b"http/1.1"))).await
    }

    /// OTLP/HTTP on 127.0.0.1:0, over TLS when given an acceptor.
    async fn serve_http(acceptor: Option<tokio_rustls::TlsAcceptor>) -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared::default());
        let tls = acceptor.is_some();
        let s = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (s, acceptor) = (Arc::clone(&s), acceptor.clone());
                tokio::spawn(async move {
                    match acceptor {
                        None => serve_http_connection(tcp, s).await,
                        Some(acceptor) => {
                            if let Some(tls) = accept_tls(&acceptor, tcp, &s).await {
                                serve_http_connection(tls, s).await;
                            }
                        }
                    }
                });
            }
        });
        OtlpReceiver {
            addr,
            tls,
            shared,
            task,
        }
    }

    /// OTLP/gRPC over TLS on 127.0.0.1:0, presenting `config`'s certificate (its ALPN is
    /// set to `h2` here).
    pub async fn grpc_tls(config: rustls::ServerConfig) -> OtlpReceiver {
        let acceptor = tls_acceptor(config, b"h2");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared::default());
        let service = TraceServiceServer::new(Grpc(Arc::clone(&shared)))
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        let s = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (s, acceptor) = (Arc::clone(&s), acceptor.clone());
                let service = hyper_util::service::TowerToHyperService::new(service.clone());
                tokio::spawn(async move {
                    let Some(tls) = accept_tls(&acceptor, tcp, &s).await else {
                        return;
                    };
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
                });
            }
        });
        OtlpReceiver {
            addr,
            tls: true,
            shared,
            task,
        }
    }

    /// OTLP/gRPC on 127.0.0.1:0.
    pub async fn grpc() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared::default());
        let service = TraceServiceServer::new(Grpc(Arc::clone(&shared)))
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        OtlpReceiver {
            addr,
            tls: false,
            shared,
            task,
        }
    }

    /// `http://{addr}`, or `https://{addr}` for a receiver over TLS.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// TLS handshakes that failed so far.
    pub fn tls_failures(&self) -> usize {
        self.shared.tls_failed.load(Ordering::SeqCst)
    }

    /// TLS handshakes so far in which the client presented a (verified) certificate.
    pub fn client_certs(&self) -> usize {
        self.shared.client_certs.load(Ordering::SeqCst)
    }

    /// Waits (up to `deadline`) until at least `n` TLS handshakes failed.
    pub async fn wait_for_tls_failures(&self, n: usize, deadline: Duration) {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let changed = self.shared.changed.notified();
            if self.tls_failures() >= n {
                return;
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                panic!(
                    "OTLP receiver: {} failed TLS handshakes, not {n}, within {deadline:?}",
                    self.tls_failures()
                );
            }
        }
    }

    /// From now on, answer this way.
    pub fn set_answer(&self, answer: Answer) {
        let code = match answer {
            Answer::Accept => ACCEPT,
            Answer::Stall => STALL,
            Answer::Status(s) => s,
        };
        self.shared.answer.store(code, Ordering::SeqCst);
    }

    /// Export requests received, accepted or not.
    pub fn attempts(&self) -> usize {
        self.shared.attempts.load(Ordering::SeqCst)
    }

    /// The accepted requests.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.shared.requests).clone()
    }

    /// Every accepted span.
    pub fn spans(&self) -> Vec<OtlpSpan> {
        self.received()
            .into_iter()
            .flat_map(|r| r.request.resource_spans)
            .flat_map(|rs| rs.scope_spans)
            .flat_map(|ss| ss.spans)
            .collect()
    }

    /// Waits (up to `deadline`) until `done` holds for the accepted spans; returns them.
    pub async fn wait_for(
        &self,
        deadline: Duration,
        done: impl Fn(&[OtlpSpan]) -> bool,
    ) -> Vec<OtlpSpan> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let changed = self.shared.changed.notified();
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                panic!("OTLP receiver: condition not met within {deadline:?}; spans: {spans:#?}");
            }
        }
    }

    /// Waits (up to `deadline`) until at least `n` export attempts arrived.
    pub async fn wait_for_attempts(&self, n: usize, deadline: Duration) {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let changed = self.shared.changed.notified();
            if self.attempts() >= n {
                return;
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                panic!(
                    "OTLP receiver: {} attempts, not {n}, within {deadline:?}",
                    self.attempts()
                );
            }
        }
    }
}

/// A string attribute of a span.
pub fn attr_str(span: &OtlpSpan, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
}

/// An integer attribute of a span.
pub fn attr_int(span: &OtlpSpan, key: &str) -> Option<i64> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::IntValue(i) => Some(*i),
            _ => None,
        })
}

/// Serves one OTLP/HTTP connection until the exporter closes it.
async fn serve_http_connection<I>(io: I, s: Arc<Shared>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let s = Arc::clone(&s);
        async move { Ok::<_, hyper::Error>(answer_http(&s, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

fn tls_acceptor(mut config: rustls::ServerConfig, alpn: &[u8]) -> tokio_rustls::TlsAcceptor {
    config.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// The server side of a handshake, counted: a failure (told to waiters), or a stream and
/// whether the client presented a certificate.
async fn accept_tls(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    shared: &Shared,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    match acceptor.accept(tcp).await {
        Ok(tls) => {
            if tls.get_ref().1.peer_certificates().is_some() {
                shared.client_certs.fetch_add(1, Ordering::SeqCst);
            }
            Some(tls)
        }
        Err(_) => {
            shared.tls_failed.fetch_add(1, Ordering::SeqCst);
            shared.changed.notify_waiters();
            None
        }
    }
}

fn record(
    shared: &Shared,
    request: ExportTraceServiceRequest,
    headers: Vec<(String, String)>,
    raw: &[u8],
) {
    lock(&shared.requests).push(Received {
        request,
        headers,
        body_len: raw.len(),
        span_lens: span_field_lens(raw),
    });
}

/// The length of every `ResourceSpans.scope_spans.spans` field in an encoded
/// `ExportTraceServiceRequest`, walked by hand: prost's decoded spans do not say how many
/// bytes each took on the wire (a sender may write fields prost would leave out).
fn span_field_lens(raw: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    // The field wanted at each depth: the request's resource_spans (1), their scope_spans
    // (2), their spans (2); every other field is skipped by its wire type.
    fn walk(bytes: &[u8], depth: usize, out: &mut Vec<usize>) {
        let want = [1u64, 2, 2][depth];
        let mut at = 0;
        while at < bytes.len() {
            let start = at;
            let Some(tag) = varint(bytes, &mut at) else {
                return;
            };
            let (field, wire) = (tag >> 3, tag & 7);
            let len = match wire {
                0 => {
                    if varint(bytes, &mut at).is_none() {
                        return;
                    }
                    0
                }
                1 => 8,
                5 => 4,
                2 => match varint(bytes, &mut at) {
                    Some(len) => usize::try_from(len).unwrap_or(usize::MAX),
                    None => return,
                },
                _ => return,
            };
            let Some(end) = at.checked_add(len).filter(|end| *end <= bytes.len()) else {
                return;
            };
            if wire == 2 && field == want {
                if depth == 2 {
                    out.push(end - start);
                } else {
                    walk(&bytes[at..end], depth + 1, out);
                }
            }
            at = end;
        }
    }
    fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *bytes.get(*at)?;
            *at += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(value);
            }
        }
        None
    }
    walk(raw, 0, &mut out);
    out
}

async fn answer_http(
    shared: &Shared,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let gzip = req
        .headers()
        .get("content-encoding")
        .is_some_and(|v| v.as_bytes() == b"gzip");
    let path_ok = req.uri().path() == "/v1/traces" && req.method() == hyper::Method::POST;
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    shared.attempts.fetch_add(1, Ordering::SeqCst);
    let answer = shared.answer.load(Ordering::SeqCst);
    let response = |status: u16, body: Bytes| {
        let mut r = hyper::Response::new(Full::new(body));
        *r.status_mut() = hyper::StatusCode::from_u16(status).expect("a status");
        r.headers_mut().insert(
            "content-type",
            "application/x-protobuf".parse().expect("value"),
        );
        r
    };
    let out = if answer == STALL {
        shared.changed.notify_waiters();
        std::future::pending::<()>().await;
        unreachable!("pending never completes")
    } else if !path_ok {
        response(404, Bytes::new())
    } else if answer != ACCEPT {
        let mut r = response(answer, Bytes::new());
        if answer == 503 || answer == 429 {
            r.headers_mut()
                .insert("retry-after", "0".parse().expect("value"));
        }
        r
    } else {
        let raw = if gzip {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut out)
                .map(|_| out)
                .unwrap_or_default()
        } else {
            body.to_vec()
        };
        match ExportTraceServiceRequest::decode(raw.as_slice()) {
            Ok(request) => {
                record(shared, request, headers, &raw);
                response(
                    200,
                    Bytes::from(ExportTraceServiceResponse::default().encode_to_vec()),
                )
            }
            Err(_) => response(400, Bytes::new()),
        }
    };
    shared.changed.notify_waiters();
    out
}

struct Grpc(Arc<Shared>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let shared = &self.0;
        shared.attempts.fetch_add(1, Ordering::SeqCst);
        let answer = shared.answer.load(Ordering::SeqCst);
        let headers = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                }
                tonic::metadata::KeyAndValueRef::Binary(..) => None,
            })
            .collect();
        let out = match answer {
            STALL => {
                shared.changed.notify_waiters();
                std::future::pending::<()>().await;
                unreachable!("pending never completes")
            }
            ACCEPT => {
                let request = request.into_inner();
                let raw = request.encode_to_vec();
                record(shared, request, headers, &raw);
                Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
            }
            503 => Err(tonic::Status::unavailable("503")),
            _ => Err(tonic::Status::invalid_argument("refused")),
        };
        shared.changed.notify_waiters();
        out
    }
}
