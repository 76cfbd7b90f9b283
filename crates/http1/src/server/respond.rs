//! Response writing: the head with the framing and connection fields it needs, the body as
//! it streams, a refused head's answer, and what is left of the request body discarded so
//! that the connection can take the next request.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, DATE};
use http::{Response, StatusCode, Version};
use http_body::Body;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::oneshot;

use super::body::Reader;
use super::conn::Connection;
use super::date;
use super::halves::{timed, write_slices};
use super::handler::{Handler, OutgoingBody, Shutdown};
use super::upgrade::Joined;
use crate::error::RequestError;
use crate::framing::{self, Framing, chunk_size_line};
use crate::recycle;
use crate::request::Meta;

/// A request body left unread after its response is discarded, up to this much, to keep
/// the connection; past it the connection closes.
const DISCARD_BYTES: u64 = 256 * 1024;
/// How long discarding that rest may take before the connection closes instead.
const DISCARD_TIME: Duration = Duration::from_secs(2);
/// A response body frame this small is copied behind the head, so that both leave in one
/// write; a larger one goes as its own slice of a vectored write.
const COPY_BYTES: usize = 16 * 1024;

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
pub(super) enum Written {
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

impl<H: Handler, S: Shutdown> Connection<'_, H, S> {
    /// Writes the response: head (with the framing and connection headers it needs), then
    /// the body as it streams. Says whether the connection can take another request.
    pub(super) async fn respond(
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

        if self.out.capacity() == 0 {
            self.out = recycle::out_buf();
        }
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

    pub(super) async fn write_flushed(&mut self, bytes: &[u8]) -> io::Result<()> {
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
    pub(super) async fn refuse(&mut self, refused: RequestError) {
        let (status, reason) = self.handler.refused(refused);
        if self.out.capacity() == 0 {
            self.out = recycle::out_buf();
        }
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
}
