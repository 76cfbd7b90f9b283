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
//!
//! Laid out bottom-up in `client/`: `conn.rs` (the connection), `request_head.rs`,
//! `request_body.rs` (the body writer), `raw_fields.rs`, `response_head.rs` (parse and
//! framing), `response_body.rs`; here the exchange: [`send`] writes the head and reads the
//! response head while the body goes.

mod conn;
mod raw_fields;
mod request_body;
mod request_head;
mod response_body;
mod response_head;

use std::future::poll_fn;
use std::io;
use std::task::{Poll, ready};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use tokio::io::AsyncWriteExt;

pub use conn::{Connection, Guard};
pub use raw_fields::RawFields;
use request_body::{BodyWriter, WriteError};
use request_head::{RequestFraming, expects_body, write_head};
pub use response_body::UpstreamBody;
use response_body::respond;
#[doc(hidden)]
pub use response_head::parse_response_head;
use response_head::{Head, MAX_HEAD_BYTES, TOO_LARGE, parse_head};

pub use crate::stream::Stream;

use crate::error::UpstreamError;

/// Why a request got no response.
#[derive(Debug)]
pub enum SendError<B: Body> {
    /// A reused connection turned out closed before the upstream answered anything, and
    /// the request (idempotent, bodiless, so unchanged by the attempt) may go again on a new
    /// connection: the keep-alive race every proxy meets when an upstream closes an idle
    /// connection as a request is written on it.
    Stale(Box<Request<B>>),
    /// The same race met by a request with a body: a reused connection closed before any
    /// byte of an answer arrived. The body went to the try and is gone with it, so only a
    /// caller that kept a copy of the request can send it again (on a new connection); the
    /// error is what the request fails with if it does not.
    StaleSent(UpstreamError<B::Error>),
    /// Anything else; the connection is gone.
    Failed(UpstreamError<B::Error>),
}

/// A response head received, and the request back if it was sent whole already (a bodiless
/// one), for its containers to serve the caller's next request.
pub type Sent<B> = (Response<UpstreamBody<B>>, Option<Box<Request<B>>>);

/// Sends `req` on `conn` and waits for the response head. `reused` says whether the
/// connection served a request before (only then is a closed connection [`SendError::Stale`]
/// or [`SendError::StaleSent`]).
/// The response body streams from the connection and gives it back at its end
/// ([`UpstreamBody::take_reusable`]).
///
/// `extra_fields` are whole field lines (`name: value\r\n` each, any number per slice)
/// written into the head after the request's own fields, as given: the caller's own
/// fields, valid by construction (the gateway's forwarding fields and `traceparent`), added
/// without a header-map insert, a value to validate and a drop (~400 instructions a field).
pub async fn send<B>(
    mut conn: Box<Connection>,
    req: Box<Request<B>>,
    reused: bool,
    extra_fields: &[&[u8]],
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
    let upgrade = write_head(&mut conn.head_buf, &req, framing, extra_fields);
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
        (Err(HeadError::Closed(e)), None) if reused => Err(SendError::StaleSent(conn.broken(e))),
        (Err(HeadError::Closed(e)), None) => Err(SendError::Failed(conn.broken(e))),
        (Err(HeadError::Failed(e)), _) => Err(SendError::Failed(e)),
    }
}

#[derive(Debug)]
enum HeadError<E> {
    /// The upstream closed (or reset) the connection before any byte of an answer arrived.
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
    // Some byte of an answer arrived (an interim 1xx leaves nothing in the buffer): a close
    // after it is no keep-alive race, the upstream read the request.
    let mut answered = false;
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
                    return Poll::Ready(if !answered && conn.read_buf.is_empty() {
                        Err(HeadError::Closed(err))
                    } else {
                        Err(HeadError::Failed(
                            conn.broken("connection closed inside the response head"),
                        ))
                    });
                }
                Ok(_) => answered = true,
                Err(e) if !answered && conn.read_buf.is_empty() => {
                    return Poll::Ready(Err(HeadError::Closed(e)));
                }
                Err(e) => return Poll::Ready(Err(HeadError::Failed(conn.broken(e)))),
            }
        }
    })
    .await
}
