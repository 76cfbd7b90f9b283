//! Downstream HTTP/1.1 connections: reads each request head, hands the request to the
//! gateway, and writes its response, keep-alive and pipelined, on the connection's task.
//!
//! # Why hand-written
//!
//! hyper's server connection was the largest single block of the gateway's user CPU per
//! request after the upstream client became its own (~20 %: its dispatch state machine,
//! head parse and encode through its own buffers, a boxed timer armed per request head),
//! and the gateway was 20-25 % short of nginx's throughput on this host
//! (`docs/benchmarks/2026-11-22-upstream-client/`). Here a request head is parsed with
//! httparse (hyper's own parser) straight from the connection's read buffer, header values
//! are slices of that buffer, the response head is encoded into one reused buffer and leaves
//! with the first body frame in one write, and the idle/head timer is one per connection,
//! moved only when it fires before the current deadline. Pingora made the same choice. HTTP/2 stays on
//! hyper (`server.rs`), as does everything that is not the product: parsing is httparse,
//! buffers are `bytes`, I/O is tokio.
//!
//! # What it speaks
//!
//! HTTP/1.1 and 1.0 as RFC 9112 has them, for a proxy's downstream side:
//! - keep-alive (1.1 by default, 1.0 with `Connection: keep-alive`) and pipelining: bytes
//!   after a head stay buffered for the next request;
//! - request bodies by `Content-Length` or chunked (extensions ignored, trailers passed
//!   on); a request with both, with a transfer coding other than a final `chunked`, with
//!   conflicting lengths, or (1.1) without exactly one `Host` is refused with `400` and the
//!   connection closed, so that nothing can be smuggled past the framing;
//! - a head larger than `limits.header_bytes` gets `431`;
//! - `Expect: 100-continue` is answered with `100 Continue` before the request goes upstream
//!   (as Envoy does), unless the declared body is over the limit;
//! - responses framed by `Content-Length` when the length is known, else chunked, else (a
//!   1.0 client) delimited by closing the connection; no body for `HEAD`, 1xx, 204 and 304;
//!   a `Date` header is added when the upstream sent none;
//! - `Upgrade` (WebSocket): after a `101` the connection, with any bytes the client sent
//!   after its head, becomes the downstream side of the gateway's tunnel.
//!
//! A connection is closed after a response whenever its framing could be in doubt: the
//! request body was not read to its end (and could not be discarded quickly), the response
//! body failed, the client asked, or the server is shutting down. A close with unread bytes
//! lingers (stops writing, discards what arrives until the client closes, bounded by
//! [`Linger`]) so that the client reads the response instead of a reset (RFC 9112 §9.6, as
//! nginx's lingering close does).

use std::future::Future;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, DATE};
use http::{Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::oneshot;

use crate::client::RawFields;
use crate::error::{BodyError, RequestError};
use crate::framing::{self, Framing, Step, chunk_size_line, step};
use crate::recycle;
use crate::request::{self, Meta};
use crate::timer::{LazyTimer, WaitTimeout};

/// A request body left unread after its response is discarded, up to this much, to keep
/// the connection; past it the connection closes.
const DISCARD_BYTES: u64 = 256 * 1024;
/// How long discarding that rest may take before the connection closes instead.
const DISCARD_TIME: Duration = Duration::from_secs(2);
/// A response body frame this small is copied behind the head, so that both leave in one
/// write; a larger one goes as its own slice of a vectored write.
const COPY_BYTES: usize = 16 * 1024;

/// A readable half of a downstream connection (plain TCP or TLS).
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// A writable half of a downstream connection.
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// What an HTTP/1.1 connection is served with: from the listener's config at accept.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The request head's size limit (`limits.header_bytes`): over it, `431` (`414` when
    /// the request line alone is over it).
    pub header_bytes: usize,
    /// `limits.body_bytes`: a declared body over it gets no `100 Continue`.
    pub body_bytes: u64,
    /// `timeouts.idle_ms`: how long a connection may wait, between requests, for the first
    /// byte of the next one, and for a write to be taken.
    pub idle: Option<Duration>,
    /// `timeouts.header_ms`: how long a request head may take, from a new connection's
    /// accept (or a later request's first byte) to its end; then `408` and close.
    pub header: Option<Duration>,
    /// `timeouts.body_ms`: the longest wait for the next bytes of a request body; then the
    /// body fails with [`BodyError::Timeout`].
    pub body: Option<Duration>,
    /// How a close with unread bytes lingers ([`Linger::DEFAULT`] unless a test needs
    /// small bounds).
    pub linger: Linger,
}

/// How a connection closed while the client may still be sending (an answer before the
/// request body was read, a refused head) lingers: after the response, the server stops
/// writing (FIN) and reads and drops what arrives until the client closes too, or one of
/// these bounds is reached; only then is the socket closed. A socket closed with unread
/// bytes sends a reset, and a reset can destroy the answer before the client reads it: a
/// client still writing its upload sees `EPIPE`/`ECONNRESET` instead of the `413` it was
/// sent (RFC 9112 §9.6; nginx's `lingering_close`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linger {
    /// The longest a close lingers in all (nginx's `lingering_time`).
    pub total: Duration,
    /// The longest wait for the client's next bytes (nginx's `lingering_timeout`).
    pub between_reads: Duration,
    /// The most bytes dropped; a client that sends more is not stopping, and is reset.
    pub bytes: u64,
}

