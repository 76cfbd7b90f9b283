//! The request body sent upstream while the response is read: length-delimited as declared,
//! or chunked, with one vectored write where the segments allow.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::Request;
use http_body::{Body, Frame};
use tokio::io::AsyncWrite;

use crate::framing::{self, chunk_size_line};
use crate::stream::Stream;

#[derive(Debug)]
pub(super) enum WriteError<E> {
    /// The downstream body failed (too large, client went away): the downstream's fault.
    Body(E),
    /// Writing to the upstream failed.
    Io(io::Error),
}

/// Streams the request head and body to the upstream: length-delimited as declared, or
/// chunked. Segments go out with one vectored write where they can.
#[derive(Debug)]
pub(super) struct BodyWriter<B> {
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
    pub(super) fn new(head: Bytes, req: Box<Request<B>>, chunked: bool) -> BodyWriter<B> {
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

    pub(super) fn poll_send(
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
