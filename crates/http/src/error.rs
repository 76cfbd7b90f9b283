//! The crate's one error type: every failure has a blame, a retryability and one status.
//! The upstream side's failures come in from its own [`UpstreamError`], one variant each.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use http::StatusCode;

use tailguard_config::diagnostic::{self, Diagnostic};
use tailguard_upstream::error::UpstreamError;

/// Who caused a failure: the answer decides which side's metrics and alerts it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The client sent something we refuse (too large, malformed, nothing routes it).
    Downstream,
    /// The upstream refused, reset or was too slow.
    Upstream,
    /// The gateway itself (a bug, or a resource it ran out of).
    Internal,
}

impl Blame {
    /// Lowercase name used in log fields.
    pub fn as_str(self) -> &'static str {
        match self {
            Blame::Downstream => "downstream",
            Blame::Upstream => "upstream",
            Blame::Internal => "internal",
        }
    }
}

/// Everything that can go wrong in the gateway, from config load to a forwarded request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config has errors; each one carries file, line, column and field.
    #[error("{}", diagnostic::lines(.0))]
    Config(Vec<Diagnostic>),
    /// A file (config, certificate, key) could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// No route matches the request.
    #[error("no route matches the request")]
    NoRoute,
    /// The request head is larger than `limits.header_bytes`.
    #[error("request headers are larger than the limit")]
    HeadersTooLarge,
    /// The request body is larger than `limits.body_bytes` (declared or streamed).
    #[error("request body is larger than the limit")]
    BodyTooLarge,
    /// The request cannot be forwarded as sent.
    #[error("malformed request: {0}")]
    BadRequest(&'static str),
    /// A `CONNECT` request: tailguard is a reverse proxy and opens no tunnels to
    /// client-named hosts (nginx answers it with an error too).
    #[error("CONNECT is not supported")]
    ConnectUnsupported,
    /// The request line alone is longer than `limits.header_bytes`.
    #[error("request target is longer than the limit")]
    UriTooLong,
    /// An HTTP version the gateway does not speak on this connection (not 1.x).
    #[error("HTTP version not supported")]
    VersionUnsupported,
    /// The client was too slow: its request head took longer than `timeouts.header_ms`
    /// (phase `head`), its body stalled for `timeouts.body_ms` (`body`), or it was still
    /// sending its body when `timeouts.request_ms` ran out (`request`).
    #[error("client timed out ({phase})")]
    DownstreamTimeout {
        /// `head`, `body` or `request`.
        phase: &'static str,
    },
    /// The client went away or broke the body stream while we were forwarding it.
    #[error("downstream body: {0}")]
    DownstreamBody(String),
    /// The admission seam refused the request (overload).
    #[error("overloaded")]
    Overloaded,
    /// A rate limit (`rate_limit` on the route or the listener) refused the request: `429`
    /// with `Retry-After`, before admission, never reaching an upstream.
    #[error("rate limited by the {scope} limit, retry in {retry_after} s")]
    RateLimited {
        /// `route` or `listener`: whose limit.
        scope: &'static str,
        /// Seconds until a request would be admitted.
        retry_after: u64,
    },
    /// The client's address is not allowed (`allow` / `deny` of the route or the listener):
    /// `403`, before anything else is done for the request.
    #[error("the client address is not allowed by the {scope}'s allow/deny lists")]
    AddressDenied {
        /// `route` or `listener`: whose lists.
        scope: &'static str,
    },
    /// The upstream endpoint refused or reset the connection attempt.
    #[error("upstream connect to {addr} failed: {reason}")]
    UpstreamConnect {
        /// The endpoint.
        addr: SocketAddr,
        /// What the OS said.
        reason: String,
    },
    /// The upstream did not connect, answer, or go on with its body within the configured
    /// timeout.
    #[error("upstream {addr} timed out ({phase})")]
    UpstreamTimeout {
        /// The endpoint.
        addr: SocketAddr,
        /// `connect`, `request` (the response head) or `body` (`timeouts.read_ms` between
        /// two reads of the response body).
        phase: &'static str,
    },
    /// The upstream connection broke after it was established.
    #[error("upstream {addr} failed: {reason}")]
    UpstreamBroken {
        /// The endpoint.
        addr: SocketAddr,
        /// What hyper said.
        reason: String,
    },
    /// The upstream has no endpoint to send to: none of its names has resolved yet.
    #[error("upstream {upstream} has no endpoints: {reason}")]
    NoEndpoint {
        /// The upstream.
        upstream: std::sync::Arc<str>,
        /// Why (each name and the resolver's error).
        reason: std::sync::Arc<str>,
    },
    /// The TLS handshake with an upstream endpoint failed: its certificate did not verify
    /// (untrusted, expired, for another name), it refused ours, or it broke off. The request
    /// was not sent, so it may be retried on another endpoint like a refused connect.
    #[error("upstream TLS handshake with {addr} failed: {reason}")]
    UpstreamTls {
        /// The endpoint.
        addr: SocketAddr,
        /// What rustls said.
        reason: String,
    },
    /// Every endpoint of the upstream is down (failing its health checks or ejected): the
    /// request is answered at once, with no connect attempt.
    #[error("no healthy endpoint in upstream `{upstream}`")]
    NoHealthyEndpoint {
        /// The upstream's name.
        upstream: std::sync::Arc<str>,
    },
    /// TLS setup failed (bad certificate or key).
    #[error("tls: {0}")]
    Tls(String),
    /// A bug or an exhausted resource in the gateway.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// Who is at fault.
    pub fn blame(&self) -> Blame {
        match self {
            Error::NoRoute
            | Error::HeadersTooLarge
            | Error::BodyTooLarge
            | Error::BadRequest(_)
            | Error::ConnectUnsupported
            | Error::UriTooLong
            | Error::VersionUnsupported
            | Error::DownstreamTimeout { .. }
            | Error::DownstreamBody(_)
            | Error::RateLimited { .. }
            | Error::AddressDenied { .. } => Blame::Downstream,
            Error::UpstreamConnect { .. }
            | Error::UpstreamTimeout { .. }
            | Error::UpstreamBroken { .. }
            | Error::NoEndpoint { .. }
            | Error::UpstreamTls { .. }
            | Error::NoHealthyEndpoint { .. } => Blame::Upstream,
            Error::Config(_)
            | Error::Read { .. }
            | Error::Bind { .. }
            | Error::Overloaded
            | Error::Tls(_)
            | Error::Internal(_) => Blame::Internal,
        }
    }

    /// Whether sending the same request again (elsewhere, or later) may succeed without
    /// the client changing it. A refused connect never reached the upstream, so it is safe
    /// to retry on another endpoint, and so is a failed TLS handshake (no request byte was
    /// sent); a timeout or a broken exchange may have had effects.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Error::UpstreamConnect { .. }
                | Error::UpstreamTls { .. }
                | Error::Overloaded
                | Error::RateLimited { .. }
        )
    }

    /// THE mapping from error to HTTP status. Every error response the gateway makes goes
    /// through here, so the table in docs/life-of-a-request.md is this function.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::NoRoute => StatusCode::NOT_FOUND,
            Error::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Error::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Error::BadRequest(_) | Error::DownstreamBody(_) => StatusCode::BAD_REQUEST,
            Error::ConnectUnsupported => StatusCode::NOT_IMPLEMENTED,
            Error::UriTooLong => StatusCode::URI_TOO_LONG,
            Error::VersionUnsupported => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            Error::DownstreamTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Error::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Error::AddressDenied { .. } => StatusCode::FORBIDDEN,
            Error::Overloaded | Error::NoEndpoint { .. } | Error::NoHealthyEndpoint { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Error::UpstreamConnect { .. }
            | Error::UpstreamBroken { .. }
            | Error::UpstreamTls { .. } => StatusCode::BAD_GATEWAY,
            Error::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Error::Config(_)
            | Error::Read { .. }
            | Error::Bind { .. }
            | Error::Tls(_)
            | Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC status a gRPC call gets for this error instead of [`Error::status`] (sent
    /// as HTTP 200 with `grpc-status`, as Envoy does): `UNAVAILABLE` where the HTTP answer
    /// would be 502 or 503, `DEADLINE_EXCEEDED` for 504 and 408, `UNIMPLEMENTED` for no
    /// route, `RESOURCE_EXHAUSTED` for a limit, `PERMISSION_DENIED` for a refused address,
    /// `INTERNAL` for the rest.
    pub fn grpc_status(&self) -> u8 {
        use crate::grpc::code;
        match self {
            Error::UpstreamConnect { .. }
            | Error::UpstreamBroken { .. }
            | Error::Overloaded
            | Error::NoEndpoint { .. }
            | Error::UpstreamTls { .. }
            | Error::NoHealthyEndpoint { .. } => code::UNAVAILABLE,
            Error::UpstreamTimeout { .. } | Error::DownstreamTimeout { .. } => {
                code::DEADLINE_EXCEEDED
            }
            Error::NoRoute | Error::ConnectUnsupported | Error::VersionUnsupported => {
                code::UNIMPLEMENTED
            }
            Error::HeadersTooLarge
            | Error::BodyTooLarge
            | Error::UriTooLong
            | Error::RateLimited { .. } => code::RESOURCE_EXHAUSTED,
            Error::AddressDenied { .. } => code::PERMISSION_DENIED,
            Error::BadRequest(_)
            | Error::DownstreamBody(_)
            | Error::Config(_)
            | Error::Read { .. }
            | Error::Bind { .. }
            | Error::Tls(_)
            | Error::Internal(_) => code::INTERNAL,
        }
    }

    /// [`Error::reason`] as a `grpc-message`: one line, no newline.
    pub fn grpc_message(&self) -> &'static str {
        self.reason().trim_end()
    }

    /// The short plain-text body sent with the status; it never leaks addresses or
    /// internals to the client (those go to the log line).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NoRoute => "no route\n",
            Error::HeadersTooLarge => "request headers too large\n",
            Error::BodyTooLarge => "request body too large\n",
            Error::BadRequest(_) | Error::DownstreamBody(_) => "bad request\n",
            Error::ConnectUnsupported => "CONNECT not supported\n",
            Error::UriTooLong => "request target too long\n",
            Error::VersionUnsupported => "HTTP version not supported\n",
            Error::DownstreamTimeout { .. } => "request timed out\n",
            Error::Overloaded => "overloaded, retry later\n",
            Error::RateLimited { .. } => "too many requests\n",
            Error::AddressDenied { .. } => "forbidden\n",
            Error::UpstreamConnect { .. } => "upstream connect failed\n",
            Error::UpstreamBroken { .. } => "upstream connection failed\n",
            Error::UpstreamTls { .. } => "upstream TLS handshake failed\n",
            Error::UpstreamTimeout { .. } => "upstream timed out\n",
            Error::NoEndpoint { .. } => "upstream unavailable\n",
            Error::NoHealthyEndpoint { .. } => "no healthy endpoint\n",
            _ => "internal error\n",
        }
    }

    /// A stable short name for the error kind, for log fields and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Config(_) => "config",
            Error::Read { .. } => "read",
            Error::Bind { .. } => "bind",
            Error::NoRoute => "no_route",
            Error::HeadersTooLarge => "headers_too_large",
            Error::BodyTooLarge => "body_too_large",
            Error::BadRequest(_) => "bad_request",
            Error::ConnectUnsupported => "connect_unsupported",
            Error::UriTooLong => "uri_too_long",
            Error::VersionUnsupported => "version_unsupported",
            Error::DownstreamTimeout { .. } => "downstream_timeout",
            Error::DownstreamBody(_) => "downstream_body",
            Error::Overloaded => "overloaded",
            Error::UpstreamConnect { .. } => "upstream_connect",
            Error::UpstreamTimeout { .. } => "upstream_timeout",
            Error::UpstreamBroken { .. } => "upstream_broken",
            Error::NoEndpoint { .. } => "no_endpoint",
            Error::UpstreamTls { .. } => "upstream_tls",
            Error::NoHealthyEndpoint { .. } => "no_healthy_endpoint",
            Error::RateLimited { .. } => "rate_limited",
            Error::AddressDenied { .. } => "address_denied",
            Error::Tls(_) => "tls",
            Error::Internal(_) => "internal",
        }
    }
}

