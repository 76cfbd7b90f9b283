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
//! lingers (stops writing, discards what arrives for a moment) so that the client reads the
//! response instead of a reset, as nginx's lingering close does.

use std::future::Future;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, EXPECT, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::oneshot;

use crate::body::{IncomingBody, RequestBody, ResponseBody};
use crate::drain::Watch;
use crate::error::Error;
use crate::framing::{self, Chunk, Framing, MAX_HEADERS, Step, chunk_size_line, step};
use crate::gateway::{self, ConnCtx};
use crate::headers;
use crate::recycle;
use crate::timer::{LazyTimer, WaitTimeout};

/// A request body left unread after its response is discarded, up to this much, to keep
/// the connection; past it the connection closes.
const DISCARD_BYTES: u64 = 256 * 1024;
/// How long a close with unread bytes waits for the client to stop sending.
const LINGER: Duration = Duration::from_secs(2);
/// A lingering close discards at most this much before it gives up.
const LINGER_BYTES: usize = 4 * 1024 * 1024;
/// A response body frame this small is copied behind the head, so that both leave in one
/// write; a larger one goes as its own slice of a vectored write.
const COPY_BYTES: usize = 16 * 1024;

/// A readable half of a downstream connection (plain TCP or TLS).
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// A writable half of a downstream connection.
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// What an HTTP/1.1 connection is served with: from the listener's config at accept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The request head's size limit (`limits.header_bytes`): over it, `431`.
    pub(crate) header_bytes: usize,
    /// `limits.body_bytes`: a declared body over it gets no `100 Continue`.
    pub(crate) body_bytes: u64,
    /// `timeouts.idle_ms`: how long a connection may wait for (the rest of) a request head.
    pub(crate) idle: Option<Duration>,
}

/// The reading side of a connection, with its buffer: held by the connection between
/// requests, and lent to a request's body while that streams.
pub(crate) struct Reader {
    io: ReadHalf,
    buf: BytesMut,
    read_size: usize,
    /// The body of the current request: what is left of it in `buf` and on the wire.
    framing: Framing,
    /// Reading the body failed (malformed, cut short): the connection cannot go on.
    broken: bool,
}

impl Reader {
    /// A reader whose first bytes (read while the protocol was sniffed) are `buf`.
    pub(crate) fn new(io: ReadHalf, buf: BytesMut) -> Box<Reader> {
        Box::new(Reader {
            io,
            buf,
            read_size: framing::MIN_READ,
            framing: Framing::Done,
            broken: false,
        })
    }

    /// Reads more bytes into `buf`; `Ok(0)` is the client's end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        framing::poll_fill(&mut self.io, cx, &mut self.buf, &mut self.read_size)
    }

    /// The next frame of the current request's body.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, String>>> {
        loop {
            if matches!(self.framing, Framing::Done) {
                return Poll::Ready(None);
            }
            match step(&mut self.framing, &mut self.buf) {
                Ok(Step::Frame(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(Step::Again) => continue,
                Ok(Step::NeedMore) => {}
                Err(reason) => return Poll::Ready(Some(Err(self.fail(reason)))),
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    let reason = "connection closed before the end of the request body";
                    return Poll::Ready(Some(Err(self.fail(reason.to_string()))));
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(self.fail(e.to_string())))),
            }
        }
    }

    fn fail(&mut self, reason: String) -> String {
        self.broken = true;
        self.framing = Framing::Done;
        reason
    }
}

