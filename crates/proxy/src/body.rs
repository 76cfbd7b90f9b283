//! Bodies streamed through the gateway: the request body with its size limit and byte
//! count, and the response body that counts bytes out and finishes the request record.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use tailguard_http1::client::{RawFields, UpstreamBody};
use tailguard_http1::server::{H1Body, OutgoingBody};

use crate::error::Error;
use crate::forward_h2::H2Body;
use crate::record::Finish;
use crate::replay::{Reader, ReplayError};

/// Set in a request body's byte count (`RequestRecord::bytes_in`) once the body has ended:
/// a request timeout that fires before then is the client's (408), not the upstream's.
pub(crate) const BODY_ENDED: u64 = 1 << 63;

/// Whether the body counted by `count` ended (was read whole, or failed) before now.
pub(crate) fn body_ended(count: &AtomicU64) -> bool {
    count.load(Ordering::Relaxed) & BODY_ENDED != 0
}

/// How much of an over-limit body is read and discarded before the 413 (a client that sends
/// more than this may see its connection reset instead).
const DRAIN_BYTES: u64 = 4 * 1024 * 1024;

/// A request body as the downstream connection delivers it.
#[derive(Debug)]
pub(crate) enum IncomingBody {
    /// No body (the head said so).
    Empty,
    /// Read from an HTTP/1.1 connection (`downstream`).
    Http1(H1Body),
    /// An HTTP/2 stream's data (hyper).
    Http2(Incoming),
    /// A try's share of a body kept for a retry (`retry.buffer_bytes`): the kept bytes,
    /// then the rest of the client's body as it comes.
    Kept(Reader<RequestBody>),
}

impl Body for IncomingBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let polled = match self.get_mut() {
            IncomingBody::Empty => return Poll::Ready(None),
            IncomingBody::Http1(b) => {
                ready!(Pin::new(b).poll_frame(cx)).map(|r| r.map_err(Error::from))
            }
            IncomingBody::Http2(b) => ready!(Pin::new(b).poll_frame(cx))
                .map(|r| r.map_err(|e| Error::DownstreamBody(e.to_string()))),
            IncomingBody::Kept(b) => ready!(Pin::new(b).poll_frame(cx)).map(|r| {
                r.map_err(|e| match e {
                    ReplayError::Source(e) => e,
                    // Only an abandoned try's body sees it; nobody reads its error.
                    ReplayError::Superseded => {
                        Error::Internal("request body taken by a later try".to_owned())
                    }
                })
            }),
        };
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match self {
            IncomingBody::Empty => true,
            IncomingBody::Http1(b) => b.is_end_stream(),
            IncomingBody::Http2(b) => b.is_end_stream(),
            IncomingBody::Kept(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            IncomingBody::Empty => SizeHint::with_exact(0),
            IncomingBody::Http1(b) => b.size_hint(),
            IncomingBody::Http2(b) => b.size_hint(),
            IncomingBody::Kept(b) => b.size_hint(),
        }
    }
}

/// The downstream request body on its way upstream: errors with [`Error::BodyTooLarge`]
/// as soon as more than the limit has streamed, whatever the framing (chunked or not), so
/// the gateway never buffers or forwards more than the limit.
#[derive(Debug)]
pub struct RequestBody {
    inner: IncomingBody,
    limit: u64,
    seen: u64,
    count: Option<Arc<AtomicU64>>,
}

impl RequestBody {
    /// A body with no limit yet: the gateway sets it ([`RequestBody::limit`]) once the
    /// request is routed.
    pub(crate) fn unlimited(inner: IncomingBody) -> RequestBody {
        RequestBody {
            inner,
            limit: u64::MAX,
            seen: 0,
            count: None,
        }
    }

    /// Limits the body to `limit` bytes; `count` (if any) is updated with the bytes read.
    pub(crate) fn limit(&mut self, limit: u64, count: Option<Arc<AtomicU64>>) {
        self.limit = limit;
        self.count = count;
    }

