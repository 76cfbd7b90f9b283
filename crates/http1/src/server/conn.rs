//! One downstream connection's state, kept across its requests, and the wait for its next
//! request head (the h2c preface sniffed, the head and idle timeouts, the drain).

use std::future::poll_fn;
use std::task::Poll;

use http::Request;

use super::body::Reader;
use super::halves::WriteHalf;
use super::handler::{Handler, Shutdown};
use super::limits::Limits;
use crate::error::RequestError;
use crate::recycle;
use crate::request::{self, Meta};
use crate::timer::{LazyTimer, WaitTimeout};

/// What waiting for the next request head gave.
pub(super) enum Next<B> {
    Request(Box<Request<B>>, Meta),
    Refused(RequestError),
    /// The client closed, went idle past the timeout, or the server is shutting down.
    Close,
    /// The connection opened with the HTTP/2 preface.
    Http2,
    /// Idle for `limits.park_after`: nothing buffered, nothing under way.
    Park,
}

/// What an h2c client sends first (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One HTTP/1.1 connection's state, kept across its requests.
pub(super) struct Connection<'a, H, S> {
    /// `None` while a request body has it.
    pub(super) reader: Option<Box<Reader>>,
    pub(super) writer: WriteHalf,
    /// The response head (and a small first body frame) being written: taken from the
    /// thread's kept buffers for a response, given back after it (an idle connection holds
    /// none).
    pub(super) out: Vec<u8>,
    pub(super) limits: Limits,
    pub(super) shutdown: &'a mut S,
    /// `timeouts.idle_ms`, for the wait for the next request's first byte and for each
    /// write the client does not take.
    pub(super) idle: WaitTimeout,
    /// `timeouts.header_ms`, for the wait for the rest of a request head once it has begun
    /// (or, on a new connection, from the start).
    pub(super) head_wait: WaitTimeout,
    /// No request has been read yet: the head's time counts from the accept.
    pub(super) first: bool,
    /// The requests' timeout timer (`timeouts.request_ms`), kept across requests.
    pub(super) request_timer: LazyTimer,
    pub(super) handler: H,
    /// Until the first head: look for the HTTP/2 preface.
    pub(super) sniff_h2: bool,
}

impl<H: Handler, S: Shutdown> Connection<'_, H, S> {
    /// Waits for the next whole request head, reading as needed; parses it into a request.
    pub(super) async fn next_head(&mut self) -> Next<H::Body> {
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
        // Parking (after a first request, and only sooner than the idle timeout) rides on
        // the idle timer: its limit is the park delay while nothing has arrived, and the
        // idle timeout again for the writes that follow (restored below).
        let mut parking = limits
            .park_after
            .filter(|park| !from_accept && limits.idle.is_none_or(|idle| *park < idle));
        if parking.is_some() {
            idle.set_limit(parking);
        }
        let next = poll_fn(|cx| {
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
                // Between requests the connection holds no buffer: one is taken for the read
                // and given back if nothing came.
                if reader.buf.capacity() == 0 {
                    reader.buf = recycle::read_buf();
                }
                match reader.poll_fill(cx) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Next::Close),
                    Poll::Ready(Ok(_)) => continue,
                    Poll::Pending => break,
                }
            }
            let waiting = reader.buf.is_empty();
            if waiting {
                recycle::give_read_buf(std::mem::take(&mut reader.buf));
            }
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
            if parking.is_some() && !waiting {
                // A head has begun: the wait for it is the idle timeout's again, counted
                // from now (only without a header timeout does the idle timer govern it).
                parking = None;
                idle.set_limit(limits.idle);
                idle.restart();
            }
            if (waiting || limits.header.is_none()) && idle.poll_expired(cx) {
                if parking.is_some() {
                    return Poll::Ready(Next::Park);
                }
                // As hyper and nginx do: a head that does not arrive in time gets no answer,
                // the connection just closes.
                return Poll::Ready(Next::Close);
            }
            Poll::Pending
        })
        .await;
        if parking.is_some() {
            self.idle.set_limit(self.limits.idle);
        }
        next
    }
}
