//! `[timeouts]` and `[limits]`: the gateway-wide timeouts and size and count limits, with
//! their defaults.

use serde::Deserialize;

/// Timeouts, in milliseconds; 0 disables one.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// TCP connect to an endpoint.
    #[serde(default = "default_connect_ms")]
    pub connect_ms: u64,
    /// From dispatch to the upstream's response head.
    #[serde(default = "default_request_ms")]
    pub request_ms: u64,
    /// The longest the gateway waits for the next bytes of an upstream response body, once
    /// its head has arrived (between two reads, not in total; nginx's `proxy_read_timeout`).
    #[serde(default = "default_read_ms")]
    pub read_ms: u64,
    /// How long a request head may take to arrive whole, from a new connection's accept
    /// (or a later request's first byte) to its end (nginx's `client_header_timeout`,
    /// HAProxy's `timeout http-request`); then `408` and the connection closes. A new
    /// connection that sends nothing in this time is closed without an answer.
    #[serde(default = "default_header_ms")]
    pub header_ms: u64,
    /// The longest the gateway waits for the next bytes of a request body (between two
    /// reads, not in total; nginx's `client_body_timeout`); then `408`, blamed on the client.
    #[serde(default = "default_body_ms")]
    pub body_ms: u64,
    /// The longest an HTTP/2 response may wait on its client: a stream whose next bytes
    /// cannot go out (the client's flow-control window stays closed, or the connection does
    /// not drain) for this long closes the client's connection (nginx's `send_timeout`).
    #[serde(default = "default_send_ms")]
    pub send_ms: u64,
    /// An idle keep-alive connection (downstream waiting for the next request head, and
    /// pooled upstream connections) is closed after this.
    #[serde(default = "default_idle_ms")]
    pub idle_ms: u64,
    /// A plain HTTP/1.1 keep-alive connection idle this long is parked: its task, timers
    /// and per-connection state are freed, and it waits for its next request in ~0.5 KB,
    /// its socket's included (nginx keeps ~0.5 KB for an idle connection). Its next request
    /// pays for rebuilding them: ~10,000 instructions (callgrind), once per such pause.
    /// Never sooner than this, so connections under load never park; TLS and HTTP/2
    /// connections do not park.
    #[serde(default = "default_park_ms")]
    pub park_ms: u64,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    #[serde(default = "default_shutdown_ms")]
    pub shutdown_ms: u64,
}

fn default_connect_ms() -> u64 {
    2_000
}
fn default_request_ms() -> u64 {
    30_000
}
fn default_read_ms() -> u64 {
    60_000
}
fn default_header_ms() -> u64 {
    10_000
}
fn default_body_ms() -> u64 {
    60_000
}
fn default_send_ms() -> u64 {
    // nginx's `send_timeout` default.
    60_000
}
fn default_idle_ms() -> u64 {
    60_000
}
fn default_park_ms() -> u64 {
    1_000
}
fn default_shutdown_ms() -> u64 {
    10_000
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: default_connect_ms(),
            request_ms: default_request_ms(),
            read_ms: default_read_ms(),
            header_ms: default_header_ms(),
            body_ms: default_body_ms(),
            send_ms: default_send_ms(),
            idle_ms: default_idle_ms(),
            park_ms: default_park_ms(),
            shutdown_ms: default_shutdown_ms(),
        }
    }
}

/// Size and count limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Request line + headers, in bytes (431 above it).
    #[serde(default = "default_header_bytes")]
    pub header_bytes: usize,
    /// Request body, in bytes, declared or streamed (413 above it).
    #[serde(default = "default_body_bytes")]
    pub body_bytes: u64,
    /// Open downstream connections per listener; more wait in the kernel's backlog.
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// Concurrent streams per downstream HTTP/2 connection (`SETTINGS_MAX_CONCURRENT_STREAMS`);
    /// a stream over it is refused with `RST_STREAM(REFUSED_STREAM)`.
    #[serde(default = "default_http2_max_streams")]
    pub http2_max_streams: u32,
    /// In-flight requests per client address, across all its connections; over it an HTTP/2
    /// stream is refused (`REFUSED_STREAM`) and an HTTP/1.1 request answered `429`. 0: no
    /// limit.
    #[serde(default = "default_client_requests")]
    pub client_requests: u32,
    /// `SO_RCVBUF` of each upstream connection, set before it connects: what the kernel may
    /// hold of a response whose client reads slowly (without it the buffer autotunes up to
    /// `net.ipv4.tcp_rmem`'s maximum). 0: the kernel's default and autotuning.
    #[serde(default = "default_upstream_receive_buffer_bytes")]
    pub upstream_receive_buffer_bytes: u32,
    /// After HTTP/2 closes a connection for abuse (`GOAWAY(ENHANCE_YOUR_CALM)`: rapid reset
    /// and the like), the client address's new connections are closed at the accept for
    /// this long, in milliseconds. 0: never held off.
    #[serde(default = "default_abuse_holdoff_ms")]
    pub abuse_holdoff_ms: u64,
}

fn default_header_bytes() -> usize {
    // 16 KiB: above what browsers send with large cookies, well under hyper's 400 KiB buffer.
    16 * 1024
}
fn default_body_bytes() -> u64 {
    16 * 1024 * 1024
}
fn default_connections() -> usize {
    10_000
}
fn default_http2_max_streams() -> u32 {
    // nginx's `http2_max_concurrent_streams` default (hyper's was 200).
    100
}
fn default_client_requests() -> u32 {
    100
}
fn default_upstream_receive_buffer_bytes() -> u32 {
    // 256 KiB: a 10 Gbit/s stream at 200 us of loopback/LAN round trip fills ~250 KiB, so
    // one stream is not slowed, while 10,000 stalled streams hold at most ~5 GiB (the kernel
    // doubles it for its bookkeeping) instead of 32 MiB each.
    256 * 1024
}

fn default_abuse_holdoff_ms() -> u64 {
    // One second: a rapid-reset client that reconnects at once (1,500 connections a second
    // measured) gets one connection a second; a client cut by mistake retries after a
    // second, as after a 503 with Retry-After: 1.
    1000
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_bytes: default_header_bytes(),
            body_bytes: default_body_bytes(),
            connections: default_connections(),
            http2_max_streams: default_http2_max_streams(),
            client_requests: default_client_requests(),
            upstream_receive_buffer_bytes: default_upstream_receive_buffer_bytes(),
            abuse_holdoff_ms: default_abuse_holdoff_ms(),
        }
    }
}