impl Linger {
    /// 30 s in all and 5 s between reads: nginx's defaults, time for a client on a slow
    /// link to finish the part of its upload it had under way. 64 MiB: more than a client
    /// that stops once it reads the answer can still have on its way, whatever the buffer
    /// sizes of the hosts (Linux grows a receive buffer up to `net.ipv4.tcp_rmem`'s max, 32
    /// MiB on some kernels, and a send buffer up to `tcp_wmem`'s, 4 MiB by default), and
    /// than a client that reads only after sending its whole body sends for most uploads.
    pub const DEFAULT: Linger = Linger {
        total: Duration::from_secs(30),
        between_reads: Duration::from_secs(5),
        bytes: 64 * 1024 * 1024,
    };
}

impl Default for Linger {
    fn default() -> Linger {
        Linger::DEFAULT
    }
}

/// What the gateway does with the requests of a connection: the small interface between the
/// HTTP/1.1 engine and everything above it (routing, metrics, the access log).
pub trait Handler {
    /// The body type of the handler's requests (which carries an [`H1Body`]).
    type Body;
    /// The body type of its responses.
    type ResponseBody: OutgoingBody;

    /// An empty request (`GET /`, HTTP/1.1, no fields, an empty body) with room for at least
    /// `fields` fields: the engine fills it from the parsed head. A handler recycles these.
    fn new_request(&self, fields: usize) -> Box<Request<Self::Body>>;

    /// Makes `body` the request's body.
    fn attach_body(&self, req: &mut Request<Self::Body>, body: H1Body);

    /// Serves one request from its head to the response head. `timer` is the connection's,
    /// kept across its requests, for the handler's own request timeout.
    fn serve(
        &self,
        req: Box<Request<Self::Body>>,
        timer: &mut LazyTimer,
    ) -> impl Future<Output = Response<Self::ResponseBody>>;

    /// A head was refused before it reached [`Handler::serve`] (logged and counted there):
    /// the status and the short text the connection answers with before it closes.
    fn refused(&self, err: RequestError) -> (StatusCode, &'static str);
}

/// A response body the connection writes, which may carry the upstream's field lines as
/// they came ([`RawFields`]) instead of in its response's map.
pub trait OutgoingBody: Body<Data = Bytes> + Unpin {
    /// The upstream response's fields as it sent them, when they were kept as lines (then
    /// the response's map holds only what the gateway added).
    fn raw_fields(&self) -> Option<&RawFields> {
        None
    }
}

/// The server's drain, as a connection sees it.
pub trait Shutdown {
    /// Ready once the server drains; registers the task to be woken then.
    fn poll_draining(&mut self, cx: &mut Context<'_>) -> Poll<()>;
    /// Whether the server drains.
    fn is_draining(&self) -> bool;
}

/// The reading side of a connection, with its buffer: held by the connection between
/// requests, and lent to a request's body while that streams.
pub struct Reader {
    io: ReadHalf,
    buf: BytesMut,
    read_size: usize,
    /// The body of the current request: what is left of it in `buf` and on the wire.
    framing: Framing,
    /// Reading the body failed (malformed, cut short): the connection cannot go on.
    broken: bool,
    /// `timeouts.body_ms`, for each wait for more of a request body.
    body_wait: WaitTimeout,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("buffered", &self.buf.len())
            .field("framing", &self.framing)
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// A reader whose first bytes (read while the protocol was sniffed) are `buf`.
    pub fn new(io: ReadHalf, buf: BytesMut) -> Box<Reader> {
        Box::new(Reader {
            io,
            buf,
            read_size: framing::MIN_READ,
            framing: Framing::Done,
            broken: false,
            body_wait: WaitTimeout::default(),
        })
    }

    /// Reads more bytes into `buf`; `Ok(0)` is the client's end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        framing::poll_fill(&mut self.io, cx, &mut self.buf, &mut self.read_size)
    }

    /// The next frame of the current request's body.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            if matches!(self.framing, Framing::Done) {
                return Poll::Ready(None);
            }
            match step(&mut self.framing, &mut self.buf) {
                Ok(Step::Frame(frame)) => {
                    self.body_wait.restart();
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(Step::Again) => continue,
                Ok(Step::NeedMore) => {}
                Err(reason) => return Poll::Ready(Some(Err(self.fail(BodyError::Broken(reason))))),
            }
            let filled = match self.poll_fill(cx) {
                Poll::Ready(filled) => filled,
                Poll::Pending => {
                    if self.body_wait.poll_expired(cx) {
                        return Poll::Ready(Some(Err(self.fail(BodyError::Timeout))));
                    }
                    return Poll::Pending;
                }
            };
            match filled {
                Ok(0) => {
                    let reason = "connection closed before the end of the request body";
                    return Poll::Ready(Some(
                        Err(self.fail(BodyError::Broken(reason.to_string()))),
                    ));
                }
                Ok(_) => self.body_wait.restart(),
                Err(e) => {
                    return Poll::Ready(Some(Err(self.fail(BodyError::Broken(e.to_string())))));
                }
            }
        }
    }

    fn fail(&mut self, err: BodyError) -> BodyError {
        self.broken = true;
        self.framing = Framing::Done;
        err
    }
}

