//! The lingering close: the connection stops writing, then reads and drops what the client
//! still sends until it closes or a bound of its [`Linger`](super::Linger) is reached.

use std::future::poll_fn;
use std::task::Poll;

use tokio::io::AsyncWriteExt as _;

use super::conn::Connection;
use super::halves::timed;
use super::handler::{Handler, Shutdown};
use crate::framing::Framing;
use crate::timer::WaitTimeout;

impl<H: Handler, S: Shutdown> Connection<'_, H, S> {
    /// Closes the connection: stops writing (FIN, or TLS close_notify); if the client may
    /// still be sending (unread bytes), lingers first ([`Linger`](super::Linger)): reads and drops what
    /// arrives until the client closes or a bound is reached, so that the close does not
    /// turn into a reset that destroys the response in flight.
    pub(super) async fn close(&mut self) {
        let _ = timed(&mut self.idle, self.writer.shutdown()).await;
        let Some(reader) = self.reader.as_mut() else {
            return;
        };
        let unread =
            !reader.buf.is_empty() || reader.broken || !matches!(reader.framing, Framing::Done);
        if !unread {
            return;
        }
        let linger = self.limits.linger;
        let mut quiet = WaitTimeout::new(Some(linger.between_reads));
        let mut discarded = 0u64;
        let discard = poll_fn(|cx| {
            loop {
                reader.buf.clear();
                match reader.poll_fill(cx) {
                    // The client closed (or reset): nothing more can destroy the answer.
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(()),
                    Poll::Ready(Ok(n)) => {
                        discarded = discarded.saturating_add(n as u64);
                        if discarded > linger.bytes {
                            return Poll::Ready(());
                        }
                        quiet.restart();
                    }
                    Poll::Pending => {
                        if quiet.poll_expired(cx) {
                            return Poll::Ready(());
                        }
                        return Poll::Pending;
                    }
                }
            }
        });
        let _ = tokio::time::timeout(linger.total, discard).await;
    }
}

#[cfg(test)]
mod tests {
    //! The lingering close, on an in-memory connection (`tokio::io::duplex`: its buffer is
    //! the test's, not the kernel's) and a paused clock: deterministic whatever the host.

    use std::io;
    use std::task::{Context, Poll};

    use bytes::{Bytes, BytesMut};
    use http::{Request, Response, StatusCode};
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::Instant;

    use crate::error::RequestError;
    use crate::framing;
    use crate::server::{
        H1Body, Handler, Limits, Linger, OutgoingBody, Reader, Shutdown, Start, serve,
    };
    use crate::timer::LazyTimer;

    /// The connection's buffer each way: a client writing more than this waits for the
    /// server to read.
    const PIPE: usize = 64 * 1024;
    /// The body a client declares: far more than it ever sends.
    const DECLARED: u64 = 1 << 30;
    const ANSWER: &[u8] = b"too big\n";

    impl OutgoingBody for Full<Bytes> {}

    /// Answers every request `413` without reading its body, as the gateway relays an
    /// upstream that refuses by the head.
    struct EarlyAnswer;

    impl Handler for EarlyAnswer {
        type Body = Option<H1Body>;
        type ResponseBody = Full<Bytes>;

        fn new_request(&self, _: usize) -> Box<Request<Option<H1Body>>> {
            Box::new(Request::new(None))
        }

        fn attach_body(&self, req: &mut Request<Option<H1Body>>, body: H1Body) {
            *req.body_mut() = Some(body);
        }

        async fn serve(
            &self,
            req: Box<Request<Option<H1Body>>>,
            _: &mut LazyTimer,
        ) -> Response<Full<Bytes>> {
            drop(req);
            let mut resp = Response::new(Full::new(Bytes::from_static(ANSWER)));
            *resp.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
            resp
        }

        fn refused(&self, _: RequestError) -> (StatusCode, &'static str) {
            (StatusCode::BAD_REQUEST, "bad request\n")
        }
    }

    struct NoShutdown;

    impl Shutdown for NoShutdown {
        fn poll_draining(&mut self, _: &mut Context<'_>) -> Poll<()> {
            Poll::Pending
        }
        fn is_draining(&self) -> bool {
            false
        }
    }

    /// Serves the server end of a pipe with `linger` until the connection ends; returns when
    /// it did.
    async fn server(end: DuplexStream, linger: Linger) -> Instant {
        let (read, write) = tokio::io::split(end);
        let limits = Limits {
            header_bytes: 8 * 1024,
            body_bytes: u64::MAX,
            idle: None,
            header: None,
            body: None,
            park_after: None,
            linger,
        };
        let reader = Reader::new(Box::new(read), BytesMut::new());
        serve(
            reader,
            Box::new(write),
            EarlyAnswer,
            limits,
            &mut NoShutdown,
            Start::New { sniff_h2: false },
        )
        .await;
        Instant::now()
    }

