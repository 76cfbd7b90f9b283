//! One keep-alive connection to an upstream endpoint: its stream, its read buffer and the
//! buffer its request heads are built in.

use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};

use crate::error::UpstreamError;
use crate::framing;
use crate::stream::Stream;

/// What the caller keeps with a connection for as long as it lives (a metric guard that
/// counts it open): dropped with it.
pub type Guard = Box<dyn std::any::Any + Send + Sync>;

/// One keep-alive connection to an upstream endpoint, over plain TCP or TLS ([`Stream`]).
#[derive(Debug)]
pub struct Connection {
    pub(super) stream: Stream,
    pub(super) addr: SocketAddr,
    /// Bytes read and not yet consumed; empty between exchanges.
    pub(super) read_buf: BytesMut,
    /// The request head being written; kept to reuse its allocation.
    pub(super) head_buf: Vec<u8>,
    pub(super) read_size: usize,
    pub(super) guard: Guard,
}

impl Connection {
    /// Wraps a connected stream (a `TcpStream`, or a [`Stream`] the caller built, such as
    /// TLS), with the caller's `guard` (dropped with the connection). Boxed once here, so
    /// that handing it between pool, request and body moves a pointer.
    pub fn new(stream: impl Into<Stream>, addr: SocketAddr, guard: Guard) -> Box<Connection> {
        Box::new(Connection {
            stream: stream.into(),
            addr,
            read_buf: BytesMut::new(),
            head_buf: Vec::with_capacity(512),
            read_size: framing::MIN_READ,
            guard,
        })
    }

    /// Whether an idle connection can take a request: the upstream has not closed it nor
    /// sent anything unasked ([`Stream::is_idle_usable`]). Over TCP it costs no syscall
    /// unless the socket was reported readable since its last read.
    pub fn is_idle_usable(&mut self) -> bool {
        self.read_buf.is_empty() && self.stream.is_idle_usable()
    }

    /// The stream and whatever the upstream sent after the head of its `101`: for a tunnel.
    pub fn into_upgraded(self) -> (Stream, Bytes, Guard) {
        (self.stream, self.read_buf.freeze(), self.guard)
    }

    /// The endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(super) fn broken<E>(&self, reason: impl std::fmt::Display) -> UpstreamError<E> {
        UpstreamError::Broken {
            addr: self.addr,
            reason: reason.to_string(),
        }
    }

    /// Reads more bytes into `read_buf`; `Ok(0)` is the upstream's end of stream.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        framing::poll_fill(
            &mut self.stream,
            cx,
            &mut self.read_buf,
            &mut self.read_size,
        )
    }
}
