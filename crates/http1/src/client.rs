//! The upstream HTTP/1.1 client: writes a request on a pooled connection and reads its
//! response, in the request's own task.
//!
//! # Why hand-written
//!
//! hyper's client connection is a task of its own that a request reaches through channels.
//! Per proxied request that cost two tasks waking each other (the request's and the
//! connection's), a oneshot for the response, a channel per body, and hyper's dispatch state
//! machine: about half of the gateway's user CPU per request, where hyper's *server* side
//! costs 2 us (perf and /proc CPU per request, `docs/benchmarks/2026-11-22-proxy-cpu/`).
//! Here the request's task writes the head, streams the body and reads the response head on
//! the socket itself, and the response body reads the same socket as the downstream
//! connection polls it: no task, no channel, no wakeup between them. Pingora made the same
//! choice. What is not the product comes from crates: the head parser is httparse (hyper's
//! own), buffers are `bytes`, reads go through tokio.
//!
//! # What it speaks
//!
//! HTTP/1.1 as RFC 9112 has it, for a proxy's upstream side: the request in origin form with
//! its body length-delimited (the client's `Content-Length`) or chunked; the response framed
//! by §6.3 (no body for `HEAD`, 1xx, 204 and 304; chunked when the last transfer coding is
//! chunked; else `Content-Length`; else until the upstream closes); interim 1xx responses
//! skipped (`101` ends the exchange: the socket becomes a tunnel); chunk extensions ignored,
//! trailers passed on both ways (a request's only when it is sent chunked; fields that
//! frame or route are left out). The request body is sent while the response is read, so an
//! upstream that answers early (a `413` before reading the body) or echoes a stream is not
//! deadlocked.
//!
//! Once the head has arrived, `timeouts.read_ms` bounds each wait for more of the body
//! (between two reads, not in total, as nginx's `proxy_read_timeout`): an upstream that
//! stalls mid-body fails the body with [`UpstreamError::Timeout`] and loses
//! its connection, instead of holding the request forever. The timer is created and armed
//! only when a read would block; a body whose bytes are already there reads no clock.
//!
//! The connection's [`Stream`] is plain TCP or a transport the caller connected (the gateway
//! hands in TLS); this crate knows no TLS library. Writes are flushed before the client
//! waits (a no-op over TCP), so a TLS record never sits unsent while the upstream waits.
//!
//! A connection goes back to its pool only when the response said keep-alive (HTTP/1.1
//! without `Connection: close`), its body was read to the end by its framing, the request
//! body was sent whole, and nothing more arrived: any doubt closes it.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::UPGRADE;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncWrite, AsyncWriteExt};

pub use crate::stream::Stream;

use crate::error::UpstreamError;
use crate::fields;
use crate::framing::{self, Chunk, Framing, MAX_HEADERS, Step, chunk_size_line, step};
use crate::recycle;
use crate::timer::WaitTimeout;

/// What the caller keeps with a connection for as long as it lives (a metric guard that
/// counts it open): dropped with it.
pub type Guard = Box<dyn std::any::Any + Send + Sync>;

/// A response head (or trailer section) larger than this is refused as broken.
const MAX_HEAD_BYTES: usize = 64 * 1024;
const TOO_LARGE: &str = "response head larger than 64 KiB";

/// One keep-alive connection to an upstream endpoint, over plain TCP or TLS ([`Stream`]).
#[derive(Debug)]
pub struct Connection {
    stream: Stream,
    addr: SocketAddr,
    /// Bytes read and not yet consumed; empty between exchanges.
    read_buf: BytesMut,
    /// The request head being written; kept to reuse its allocation.
    head_buf: Vec<u8>,
    read_size: usize,
    guard: Guard,
}

impl Connection {
    /// Wraps a connected stream (a `TcpStream`, or a [`Stream`] the caller built, such as
    /// TLS), with the caller's `guard` (dropped with the connection). Boxed once here, so
    /// that handing it between pool, request and body moves a pointer.
    pub fn new(stream: impl Into<Stream>, addr: SocketAddr, guard: Guard) -> Box<Connection> {
        Box::new(Connection {
            stream: stream.into(),
            addr,
            read_buf: BytesMut::new(),
            head_buf: Vec::with_capacity(512),
            read_size: framing::MIN_READ,
            guard,
        })
    }

    /// Whether an idle connection can take a request: the upstream has not closed it nor
    /// sent anything unasked ([`Stream::is_idle_usable`]). Over TCP it costs no syscall
    /// unless the socket was reported readable since its last read.
    pub fn is_idle_usable(&mut self) -> bool {
        self.read_buf.is_empty() && self.stream.is_idle_usable()
    }

    /// The stream and whatever the upstream sent after the head of its `101`: for a tunnel.
    pub fn into_upgraded(self) -> (Stream, Bytes, Guard) {
        (self.stream, self.read_buf.freeze(), self.guard)
    }

    /// The endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn broken<E>(&self, reason: impl std::fmt::Display) -> UpstreamError<E> {
        UpstreamError::Broken {
            addr: self.addr,
            reason: reason.to_string(),
        }
    }

    /// Reads more bytes into `read_buf`; `Ok(0)` is the upstream's end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        framing::poll_fill(
            &mut self.stream,
            cx,
            &mut self.read_buf,
            &mut self.read_size,
        )
    }
}

/// Why a request got no response.
#[derive(Debug)]
pub enum SendError<B: Body> {
    /// A reused connection turned out closed before the upstream answered anything, and
    /// the request (idempotent, bodiless, so unchanged by the attempt) may go again on a new
    /// connection: the keep-alive race every proxy meets when an upstream closes an idle
    /// connection as a request is written on it.
    Stale(Box<Request<B>>),
    /// Anything else; the connection is gone.
    Failed(UpstreamError<B::Error>),
}