    /// Sends a head declaring a large body and the body's first KiB, then reads the answer
    /// to the server's end of stream: it must be the whole `413`, closing.
    async fn upload_and_read_answer(client: &mut DuplexStream) {
        let head = format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {DECLARED}\r\n\r\n");
        client.write_all(head.as_bytes()).await.expect("head");
        client.write_all(&[b'x'; 1024]).await.expect("body");
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("answer");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 413 "), "{text}");
        assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\ntoo big\n"), "{text}");
    }

    /// Writes `chunk`s until a write fails or `limit` bytes went; the bytes that went.
    async fn send_until_closed(client: &mut DuplexStream, limit: u64) -> (u64, io::Result<()>) {
        let chunk = [b'x'; 16 * 1024];
        let mut sent = 0;
        while sent < limit {
            if let Err(e) = client.write_all(&chunk).await {
                return (sent, Err(e));
            }
            sent += chunk.len() as u64;
        }
        (sent, Ok(()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_still_sending_after_an_early_answer_reads_it_whole_and_is_not_cut_off() {
        let (mut client, end) = tokio::io::duplex(PIPE);
        let client_side = async {
            upload_and_read_answer(&mut client).await;
            // The answer is written and the server stopped writing; the client goes on with
            // its upload (it reads only later, or did not look): every byte is taken.
            let (sent, result) = send_until_closed(&mut client, 4 << 20).await;
            result.expect("the lingering server takes what the client still sends");
            assert_eq!(sent, 4 << 20);
            // The client is done and closes: the server closes at once.
            client.shutdown().await.expect("shutdown");
            let closed = Instant::now();
            (client, closed)
        };
        let (server_done, (_client, client_closed)) =
            tokio::join!(server(end, Linger::DEFAULT), client_side);
        assert_eq!(server_done, client_closed, "no wait once the client closed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lingering_close_gives_up_after_its_byte_bound() {
        let bound = 256 * 1024;
        let linger = Linger {
            bytes: bound,
            ..Linger::DEFAULT
        };
        let (mut client, end) = tokio::io::duplex(PIPE);
        let client_side = async {
            upload_and_read_answer(&mut client).await;
            // A client that never stops sending: cut off once the bound is dropped.
            let (sent, result) = send_until_closed(&mut client, u64::MAX).await;
            let err = result.expect_err("the server closed");
            assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
            (sent, Instant::now())
        };
        let start = Instant::now();
        let (server_done, (sent, cut)) = tokio::join!(server(end, linger), client_side);
        assert!(sent > bound, "cut off after {sent} bytes, before the bound");
        // What the server dropped, at most one read past the bound, and what the pipe held.
        assert!(
            sent <= bound + framing::MAX_READ as u64 + PIPE as u64,
            "{sent} bytes went"
        );
        assert!(server_done <= cut);
        assert_eq!(
            start, cut,
            "no time bound was reached (the clock is paused)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lingering_close_ends_when_the_client_is_quiet_for_between_reads() {
        let linger = Linger::DEFAULT;
        let (mut client, end) = tokio::io::duplex(PIPE);
        let client_side = async {
            upload_and_read_answer(&mut client).await;
            client.write_all(&[b'x'; 1024]).await.expect("more body");
            // Then silence, the connection left open.
            (client, Instant::now())
        };
        let (server_done, (mut client, quiet_since)) =
            tokio::join!(server(end, linger), client_side);
        assert_eq!(server_done - quiet_since, linger.between_reads);
        let err = client.write_all(b"x").await.expect_err("closed");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lingering_close_ends_after_its_total_time_however_the_client_trickles() {
        let linger = Linger::DEFAULT;
        let (mut client, end) = tokio::io::duplex(PIPE);
        let every = linger.between_reads / 2;
        let client_side = async {
            upload_and_read_answer(&mut client).await;
            let answered = Instant::now();
            // A KiB every half of `between_reads`: never quiet for long enough, for ever.
            loop {
                if let Err(e) = client.write_all(&[b'x'; 1024]).await {
                    assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
                    break;
                }
                tokio::time::sleep(every).await;
            }
            answered
        };
        let (server_done, answered) = tokio::join!(server(end, linger), client_side);
        assert_eq!(server_done - answered, linger.total);
    }
}
