//! The reading side of a connection, and the request body lent from it: framed by the
//! request's head, each wait bounded by `timeouts.body_ms`, given back at its end.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

use super::halves::ReadHalf;
use crate::error::BodyError;
use crate::framing::{self, Framing, Step, step};
use crate::timer::WaitTimeout;

/// The reading side of a connection, with its buffer: held by the connection between
/// requests, and lent to a request's body while that streams.
pub struct Reader {
    pub(super) io: ReadHalf,
    pub(super) buf: BytesMut,
    read_size: usize,
    /// The body of the current request: what is left of it in `buf` and on the wire.
    pub(super) framing: Framing,
    /// Reading the body failed (malformed, cut short): the connection cannot go on.
    pub(super) broken: bool,
    /// `timeouts.body_ms`, for each wait for more of a request body.
    pub(super) body_wait: WaitTimeout,
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
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        framing::poll_fill(&mut self.io, cx, &mut self.buf, &mut self.read_size)
    }

    /// The next frame of the current request's body.
    pub(super) fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
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
    pub(super) reader: Option<Box<Reader>>,
    pub(super) back: Option<oneshot::Sender<Box<Reader>>>,
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