/// A response head received, and the request back if it was sent whole already (a bodiless
/// one), for its containers to serve the caller's next request.
pub type Sent<B> = (Response<UpstreamBody<B>>, Option<Box<Request<B>>>);

/// Sends `req` on `conn` and waits for the response head. `reused` says whether the
/// connection served a request before (only then is a closed connection [`SendError::Stale`]).
/// The response body streams from the connection and gives it back at its end
/// ([`UpstreamBody::take_reusable`]).
pub async fn send<B>(
    mut conn: Box<Connection>,
    req: Box<Request<B>>,
    reused: bool,
) -> Result<Sent<B>, SendError<B>>
where
    B: Body<Data = Bytes> + Unpin,
{
    let has_body = !req.body().is_end_stream();
    // The framing is the gateway's, from the body it will send: never a peer's field.
    let framing = if has_body {
        match req.body().size_hint().exact() {
            Some(n) => RequestFraming::Length(n),
            None => RequestFraming::Chunked,
        }
    } else if expects_body(req.method()) {
        RequestFraming::Length(0)
    } else {
        RequestFraming::None
    };
    let upgrade = write_head(&mut conn.head_buf, &req, framing);
    let head_request = req.method() == Method::HEAD;

    // A bodiless request is kept whole until an answer starts, for a resend on a stale
    // connection; one with a body goes to the writer, which sends the body while the head
    // is awaited. Either way the request stays in its one allocation.
    let (mut writer, mut unsent) = if has_body {
        let head = Bytes::copy_from_slice(&conn.head_buf);
        let chunked = framing == RequestFraming::Chunked;
        (Some(Box::new(BodyWriter::new(head, req, chunked))), None)
    } else {
        (None, Some(req))
    };
    let written = match writer {
        Some(_) => Ok(()),
        None => {
            let Connection {
                stream, head_buf, ..
            } = &mut *conn;
            // The flush is nothing over TCP; TLS may hold the last record until asked.
            match stream.write_all(head_buf).await {
                Ok(()) => stream.flush().await,
                Err(e) => Err(e),
            }
        }
    };
    let head = match written {
        Ok(()) => read_head(&mut conn, &mut writer, head_request).await,
        Err(e) => Err(HeadError::Closed(e)),
    };
    match (head, unsent.take()) {
        (Ok(head), _) if head.status == StatusCode::SWITCHING_PROTOCOLS && !upgrade => Err(
            SendError::Failed(conn.broken("101 to a request that asked for no upgrade")),
        ),
        // Sent and answered: the request's containers can serve the caller's next request.
        (Ok(head), unsent) => Ok((respond(conn, head, writer), unsent)),
        (Err(HeadError::Closed(e)), Some(req)) => Err(if reused && req.method().is_idempotent() {
            SendError::Stale(req)
        } else {
            SendError::Failed(conn.broken(e))
        }),
        (Err(HeadError::Closed(e)), None) => Err(SendError::Failed(conn.broken(e))),
        (Err(HeadError::Failed(e)), _) => Err(SendError::Failed(e)),
    }
}

