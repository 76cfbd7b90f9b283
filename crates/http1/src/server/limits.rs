//! What a connection is served with: its size limits and timeouts, and the bounds of a
//! lingering close.

use std::time::Duration;

/// What an HTTP/1.1 connection is served with: from the listener's config at accept.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The request head's size limit (`limits.header_bytes`): over it, `431` (`414` when
    /// the request line alone is over it).
    pub header_bytes: usize,
    /// `limits.body_bytes`: a declared body over it gets no `100 Continue`.
    pub body_bytes: u64,
    /// `timeouts.idle_ms`: how long a connection may wait, between requests, for the first
    /// byte of the next one, and for a write to be taken.
    pub idle: Option<Duration>,
    /// `timeouts.header_ms`: how long a request head may take, from a new connection's
    /// accept (or a later request's first byte) to its end; then `408` and close.
    pub header: Option<Duration>,
    /// `timeouts.body_ms`: the longest wait for the next bytes of a request body; then the
    /// body fails with [`BodyError::Timeout`](crate::BodyError::Timeout).
    pub body: Option<Duration>,
    /// `timeouts.park_ms`: a keep-alive connection idle this long (after its first request)
    /// is handed back to the caller, [`Served::Parked`](super::Served::Parked), to wait for
    /// its next request without its task; `None` (and any value not under `idle`) keeps
    /// every connection on its task until it closes.
    pub park_after: Option<Duration>,
    /// How a close with unread bytes lingers ([`Linger::DEFAULT`] unless a test needs
    /// small bounds).
    pub linger: Linger,
}

/// How a connection closed while the client may still be sending (an answer before the
/// request body was read, a refused head) lingers: after the response, the server stops
/// writing (FIN) and reads and drops what arrives until the client closes too, or one of
/// these bounds is reached; only then is the socket closed. A socket closed with unread
/// bytes sends a reset, and a reset can destroy the answer before the client reads it: a
/// client still writing its upload sees `EPIPE`/`ECONNRESET` instead of the `413` it was
/// sent (RFC 9112 §9.6; nginx's `lingering_close`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linger {
    /// The longest a close lingers in all (nginx's `lingering_time`).
    pub total: Duration,
    /// The longest wait for the client's next bytes (nginx's `lingering_timeout`).
    pub between_reads: Duration,
    /// The most bytes dropped; a client that sends more is not stopping, and is reset.
    pub bytes: u64,
}

impl Linger {
    /// 30 s in all and 5 s between reads: nginx's defaults, time for a client on a slow
    /// link to finish the part of its upload it had under way. 64 MiB: more than a client
    /// that stops once it reads the answer can still have on its way, whatever the buffer
    /// sizes of the hosts (Linux grows a receive buffer up to `net.ipv4.tcp_rmem`'s max, 32
    /// MiB on some kernels, and a send buffer up to `tcp_wmem`'s, 4 MiB by default), and
    /// than a client that reads only after sending its whole body sends for most uploads.
    pub const DEFAULT: Linger = Linger {
        total: Duration::from_secs(30),
        between_reads: Duration::from_secs(5),
        bytes: 64 * 1024 * 1024,
    };
}

impl Default for Linger {
    fn default() -> Linger {
        Linger::DEFAULT
    }
}
