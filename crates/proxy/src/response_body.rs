//! The response body sent downstream: the upstream's body streamed as it arrives (HTTP/1.1
//! or HTTP/2), or a local answer; it counts bytes out and, when it ends, finishes the
//! request record.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use tailguard_http::body::{H2Body, RequestBody};
use tailguard_http::error::Error;
use tailguard_http1::client::{RawFields, UpstreamBody};
use tailguard_http1::server::OutgoingBody;

use crate::finish::Finish;

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
        // As for errors before the head (`respond::error_response`): the client's own
        // failure is routine, the upstream's is not.
        match err.blame() {
            tailguard_http::error::Blame::Downstream => line!(info),
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
                                tailguard_http::grpc::status(trailers).or(f.record.grpc_status);
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
                        Poll::Ready(Some(Ok(Frame::trailers(tailguard_http::grpc::trailers(
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

impl ResponseBody {
    /// Moves an HTTP/1.1 upstream's fields kept as lines into `map` (for a stage that must
    /// see or remove them); nothing for any other body.
    pub(crate) fn fields_into(&mut self, map: &mut http::HeaderMap) {
        if let Source::Upstream(_, body) = &mut self.source {
            body.fields_into(map);
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
