//! The response body sent downstream: the upstream's body streamed as it arrives (HTTP/1.1
//! or HTTP/2), or a local answer, compressed frame by frame when the route compresses it;
//! it counts bytes out and, when it ends, finishes the request record.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use tailguard_compress::Encoder;
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
    /// Compressing: the encoder the source's data goes through (boxed: most responses are
    /// not compressed, and the body stays small for them).
    encoding: Option<Box<Encoding>>,
}

/// A compressed body's encoder and what it holds back.
#[derive(Debug)]
struct Encoding {
    encoder: Encoder,
    /// Flush after every frame (an event stream: each event goes out as it comes).
    flush: bool,
    /// The source's trailers, sent after the encoder's last bytes.
    trailers: Option<http::HeaderMap>,
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
            encoding: None,
        }
    }

    /// Streams an HTTP/2 upstream's body.
    pub(crate) fn upstream_h2(body: H2Body, finish: Option<Finish>) -> ResponseBody {
        ResponseBody {
            source: Source::UpstreamH2(Box::new(body)),
            finish,
            encoding: None,
        }
    }

    /// No body at all: the head ends the response (an HTTP/2 head with `END_STREAM`).
    pub(crate) fn empty(finish: Option<Finish>) -> ResponseBody {
        ResponseBody {
            source: Source::Local(None),
            finish,
            encoding: None,
        }
    }

    /// A body made by the gateway.
    pub(crate) fn local(body: Bytes, finish: Option<Finish>) -> ResponseBody {
        ResponseBody {
            source: Source::Local(Some(body)),
            finish,
            encoding: None,
        }
    }

    /// Compresses the rest of the body with `encoder` (its head says so already), flushing
    /// after every frame when `flush`.
    pub(crate) fn compress(&mut self, encoder: Encoder, flush: bool) {
        self.encoding = Some(Box::new(Encoding {
            encoder,
            flush,
            trailers: None,
        }));
    }

    /// The body streams an upstream's (not a local answer or an error's).
    pub(crate) fn is_upstream(&self) -> bool {
        !matches!(self.source, Source::Local(_))
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

impl ResponseBody {
    /// The source's next frame, as it is (a gRPC stream the upstream broke ends in trailers
    /// here).
    fn poll_source(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self;
        match &mut this.source {
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
        }
    }

    /// The next frame of a compressed body: the source's data through the encoder (polled
    /// again while the encoder keeps what it was given), its last bytes when the source
    /// ends, then the source's trailers.
    fn poll_encoded(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        loop {
            let encoding = self
                .encoding
                .as_mut()
                .expect("only called while compressing");
            if encoding.encoder.is_finished() {
                return Poll::Ready(encoding.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let (frame, ended) = match ready!(self.poll_source(cx)) {
                Some(Ok(frame)) => (frame, self.source_ended()),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => (Frame::data(Bytes::new()), true),
            };
            let encoding = self
                .encoding
                .as_mut()
                .expect("only called while compressing");
            let out = match frame.into_data() {
                Ok(data) => {
                    let end = if ended {
                        tailguard_compress::End::Finish
                    } else if encoding.flush {
                        tailguard_compress::End::Flush
                    } else {
                        tailguard_compress::End::No
                    };
                    encoding.encoder.encode(&data, end)
                }
                Err(frame) => {
                    encoding.trailers = frame.into_trailers().ok();
                    encoding
                        .encoder
                        .encode(&[], tailguard_compress::End::Finish)
                }
            };
            match out {
                Ok(out) if out.is_empty() => {}
                Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                Err(e) => {
                    return Poll::Ready(Some(Err(Error::Internal(format!(
                        "compressing the response: {e}"
                    )))));
                }
            }
        }
    }

    /// The source has no more frames.
    fn source_ended(&self) -> bool {
        match &self.source {
            Source::Local(b) => b.is_none(),
            Source::Upstream(first, b) => first.is_none() && b.is_end_stream(),
            Source::UpstreamH2(b) => b.is_end_stream(),
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
        let polled = if this.encoding.is_some() {
            this.poll_encoded(cx)
        } else {
            this.poll_source(cx)
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
        match &self.encoding {
            // Its last bytes are out only once the encoder finished.
            Some(e) => e.encoder.is_finished() && e.trailers.is_none(),
            None => self.source_ended(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        if self.encoding.is_some() {
            // A compressed length is known only at its end.
            return SizeHint::new();
        }
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