/// A request body read from its HTTP/1.1 connection as the gateway polls it; at its end
/// (or when dropped) the reader goes back to the connection for the next request.
pub struct H1Body {
    reader: Option<Box<Reader>>,
    back: Option<oneshot::Sender<Box<Reader>>>,
}

impl std::fmt::Debug for H1Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Body")
            .field("framing", &self.reader.as_ref().map(|r| &r.framing))
            .finish()
    }
}

impl H1Body {
    fn give_back(&mut self) {
        if let (Some(reader), Some(back)) = (self.reader.take(), self.back.take()) {
            let _ = back.send(reader);
        }
    }
}

impl Drop for H1Body {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let Some(reader) = this.reader.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = ready!(reader.poll_body(cx));
        if matches!(reader.framing, Framing::Done) {
            // Whole (or failed): the connection can read its next request (or close).
            this.give_back();
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.reader
            .as_ref()
            .is_none_or(|r| matches!(r.framing, Framing::Done))
    }

    fn size_hint(&self) -> SizeHint {
        match self.reader.as_ref().map(|r| &r.framing) {
            None | Some(Framing::Done) => SizeHint::with_exact(0),
            Some(Framing::Length(n)) => SizeHint::with_exact(*n),
            Some(_) => SizeHint::default(),
        }
    }
}

/// The downstream side of an upgrade (a WebSocket): resolves to the connection once the
/// `101` head has been written to it. Found in the request's extensions.
/// (Shared and clonable, as request extensions must be; only an upgrade request pays.)
#[derive(Debug, Clone)]
pub struct OnUpgrade(Arc<std::sync::Mutex<Option<oneshot::Receiver<Joined>>>>);

impl OnUpgrade {
    /// The upgraded connection, or `None` if the connection ended instead.
    pub async fn connection(self) -> Option<Joined> {
        let receiver = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        receiver.await.ok()
    }
}

/// A connection made whole again from its halves, with the bytes already read from it put
/// back in front: the downstream side of a tunnel after a `101`, or an h2c connection
/// found by its preface.
pub struct Joined {
    prelude: Bytes,
    reader: ReadHalf,
    writer: WriteHalf,
}

impl std::fmt::Debug for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joined")
            .field("prelude", &self.prelude.len())
            .finish_non_exhaustive()
    }
}

impl AsyncRead for Joined {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prelude.is_empty() {
            let n = self.prelude.len().min(buf.remaining());
            buf.put_slice(&self.prelude[..n]);
            self.prelude.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for Joined {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.writer).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}

/// What waiting for the next request head gave.
enum Next<B> {
    Request(Box<Request<B>>, Meta),
    Refused(RequestError),
    /// The client closed, went idle past the timeout, or the server is shutting down.
    Close,
    /// The connection opened with the HTTP/2 preface.
    Http2,
}

/// What an h2c client sends first (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves requests on one HTTP/1.1 connection until it closes; `shutdown` says when the
/// server drains. With `sniff_h2`, a connection that opens with the HTTP/2 preface is
/// given back whole instead, for the HTTP/2 server.
pub async fn serve<H: Handler, S: Shutdown>(
    mut reader: Box<Reader>,
    writer: WriteHalf,
    handler: H,
    limits: Limits,
    shutdown: &mut S,
    sniff_h2: bool,
) -> Option<Joined> {
    reader.body_wait.set_limit(limits.body);
    let mut conn = Connection {
        sniff_h2,
        reader: Some(reader),
        writer,
        out: Vec::with_capacity(1024),
        limits,
        shutdown,
        idle: WaitTimeout::new(limits.idle),
        head_wait: WaitTimeout::new(limits.header),
        first: true,
        request_timer: LazyTimer::new(),
        handler,
    };
    conn.run().await
}

/// One HTTP/1.1 connection's state, kept across its requests.
struct Connection<'a, H, S> {
    /// `None` while a request body has it.
    reader: Option<Box<Reader>>,
    writer: WriteHalf,
    /// The response head (and a small first body frame) being written; reused.
    out: Vec<u8>,
    limits: Limits,
    shutdown: &'a mut S,
    /// `timeouts.idle_ms`, for the wait for the next request's first byte and for each
    /// write the client does not take.
    idle: WaitTimeout,
    /// `timeouts.header_ms`, for the wait for the rest of a request head once it has begun
    /// (or, on a new connection, from the start).
    head_wait: WaitTimeout,
    /// No request has been read yet: the head's time counts from the accept.
    first: bool,
    /// The requests' timeout timer (`timeouts.request_ms`), kept across requests.
    request_timer: LazyTimer,
    handler: H,
    /// Until the first head: look for the HTTP/2 preface.
    sniff_h2: bool,
}

