//! What can go wrong in an HTTP/1.1 exchange, on either side: a request head refused before
//! anyone saw it, a request body that failed while it was read, and an upstream exchange
//! that broke. The gateway maps each into its own error (with its blame and its one
//! status); the statuses here are what RFC 9110 names for them, for that mapping and tests.

use std::fmt;
use std::net::SocketAddr;

/// A request head refused before it reached the handler; the connection answers it and
/// closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// Malformed or ambiguous (framing, target, Host, syntax): `400`.
    Malformed(&'static str),
    /// The header section is over the limit or has too many fields: `431`.
    HeadTooLarge,
    /// The request line alone is over the head limit: `414`.
    TargetTooLong,
    /// An HTTP version other than 1.x: `505`.
    VersionUnsupported,
    /// A `CONNECT`: the gateway opens no tunnels to client-named hosts: `501`, and the
    /// bytes after it are never read as requests.
    Connect,
    /// The head did not arrive within `timeouts.header_ms`: `408`.
    HeadTimeout,
}

impl RequestError {
    /// The status RFC 9110 gives this refusal.
    pub fn status(self) -> u16 {
        match self {
            RequestError::Malformed(_) => 400,
            RequestError::HeadTooLarge => 431,
            RequestError::TargetTooLong => 414,
            RequestError::VersionUnsupported => 505,
            RequestError::Connect => 501,
            RequestError::HeadTimeout => 408,
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Malformed(why) => write!(f, "malformed request: {why}"),
            RequestError::HeadTooLarge => f.write_str("request headers are larger than the limit"),
            RequestError::TargetTooLong => f.write_str("request target is longer than the limit"),
            RequestError::VersionUnsupported => f.write_str("HTTP version not supported"),
            RequestError::Connect => f.write_str("CONNECT is not supported"),
            RequestError::HeadTimeout => f.write_str("request head not received in time"),
        }
    }
}

impl std::error::Error for RequestError {}

/// Why a request body read from a downstream connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Malformed framing, or the client closed before the body's end.
    Broken(String),
    /// The client sent nothing for `timeouts.body_ms`.
    Timeout,
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Broken(why) => f.write_str(why),
            BodyError::Timeout => f.write_str("the client sent no body bytes for the body timeout"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Why an upstream exchange failed.
#[derive(Debug)]
pub enum UpstreamError<E> {
    /// The connection broke, or the upstream sent something that cannot be framed.
    Broken {
        /// The endpoint.
        addr: SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// The response body stalled for longer than its read timeout.
    Timeout {
        /// The endpoint.
        addr: SocketAddr,
    },
    /// The request body being sent failed (the downstream's fault).
    RequestBody(E),
}

impl<E: fmt::Display> fmt::Display for UpstreamError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Broken { addr, reason } => write!(f, "upstream {addr} failed: {reason}"),
            UpstreamError::Timeout { addr } => write!(f, "upstream {addr} timed out (body)"),
            UpstreamError::RequestBody(e) => write!(f, "request body: {e}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for UpstreamError<E> {}