    fn ended(&self) {
        if let Some(c) = &self.count {
            c.store(self.seen | BODY_ENDED, Ordering::Relaxed);
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        if this.seen > this.limit {
            // Over the limit: read and discard the rest (up to DRAIN_BYTES more) before
            // failing, so the client finishes sending and reads the 413 instead of a reset on
            // a connection closed with unread data (nginx's lingering close). `seen` keeps
            // this state across Pending; nothing more is forwarded.
            while this.seen <= this.limit.saturating_add(DRAIN_BYTES) {
                match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                    Some(Ok(f)) => this.seen += f.data_ref().map_or(0, |d| d.len() as u64),
                    _ => break,
                }
            }
            this.ended();
            return Poll::Ready(Some(Err(Error::BodyTooLarge)));
        }
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len() as u64;
                    if let Some(c) = &this.count {
                        c.store(this.seen, Ordering::Relaxed);
                    }
                    if this.seen > this.limit {
                        // Drain (above), then fail.
                        return Pin::new(this).poll_frame(cx);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                this.ended();
                Poll::Ready(Some(Err(e)))
            }
            None => {
                this.ended();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[derive(Debug)]
enum Source {
    /// The upstream's body, with the frame read ahead (if any) to be sent first.
    Upstream(Option<Frame<Bytes>>, UpstreamBody<RequestBody>),
    /// An HTTP/2 upstream's body (boxed: the HTTP/1.1 variant stays the enum's size).
    UpstreamH2(Box<H2Body>),
    Local(Option<Bytes>),
}

/// The response body sent downstream: the upstream's body streamed as it arrives, or a
/// local answer. Counts bytes out; when it ends, errors, or is dropped, the request's
/// [`Finish`] runs.
#[derive(Debug)]
pub struct ResponseBody {
    source: Source,
    finish: Option<Finish>,
}

impl ResponseBody {
    /// Streams an upstream body.
    pub(crate) fn upstream(
        first: Option<Frame<Bytes>>,
        body: UpstreamBody<RequestBody>,
        finish: Option<Finish>,
    ) -> ResponseBody {
        ResponseBody {
            source: Source::Upstream(first, body),
            finish,
        }
    }

    /// Streams an HTTP/2 upstream's body.
    pub(crate) fn upstream_h2(body: H2Body, finish: Option<Finish>) -> ResponseBody {
        ResponseBody {
            source: Source::UpstreamH2(Box::new(body)),
            finish,
        }
    }

    /// No body at all: the head ends the response (an HTTP/2 head with `END_STREAM`).
    pub(crate) fn empty(finish: Option<Finish>) -> ResponseBody {
        ResponseBody {
            source: Source::Local(None),
            finish,
        }
    }

    /// A body made by the gateway.
    pub(crate) fn local(body: Bytes, finish: Option<Finish>) -> ResponseBody {
        ResponseBody {
            source: Source::Local(Some(body)),
            finish,
        }
    }

    fn count(&mut self, n: usize) {
        if let Some(f) = &mut self.finish {
            f.record.bytes_out += n as u64;
        }
    }

    fn end(&mut self, completed: bool) {
        self.settle(completed);
        drop(self.finish.take());
    }

    /// The body failed after its head was sent (an upstream that broke or stalled mid-body,
    /// or a request body that failed while still being sent): nothing can tell the client,
    /// whose connection is closed, so this is the request's one log line saying who was at
    /// fault, and its error for the access log and the error metric.
    fn failed(&mut self, err: &Error) {
        let Some(f) = &mut self.finish else {
            return;
        };
        f.record.error = Some(err.kind());
        let snapshot = f.held.snapshot();
        snapshot.metrics.gateway.error(err.kind(), err.blame());
        let route = f.record.route.map(|r| &*snapshot.router.get(r).id);
        let upstream = f
            .record
            .endpoint
            .map(|(u, e)| snapshot.upstreams[u].endpoints[e].addr);
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    target: "tailguard::request",
                    status = f.record.status,
                    kind = err.kind(),
                    blame = err.blame().as_str(),
                    route,
                    upstream = ?upstream,
                    method = %f.record.method,
                    uri = %f.record.uri,
                    remote = %f.record.remote,
                    bytes_out = f.record.bytes_out,
                    "response body failed mid-way: {err}"
                )
            };
        }
        // As for errors before the head (`gateway::error_response`): the client's own
        // failure is routine, the upstream's is not.
        match err.blame() {
            crate::error::Blame::Downstream => line!(info),
            _ => line!(warn),
        }
    }

    /// Notes whether the response went out whole; if it did, the upstream connection can go
    /// back to its pool (the finish does that, as it knows the endpoint).
    fn settle(&mut self, completed: bool) {
        if let Some(f) = &mut self.finish {
            f.record.completed = completed;
            if completed && let Source::Upstream(_, body) = &mut self.source {
                f.upstream_conn = body.take_reusable();
            }
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        let polled = match &mut this.source {
            Source::Local(body) => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
            Source::Upstream(first, body) => match first.take() {
                Some(frame) => Poll::Ready(Some(Ok(frame))),
                None => Pin::new(body)
                    .poll_frame(cx)
                    .map(|polled| polled.map(|r| r.map_err(Error::from))),
            },
            Source::UpstreamH2(body) => {
                let polled = ready!(Pin::new(&mut **body).poll_frame(cx));
                let Some(f) = &mut this.finish else {
                    return Poll::Ready(polled);
                };
                match &polled {
                    // A gRPC call's outcome is in its trailers.
                    Some(Ok(frame)) => {
                        if let Some(trailers) = frame.trailers_ref() {
                            f.record.grpc_status =
                                crate::grpc::status(trailers).or(f.record.grpc_status);
                        }
                        Poll::Ready(polled)
                    }
                    // A gRPC stream the upstream broke ends with a status the client can
                    // read (the failure logged and counted as any other), not a reset.
                    Some(Err(e)) if f.record.grpc => {
                        let code = e.grpc_status();
                        let message = e.grpc_message();
                        f.record.grpc_status = Some(code);
                        this.failed(e);
                        Poll::Ready(Some(Ok(Frame::trailers(crate::grpc::trailers(
                            code, message,
                        )))))
                    }
                    _ => Poll::Ready(polled),
                }
            }
        };
        match ready!(polled) {
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    let n = d.len();
                    this.count(n);
                }
                if Body::is_end_stream(this) {
                    this.end(true);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                this.failed(&e);
                this.end(false);
                Poll::Ready(Some(Err(e)))
            }
            None => {
                this.end(true);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Local(b) => b.is_none(),
            Source::Upstream(first, b) => first.is_none() && b.is_end_stream(),
            Source::UpstreamH2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Local(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Source::Upstream(first, b) => {
                let ahead = first
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |d| d.len() as u64);
                let rest = b.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + ahead);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + ahead);
                }
                hint
            }
            Source::UpstreamH2(b) => b.size_hint(),
        }
    }
}

impl OutgoingBody for ResponseBody {
    fn raw_fields(&self) -> Option<&RawFields> {
        match &self.source {
            Source::Upstream(_, body) => body.raw_fields(),
            Source::UpstreamH2(_) | Source::Local(_) => None,
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // Dropped before its end: the client went away or the connection was torn down.
        // hyper also drops a body it knows is empty (`is_end_stream`) without polling it,
        // which is a completed response.
        let done = Body::is_end_stream(self);
        self.settle(done);
    }
}
