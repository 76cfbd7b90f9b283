//! A connection handed on whole: the downstream side of a WebSocket tunnel after a `101`,
//! or an h2c connection found by its preface, with the bytes already read put back in front.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::halves::{ReadHalf, WriteHalf};

/// The downstream side of an upgrade (a WebSocket): resolves to the connection once the
/// `101` head has been written to it. Found in the request's extensions.
/// (Shared and clonable, as request extensions must be; only an upgrade request pays.)
#[derive(Debug, Clone)]
pub struct OnUpgrade(pub(super) Arc<std::sync::Mutex<Option<oneshot::Receiver<Joined>>>>);

impl OnUpgrade {
    /// The upgraded connection, or `None` if the connection ended instead.
    pub async fn connection(self) -> Option<Joined> {
        let receiver = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        receiver.await.ok()
    }
}

/// A connection made whole again from its halves, with the bytes already read from it put
/// back in front: the downstream side of a tunnel after a `101`, or an h2c connection
/// found by its preface.
pub struct Joined {
    pub(super) prelude: Bytes,
    pub(super) reader: ReadHalf,
    pub(super) writer: WriteHalf,
}

impl std::fmt::Debug for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joined")
            .field("prelude", &self.prelude.len())
            .finish_non_exhaustive()
    }
}

impl AsyncRead for Joined {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prelude.is_empty() {
            let n = self.prelude.len().min(buf.remaining());
            buf.put_slice(&self.prelude[..n]);
            self.prelude.advance(n);
            if self.prelude.is_empty() {
                // The prelude is a view of the HTTP/1.1 reader's buffer (8 KiB), which an
                // emptied view still keeps alive: for an h2c connection, as long as it lives.
                self.prelude = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for Joined {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.writer).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}
