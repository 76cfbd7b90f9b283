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
//!
//! Laid out bottom-up in `server/`: `halves.rs` (the halves and timed writes), `limits.rs`,
//! `body.rs` (the reader and the request body), `upgrade.rs`, `handler.rs` (the interface to
//! the gateway), `conn.rs` (a connection's state and its wait for the next head),
//! `respond.rs` (response writing), `linger.rs` (the lingering close), `date.rs`; here the
//! connection's loop, which reads as a request's stages.

mod body;
mod conn;
mod date;
mod halves;
mod handler;
mod limits;
mod linger;
mod respond;
mod upgrade;

use std::sync::Arc;

use tokio::sync::oneshot;

pub use body::{H1Body, Reader};
use conn::{Connection, Next};
pub use halves::{ReadHalf, ReadIo, WriteHalf, WriteIo};
pub use handler::{Handler, OutgoingBody, Shutdown};
pub use limits::{Limits, Linger};
use respond::Written;
pub use upgrade::{Joined, OnUpgrade};

use crate::framing::Framing;
use crate::timer::{LazyTimer, WaitTimeout};

/// How a connection comes to [`serve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Just accepted: its first head is timed from now. With `sniff_h2`, a connection that
    /// opens with the HTTP/2 preface is given back whole ([`Served::Http2`]).
    New {
        /// Look for the HTTP/2 preface before the first head.
        sniff_h2: bool,
    },
    /// Given back parked ([`Served::Parked`]) and readable since: its next head is timed
    /// from its first byte, as any later request's is.
    Resumed,
}

/// How [`serve`] ended.
#[derive(Debug)]
pub enum Served {
    /// The connection closed (or became a tunnel, which owns it now).
    Closed,
    /// It opened with the HTTP/2 preface: the connection, whole, for the HTTP/2 server.
    Http2(Joined),
    /// It stayed idle for `limits.park_after` between requests: its halves, with nothing
    /// buffered and no request under way, for the caller to wait on without this task and
    /// to serve again ([`Start::Resumed`]) once the client sends more. The rest of the idle
    /// timeout is the caller's to keep.
    Parked(Parked),
}

/// A connection handed back idle: its halves as they were given to [`serve`] (take them
/// back as their own types through `Box<dyn Any>`).
pub struct Parked {
    /// The read half; nothing read from it is left unserved.
    pub reader: ReadHalf,
    /// The write half; every response is written.
    pub writer: WriteHalf,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked").finish_non_exhaustive()
    }
}

/// Serves requests on one HTTP/1.1 connection until it closes, turns out to be HTTP/2, or
/// parks ([`Served`]); `shutdown` says when the server drains.
///
/// Not an `async fn`: the connection is built before the future, so the future holds it
/// alone. An `async fn` keeps every argument's slot for its whole life, moved out or not
/// (the limits' 104 bytes twice in every connection's task).
pub fn serve<H: Handler, S: Shutdown>(
    mut reader: Box<Reader>,
    writer: WriteHalf,
    handler: H,
    limits: Limits,
    shutdown: &mut S,
    start: Start,
) -> impl Future<Output = Served> {
    reader.body_wait.set_limit(limits.body);
    let mut conn = Connection {
        sniff_h2: matches!(start, Start::New { sniff_h2: true }),
        reader: Some(reader),
        writer,
        out: Vec::new(),
        limits,
        shutdown,
        idle: WaitTimeout::new(limits.idle),
        head_wait: WaitTimeout::new(limits.header),
        first: matches!(start, Start::New { .. }),
        request_timer: LazyTimer::new(),
        handler,
    };
    async move { conn.run().await }
}

impl<H: Handler, S: Shutdown> Connection<'_, H, S> {
    /// The connection's loop, one request per turn: the next head, its body lent to the
    /// request, `100 Continue`, the handler, the response; until the connection closes.
    async fn run(&mut self) -> Served {
        loop {
            let (mut req, meta) = match self.next_head().await {
                Next::Request(req, meta) => (req, meta),
                // The last answer and the close are boxed: once per connection, they would
                // otherwise size the connection's task for their state (~300 bytes) while it
                // waits for its next request.
                Next::Refused(refused) => {
                    Box::pin(self.refuse(refused)).await;
                    return Served::Closed;
                }
                Next::Close => {
                    Box::pin(self.close()).await;
                    return Served::Closed;
                }
                Next::Http2 => {
                    let Some((reader, writer)) = self.take_halves() else {
                        return Served::Closed;
                    };
                    return Served::Http2(Joined {
                        prelude: reader.buf.freeze(),
                        reader: reader.io,
                        writer,
                    });
                }
                Next::Park => {
                    let Some((reader, writer)) = self.take_halves() else {
                        return Served::Closed;
                    };
                    return Served::Parked(Parked {
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
                        return Served::Closed;
                    }
                } else {
                    // Told no `100 Continue`, the client may or may not send its body: the
                    // connection cannot tell what comes next, so it closes after the answer.
                    meta.keep_alive = false;
                }
            }
            // Boxed: the handler's and the response's state (a few KiB) exists only while a
            // request is served, so a connection waiting for its next request holds only the
            // small state of that wait. Written into a box allocated first: the compiler
            // then builds the future in place, where `Box::pin(future)` built it on the stack
            // and copied all ~2.7 KB of it (~300 instructions of `memcpy` a request, in
            // callgrind), though a new future holds only its ~70 bytes of arguments.
            let turn = Box::write(
                Box::new_uninit(),
                self.serve_request(req, meta, upgrade, lent),
            );
            let written = Box::into_pin(turn).await;
            crate::recycle::give_out_buf(std::mem::take(&mut self.out));
            match written {
                Ok(Written::KeepAlive) => {}
                Ok(Written::Close) => {
                    Box::pin(self.close()).await;
                    return Served::Closed;
                }
                // The tunnel owns the connection now.
                Ok(Written::Upgraded) => return Served::Closed,
                // The client went away or stopped reading: nothing to tell it.
                Err(_) => return Served::Closed,
            }
        }
    }

    /// The connection's reader and write half, to give the connection back whole (`None`
    /// while a request body has the reader, which never happens between requests).
    fn take_halves(&mut self) -> Option<(Reader, WriteHalf)> {
        let reader = self.reader.take()?;
        let writer = std::mem::replace(&mut self.writer, Box::new(tokio::io::sink()));
        Some((*reader, writer))
    }

    /// One request's turn once its head is read: the handler, then the response.
    async fn serve_request(
        &mut self,
        req: Box<http::Request<H::Body>>,
        meta: crate::request::Meta,
        upgrade: Option<oneshot::Sender<Joined>>,
        lent: Option<oneshot::Receiver<Box<Reader>>>,
    ) -> std::io::Result<Written> {
        let resp = self.handler.serve(req, &mut self.request_timer).await;
        self.respond(resp, meta, upgrade, lent).await
    }
}