/// A request body read from its HTTP/1.1 connection as the gateway polls it; at its end
/// (or when dropped) the reader goes back to the connection for the next request.
pub(crate) struct H1Body {
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
    type Error = String;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, String>>> {
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
pub(crate) struct OnUpgrade(Arc<std::sync::Mutex<Option<oneshot::Receiver<Joined>>>>);

impl OnUpgrade {
    /// The upgraded connection, or `None` if the connection ended instead.
    pub(crate) async fn connection(self) -> Option<Joined> {
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
pub(crate) struct Joined {
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

/// A request head refused before the gateway saw it.
#[derive(Debug)]
enum Refused {
    /// Malformed: `400`.
    Bad(&'static str),
    /// Over `limits.header_bytes` or [`MAX_HEADERS`] lines: `431`.
    TooLarge,
}

/// What the connection learned from a request head, beyond the request itself.
#[derive(Debug, Clone, Copy)]
struct Meta {
    version: Version,
    /// The client takes another request after this one.
    keep_alive: bool,
    head_request: bool,
    expect_continue: bool,
    /// The declared body length, if any.
    declared: Option<u64>,
    upgrade: bool,
}

/// What waiting for the next request head gave.
enum Next {
    Request(Box<Request<RequestBody>>, Meta),
    Refused(Refused),
    /// The client closed, went idle past the timeout, or the server is shutting down.
    Close,
    /// The connection opened with the HTTP/2 preface.
    Http2,
}

/// What an h2c client sends first (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Framing headers a head carried, noted while its fields are copied.
const SEEN_CONTENT_LENGTH: u8 = 1;
const SEEN_TRANSFER_ENCODING: u8 = 2;
const SEEN_CONNECTION: u8 = 4;
const SEEN_EXPECT: u8 = 8;
const SEEN_UPGRADE: u8 = 16;

/// Serves requests on one HTTP/1.1 connection until it closes; `shutdown` says when the
/// server drains. With `sniff_h2`, a connection that opens with the HTTP/2 preface is
/// given back whole instead, for the HTTP/2 server.
pub(crate) async fn serve(
    reader: Box<Reader>,
    writer: WriteHalf,
    ctx: Arc<ConnCtx>,
    limits: Limits,
    shutdown: &mut Watch,
    sniff_h2: bool,
) -> Option<Joined> {
    let mut conn = Connection {
        sniff_h2,
        reader: Some(reader),
        writer,
        out: Vec::with_capacity(1024),
        limits,
        shutdown,
        idle: WaitTimeout::new(limits.idle),
        request_timer: LazyTimer::new(),
        ctx,
    };
    conn.run().await
}

/// One HTTP/1.1 connection's state, kept across its requests.
struct Connection<'a> {
    /// `None` while a request body has it.
    reader: Option<Box<Reader>>,
    writer: WriteHalf,
    /// The response head (and a small first body frame) being written; reused.
    out: Vec<u8>,
    limits: Limits,
    shutdown: &'a mut Watch,
    /// `timeouts.idle_ms`, for the wait for a request head and for each write the client
    /// does not take.
    idle: WaitTimeout,
    /// The requests' timeout timer (`timeouts.request_ms`), kept across requests.
    request_timer: LazyTimer,
    ctx: Arc<ConnCtx>,
    /// Until the first head: look for the HTTP/2 preface.
    sniff_h2: bool,
}

impl Connection<'_> {
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
                *req.body_mut() = RequestBody::unlimited(IncomingBody::Http1(H1Body {
                    reader: Some(reader),
                    back: Some(back),
                }));
                lent = Some(returned);
            }
            let upgrade = meta.upgrade.then(|| {
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
            let Ok(resp) = gateway::serve(&self.ctx, req, &mut self.request_timer).await;
            match self.respond(resp, meta, upgrade, lent).await {
                Ok(Written::KeepAlive) => {}
                Ok(Written::Close) => {
                    self.close().await;
                    return None;
                }
                // The tunnel owns the connection now.
                Ok(Written::Upgraded) => return None,
                Err(e) => {
                    tracing::debug!(remote = %self.ctx.remote, "connection ended: {e}");
                    return None;
                }
            }
        }
    }

    /// Writes the response: head (with the framing and connection headers it needs), then
    /// the body as it streams. Says whether the connection can take another request.
    async fn respond(
        &mut self,
        resp: Response<ResponseBody>,
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
        let raw = body.raw_fields();
        let (mut has_length, mut has_date) =
            raw.map_or((false, false), |raw| (raw.has_length, raw.has_date));
        for name in parts.headers.keys() {
            if name == CONTENT_LENGTH {
                has_length = true;
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
        let keep = meta.keep_alive
            && body_settled
            && framing != Out::Close
            && !status.is_informational()
            && !self.shutdown.is_draining();

        let out = &mut self.out;
        out.clear();
        status_line(out, status);
        if let Some(raw) = raw {
            raw.write_to(out);
        }
        for (name, value) in &parts.headers {
            framing::push_field(out, name, value);
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
    async fn stream_body(&mut self, body: &mut ResponseBody, chunked: bool) -> io::Result<()> {
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
                    body.frame().await
                }
            };
            match frame {
                None => ended = true,
                Some(Err(e)) => {
                    // Nothing can tell the client mid-body: the connection closes (a chunked
                    // body without its last chunk, or a short one, reads as cut).
                    return Err(io::Error::other(e.to_string()));
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
        tokio::time::timeout(LINGER, discard).await.unwrap_or(false)
    }

    /// Answers a head refused before the gateway saw it, logs it, and closes.
    async fn refuse(&mut self, refused: Refused) {
        let err = match refused {
            Refused::Bad(reason) => Error::BadRequest(reason),
            Refused::TooLarge => Error::HeadersTooLarge,
        };
        let status = err.status();
        tracing::info!(
            target: "tailguard::request",
            status = status.as_u16(),
            kind = err.kind(),
            blame = err.blame().as_str(),
            retryable = false,
            remote = %self.ctx.remote,
            "{err}"
        );
        let reason = err.reason();
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
    /// still be sending (unread bytes), discards what arrives for a moment first, so that
    /// the close does not turn into a reset that destroys the response in flight.
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
        let mut discarded = 0usize;
        let linger = poll_fn(|cx| {
            loop {
                reader.buf.clear();
                match ready!(reader.poll_fill(cx)) {
                    Ok(0) | Err(_) => return Poll::Ready(()),
                    Ok(n) => {
                        discarded += n;
                        if discarded > LINGER_BYTES {
                            return Poll::Ready(());
                        }
                    }
                }
            }
        });
        let _ = tokio::time::timeout(LINGER, linger).await;
    }

    /// Waits for the next whole request head, reading as needed; parses it into a request.
    async fn next_head(&mut self) -> Next {
        let Connection {
            reader,
            idle,
            shutdown,
            limits,
            sniff_h2,
            ..
        } = self;
        let Some(reader) = reader.as_mut() else {
            return Next::Close;
        };
        idle.restart();
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
                    match parse_request(&mut reader.buf, limits.header_bytes) {
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
            // Idle between requests: a draining server closes the connection at once.
            if reader.buf.is_empty() && shutdown.poll_draining(cx).is_ready() {
                return Poll::Ready(Next::Close);
            }
            if idle.poll_expired(cx) {
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

/// A parsed request head: the request (its body still empty), what the connection needs to
/// know of it, and where its body ends.
type Parsed = (Box<Request<RequestBody>>, Meta, Framing);

/// Parses a whole request head from the front of `buf` (consuming it), or `None` for more
/// bytes. The request's body is empty until the connection lends it the
/// reader; the returned framing says where its body ends.
fn parse_request(buf: &mut BytesMut, limit: usize) -> Result<Option<Parsed>, Refused> {
    // Most heads have a handful of fields: parsed with room for 16 first (the slots are
    // initialised on every call), and only a head with more pays for the full 100.
    match parse_with::<16>(buf, limit) {
        Err(Refused::TooLarge) if buf.len() <= limit => parse_with::<MAX_HEADERS>(buf, limit),
        other => other,
    }
}

fn parse_with<const N: usize>(buf: &mut BytesMut, limit: usize) -> Result<Option<Parsed>, Refused> {
    let mut slots = [httparse::EMPTY_HEADER; N];
    let mut parsed = httparse::Request::new(&mut slots);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > limit => return Err(Refused::TooLarge),
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > limit => return Err(Refused::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Refused::TooLarge),
        Err(_) => return Err(Refused::Bad("malformed request head")),
    };
    let method = Method::from_bytes(parsed.method.unwrap_or_default().as_bytes())
        .map_err(|_| Refused::Bad("invalid method"))?;
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Offsets first (the parsed slices borrow `buf`), then the head becomes shared bytes and
    // the target and each value a slice of it: no copy.
    let base = buf.as_ptr() as usize;
    let span = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        (start as u32, (start + s.len()) as u32)
    };
    let target = span(parsed.path.unwrap_or_default().as_bytes());
    let mut spans = [((0u32, 0u32), (0u32, 0u32)); N];
    let count = parsed.headers.len();
    for (slot, h) in spans.iter_mut().zip(parsed.headers.iter()) {
        *slot = (span(h.name.as_bytes()), span(h.value));
    }
    let head = buf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(head.slice(target.0 as usize..target.1 as usize))
        .map_err(|_| Refused::Bad("invalid request target"))?;
    // A request box and header map that served an earlier request (`recycle`), with room
    // for the headers the gateway adds (forwarding, request id, host) without a regrow.
    let mut req = recycle::request(count + 5);
    let headers = req.headers_mut();
    let mut seen = 0u8;
    let mut hosts = 0u32;
    for &((n0, n1), (v0, v1)) in &spans[..count] {
        let name = HeaderName::from_bytes(&head[n0 as usize..n1 as usize])
            .map_err(|_| Refused::Bad("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0 as usize..v1 as usize))
            .map_err(|_| Refused::Bad("invalid header value"))?;
        if name == HOST {
            hosts += 1;
        } else if name == CONTENT_LENGTH {
            seen |= SEEN_CONTENT_LENGTH;
        } else if name == TRANSFER_ENCODING {
            seen |= SEEN_TRANSFER_ENCODING;
        } else if name == CONNECTION {
            seen |= SEEN_CONNECTION;
        } else if name == EXPECT {
            seen |= SEEN_EXPECT;
        } else if name == UPGRADE {
            seen |= SEEN_UPGRADE;
        }
        headers.append(name, value);
    }
    // RFC 9112 §3.2: exactly one Host in HTTP/1.1 (1.0 may have none).
    if hosts > 1 || (hosts == 0 && version == Version::HTTP_11) {
        return Err(Refused::Bad(
            "an HTTP/1.1 request needs exactly one Host header",
        ));
    }
    // RFC 9112 §3.2.2: an absolute-form target's authority replaces the Host header (which
    // routing already prefers), so the upstream sees the host the request was routed by.
    if let Some(authority) = uri.authority() {
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| Refused::Bad("invalid request target"))?;
        headers.insert(HOST, host);
    }
    let (framing, declared) = request_framing(headers, seen, version)?;
    let keep_alive = if seen & SEEN_CONNECTION == 0 {
        version == Version::HTTP_11
    } else if version == Version::HTTP_11 {
        !headers::connection_has(headers, "close")
    } else {
        headers::connection_has(headers, "keep-alive")
    };
    let expect_continue = seen & SEEN_EXPECT != 0
        && version == Version::HTTP_11
        && headers
            .get(EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let upgrade = seen & SEEN_UPGRADE != 0
        && seen & SEEN_CONNECTION != 0
        && version == Version::HTTP_11
        && headers::connection_has(headers, "upgrade");
    let meta = Meta {
        version,
        keep_alive,
        head_request: method == Method::HEAD,
        expect_continue,
        declared,
        upgrade,
    };
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = version;
    Ok(Some((req, meta, framing)))
}

/// RFC 9112 §6.1-6.3 for a request: chunked when the last transfer coding is chunked, else
/// `Content-Length`, else no body. Anything ambiguous is refused.
fn request_framing(
    headers: &HeaderMap,
    seen: u8,
    version: Version,
) -> Result<(Framing, Option<u64>), Refused> {
    if seen & SEEN_TRANSFER_ENCODING != 0 {
        if version == Version::HTTP_10 {
            return Err(Refused::Bad("transfer-encoding in an HTTP/1.0 request"));
        }
        if seen & SEEN_CONTENT_LENGTH != 0 {
            return Err(Refused::Bad(
                "both transfer-encoding and content-length in a request",
            ));
        }
        // Only `chunked`, once: a coding the gateway cannot decode or re-encode upstream
        // (it re-frames the body) is refused rather than passed on wrong.
        let mut codings = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|c| !c.is_empty());
        return match (codings.next(), codings.next()) {
            (Some(c), None) if c.eq_ignore_ascii_case(b"chunked") => {
                Ok((Framing::Chunked(Chunk::Size), None))
            }
            _ => Err(Refused::Bad("unsupported transfer-encoding")),
        };
    }
    if seen & SEEN_CONTENT_LENGTH == 0 {
        return Ok((Framing::Done, None));
    }
    let mut length: Option<u64> = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let n =
                parse_length(part.trim_ascii()).ok_or(Refused::Bad("invalid content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Refused::Bad("conflicting content-length values"));
            }
            length = Some(n);
        }
    }
    match length {
        Some(0) => Ok((Framing::Done, Some(0))),
        Some(n) => Ok((Framing::Length(n), Some(n))),
        None => Err(Refused::Bad("invalid content-length")),
    }
}

/// A `Content-Length` value: decimal digits only, at most 18 of them.
fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
    )
}
