//! `[[upstreams]]`: a named service, its endpoints (or a built-in responder), the protocol
//! spoken to them, how requests are spread over them, and its TLS and health settings.

use serde::Deserialize;
use toml::Spanned;

use crate::health::HealthConfig;
use crate::upstream_tls::UpstreamTlsConfig;

/// How an upstream spreads requests over its endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalanceKind {
    /// Smooth weighted round robin (nginx's algorithm), per serving thread.
    #[default]
    RoundRobin,
    /// Power of two choices over peak-EWMA latency x (in-flight + 1), with a success-rate
    /// health gate (weights are ignored).
    P2cEwma,
}

/// The protocol the gateway speaks to an upstream's endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// HTTP/1.1 over plain TCP, a keep-alive pool of connections per endpoint.
    #[default]
    Http1,
    /// HTTP/2 over plain TCP (prior knowledge), requests multiplexed on few connections;
    /// what a plaintext gRPC service speaks.
    H2c,
    /// HTTP/2 over TLS (ALPN `h2`); needs `[upstreams.tls]`.
    H2,
}

impl Protocol {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::H2c => "h2c",
            Protocol::H2 => "h2",
        }
    }
}

fn default_protocol() -> Spanned<Protocol> {
    Spanned::new(0..0, Protocol::Http1)
}

fn default_max_concurrent_streams() -> Spanned<u32> {
    // 100: the smallest limit RFC 9113 §6.5.2 advises a server to allow, and what nginx,
    // Go and tonic servers announce; a connection never carries more than its peer allows.
    Spanned::new(0..0, 100)
}

/// A named service with one or more endpoints.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Name that routes refer to.
    pub name: Spanned<String>,
    /// Balancing algorithm.
    #[serde(default)]
    pub balance: BalanceKind,
    /// `http1` (default), `h2c` or `h2`.
    #[serde(default = "default_protocol")]
    pub protocol: Spanned<Protocol>,
    /// HTTP/2 only: streams (requests) one connection to an endpoint carries at once, per
    /// serving thread; a request beyond it opens another connection. Default 100.
    #[serde(default = "default_max_concurrent_streams")]
    pub max_concurrent_streams: Spanned<u32>,
    /// Endpoints (`IP:PORT` with a weight). Exactly one of `endpoints` and `builtin`.
    #[serde(default)]
    pub endpoints: Vec<EndpointConfig>,
    /// A responder started inside the gateway on 127.0.0.1 (an ephemeral port), so a demo
    /// needs no other process. Exactly one of `endpoints` and `builtin`.
    #[serde(default)]
    pub builtin: Option<BuiltinConfig>,
    /// How often endpoint names are looked up again (an answer's TTL, if shorter, wins).
    #[serde(default = "default_dns_refresh_ms")]
    pub dns_refresh_ms: u64,
    /// Connect to the endpoints over TLS (`[upstreams.tls]`).
    #[serde(default)]
    pub tls: Option<UpstreamTlsConfig>,
    /// Active health checks and passive ejection (`[upstreams.health]`); none: every
    /// endpoint always takes traffic.
    #[serde(default)]
    pub health: Option<HealthConfig>,
}

fn default_dns_refresh_ms() -> u64 {
    5000
}

/// One address of an upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// `IP:PORT`, `[IPv6]:PORT` or `NAME:PORT`. A name becomes one endpoint per address it
    /// resolves to, looked up by the resolver thread (never on the request path).
    pub address: Spanned<String>,
    /// Relative share of requests, 1..=1000.
    #[serde(default = "default_weight")]
    pub weight: Spanned<u32>,
}

pub(crate) fn default_weight() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}

/// The built-in responder's answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuiltinConfig {
    /// Status code of every answer.
    #[serde(default = "default_status")]
    pub status: u16,
    /// Text sent first in every answer.
    #[serde(default)]
    pub body: String,
    /// Append the request as the responder received it (request line, headers), which
    /// shows what the gateway added and removed.
    #[serde(default)]
    pub echo: bool,
}

fn default_status() -> u16 {
    200
}