impl<H: Handler, S: Shutdown> Connection<'_, H, S> {
    async fn run(&mut self) -> Option<Joined> {
        loop {
            let (mut req, meta) = match self.next_head().await {
                Next::Request(req, meta) => (req, meta),
                Next::Refused(refused) => {
                    self.refuse(refused).await;
                    return None;
                }
                Next::Close => {
                    self.close().await;
                    return None;
                }
                Next::Http2 => {
                    let reader = *self.reader.take()?;
                    let writer = std::mem::replace(&mut self.writer, Box::new(tokio::io::sink()));
                    return Some(Joined {
                        prelude: reader.buf.freeze(),
                        reader: reader.io,
                        writer,
                    });
                }
            };
            self.sniff_h2 = false;
            // A request with a body borrows the reader; it comes back when the body ends or
            // is dropped.
            let mut lent = None;
            if let Some(reader) = self.reader.take_if(|r| !matches!(r.framing, Framing::Done)) {
                let (back, returned) = oneshot::channel();
                let body = H1Body {
                    reader: Some(reader),
                    back: Some(back),
                };
                self.handler.attach_body(&mut req, body);
                lent = Some(returned);
            }
            let upgrade = meta.websocket.then(|| {
                let (tx, rx) = oneshot::channel();
                req.extensions_mut()
                    .insert(OnUpgrade(Arc::new(std::sync::Mutex::new(Some(rx)))));
                tx
            });
            let mut meta = meta;
            if meta.expect_continue && lent.is_some() {
                if meta.declared.is_none_or(|n| n <= self.limits.body_bytes) {
                    if self
                        .write_flushed(b"HTTP/1.1 100 Continue\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return None;
                    }
                } else {
                    // Told no `100 Continue`, the client may or may not send its body: the
                    // connection cannot tell what comes next, so it closes after the answer.
                    meta.keep_alive = false;
                }
            }
            let resp = self.handler.serve(req, &mut self.request_timer).await;
            match self.respond(resp, meta, upgrade, lent).await {
                Ok(Written::KeepAlive) => {}
                Ok(Written::Close) => {
                    self.close().await;
                    return None;
                }
                // The tunnel owns the connection now.
                Ok(Written::Upgraded) => return None,
                // The client went away or stopped reading: nothing to tell it.
                Err(_) => return None,
            }
        }
    }

    /// Writes the response: head (with the framing and connection headers it needs), then
    /// the body as it streams. Says whether the connection can take another request.
    async fn respond(
        &mut self,
        resp: Response<H::ResponseBody>,
        meta: Meta,
        upgrade: Option<oneshot::Sender<Joined>>,
        mut lent: Option<oneshot::Receiver<Box<Reader>>>,
    ) -> io::Result<Written> {
        let (parts, mut body) = resp.into_parts();
        let status = parts.status;
        let upgrading = status == StatusCode::SWITCHING_PROTOCOLS && upgrade.is_some();
        let bodiless = meta.head_request
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        // One pass over the few names (standard ones compare as enum tags) instead of two
        // hashed lookups; fields kept as lines say it themselves.
        // The body is framed by what it is, never by a length the upstream wrote: its
        // `Content-Length` crosses only where it is a plain number that says what the body
        // is, or where there is no body to frame (HEAD, 304).
        let raw = body.raw_fields();
        let keep_length = bodiless || raw.is_some_and(|raw| raw.length_exact);
        let (mut has_length, mut has_date) = raw.map_or((false, false), |raw| {
            (raw.has_length && keep_length, raw.has_date)
        });
        for name in parts.headers.keys() {
            if name == CONTENT_LENGTH {
                has_length |= bodiless;
            } else if name == DATE {
                has_date = true;
            }
        }
        let mut add_length = None;
        let framing = if bodiless {
            // A HEAD answer has the headers a GET would have: a local body's length too.
            if meta.head_request && !has_length {
                add_length = body.size_hint().exact().filter(|&n| n > 0);
            }
            Out::None
        } else if has_length {
            Out::Length
        } else if let Some(n) = body.size_hint().exact() {
            add_length = Some(n);
            Out::Length
        } else if meta.version == Version::HTTP_11 {
            Out::Chunked
        } else {
            Out::Close
        };
        // The request body usually ended before its response: then the reader is back.
        if let Some(returned) = &mut lent
            && let Ok(reader) = returned.try_recv()
        {
            self.reader = Some(reader);
            lent = None;
        }
        let body_settled = lent.is_none()
            && self.reader.as_ref().is_some_and(|r| {
                !r.broken
                    && match r.framing {
                        Framing::Done => true,
                        Framing::Length(n) => n <= DISCARD_BYTES,
                        _ => true,
                    }
            });
        // A `408` says the client was too slow: the connection closes with it (RFC 9110
        // §15.5.9), rather than wait longer for the rest of a body to discard.
        let keep = meta.keep_alive
            && body_settled
            && framing != Out::Close
            && !status.is_informational()
            && status != StatusCode::REQUEST_TIMEOUT
            && !self.shutdown.is_draining();

        let out = &mut self.out;
        out.clear();
        status_line(out, status);
        if let Some(raw) = raw {
            raw.write_to(out, keep_length);
        }
        for (name, value) in &parts.headers {
            if bodiless || name != CONTENT_LENGTH {
                framing::push_field(out, name, value);
            }
        }
        if let Some(n) = add_length {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if framing == Out::Chunked {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        if !upgrading {
            if !keep {
                out.extend_from_slice(b"connection: close\r\n");
            } else if meta.version == Version::HTTP_10 {
                out.extend_from_slice(b"connection: keep-alive\r\n");
            }
        }
        if !has_date {
            out.extend_from_slice(b"date: ");
            date::append(out);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        recycle::give_header_map(parts.headers);

        if framing == Out::None {
            drop(body);
            self.send_out().await?;
            if upgrading {
                return Ok(self.upgrade(upgrade));
            }
        } else {
            self.stream_body(&mut body, framing == Out::Chunked).await?;
            drop(body);
        }
        if !keep {
            if let Some(mut returned) = lent
                && let Ok(reader) = returned.try_recv()
            {
                self.reader = Some(reader);
            }
            return Ok(Written::Close);
        }
        Ok(if self.discard_body().await {
            Written::KeepAlive
        } else {
            Written::Close
        })
    }

    /// Streams the response body after the head in `out`: every frame that is ready joins
    /// the pending bytes, which go out when the body has nothing more at once.
    async fn stream_body(&mut self, body: &mut H::ResponseBody, chunked: bool) -> io::Result<()> {
        let mut trailers = None;
        let mut ended = body.is_end_stream();
        while !ended {
            let polled = poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await;
            let frame = match polled {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    // Nothing more for now: what is pending goes out (a stream's events are
                    // not held back), then wait.
                    self.send_out().await?;
                    poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
                }
            };
            match frame {
                None => ended = true,
                Some(Err(_)) => {
                    // Nothing can tell the client mid-body: the connection closes (a chunked
                    // body without its last chunk, or a short one, reads as cut). The body
                    // logged its own failure.
                    return Err(io::Error::other("the response body failed"));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.queue(data, chunked).await?,
                    Err(frame) => trailers = frame.into_trailers().ok(),
                },
            }
            ended = ended || body.is_end_stream();
        }
        if chunked {
            framing::push_last_chunk(&mut self.out, trailers.as_ref());
        }
        self.send_out().await
    }

    /// Adds a data frame to what is pending: copied if small, else written at once with the
    /// pending bytes in one vectored write.
    async fn queue(&mut self, data: Bytes, chunked: bool) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if chunked {
            self.out.extend_from_slice(&chunk_size_line(data.len()));
        }
        if data.len() <= COPY_BYTES {
            self.out.extend_from_slice(&data);
            if chunked {
                self.out.extend_from_slice(b"\r\n");
            }
            if self.out.len() >= COPY_BYTES {
                self.send_out().await?;
            }
            return Ok(());
        }
        let tail: &[u8] = if chunked { b"\r\n" } else { b"" };
        timed(
            &mut self.idle,
            write_slices(&mut self.writer, &mut [&self.out, &data, tail]),
        )
        .await?;
        self.out.clear();
        Ok(())
    }

    /// Writes and flushes whatever is pending in `out`.
    async fn send_out(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            timed(&mut self.idle, self.writer.write_all(&self.out)).await?;
            self.out.clear();
        }
        // A no-op on TCP; TLS writes out its last record.
        timed(&mut self.idle, self.writer.flush()).await
    }

    async fn write_flushed(&mut self, bytes: &[u8]) -> io::Result<()> {
        timed(&mut self.idle, self.writer.write_all(bytes)).await?;
        timed(&mut self.idle, self.writer.flush()).await
    }

    /// Hands the connection to the tunnel after a `101`.
    fn upgrade(&mut self, upgrade: Option<oneshot::Sender<Joined>>) -> Written {
        let (Some(tx), Some(reader)) = (upgrade, self.reader.take()) else {
            return Written::Close;
        };
        let reader = *reader;
        let writer = std::mem::replace(&mut self.writer, Box::new(tokio::io::sink()));
        let _ = tx.send(Joined {
            prelude: reader.buf.freeze(),
            reader: reader.io,
            writer,
        });
        Written::Upgraded
    }

    /// Reads and drops what is left of a request body the gateway did not read (an early
    /// answer), up to [`DISCARD_BYTES`]: whether the connection is fit for the next request.
    async fn discard_body(&mut self) -> bool {
        let Some(reader) = self.reader.as_mut() else {
            return false;
        };
        if reader.broken {
            return false;
        }
        if matches!(reader.framing, Framing::Done) {
            return true;
        }
        let mut left = DISCARD_BYTES;
        let discard = poll_fn(|cx| {
            loop {
                match ready!(reader.poll_body(cx)) {
                    None => return Poll::Ready(true),
                    Some(Ok(frame)) => {
                        let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                        if n > left {
                            return Poll::Ready(false);
                        }
                        left -= n;
                    }
                    Some(Err(_)) => return Poll::Ready(false),
                }
            }
        });
        tokio::time::timeout(DISCARD_TIME, discard)
            .await
            .unwrap_or(false)
    }

    /// Answers a head refused before the handler saw it (the handler logs it), and closes.
    async fn refuse(&mut self, refused: RequestError) {
        let (status, reason) = self.handler.refused(refused);
        let out = &mut self.out;
        out.clear();
        status_line(out, status);
        out.extend_from_slice(b"content-type: text/plain; charset=utf-8\r\ncontent-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(reason.len()).as_bytes());
        out.extend_from_slice(b"\r\nconnection: close\r\ndate: ");
        date::append(out);
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(reason.as_bytes());
        if self.send_out().await.is_ok() {
            // What the client sent after the bad head is unread: linger.
            if let Some(reader) = self.reader.as_mut() {
                reader.broken = true;
            }
            self.close().await;
        }
    }

    /// Closes the connection: stops writing (FIN, or TLS close_notify); if the client may
    /// still be sending (unread bytes), lingers first ([`Linger`]): reads and drops what
    /// arrives until the client closes or a bound is reached, so that the close does not
    /// turn into a reset that destroys the response in flight.
    async fn close(&mut self) {
        let _ = timed(&mut self.idle, self.writer.shutdown()).await;
        let Some(reader) = self.reader.as_mut() else {
            return;
        };
        let unread =
            !reader.buf.is_empty() || reader.broken || !matches!(reader.framing, Framing::Done);
        if !unread {
            return;
        }
        let linger = self.limits.linger;
        let mut quiet = WaitTimeout::new(Some(linger.between_reads));
        let mut discarded = 0u64;
        let discard = poll_fn(|cx| {
            loop {
                reader.buf.clear();
                match reader.poll_fill(cx) {
                    // The client closed (or reset): nothing more can destroy the answer.
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(()),
                    Poll::Ready(Ok(n)) => {
                        discarded = discarded.saturating_add(n as u64);
                        if discarded > linger.bytes {
                            return Poll::Ready(());
                        }
                        quiet.restart();
                    }
                    Poll::Pending => {
                        if quiet.poll_expired(cx) {
                            return Poll::Ready(());
                        }
                        return Poll::Pending;
                    }
                }
            }
        });
        let _ = tokio::time::timeout(linger.total, discard).await;
    }

    /// Waits for the next whole request head, reading as needed; parses it into a request.
    async fn next_head(&mut self) -> Next<H::Body> {
        let Connection {
            reader,
            idle,
            head_wait,
            first,
            shutdown,
            limits,
            sniff_h2,
            handler,
            ..
        } = self;
        let Some(reader) = reader.as_mut() else {
            return Next::Close;
        };
        idle.restart();
        head_wait.restart();
        // A new connection's first head is timed from the accept; a later one from its
        // first byte (before it, the connection is idle).
        let from_accept = std::mem::take(first);
        poll_fn(|cx| {
            loop {
                if *sniff_h2 {
                    let n = reader.buf.len().min(PREFACE.len());
                    if reader.buf[..n] == PREFACE[..n] {
                        if n == PREFACE.len() {
                            return Poll::Ready(Next::Http2);
                        }
                    } else {
                        *sniff_h2 = false;
                    }
                }
                if !reader.buf.is_empty() && !*sniff_h2 {
                    let parsed = request::parse(&mut reader.buf, limits.header_bytes, |n| {
                        handler.new_request(n)
                    });
                    match parsed {
                        Ok(Some((req, meta, framing))) => {
                            reader.framing = framing;
                            return Poll::Ready(Next::Request(req, meta));
                        }
                        Ok(None) => {}
                        Err(refused) => return Poll::Ready(Next::Refused(refused)),
                    }
                }
                match reader.poll_fill(cx) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Next::Close),
                    Poll::Ready(Ok(_)) => continue,
                    Poll::Pending => break,
                }
            }
            let waiting = reader.buf.is_empty();
            // Idle between requests: a draining server closes the connection at once.
            if waiting && shutdown.poll_draining(cx).is_ready() {
                return Poll::Ready(Next::Close);
            }
            // The head's own clock (nginx's `client_header_timeout`): a client that began a
            // head and does not finish it is told so; one that sent nothing (a new
            // connection's) is closed without a word, as an idle one is.
            if (from_accept || !waiting) && head_wait.poll_expired(cx) {
                return Poll::Ready(if waiting || *sniff_h2 {
                    Next::Close
                } else {
                    Next::Refused(RequestError::HeadTimeout)
                });
            }
            if (waiting || limits.header.is_none()) && idle.poll_expired(cx) {
                // As hyper and nginx do: a head that does not arrive in time gets no answer,
                // the connection just closes.
                return Poll::Ready(Next::Close);
            }
            Poll::Pending
        })
        .await
    }
}

