//! What goes wrong on the upstream side (a connect, a TLS handshake, an exchange, no endpoint
//! to send to, the resolver's setup), naming the endpoint or upstream; the gateway's `Error`
//! takes each one over with the same message, blame and status.

use std::net::SocketAddr;
use std::sync::Arc;

/// A failure of the upstream side. The gateway's error has a variant for each (`From`), so
/// these messages are the ones its log lines and error metrics show.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The endpoint refused or reset the connection attempt.
    #[error("upstream connect to {addr} failed: {reason}")]
    Connect {
        /// The endpoint.
        addr: SocketAddr,
        /// What the OS said.
        reason: String,
    },
    /// The endpoint did not connect or answer within the configured timeout.
    #[error("upstream {addr} timed out ({phase})")]
    Timeout {
        /// The endpoint.
        addr: SocketAddr,
        /// `connect` here (the gateway's error names its other phases).
        phase: &'static str,
    },
    /// The connection broke after it was established.
    #[error("upstream {addr} failed: {reason}")]
    Broken {
        /// The endpoint.
        addr: SocketAddr,
        /// What hyper said.
        reason: String,
    },
    /// The TLS handshake with the endpoint failed (no request byte was sent).
    #[error("upstream TLS handshake with {addr} failed: {reason}")]
    Tls {
        /// The endpoint.
        addr: SocketAddr,
        /// What rustls said.
        reason: String,
    },
    /// The upstream has no endpoint to send to: none of its names has resolved yet.
    #[error("upstream {upstream} has no endpoints: {reason}")]
    NoEndpoint {
        /// The upstream.
        upstream: Arc<str>,
        /// Why (each name and the resolver's error).
        reason: Arc<str>,
    },
    /// Every endpoint of the upstream is down (failing its health checks or ejected).
    #[error("no healthy endpoint in upstream `{upstream}`")]
    NoHealthyEndpoint {
        /// The upstream's name.
        upstream: Arc<str>,
    },
    /// A resource the upstream side could not get (a thread, a runtime, a metric family).
    #[error("internal error: {0}")]
    Internal(String),
}