/// Methods whose requests carry a body by definition: sent with `Content-Length: 0` when
/// they have none, as an HTTP/1.1 server may otherwise wait for one (411 or a hang).
fn expects_body(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PUT || *method == Method::PATCH
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestFraming {
    /// No body, and a method that needs no length.
    None,
    /// `Content-Length` (`0` for a method that expects a body and has none).
    Length(u64),
    /// A body of unknown length (HTTP/2 without `content-length`, or chunked from an
    /// HTTP/1.1 client): sent chunked.
    Chunked,
}

/// The request head on the wire, built from the parsed message by one rule: origin form,
/// HTTP/1.1, the fields as the gateway left them less every hop-by-hop and framing field
/// (whatever a peer sent of those never crosses), then exactly one framing field chosen from
/// the body, and `Upgrade` only for a WebSocket the gateway tunnels (never `h2c`). Says
/// whether the request asks for that upgrade.
fn write_head<B>(buf: &mut Vec<u8>, req: &Request<B>, framing: RequestFraming) -> bool {
    buf.clear();
    buf.extend_from_slice(req.method().as_str().as_bytes());
    buf.push(b' ');
    // Origin form starts with `/` (RFC 9112 §3.2.1). An absolute-form request with an
    // empty path (`GET http://h?q`) parses to the path-and-query `?q`: its origin form is
    // `/?q` (§3.2.2: an empty path is `/`), never a target an upstream cannot frame.
    // `*` (asterisk form, `OPTIONS *`) goes as it came.
    let target = req.uri().path_and_query().map_or("", |p| p.as_str());
    if !target.starts_with('/') && target != "*" {
        buf.push(b'/');
    }
    buf.extend_from_slice(target.as_bytes());
    buf.extend_from_slice(b" HTTP/1.1\r\n");
    let mut websocket = false;
    for (name, value) in req.headers() {
        if fields::is_hop_by_hop(name) || fields::is_framing(name) {
            websocket |= name == UPGRADE && value.as_bytes().eq_ignore_ascii_case(b"websocket");
            continue;
        }
        framing::push_field(buf, name, value);
    }
    if websocket {
        buf.extend_from_slice(b"connection: upgrade\r\nupgrade: websocket\r\n");
    }
    match framing {
        RequestFraming::None => {}
        RequestFraming::Length(n) => {
            buf.extend_from_slice(b"content-length: ");
            buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => buf.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    buf.extend_from_slice(b"\r\n");
    websocket
}

/// A parsed response head, and how its body is framed.
#[derive(Debug)]
struct Head {
    status: StatusCode,
    version: Version,
    fields: Fields,
    framing: Framing,
    keep_alive: bool,
}

/// A response head's fields: as the upstream sent them, or in a map.
#[derive(Debug)]
enum Fields {
    /// The common head (no `Connection`, not a `101`): kept as its lines, which an HTTP/1.1
    /// downstream writes out as they are, without a `HeaderMap` being built and torn down.
    Raw(RawFields),
    Map(HeaderMap),
}

/// A response's field lines as the upstream sent them (names and values validated by the
/// parser), with what the downstream writer needs to know of them.
#[derive(Debug)]
pub struct RawFields {
    /// The field lines between the status line and the head's empty line, each ending in
    /// CRLF (or a bare LF, which the parser accepts).
    lines: Bytes,
    /// A `Content-Length` field is among them.
    pub has_length: bool,
    /// It is the one framing field, once, a plain number: the line is what the downstream
    /// would write itself, so it may be copied as it is.
    pub length_exact: bool,
    /// A `Date` field is among them.
    pub has_date: bool,
}

impl RawFields {
    /// The fields, hop-by-hop ones (RFC 9110 §7.6.1) left out, each as `(name, value)`.
    fn end_to_end(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines.split(|&b| b == b'\n').filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            let name = &line[..colon];
            (!fields::is_hop_by_hop_name(name)).then(|| (name, line[colon + 1..].trim_ascii()))
        })
    }

    /// Appends the end-to-end fields as head lines, as the upstream wrote them: runs of lines
    /// that need no change (usually the whole section) are copied in one piece; a hop-by-hop
    /// line is left out, and a line ending in a bare LF gets its CRLF. `Content-Length` lines
    /// are left out too unless `keep_length` (the downstream frames the body itself; a
    /// response without a body keeps the length it announces).
    pub fn write_to(&self, out: &mut Vec<u8>, keep_length: bool) {
        let bytes = &self.lines[..];
        // Start of the lines not yet copied, and of the line looked at.
        let (mut run, mut at) = (0, 0);
        while at < bytes.len() {
            let end = bytes[at..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |i| at + i + 1);
            let line = &bytes[at..end];
            let content = line.strip_suffix(b"\n").unwrap_or(line);
            let crlf = content.ends_with(b"\r");
            let name_end = content.iter().position(|&b| b == b':').unwrap_or(0);
            let name = &content[..name_end];
            let hop_by_hop = fields::is_hop_by_hop_name(name)
                || (!keep_length && name.eq_ignore_ascii_case(b"content-length"));
            if hop_by_hop || !crlf {
                out.extend_from_slice(&bytes[run..at]);
                if !hop_by_hop {
                    out.extend_from_slice(content);
                    out.extend_from_slice(b"\r\n");
                }
                run = end;
            }
            at = end;
        }
        out.extend_from_slice(&bytes[run..]);
    }

    /// Appends the end-to-end fields to `map` (for a downstream that needs a map: HTTP/2).
    pub fn append_to(&self, map: &mut HeaderMap) {
        for (name, value) in self.end_to_end() {
            // The parser validated both, so neither conversion fails in practice.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name),
                HeaderValue::from_maybe_shared(self.lines.slice_ref(value)),
            ) {
                map.append(name, value);
            }
        }
    }
}

#[derive(Debug)]
enum HeadError<E> {
    /// The upstream closed (or reset) the connection before a whole head arrived.
    Closed(io::Error),
    Failed(UpstreamError<E>),
}

/// Reads the response head, sending the request body (if any) meanwhile. Interim 1xx
/// responses other than `101` are skipped.
async fn read_head<B: Body<Data = Bytes> + Unpin>(
    conn: &mut Connection,
    writer: &mut Option<Box<BodyWriter<B>>>,
    head_request: bool,
) -> Result<Head, HeadError<B::Error>> {
    let mut write_failed: Option<io::Error> = None;
    poll_fn(|cx| {
        loop {
            if let Some(w) = writer {
                match w.poll_send(cx, &mut conn.stream) {
                    Poll::Ready(Ok(())) => *writer = None,
                    Poll::Ready(Err(WriteError::Body(e))) => {
                        return Poll::Ready(Err(HeadError::Failed(UpstreamError::RequestBody(e))));
                    }
                    Poll::Ready(Err(WriteError::Io(e))) => {
                        // The upstream stopped reading: it may have answered already (an
                        // early 413); the read below finds out.
                        *writer = None;
                        write_failed = Some(e);
                    }
                    Poll::Pending => {}
                }
            }
            match parse_head(&mut conn.read_buf, head_request) {
                Ok(Some(mut head)) => {
                    if write_failed.is_some() {
                        head.keep_alive = false;
                    }
                    return Poll::Ready(Ok(head));
                }
                Ok(None) => {}
                Err(reason) => return Poll::Ready(Err(HeadError::Failed(conn.broken(reason)))),
            }
            if conn.read_buf.len() > MAX_HEAD_BYTES {
                return Poll::Ready(Err(HeadError::Failed(conn.broken(TOO_LARGE))));
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => {
                    let err = write_failed.take().unwrap_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed before a response",
                        )
                    });
                    return Poll::Ready(if conn.read_buf.is_empty() {
                        Err(HeadError::Closed(err))
                    } else {
                        Err(HeadError::Failed(
                            conn.broken("connection closed inside the response head"),
                        ))
                    });
                }
                Ok(_) => {}
                Err(e) if conn.read_buf.is_empty() => {
                    return Poll::Ready(Err(HeadError::Closed(e)));
                }
                Err(e) => return Poll::Ready(Err(HeadError::Failed(conn.broken(e)))),
            }
        }
    })
    .await
}

