//! Bodies streamed through the gateway: the request body with its size limit and byte
//! count, and an HTTP/2 upstream's response body under its deadline or read timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use tailguard_http1::server::H1Body;

use crate::error::Error;
use crate::grpc;
use crate::replay::{Reader, ReplayError};
use tailguard_upstream::h2::StreamGuard;

/// Set in a request body's byte count (`RequestRecord::bytes_in`) once the body has ended:
/// a request timeout that fires before then is the client's (408), not the upstream's.
pub const BODY_ENDED: u64 = 1 << 63;

/// Whether the body counted by `count` ended (was read whole, or failed) before now.
#[inline]
pub fn body_ended(count: &AtomicU64) -> bool {
    count.load(Ordering::Relaxed) & BODY_ENDED != 0
}

/// How much of an over-limit body is read and discarded before the 413 (a client that sends
/// more than this may see its connection reset instead).
const DRAIN_BYTES: u64 = 4 * 1024 * 1024;

/// A request body as the downstream connection delivers it.
#[derive(Debug)]
pub enum IncomingBody {
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
    /// The first frame, read before the request was forwarded ([`RequestBody::poll_first`]):
    /// given out first, counted then.
    first: Option<Frame<Bytes>>,
}

impl RequestBody {
    /// A body with no limit yet: the gateway sets it ([`RequestBody::limit`]) once the
    /// request is routed.
    #[inline]
    pub fn unlimited(inner: IncomingBody) -> RequestBody {
        RequestBody {
            inner,
            limit: u64::MAX,
            seen: 0,
            count: None,
            first: None,
        }
    }

    /// Ready once the body's first bytes (a frame with data, or trailers) or its end have
    /// arrived, which it keeps to give out first: the gateway waits on it before it chooses
    /// an upstream, so a request whose body never comes holds no upstream connection. Empty
    /// DATA frames do not count (they would let a client hold a stream open for free).
    pub fn poll_first(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        while self.first.is_none() && !self.inner.is_end_stream() {
            match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if frame.data_ref().is_none_or(|d| !d.is_empty()) {
                        self.first = Some(frame);
                    }
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None => break,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Limits the body to `limit` bytes; `count` (if any) is updated with the bytes read.
    #[inline]
    pub fn limit(&mut self, limit: u64, count: Option<Arc<AtomicU64>>) {
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
        let polled = match this.first.take() {
            Some(frame) => Some(Ok(frame)),
            None => ready!(Pin::new(&mut this.inner).poll_frame(cx)),
        };
        match polled {
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
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        // The first frame, kept, is still to come.
        if let Some(n) = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map(|d| d.len() as u64)
        {
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper.saturating_add(n));
            }
            hint.set_lower(hint.lower().saturating_add(n));
        }
        hint
    }
}

/// An HTTP/2 upstream's response body: frames passed on as they come (data and trailers),
/// under the call's deadline (gRPC) or the read timeout (plain HTTP).
#[derive(Debug)]
pub struct H2Body {
    inner: Incoming,
    addr: std::net::SocketAddr,
    /// Counts the stream against its connection until the body ends or is dropped.
    _stream: StreamGuard,
    /// A gRPC call's deadline: when it passes, the stream ends with `DEADLINE_EXCEEDED`.
    deadline: Option<Pin<Box<Sleep>>>,
    /// `timeouts.read_ms` and its timer, re-armed by every frame.
    read: Option<(Duration, Pin<Box<Sleep>>)>,
    /// The deadline passed (its trailers were sent) or the body failed: nothing more.
    ended: bool,
}

impl H2Body {
    /// The body of the stream `stream` from `addr`, ended by `deadline` (a gRPC call's)
    /// or by `read_timeout` between frames.
    pub fn new(
        inner: Incoming,
        stream: StreamGuard,
        addr: std::net::SocketAddr,
        deadline: Option<Pin<Box<Sleep>>>,
        read_timeout: Option<Duration>,
    ) -> H2Body {
        H2Body {
            inner,
            addr,
            _stream: stream,
            deadline,
            read: read_timeout.map(|t| (t, Box::pin(tokio::time::sleep(t)))),
            ended: false,
        }
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some((limit, timer)) = &mut this.read {
                    timer.as_mut().reset(tokio::time::Instant::now() + *limit);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // Nothing follows an error (a gRPC response turns it into its last frame).
                this.ended = true;
                let reason = match std::error::Error::source(&e) {
                    Some(cause) => format!("{e}: {cause}"),
                    None => e.to_string(),
                };
                Poll::Ready(Some(Err(Error::UpstreamBroken {
                    addr: this.addr,
                    reason,
                })))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if let Some(deadline) = &mut this.deadline {
                    ready!(deadline.as_mut().poll(cx));
                    // The call is over for the client; dropping the upstream's body (with
                    // this one) cancels its stream.
                    this.ended = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(grpc::trailers(
                        grpc::code::DEADLINE_EXCEEDED,
                        "deadline exceeded",
                    )))));
                }
                if let Some((_, timer)) = &mut this.read {
                    ready!(timer.as_mut().poll(cx));
                    this.ended = true;
                    return Poll::Ready(Some(Err(Error::UpstreamTimeout {
                        addr: this.addr,
                        phase: "body",
                    })));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
