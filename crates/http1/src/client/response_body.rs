//! The response body, read from the upstream connection as the downstream side polls it,
//! each wait bounded by the read timeout; it finishes sending the request body meanwhile,
//! and gives the connection back when the exchange left it fit for another.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};

use super::conn::Connection;
use super::raw_fields::RawFields;
use super::request_body::{BodyWriter, WriteError};
use super::response_head::{Fields, Head};
use crate::error::UpstreamError;
use crate::framing::{Framing, Step, step};
use crate::recycle;
use crate::timer::WaitTimeout;

pub(super) fn respond<B: Body>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use crate::client::send;
    use crate::stream::Stream;

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
        let (resp, _) = within(send(conn, get(), false, &[]))
            .await
            .expect("response");
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
}