/// The response-head parser as the client runs it, for the fuzz targets: the status, how
/// the body is framed and whether the connection may be reused, or `None` for more bytes.
#[doc(hidden)]
pub fn parse_response_head(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<(StatusCode, Framing, bool)>, String> {
    Ok(parse_head(buf, head_request)?.map(|head| (head.status, head.framing, head.keep_alive)))
}

/// Parses a whole response head from the front of `buf` (consuming it) or returns `None`
/// for more bytes. Interim 1xx heads are consumed and skipped.
fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, String> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        // Most heads have a handful of fields: parse with room for 16 first (its slots are
        // initialised on every call), and only a head with more pays for the full 100.
        let parsed = match parse_with::<16>(buf, head_request) {
            Err(Parse::TooManyHeaders) => parse_with::<MAX_HEADERS>(buf, head_request),
            other => other,
        };
        match parsed {
            Ok(Some(head)) => return Ok(Some(head)),
            Ok(None) => return Ok(None),
            Err(Parse::Interim) => continue,
            Err(Parse::TooManyHeaders) => {
                return Err(format!("more than {MAX_HEADERS} response header fields"));
            }
            Err(Parse::Invalid(reason)) => return Err(reason),
        }
    }
}

/// Why [`parse_with`] gave no head.
#[derive(Debug)]
enum Parse {
    /// A 1xx other than 101 was consumed: parse again.
    Interim,
    TooManyHeaders,
    Invalid(String),
}

/// What a response's framing and its writing downstream depend on, read from its fields in
/// one pass over the parsed names (a length test and a case-insensitive compare each).
#[derive(Debug)]
struct FramingFields {
    /// A `Connection` field is present.
    connection: bool,
    /// `close` is among its tokens.
    close: bool,
    /// With `Transfer-Encoding`: whether the last coding of the last such field is chunked.
    chunked_last: Option<bool>,
    /// A `Content-Length` field is present.
    content_length: bool,
    /// More than one `Content-Length` field, or a list in one.
    length_repeated: bool,
    /// Its value (one number, however many fields and comma-separated copies carry it), or
    /// why it is invalid.
    length: Result<Option<u64>, &'static str>,
    /// A `Date` field is present.
    date: bool,
}

impl FramingFields {
    fn scan<'a>(fields: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> FramingFields {
        let mut f = FramingFields {
            connection: false,
            close: false,
            chunked_last: None,
            content_length: false,
            length_repeated: false,
            length: Ok(None),
            date: false,
        };
        for (name, value) in fields {
            if name.eq_ignore_ascii_case(b"content-length") {
                f.length_repeated |= f.content_length || value.contains(&b',');
                f.content_length = true;
                for part in value.split(|&b| b == b',') {
                    let n = std::str::from_utf8(part.trim_ascii())
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok());
                    f.length = match (f.length, n) {
                        (Err(e), _) => Err(e),
                        (_, None) => Err("invalid content-length"),
                        (Ok(Some(l)), Some(n)) if l != n => {
                            Err("conflicting content-length values")
                        }
                        (Ok(_), Some(n)) => Ok(Some(n)),
                    };
                }
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                let last = value.rsplit(|&b| b == b',').next().unwrap_or(&[]);
                f.chunked_last = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"connection") {
                f.connection = true;
                f.close |= value
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            } else if name.eq_ignore_ascii_case(b"date") {
                f.date = true;
            }
        }
        f
    }
}

fn parse_with<const N: usize>(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<Head>, Parse> {
    let mut slots = [httparse::EMPTY_HEADER; N];
    let mut parsed = httparse::Response::new(&mut slots);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD_BYTES => {
            return Err(Parse::Invalid(TOO_LARGE.to_string()));
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Parse::TooManyHeaders),
        Err(e) => return Err(Parse::Invalid(format!("invalid response head: {e}"))),
    };
    let code = parsed.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| Parse::Invalid(format!("invalid response status {code}")))?;
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        buf.advance(len);
        return Err(Parse::Interim);
    }
    let found = FramingFields::scan(parsed.headers.iter().map(|h| (h.name.as_bytes(), h.value)));
    let (framing, keep_alive) =
        response_framing(status, version, &found, head_request).map_err(Parse::Invalid)?;
    let base = buf.as_ptr() as usize;
    if !found.connection && status != StatusCode::SWITCHING_PROTOCOLS {
        // The field lines, from the first name to before the head's empty line, kept as
        // they are: no map, no value slices (each a reference count taken and dropped).
        let first = parsed
            .headers
            .first()
            .map_or(len, |h| h.name.as_ptr() as usize - base);
        let blank = if buf[..len].ends_with(b"\r\n") { 2 } else { 1 };
        let mut lines = buf.split_to(len);
        lines.truncate(len - blank);
        lines.advance(first.min(lines.len()));
        return Ok(Some(Head {
            status,
            version,
            fields: Fields::Raw(RawFields {
                lines: lines.freeze(),
                has_length: found.content_length,
                length_exact: found.content_length
                    && !found.length_repeated
                    && found.chunked_last.is_none()
                    && matches!(found.length, Ok(Some(_))),
                has_date: found.date,
            }),
            framing,
            keep_alive,
        }));
    }
    // A `Connection` field may name more hop-by-hop fields, and a `101` is looked into by
    // the gateway: both get a map. Offsets first (the parsed slices borrow `buf`), then the
    // head becomes shared bytes and each value a slice of it: no copy per header value.
    let mut spans = [(0u32, 0u32, 0u32, 0u32); N];
    let count = parsed.headers.len();
    for (span, h) in spans.iter_mut().zip(parsed.headers.iter()) {
        let name = h.name.as_ptr() as usize - base;
        let value = h.value.as_ptr() as usize - base;
        *span = (
            name as u32,
            (name + h.name.len()) as u32,
            value as u32,
            (value + h.value.len()) as u32,
        );
    }
    let head = buf.split_to(len).freeze();
    // Room for the `Via` the gateway appends without a regrow; a map that served an
    // earlier response if the thread has one (`recycle`).
    let mut headers = recycle::header_map(count + 1);
    for &(n0, n1, v0, v1) in &spans[..count] {
        let name = HeaderName::from_bytes(&head[n0 as usize..n1 as usize])
            .map_err(|_| Parse::Invalid("invalid response header name".to_string()))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0 as usize..v1 as usize))
            .map_err(|_| Parse::Invalid("invalid response header value".to_string()))?;
        headers.append(name, value);
    }
    Ok(Some(Head {
        status,
        version,
        fields: Fields::Map(headers),
        framing,
        keep_alive,
    }))
}

