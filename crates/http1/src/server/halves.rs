//! A downstream connection's two halves, and the writes to the client: each bounded by the
//! idle timeout, vectored however the writes fall.

use std::any::Any;
use std::future::Future;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::{Pin, pin};
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::timer::WaitTimeout;

/// A readable half of a downstream connection (plain TCP or TLS).
pub type ReadHalf = Box<dyn ReadIo>;
/// A writable half of a downstream connection.
pub type WriteHalf = Box<dyn WriteIo>;

/// What a [`ReadHalf`] holds: any reader, which its owner can take back as its own type
/// (`Box<dyn Any>` and a downcast) when the connection is handed back parked
/// ([`Served::Parked`](super::Served::Parked)).
pub trait ReadIo: AsyncRead + Send + Unpin + Any {}
impl<T: AsyncRead + Send + Unpin + Any> ReadIo for T {}

/// What a [`WriteHalf`] holds; as [`ReadIo`].
pub trait WriteIo: AsyncWrite + Send + Unpin + Any {}
impl<T: AsyncWrite + Send + Unpin + Any> WriteIo for T {}

/// Runs a write to the client, failing it if it stays blocked for the idle timeout: a
/// client that stops reading would otherwise hold its connection (and the upstream's) for
/// ever. A write that completes at once touches no timer and reads no clock.
pub(super) async fn timed<T>(
    idle: &mut WaitTimeout,
    write: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    let mut write = pin!(write);
    idle.restart();
    poll_fn(|cx| {
        if let Poll::Ready(done) = write.as_mut().poll(cx) {
            return Poll::Ready(done);
        }
        if idle.poll_expired(cx) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took nothing for the idle timeout",
            )));
        }
        Poll::Pending
    })
    .await
}

/// Writes every slice, with vectored writes, however the writes fall.
pub(super) async fn write_slices(writer: &mut WriteHalf, slices: &mut [&[u8]]) -> io::Result<()> {
    let mut first = 0;
    loop {
        while first < slices.len() && slices[first].is_empty() {
            first += 1;
        }
        if first == slices.len() {
            return Ok(());
        }
        let mut iov = [IoSlice::new(&[]); 4];
        let mut used = 0;
        for (slot, slice) in iov.iter_mut().zip(&slices[first..]) {
            *slot = IoSlice::new(slice);
            used += 1;
        }
        let mut n =
            poll_fn(|cx| Pin::new(&mut *writer).poll_write_vectored(cx, &iov[..used])).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let len = slices[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                slices[first] = &slices[first][n..];
                n = 0;
            }
        }
    }
}
