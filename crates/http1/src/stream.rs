//! The byte stream under an upstream connection: a plain TCP socket, or any other transport
//! (TLS, built by the caller) boxed behind the same reads and writes.
//!
//! An enum, not a trait object for both: the plaintext path is the measured hot path, and
//! with `Tcp` it pays one branch per read or write (no virtual call, no allocation), while
//! the crate stays free of any TLS library: the gateway hands in whatever it connected.

use std::fmt;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// What a boxed transport must be: a byte stream that can move between threads.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> Transport for T {}

/// An upstream connection's byte stream.
pub enum Stream {
    /// Plain TCP (HTTP/1.1 in the clear).
    Tcp(TcpStream),
    /// Anything else the caller connected, e.g. TLS over TCP.
    Boxed(Box<dyn Transport>),
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stream::Tcp(s) => f.debug_tuple("Tcp").field(s).finish(),
            Stream::Boxed(_) => f.write_str("Boxed(..)"),
        }
    }
}

impl From<TcpStream> for Stream {
    fn from(stream: TcpStream) -> Stream {
        Stream::Tcp(stream)
    }
}

impl Stream {
    /// Boxes another transport (e.g. a TLS stream).
    pub fn boxed(io: impl Transport) -> Stream {
        Stream::Boxed(Box::new(io))
    }

    /// Whether an idle stream can carry another exchange: the peer has not closed it nor
    /// sent anything unasked.
    ///
    /// TCP: one `try_read`, which costs no syscall unless the socket was reported readable
    /// since its last read (tokio keeps the readiness; an idle connection has none).
    /// Another transport: one poll of a read that nothing will wake. A TLS layer consumes
    /// what carries no data itself (TLS 1.3 session tickets a server sends after the
    /// handshake, a key update) and reports pending, so those leave the connection usable;
    /// a `close_notify`, an end of stream, an alert or application bytes make it unusable.
    /// The poll runs outside tokio's cooperative budget, as `try_read` does: a task that
    /// spent its budget (a checkout that threw away many closed connections, an eviction
    /// sweep) would otherwise be told pending without the read being tried, and take a
    /// closed connection for a usable one.
    ///
    /// What arrives after the check (or has arrived but not yet been reported by the
    /// runtime's poll of the sockets) is not seen: a request written then meets the closed
    /// connection, the keep-alive race `client::send` answers with [`SendError::Stale`].
    ///
    /// [`SendError::Stale`]: crate::client::SendError::Stale
    pub fn is_idle_usable(&mut self) -> bool {
        match self {
            Stream::Tcp(s) => {
                let mut byte = [0u8; 1];
                matches!(s.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Stream::Boxed(io) => {
                let mut byte = [0u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                let read = std::future::poll_fn(|cx| Pin::new(&mut *io).poll_read(cx, &mut buf));
                let mut read = std::pin::pin!(tokio::task::coop::unconstrained(read));
                read.as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending()
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Boxed(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Boxed(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Boxed(io) => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Boxed(io) => io.is_write_vectored(),
        }
    }

    /// TCP has nothing to flush; a TLS layer may hold records it could not write yet.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(_) => Poll::Ready(Ok(())),
            Stream::Boxed(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Boxed(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[tokio::test]
    async fn a_boxed_stream_is_idle_usable_until_the_peer_sends_or_closes() {
        let (ours, mut peer) = tokio::io::duplex(64);
        let mut stream = Stream::boxed(ours);
        assert!(stream.is_idle_usable(), "nothing arrived: usable");
        assert!(stream.is_idle_usable(), "asking again changes nothing");
        peer.write_all(b"x").await.expect("write");
        assert!(!stream.is_idle_usable(), "unasked bytes: unusable");

        let (ours, peer) = tokio::io::duplex(64);
        let mut stream = Stream::boxed(ours);
        drop(peer);
        assert!(!stream.is_idle_usable(), "end of stream: unusable");
    }

    #[tokio::test]
    async fn a_boxed_stream_closed_by_its_peer_is_unusable_in_a_task_out_of_budget() {
        let (ours, peer) = tokio::io::duplex(64);
        let mut stream = Stream::boxed(ours);
        drop(peer);
        // Spends the task's cooperative budget in one poll, as a checkout that threw away
        // that many closed connections does, then asks.
        let usable = std::future::poll_fn(|cx| {
            while std::pin::pin!(tokio::task::coop::consume_budget())
                .poll(cx)
                .is_ready()
            {}
            assert!(!tokio::task::coop::has_budget_remaining());
            Poll::Ready(stream.is_idle_usable())
        })
        .await;
        assert!(!usable, "the end of stream is seen with no budget left");
    }

    #[tokio::test]
    async fn a_tcp_stream_is_idle_usable_until_the_peer_closes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let mut stream = Stream::from(client);
        assert!(stream.is_idle_usable());
        drop(server);
        // The FIN arrives asynchronously; readiness follows within a moment.
        let mut closed = false;
        for _ in 0..200 {
            if !stream.is_idle_usable() {
                closed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(closed, "a closed connection is seen as unusable");
    }
}