/// Runs a write to the client, failing it if it stays blocked for the idle timeout: a
/// client that stops reading would otherwise hold its connection (and the upstream's) for
/// ever. A write that completes at once touches no timer and reads no clock.
async fn timed<T>(
    idle: &mut WaitTimeout,
    write: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    let mut write = pin!(write);
    idle.restart();
    poll_fn(|cx| {
        if let Poll::Ready(done) = write.as_mut().poll(cx) {
            return Poll::Ready(done);
        }
        if idle.poll_expired(cx) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took nothing for the idle timeout",
            )));
        }
        Poll::Pending
    })
    .await
}

/// How a response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// No body (`HEAD`, 1xx, 204, 304).
    None,
    Length,
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, length unknown).
    Close,
}

/// How a response left the connection.
#[derive(Debug)]
enum Written {
    KeepAlive,
    Close,
    Upgraded,
}

/// `HTTP/1.1 <code> <reason>\r\n`: the gateway answers in its own version, 1.1, whatever the
/// client's (RFC 9110 §2.5).
fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Writes every slice, with vectored writes, however the writes fall.
async fn write_slices(writer: &mut WriteHalf, slices: &mut [&[u8]]) -> io::Result<()> {
    let mut first = 0;
    loop {
        while first < slices.len() && slices[first].is_empty() {
            first += 1;
        }
        if first == slices.len() {
            return Ok(());
        }
        let mut iov = [IoSlice::new(&[]); 4];
        let mut used = 0;
        for (slot, slice) in iov.iter_mut().zip(&slices[first..]) {
            *slot = IoSlice::new(slice);
            used += 1;
        }
        let mut n =
            poll_fn(|cx| Pin::new(&mut *writer).poll_write_vectored(cx, &iov[..used])).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let len = slices[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                slices[first] = &slices[first][n..];
                n = 0;
            }
        }
    }
}

