//! `timeouts.send_ms` on a downstream HTTP/2 connection: a connection whose responses wait
//! on the client and make no progress for that long is closed (nginx's `send_timeout`).
//!
//! hyper polls a stream's response body only when the client's flow-control windows leave
//! room for what it would send: while a client reads nothing, the body is never polled, so
//! a timer inside it could not act, and hyper offers no way to reset one stream from
//! outside. So each body ([`Watched`]) tells its connection's [`SendWatch`] when it handed
//! hyper a frame and has not been asked for the next one yet (it waits on the client, not
//! on its upstream), and when it is polled (progress); the connection's task closes the
//! connection once some body waits and none has progressed for `send_ms`. Each closed
//! stream's upstream exchange ends with it, so a slow reader holds an upstream connection
//! (and its receive buffer, `limits.upstream_receive_buffer_bytes`) for `send_ms` at most.
//!
//! The cost on the request path: one relaxed add on the connection's own counter per frame
//! (the connection's streams all run on its serving thread), no lock, no allocation.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::response_body::ResponseBody;

/// A stall is checked this many times per `send_ms`: a connection is closed between
/// `send_ms` and `send_ms * (1 + 1/TICKS)` after its last progress.
const TICKS: u32 = 4;

/// One downstream HTTP/2 connection's view of its response bodies.
#[derive(Debug, Default)]
pub(super) struct SendWatch {
    /// Polls of any of its response bodies so far.
    progress: AtomicU64,
    /// Bodies that handed hyper a frame and were not polled since: they wait on the client.
    waiting: AtomicU32,
}

impl SendWatch {
    /// Resolves once some body has waited on the client and no body has progressed for
    /// `send_ms`; never when `send_ms` is `None`.
    pub(super) async fn stalled(&self, send_ms: Option<Duration>) {
        let Some(limit) = send_ms else {
            return std::future::pending().await;
        };
        let tick = limit / TICKS;
        let mut last = self.progress.load(Ordering::Relaxed);
        let mut still = 0;
        loop {
            tokio::time::sleep(tick).await;
            let now = self.progress.load(Ordering::Relaxed);
            if now == last && self.waiting.load(Ordering::Relaxed) > 0 {
                still += 1;
                if still >= TICKS {
                    return;
                }
            } else {
                still = 0;
            }
            last = now;
        }
    }
}

/// A response body of an HTTP/2 stream, reporting to its connection's [`SendWatch`].
#[derive(Debug)]
pub(super) struct Watched {
    inner: ResponseBody,
    watch: Arc<SendWatch>,
    /// Counted in `watch.waiting`.
    waiting: bool,
}

impl Watched {
    pub(super) fn new(inner: ResponseBody, watch: &Arc<SendWatch>) -> Watched {
        Watched {
            inner,
            watch: Arc::clone(watch),
            waiting: false,
        }
    }

    fn stop_waiting(&mut self) {
        if self.waiting {
            self.waiting = false;
            self.watch.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = tailguard_http::error::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        this.stop_waiting();
        this.watch.progress.fetch_add(1, Ordering::Relaxed);
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled
            && !this.inner.is_end_stream()
        {
            this.waiting = true;
            this.watch.waiting.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.stop_waiting();
    }
}