impl From<UpstreamError> for Error {
    fn from(err: UpstreamError) -> Error {
        match err {
            UpstreamError::Connect { addr, reason } => Error::UpstreamConnect { addr, reason },
            UpstreamError::Timeout { addr, phase } => Error::UpstreamTimeout { addr, phase },
            UpstreamError::Broken { addr, reason } => Error::UpstreamBroken { addr, reason },
            UpstreamError::Tls { addr, reason } => Error::UpstreamTls { addr, reason },
            UpstreamError::NoEndpoint { upstream, reason } => {
                Error::NoEndpoint { upstream, reason }
            }
            UpstreamError::NoHealthyEndpoint { upstream } => Error::NoHealthyEndpoint { upstream },
            UpstreamError::Internal(why) => Error::Internal(why),
        }
    }
}

/// A config that failed to load is the same failure in the gateway: the same variant, so
/// the same message, kind and status.
impl From<tailguard_config::Error> for Error {
    fn from(err: tailguard_config::Error) -> Error {
        match err {
            tailguard_config::Error::Config(diags) => Error::Config(diags),
            tailguard_config::Error::Read { path, source } => Error::Read { path, source },
        }
    }
}

impl From<tailguard_http1::RequestError> for Error {
    fn from(err: tailguard_http1::RequestError) -> Error {
        use tailguard_http1::RequestError as R;
        match err {
            R::Malformed(why) => Error::BadRequest(why),
            R::HeadTooLarge => Error::HeadersTooLarge,
            R::TargetTooLong => Error::UriTooLong,
            R::VersionUnsupported => Error::VersionUnsupported,
            R::Connect => Error::ConnectUnsupported,
            R::HeadTimeout => Error::DownstreamTimeout { phase: "head" },
        }
    }
}

impl From<tailguard_http1::BodyError> for Error {
    fn from(err: tailguard_http1::BodyError) -> Error {
        match err {
            tailguard_http1::BodyError::Broken(why) => Error::DownstreamBody(why),
            tailguard_http1::BodyError::Timeout => Error::DownstreamTimeout { phase: "body" },
        }
    }
}

impl From<tailguard_http1::UpstreamError<Error>> for Error {
    fn from(err: tailguard_http1::UpstreamError<Error>) -> Error {
        match err {
            tailguard_http1::UpstreamError::Broken { addr, reason } => {
                Error::UpstreamBroken { addr, reason }
            }
            tailguard_http1::UpstreamError::Timeout { addr } => Error::UpstreamTimeout {
                addr,
                phase: "body",
            },
            tailguard_http1::UpstreamError::RequestBody(e) => e,
        }
    }
}
