//! What one answered request contributes to the access log: fixed fields, borrowed.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One answered request, as the serving thread knows it when the response is done.
///
/// Every byte string is borrowed from the request, so building a record allocates
/// nothing. Fields that come from the client (`method`, `target`, `remote_user`,
/// `referer`, `user_agent`, other headers) are raw bytes: they are escaped when
/// formatted, never trusted. `None` prints as nginx prints an unset variable: `-` in
/// text formats, `null` in JSON.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// When the request was answered (`$time_local`, `$time_iso8601`, `$msec`).
    pub time: SystemTime,
    /// The downstream's address (`$remote_addr`).
    pub remote_addr: Option<IpAddr>,
    /// The user from HTTP basic authentication (`$remote_user`).
    pub remote_user: Option<&'a [u8]>,
    /// The request method as received (`$request_method`).
    pub method: &'a [u8],
    /// The request target as received: path and query (`$request_uri`).
    pub target: &'a [u8],
    /// The protocol, e.g. `HTTP/1.1` (`$server_protocol`).
    pub protocol: &'a str,
    /// The status sent downstream (`$status`).
    pub status: u16,
    /// Response body bytes sent downstream (`$body_bytes_sent`).
    pub body_bytes_sent: u64,
    /// All bytes sent downstream, head included (`$bytes_sent`).
    pub bytes_sent: u64,
    /// From the first request byte to the last response byte (`$request_time`).
    pub request_time: Duration,
    /// The endpoint that answered (`$upstream_addr`); the last one tried.
    pub upstream_addr: Option<SocketAddr>,
    /// The endpoints a retried request tried before `upstream_addr`, in order (empty for
    /// a request tried once): `$upstream_addr` and `$upstream_status` list them first,
    /// comma-separated as nginx does, and `$upstream_tries` counts them.
    pub earlier_tries: &'a [UpstreamTry],
    /// The status the endpoint returned (`$upstream_status`).
    pub upstream_status: Option<u16>,
    /// Time spent waiting for and reading the endpoint (`$upstream_response_time`).
    pub upstream_response_time: Option<Duration>,
    /// The `Referer` header (`$http_referer`).
    pub referer: Option<&'a [u8]>,
    /// The `User-Agent` header (`$http_user_agent`).
    pub user_agent: Option<&'a [u8]>,
    /// The name of the route that matched (`$route`).
    pub route: Option<&'a str>,
    /// The request id sent upstream, the client's or a generated one (`$request_id`).
    pub request_id: Option<&'a [u8]>,
    /// Why the gateway answered with an error itself, e.g. `upstream_timeout` (`$error`).
    pub error: Option<&'a str>,
    /// All request headers, for `$http_<name>` template variables.
    pub headers: Option<&'a http::HeaderMap>,
    /// The gRPC status of a gRPC call (`$grpc_status`): the upstream's `grpc-status`, or
    /// the one the gateway answered with; `None` for other requests and for a call that
    /// ended without one.
    pub grpc_status: Option<u8>,
    /// The W3C trace id of the request's trace (`$trace_id`): the one the client sent in
    /// `traceparent` or the one the gateway started; `None` when tracing is off.
    pub trace_id: Option<[u8; 16]>,
    /// The id of the gateway's server span for the request (`$span_id`), the parent of the
    /// spans the upstream records; `None` when tracing is off.
    pub span_id: Option<[u8; 8]>,
    /// Who called, as a route's authentication named them (`$consumer`); `None` on an
    /// open route or a refused request.
    pub consumer: Option<&'a str>,
    /// How a route's authentication ended (`$auth_result`: `ok`, `missing`, `invalid`,
    /// ...); `None` on an open route.
    pub auth_result: Option<&'a str>,
}

/// One try of a retried request that did not give the answer: where it went and how it
/// ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamTry {
    /// The endpoint tried.
    pub addr: SocketAddr,
    /// The status it answered (a `502`, `503` or `504` that was retried), or the one the
    /// gateway gives the failure when the try got no answer (`502` for a failed connect,
    /// `504` for a timeout), as nginx puts in `$upstream_status`.
    pub status: u16,
}

impl Default for Record<'_> {
    /// An empty record at the Unix epoch; tests and examples fill in what they need.
    fn default() -> Self {
        Self {
            time: UNIX_EPOCH,
            remote_addr: None,
            remote_user: None,
            method: b"GET",
            target: b"/",
            protocol: "HTTP/1.1",
            status: 200,
            body_bytes_sent: 0,
            bytes_sent: 0,
            request_time: Duration::ZERO,
            upstream_addr: None,
            earlier_tries: &[],
            upstream_status: None,
            upstream_response_time: None,
            referer: None,
            user_agent: None,
            route: None,
            request_id: None,
            error: None,
            headers: None,
            grpc_status: None,
            trace_id: None,
            span_id: None,
            consumer: None,
            auth_result: None,
        }
    }
}