/// RFC 9112 §6.3: how the response body is delimited, and whether the connection may carry
/// another exchange after it.
fn response_framing(
    status: StatusCode,
    version: Version,
    found: &FramingFields,
    head_request: bool,
) -> Result<(Framing, bool), String> {
    let mut keep_alive = version == Version::HTTP_11 && !found.close;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Ok((Framing::Done, false));
    }
    if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((Framing::Done, keep_alive));
    }
    if let Some(chunked_last) = found.chunked_last {
        // With both, Transfer-Encoding wins and the connection cannot be trusted after.
        if found.content_length {
            keep_alive = false;
        }
        return Ok(if chunked_last {
            (Framing::Chunked(Chunk::Size), keep_alive)
        } else {
            (Framing::UntilClose, false)
        });
    }
    Ok(match found.length.map_err(str::to_string)? {
        Some(0) => (Framing::Done, keep_alive),
        Some(n) => (Framing::Length(n), keep_alive),
        None => (Framing::UntilClose, false),
    })
}

fn respond<B: Body>(
    conn: Box<Connection>,
    head: Head,
    writer: Option<Box<BodyWriter<B>>>,
) -> Response<UpstreamBody<B>> {
    let (headers, raw) = match head.fields {
        // A recycled map for the fields the gateway adds (`Via`).
        Fields::Raw(raw) => (recycle::header_map(1), Some(raw)),
        Fields::Map(map) => (map, None),
    };
    let body = UpstreamBody {
        conn: Some(conn),
        framing: head.framing,
        writer,
        keep_alive: head.keep_alive,
        read_timeout: WaitTimeout::default(),
        raw,
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    *resp.headers_mut() = headers;
    resp
}

/// The response body, read from the upstream connection as the downstream side polls it;
/// it also finishes sending the request body if the upstream answered before taking all of
/// it.
#[derive(Debug)]
pub struct UpstreamBody<B: Body> {
    conn: Option<Box<Connection>>,
    framing: Framing,
    writer: Option<Box<BodyWriter<B>>>,
    keep_alive: bool,
    read_timeout: WaitTimeout,
    /// The response's own fields when they were kept as lines (else they are in the
    /// response's map).
    raw: Option<RawFields>,
}

impl<B: Body> UpstreamBody<B> {
    /// The response's fields as the upstream sent them, if they were kept as lines.
    pub fn raw_fields(&self) -> Option<&RawFields> {
        self.raw.as_ref()
    }

    /// Moves fields kept as lines into `map`, for a downstream that needs them there.
    pub fn fields_into(&mut self, map: &mut HeaderMap) {
        if let Some(raw) = self.raw.take() {
            raw.append_to(map);
        }
    }

    /// Bounds each wait for more body bytes by `limit` (`timeouts.read_ms`; `None`: none).
    pub fn set_read_timeout(&mut self, limit: Option<Duration>) {
        self.read_timeout.set_limit(limit);
    }

    /// The connection, if this exchange left it fit for another: called when the body has
    /// been read to its end.
    pub fn take_reusable(&mut self) -> Option<Box<Connection>> {
        let fit = matches!(self.framing, Framing::Done)
            && self.keep_alive
            && self.writer.is_none()
            && self.conn.as_ref().is_some_and(|c| c.read_buf.is_empty());
        if fit { self.conn.take() } else { None }
    }

    /// The connection after a `101 Switching Protocols`: the tunnel's upstream side.
    pub fn take_upgraded(&mut self) -> Option<Box<Connection>> {
        self.writer = None;
        self.conn.take()
    }

    fn fail(&mut self, err: UpstreamError<B::Error>) -> Polled<B> {
        self.conn = None;
        self.framing = Framing::Done;
        self.writer = None;
        self.read_timeout.timer = None;
        Poll::Ready(Some(Err(err)))
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for UpstreamBody<B> {
    type Data = Bytes;
    type Error = UpstreamError<B::Error>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        loop {
            if matches!(this.framing, Framing::Done) {
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if let Some(w) = &mut this.writer {
                match w.poll_send(cx, &mut conn.stream) {
                    Poll::Ready(Ok(())) => this.writer = None,
                    Poll::Ready(Err(WriteError::Body(e))) => {
                        return this.fail(UpstreamError::RequestBody(e));
                    }
                    Poll::Ready(Err(WriteError::Io(_))) => {
                        // The upstream no longer reads the request; its response goes on.
                        this.writer = None;
                        this.keep_alive = false;
                    }
                    Poll::Pending => {}
                }
            }
            match step(&mut this.framing, &mut conn.read_buf) {
                Ok(Step::Frame(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(Step::Again) => continue,
                Ok(Step::NeedMore) => {}
                Err(reason) => {
                    let err = conn.broken(reason);
                    return this.fail(err);
                }
            }
            let filled = match conn.poll_fill(cx) {
                Poll::Ready(filled) => filled,
                Poll::Pending => {
                    if this.read_timeout.poll_expired(cx) {
                        // Closed, never pooled: the rest of the body may still arrive.
                        let err = UpstreamError::Timeout { addr: conn.addr };
                        return this.fail(err);
                    }
                    return Poll::Pending;
                }
            };
            match filled {
                Ok(0) if matches!(this.framing, Framing::UntilClose) => {
                    this.framing = Framing::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    let err = conn.broken("connection closed before the end of the body");
                    return this.fail(err);
                }
                Ok(_) => this.read_timeout.restart(),
                Err(e) => {
                    let err = conn.broken(e);
                    return this.fail(err);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.framing, Framing::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Done => SizeHint::with_exact(0),
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

/// What polling an [`UpstreamBody`] gives.
type Polled<B> = Poll<Option<Result<Frame<Bytes>, UpstreamError<<B as Body>::Error>>>>;

#[derive(Debug)]
enum WriteError<E> {
    /// The downstream body failed (too large, client went away): the downstream's fault.
    Body(E),
    /// Writing to the upstream failed.
    Io(io::Error),
}

/// Streams the request head and body to the upstream: length-delimited as declared, or
/// chunked. Segments go out with one vectored write where they can.
#[derive(Debug)]
struct BodyWriter<B> {
    /// The request whose body is sent (its head was written into `pending`).
    req: Box<Request<B>>,
    chunked: bool,
    /// Taken from the body (or the head), not yet written, front first.
    pending: VecDeque<Bytes>,
    /// The body's end was seen (and, chunked, the last chunk queued).
    ended: bool,
    /// Chunked: the last chunk is queued (with the trailers, which come before the end).
    last_chunk_queued: bool,
    /// The first frame is awaited before the first write, so that a small body leaves with
    /// the head in one segment.
    first: bool,
}

impl<B: Body<Data = Bytes> + Unpin> BodyWriter<B> {
    fn new(head: Bytes, req: Box<Request<B>>, chunked: bool) -> BodyWriter<B> {
        let mut pending = VecDeque::with_capacity(4);
        pending.push_back(head);
        BodyWriter {
            req,
            chunked,
            pending,
            ended: false,
            last_chunk_queued: false,
            first: true,
        }
    }

    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut Stream,
    ) -> Poll<Result<(), WriteError<B::Error>>> {
        loop {
            if self.first {
                self.first = false;
                // Whatever the body has at once joins the head's write; if it has nothing
                // yet, the head goes alone (the upstream may be waiting for it: a 100-continue).
                if let Poll::Ready(frame) = Pin::new(self.req.body_mut()).poll_frame(cx) {
                    self.take(frame).map_err(WriteError::Body)?;
                }
            }
            while !self.pending.is_empty() {
                let mut slices = [IoSlice::new(&[]); 4];
                let mut used = 0;
                for (slot, seg) in slices.iter_mut().zip(self.pending.iter()) {
                    *slot = IoSlice::new(seg);
                    used += 1;
                }
                let n = ready!(Pin::new(&mut *stream).poll_write_vectored(cx, &slices[..used]))
                    .map_err(WriteError::Io)?;
                if n == 0 {
                    return Poll::Ready(Err(WriteError::Io(io::ErrorKind::WriteZero.into())));
                }
                self.advance(n);
            }
            // Before waiting for more of the body: a TLS layer may hold records it accepted
            // but could not write yet (nothing over TCP), which must not wait on the client.
            ready!(Pin::new(&mut *stream).poll_flush(cx)).map_err(WriteError::Io)?;
            if self.ended {
                return Poll::Ready(Ok(()));
            }
            let frame = ready!(Pin::new(self.req.body_mut()).poll_frame(cx));
            self.take(frame).map_err(WriteError::Body)?;
        }
    }

    /// Queues what one poll of the body gave.
    fn take(&mut self, frame: Option<Result<Frame<Bytes>, B::Error>>) -> Result<(), B::Error> {
        match frame {
            Some(Ok(frame)) => {
                match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) if self.chunked => {
                        self.pending.push_back(chunk_size_line(data.len()));
                        self.pending.push_back(data);
                        self.pending.push_back(Bytes::from_static(b"\r\n"));
                    }
                    Ok(data) => self.pending.push_back(data),
                    // Trailers go in the last chunk. A body sent with a declared length has
                    // no trailer section in HTTP/1.1: there they are dropped.
                    Err(frame) => {
                        if let (true, Ok(trailers)) = (self.chunked, frame.into_trailers()) {
                            let mut last = Vec::with_capacity(64);
                            framing::push_last_chunk(&mut last, Some(&trailers));
                            self.pending.push_back(Bytes::from(last));
                            self.last_chunk_queued = true;
                        }
                    }
                }
                Ok(())
            }
            Some(Err(e)) => Err(e),
            None => {
                if self.chunked && !self.last_chunk_queued {
                    self.pending.push_back(Bytes::from_static(b"0\r\n\r\n"));
                }
                self.ended = true;
                Ok(())
            }
        }
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.pending.front_mut() else {
                return;
            };
            if n >= front.len() {
                n -= front.len();
                self.pending.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    #[test]
    fn response_framing_follows_rfc_9112() {
        let h = |pairs: &[(&str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(
                    HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                );
            }
            m
        };
        let ok = StatusCode::OK;
        let v11 = Version::HTTP_11;
        let framing = |s, v, m: &HeaderMap, head| {
            let found =
                FramingFields::scan(m.iter().map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes())));
            response_framing(s, v, &found, head)
        };
        let (f, keep) = framing(ok, v11, &h(&[("content-length", "5")]), false).expect("ok");
        assert!(matches!(f, Framing::Length(5)) && keep);
        let (f, keep) = framing(ok, v11, &h(&[("content-length", "5")]), true).expect("ok");
        assert!(matches!(f, Framing::Done) && keep, "HEAD has no body");
        let (f, _) = framing(
            StatusCode::NOT_MODIFIED,
            v11,
            &h(&[("content-length", "5")]),
            false,
        )
        .expect("ok");
        assert!(matches!(f, Framing::Done));
        let te = h(&[
            ("transfer-encoding", "gzip, chunked"),
            ("content-length", "5"),
        ]);
        let (f, keep) = framing(ok, v11, &te, false).expect("ok");
        assert!(
            matches!(f, Framing::Chunked(_)) && !keep,
            "TE wins, connection closed after"
        );
        let (f, keep) = framing(ok, v11, &h(&[("transfer-encoding", "gzip")]), false).expect("ok");
        assert!(matches!(f, Framing::UntilClose) && !keep);
        let (f, keep) = framing(ok, v11, &h(&[]), false).expect("ok");
        assert!(matches!(f, Framing::UntilClose) && !keep);
        let (_, keep) = framing(
            ok,
            v11,
            &h(&[("connection", "Close"), ("content-length", "0")]),
            false,
        )
        .expect("ok");
        assert!(!keep);
        let (_, keep) =
            framing(ok, Version::HTTP_10, &h(&[("content-length", "1")]), false).expect("ok");
        assert!(!keep, "HTTP/1.0 responses close");
        assert!(framing(ok, v11, &h(&[("content-length", "5, 6")]), false).is_err());
        assert!(framing(ok, v11, &h(&[("content-length", "x")]), false).is_err());
        let (f, _) = framing(ok, v11, &h(&[("content-length", "7, 7")]), false).expect("ok");
        assert!(matches!(f, Framing::Length(7)));
    }

    #[test]
    fn raw_fields_are_written_as_sent_without_hop_by_hop_lines_and_with_crlf() {
        let raw = RawFields {
            lines: Bytes::from_static(
                b"A: 1\r\nKeep-Alive: timeout=5\r\nB: 2\nC:  3 \r\nTRANSFER-ENCODING: chunked\r\n",
            ),
            has_length: false,
            length_exact: false,
            has_date: false,
        };
        let mut out = Vec::new();
        raw.write_to(&mut out, true);
        assert_eq!(String::from_utf8_lossy(&out), "A: 1\r\nB: 2\r\nC:  3 \r\n");
        let mut map = HeaderMap::new();
        raw.append_to(&mut map);
        assert_eq!(map.len(), 3);
        assert_eq!(map["c"], "3");
    }

    /// A parsed head's fields in a map, however they were kept.
    fn map_of(head: Head) -> HeaderMap {
        match head.fields {
            Fields::Raw(raw) => {
                let mut map = HeaderMap::new();
                raw.append_to(&mut map);
                map
            }
            Fields::Map(map) => map,
        }
    }

    #[test]
    fn interim_responses_are_skipped_and_values_share_the_head() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhi"[..],
        );
        let head = parse_head(&mut buf, false)
            .expect("valid")
            .expect("complete");
        assert_eq!(head.status, StatusCode::OK);
        assert!(matches!(head.framing, Framing::Length(2)));
        let headers = map_of(head);
        assert_eq!(headers["x-a"], "b");
        assert!(!headers.contains_key("link"));
        assert_eq!(&buf[..], b"hi");
        let mut partial = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Le"[..]);
        assert!(parse_head(&mut partial, false).expect("valid").is_none());
        let mut bad = BytesMut::from(&b"HTTP/1.1 2x0 OK\r\n\r\n"[..]);
        assert!(parse_head(&mut bad, false).is_err());
    }

    #[test]
    fn heads_with_many_fields_parse_up_to_the_limit() {
        let head = |fields: usize| {
            let mut h = b"HTTP/1.1 200 OK\r\n".to_vec();
            for i in 0..fields {
                h.extend_from_slice(format!("x-f{i}: {i}\r\n").as_bytes());
            }
            h.extend_from_slice(b"content-length: 0\r\n\r\n");
            BytesMut::from(&h[..])
        };
        let parsed = parse_head(&mut head(40), false)
            .expect("valid")
            .expect("complete");
        let headers = map_of(parsed);
        assert_eq!(headers.len(), 41);
        assert_eq!(headers["x-f39"], "39");
        assert!(parse_head(&mut head(MAX_HEADERS), false).is_err());
    }

    /// A connection to a raw upstream on 127.0.0.1 that has already written `answer` (so
    /// the whole answer is in the socket's buffer when the client reads), and keeps its side
    /// open for as long as the returned stream lives.
    async fn answered(answer: &'static [u8]) -> (Box<Connection>, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = TcpStream::connect(addr).await.expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        server.write_all(answer).await.expect("answer");
        let conn = Connection::new(client, addr, Box::new(()));
        (conn, server)
    }

    type Empty = http_body_util::Empty<Bytes>;

    fn get() -> Box<Request<Empty>> {
        Box::new(Request::get("/").body(Empty::new()).expect("request"))
    }

    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("finished within 10 s")
    }

    /// Sends a request to an upstream that answers `wire` (whose body starts with `hello`),
    /// sets a 50 ms read timeout on the response body, and reads its first frame, asserted
    /// to be that `hello`. The upstream's socket is returned, to keep the connection open.
    async fn hello_with_read_timeout(wire: &'static [u8]) -> (UpstreamBody<Empty>, TcpStream) {
        let (conn, server) = answered(wire).await;
        let (resp, _) = within(send(conn, get(), false)).await.expect("response");
        let mut body = resp.into_body();
        body.set_read_timeout(Some(Duration::from_millis(50)));
        let frame = within(http_body_util::BodyExt::frame(&mut body)).await;
        let data = frame
            .expect("a frame")
            .expect("data")
            .into_data()
            .expect("data");
        assert_eq!(&data[..], b"hello");
        (body, server)
    }

    #[tokio::test]
    async fn a_body_already_read_arms_no_read_timer() {
        let (mut body, _server) =
            hello_with_read_timeout(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello").await;
        assert!(body.is_end_stream());
        assert!(
            body.read_timeout.timer.is_none(),
            "no timer for bytes that were already there"
        );
        assert!(body.take_reusable().is_some(), "read to its end: reusable");
    }

    #[tokio::test]
    async fn a_body_that_stalls_fails_after_the_read_timeout_and_is_not_reusable() {
        let (mut body, _server) =
            hello_with_read_timeout(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello").await;
        assert!(body.read_timeout.timer.is_none());
        // The upstream keeps the connection open and sends nothing more.
        let next = within(http_body_util::BodyExt::frame(&mut body)).await;
        match next {
            Some(Err(UpstreamError::Timeout { .. })) => {}
            other => panic!("expected a body timeout, got {other:?}"),
        }
        assert!(body.is_end_stream());
        assert!(body.take_reusable().is_none(), "a timed-out body closes");
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection_though_the_rest_is_buffered() {
        // The gateway's rule for a response whose client left: close, never drain to keep
        // the connection, even when the whole rest already sits in the socket's buffer.
        let (body, mut server) =
            hello_with_read_timeout(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello").await;
        server.write_all(b"world").await.expect("the rest");
        let Some(Stream::Tcp(tcp)) = body.conn.as_ref().map(|c| &c.stream) else {
            panic!("a TCP connection");
        };
        within(tcp.readable()).await.expect("the rest arrived");
        drop(body);
        // The upstream reads the request it was sent, then its connection's end (a reset,
        // as the rest was left unread): within the deadline, so the connection was closed.
        let mut rest = Vec::new();
        let _ = within(tokio::io::AsyncReadExt::read_to_end(&mut server, &mut rest)).await;
        assert!(rest.starts_with(b"GET / HTTP/1.1\r\n"), "{rest:?}");
    }

    #[test]
    fn request_head_is_origin_form_with_its_framing_header() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/a?b=1")
            .header("host", "x")
            .body(())
            .expect("request");
        let mut buf = Vec::new();
        write_head(&mut buf, &req, RequestFraming::Chunked);
        assert_eq!(
            buf,
            b"POST /a?b=1 HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        write_head(&mut buf, &req, RequestFraming::Length(0));
        assert!(buf.ends_with(b"content-length: 0\r\n\r\n"));
    }

    #[test]
    fn an_absolute_target_with_an_empty_path_goes_upstream_as_slash() {
        // Found by the differential fuzz target: `GET http://h?q` went up as `GET ?q`.
        for (uri, line) in [
            ("http://a.example?q=1", &b"GET /?q=1 HTTP/1.1\r\n"[..]),
            ("http://a.example", b"GET / HTTP/1.1\r\n"),
            ("*", b"GET * HTTP/1.1\r\n"),
        ] {
            let req = Request::builder().uri(uri).body(()).expect("request");
            let mut buf = Vec::new();
            write_head(&mut buf, &req, RequestFraming::None);
            assert!(
                buf.starts_with(line),
                "{uri}: {}",
                String::from_utf8_lossy(&buf)
            );
        }
    }

    #[test]
    fn a_peers_framing_and_hop_by_hop_fields_never_reach_the_head_and_only_websocket_upgrades() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/")
            .header("host", "x")
            .header("content-length", "5, 5")
            .header("transfer-encoding", "chunked")
            .header("connection", "upgrade, http2-settings")
            .header("upgrade", "h2c")
            .header("te", "trailers")
            .header("x-kept", "1")
            .body(())
            .expect("request");
        let mut buf = Vec::new();
        let upgrade = write_head(&mut buf, &req, RequestFraming::Length(5));
        assert!(!upgrade);
        assert_eq!(
            String::from_utf8_lossy(&buf),
            "POST / HTTP/1.1\r\nhost: x\r\nx-kept: 1\r\ncontent-length: 5\r\n\r\n"
        );
        let ws = Request::builder()
            .uri("/chat")
            .header("host", "x")
            .header("upgrade", "websocket")
            .header("connection", "upgrade")
            .body(())
            .expect("request");
        assert!(write_head(&mut buf, &ws, RequestFraming::None));
        assert_eq!(
            String::from_utf8_lossy(&buf),
            "GET /chat HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
        );
    }
}
