//! A tower layer that traces any hyper/axum service: the incoming context extracted, a
//! SERVER span with the stable HTTP semantic conventions, ended when the response body
//! ends (or is dropped), and the span's context handed to the handler as a
//! [`CurrentSpan`] request extension so the application can propagate it.
//!
//! The span is built for every request (the head decision only sets the `sampled` flag the
//! application propagates); whether it is exported is decided when it ends, by the
//! [`TailRule`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http::{Method, Request, Response, Version};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::context::{CurrentSpan, SpanContext};
use crate::id::{SpanId, TraceId};
use crate::propagation::extract;
use crate::recorder::Tracer;
use crate::sampler::{Sampler, TailRule};
use crate::span::{Span, SpanKind, Status};

/// Nanoseconds since the Unix epoch now (a vDSO `clock_gettime`, no syscall).
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `http.request.method`: the method if it is a known one, `_OTHER` otherwise (the
/// semantic conventions' rule, which also bounds the attribute's values).
pub fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "_OTHER",
    }
}

/// `network.protocol.version`.
pub fn protocol_version(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// The host of a `Host` value (`example.com:8080` → `example.com`, `[::1]:80` → `::1`).
pub fn host_without_port(host: &[u8]) -> &[u8] {
    if let Some(rest) = host.strip_prefix(b"[") {
        return rest.split(|&b| b == b']').next().unwrap_or(rest);
    }
    match host.iter().rposition(|&b| b == b':') {
        Some(i) => &host[..i],
        None => host,
    }
}

/// Adds [`TraceService`] to a service.
#[derive(Debug, Clone)]
pub struct TraceLayer {
    tracer: Tracer,
    sampler: Sampler,
    tail: TailRule,
}

impl TraceLayer {
    /// Records into `tracer` (from [`crate::Exporter::tracer`]); parent-based sampling of
    /// every new trace, and failed requests kept.
    pub fn new(tracer: Tracer) -> TraceLayer {
        TraceLayer {
            tracer,
            sampler: Sampler::default(),
            tail: TailRule {
                keep_errors: true,
                slow_nanos: 0,
            },
        }
    }

    /// The head sampler.
    pub fn sampler(mut self, sampler: Sampler) -> TraceLayer {
        self.sampler = sampler;
        self
    }

    /// The tail rule.
    pub fn tail(mut self, tail: TailRule) -> TraceLayer {
        self.tail = tail;
        self
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = TraceService<S>;

    fn layer(&self, inner: S) -> TraceService<S> {
        TraceService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`TraceLayer`] makes.
#[derive(Debug, Clone)]
pub struct TraceService<S> {
    inner: S,
    layer: TraceLayer,
}

/// A span waiting for its request to end; recorded (if the tail rule keeps it) when
/// dropped.
#[derive(Debug)]
struct Pending {
    span: Span,
    tracer: Tracer,
    tail: TailRule,
    sampled: bool,
    failed: bool,
    started: Instant,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let elapsed = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if self.tail.keep(self.sampled, self.failed, elapsed) {
            self.span.end_unix_nanos = self.span.start_unix_nanos.saturating_add(elapsed);
            self.tracer.record(&self.span);
        }
    }
}

impl<S, B, ResBody> Service<Request<B>> for TraceService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<TraceBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if !self.layer.tracer.is_enabled() {
            return ResponseFuture {
                inner: self.inner.call(req),
                pending: None,
            };
        }
        let started = Instant::now();
        let start_unix = unix_nanos();
        let found = extract(req.headers());
        if let Some(m) = self.layer.tracer.metrics() {
            for header in found.malformed() {
                m.context_invalid(header);
            }
        }
        let trace_id = found.parent.map_or_else(TraceId::random, |p| p.trace_id);
        let sampled =
            self.layer
                .sampler
                .sample(found.parent.as_ref(), found.sampling_hint, trace_id);
        let context = SpanContext {
            trace_id,
            span_id: SpanId::random(),
            sampled,
        };
        let mut span = Span::new(SpanKind::Server, &context, found.parent.map(|p| p.span_id));
        span.start_unix_nanos = start_unix;
        let method = method_name(req.method());
        span.set_name(method);
        span.str("http.request.method", method);
        span.bytes("url.path", req.uri().path().as_bytes());
        if let Some(host) = req
            .headers()
            .get(http::header::HOST)
            .map(|h| h.as_bytes())
            .or_else(|| req.uri().host().map(str::as_bytes))
        {
            span.bytes("server.address", host_without_port(host));
        }
        span.str("network.protocol.version", protocol_version(req.version()));
        req.extensions_mut().insert(CurrentSpan {
            context,
            tracestate: found.tracestate,
        });
        ResponseFuture {
            inner: self.inner.call(req),
            pending: Some(Pending {
                span,
                tracer: self.layer.tracer.clone(),
                tail: self.layer.tail,
                sampled,
                failed: false,
                started,
            }),
        }
    }
}

pin_project! {
    /// The future of [`TraceService`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        pending: Option<Pending>,
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<TraceBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        let mut pending = this.pending.take();
        Poll::Ready(match result {
            Ok(response) => {
                if let Some(p) = &mut pending {
                    let status = response.status().as_u16();
                    p.span.int("http.response.status_code", i64::from(status));
                    if status >= 500 {
                        p.failed = true;
                        p.span.status = Status::Error;
                        p.span.bytes("error.type", &status_digits(status));
                    }
                }
                Ok(response.map(|inner| TraceBody { inner, pending }))
            }
            Err(e) => {
                if let Some(p) = &mut pending {
                    p.failed = true;
                    p.span.status = Status::Error;
                    p.span.str("error.type", "_OTHER");
                }
                Err(e)
            }
        })
    }
}

/// A status code's three digits.
fn status_digits(status: u16) -> [u8; 3] {
    let d = |n: u16| b'0' + u8::try_from(n % 10).expect("a digit");
    [d(status / 100), d(status / 10), d(status)]
}

pin_project! {
    /// A response body that ends its request's span when it ends (or is dropped).
    pub struct TraceBody<B> {
        #[pin]
        inner: B,
        pending: Option<Pending>,
    }
}

impl<B: Body> Body for TraceBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        match &frame {
            None => drop(this.pending.take()),
            Some(Err(_)) => {
                if let Some(mut p) = this.pending.take() {
                    p.failed = true;
                    p.span.status = Status::Error;
                }
            }
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