/// The `Date` header's value, formatted once a second per thread (RFC 9110 §6.6.1: an
/// origin server with a clock sends it; the gateway adds it when the upstream did not).
mod date {
    use std::cell::RefCell;
    use std::time::{Duration, UNIX_EPOCH};

    use rustix::time::{ClockId, clock_gettime};

    thread_local! {
        static CACHED: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
    }

    /// Appends the current date, `Sun, 06 Nov 1994 08:49:37 GMT`.
    pub(super) fn append(out: &mut Vec<u8>) {
        // The coarse clock (the kernel's last tick, a few ms old): a header with one-second
        // resolution needs no more, and it costs a fraction of a precise read.
        let second = clock_gettime(ClockId::RealtimeCoarse).tv_sec;
        CACHED.with_borrow_mut(|(at, text)| {
            if *at != second {
                *at = second;
                let since_epoch = Duration::from_secs(u64::try_from(second).unwrap_or(0));
                *text = httpdate::fmt_http_date(UNIX_EPOCH + since_epoch);
            }
            out.extend_from_slice(text.as_bytes());
        });
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn the_date_is_an_imf_fixdate_within_a_few_seconds_of_now() {
            let mut out = Vec::new();
            super::append(&mut out);
            let text = String::from_utf8(out).expect("ascii");
            assert_eq!(text.len(), 29, "{text}");
            assert!(text.ends_with(" GMT"), "{text}");
            let parsed = httpdate::parse_http_date(&text).expect("an HTTP date");
            let now = std::time::SystemTime::now();
            let skew = now.duration_since(parsed).unwrap_or_else(|e| e.duration());
            assert!(skew.as_secs() <= 5, "{text} is {skew:?} from now");
        }
    }
}

