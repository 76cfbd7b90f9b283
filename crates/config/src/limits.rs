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

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_bytes: default_header_bytes(),
            body_bytes: default_body_bytes(),
            connections: default_connections(),
        }
    }
}