#[cfg(test)]
mod tests {
    //! The lingering close, on an in-memory connection (`tokio::io::duplex`: its buffer is
    //! the test's, not the kernel's) and a paused clock: deterministic whatever the host.

    use super::*;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::Instant;

    use crate::timer::LazyTimer;

    /// The connection's buffer each way: a client writing more than this waits for the
    /// server to read.
    const PIPE: usize = 64 * 1024;
    /// The body a client declares: far more than it ever sends.
    const DECLARED: u64 = 1 << 30;
    const ANSWER: &[u8] = b"too big\n";

    impl OutgoingBody for Full<Bytes> {}

    /// Answers every request `413` without reading its body, as the gateway relays an
    /// upstream that refuses by the head.
    struct EarlyAnswer;

    impl Handler for EarlyAnswer {
        type Body = Option<H1Body>;
        type ResponseBody = Full<Bytes>;

        fn new_request(&self, _: usize) -> Box<Request<Option<H1Body>>> {
            Box::new(Request::new(None))
        }

        fn attach_body(&self, req: &mut Request<Option<H1Body>>, body: H1Body) {
            *req.body_mut() = Some(body);
        }

        async fn serve(
            &self,
            req: Box<Request<Option<H1Body>>>,
            _: &mut LazyTimer,
        ) -> Response<Full<Bytes>> {
            drop(req);
            let mut resp = Response::new(Full::new(Bytes::from_static(ANSWER)));
            *resp.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
            resp
        }

        fn refused(&self, _: RequestError) -> (StatusCode, &'static str) {
            (StatusCode::BAD_REQUEST, "bad request\n")
        }
    }

    struct NoShutdown;

    impl Shutdown for NoShutdown {
        fn poll_draining(&mut self, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
        fn is_draining(&self) -> bool {
            false
        }
    }

    /// Serves the server end of a pipe with `linger` until the connection ends; returns when
    /// it did.
    async fn server(end: DuplexStream, linger: Linger) -> Instant {
        let (read, write) = tokio::io::split(end);
        let limits = Limits {
            header_bytes: 8 * 1024,
            body_bytes: u64::MAX,
            idle: None,
            header: None,
            body: None,
            linger,
        };
        let reader = Reader::new(Box::new(read), BytesMut::new());
        serve(
            reader,
            Box::new(write),
            EarlyAnswer,
            limits,
            &mut NoShutdown,
            false,
        )
        .await;
        Instant::now()
    }

    /// Sends a head declaring a large body and the body's first KiB, then reads the answer
    /// to the server's end of stream: it must be the whole `413`, closing.
    async fn upload_and_read_answer(client: &mut DuplexStream) {
        let head = format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {DECLARED}\r\n\r\n");
        client.write_all(head.as_bytes()).await.expect("head");
        client.write_all(&[b'x'; 1024]).await.expect("body");
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("answer");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 413 "), "{text}");
        assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\ntoo big\n"), "{text}");
    }

    /// Writes `chunk`s until a write fails or `limit` bytes went; the bytes that went.
    async fn send_until_closed(client: &mut DuplexStream, limit: u64) -> (u64, io::Result<()>) {
        let chunk = [b'x'; 16 * 1024];
        let mut sent = 0;
        while sent < limit {
            if let Err(e) = client.write_all(&chunk).await {
                return (sent, Err(e));
            }
            sent += chunk.len() as u64;
        }
        (sent, Ok(()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_still_sending_after_an_early_answer_reads_it_whole_and_is_not_cut_off() {
        let (mut client, end) = tokio::io::duplex(PIPE);
        let client_side = async {
            upload_and_read_answer(&mut client).await;
            // The answer is written and the server stopped writing; the client goes on with
            // its upload (it reads only later, or did not look): every byte is taken.
            let (sent, result) = send_until_closed(&mut client, 4 << 20).await;
            result.expect("the lingering server takes what the client still sends");
            assert_eq!(sent, 4 << 20);
            // The client is done and closes: the server closes at once.
            client.shutdown().await.expect("shutdown");
            let closed = Instant::now();
            (client, closed)
        };
        let (server_done, (_client, client_closed)) =
            tokio::join!(server(end, Linger::DEFAULT), client_side);
        assert_eq!(server_done, client_closed, "no wait once the client closed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lingering_close_gives_up_after_its_byte_bound() {
        let bound = 256 * 1024;
        let linger = Linger {
            bytes: bound,
            ..Linger::DEFAULT
        };
        let (mut client, end) = tokio::io::duplex(PIPE);
        let client_side = async {
            upload_and_read_answer(&mut client).await;
            // A client that never stops sending: cut off once the bound is dropped.
            let (sent, result) = send_until_closed(&mut client, u64::MAX).await;
            let err = result.expect_err("the server closed");
            assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
            (sent, Instant::now())
        };
        let start = Instant::now();
        let (server_done, (sent, cut)) = tokio::join!(server(end, linger), client_side);
        assert!(sent > bound, "cut off after {sent} bytes, before the bound");
        // What the server dropped, at most one read past the bound, and what the pipe held.
        assert!(
            sent <= bound + framing::MAX_READ as u64 + PIPE as u64,
            "{sent} bytes went"
        );
        assert!(server_done <= cut);
        assert_eq!(
            start, cut,
            "no time bound was reached (the clock is paused)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lingering_close_ends_when_the_client_is_quiet_for_between_reads() {
        let linger = Linger::DEFAULT;
        let (mut client, end) = tokio::io::duplex(PIPE);
        let client_side = async {
            upload_and_read_answer(&mut client).await;
            client.write_all(&[b'x'; 1024]).await.expect("more body");
            // Then silence, the connection left open.
            (client, Instant::now())
        };
        let (server_done, (mut client, quiet_since)) =
            tokio::join!(server(end, linger), client_side);
        assert_eq!(server_done - quiet_since, linger.between_reads);
        let err = client.write_all(b"x").await.expect_err("closed");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lingering_close_ends_after_its_total_time_however_the_client_trickles() {
        let linger = Linger::DEFAULT;
        let (mut client, end) = tokio::io::duplex(PIPE);
        let every = linger.between_reads / 2;
        let client_side = async {
            upload_and_read_answer(&mut client).await;
            let answered = Instant::now();
            // A KiB every half of `between_reads`: never quiet for long enough, for ever.
            loop {
                if let Err(e) = client.write_all(&[b'x'; 1024]).await {
                    assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
                    break;
                }
                tokio::time::sleep(every).await;
            }
            answered
        };
        let (server_done, answered) = tokio::join!(server(end, linger), client_side);
        assert_eq!(server_done - answered, linger.total);
    }
}
