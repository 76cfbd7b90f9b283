//! `[[listeners]]`: a listening socket, its TLS, its own access log, rate limit and compression.

use serde::Deserialize;
use toml::Spanned;

use crate::compress::CompressConfig;
use crate::rate_limit::RateLimitConfig;
use crate::tls::{ListenerTls, TlsVersion};

/// A listening socket.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// `IP:PORT` to bind.
    pub address: Spanned<String>,
    /// Serve TLS (with ALPN `h2`, `http/1.1`) instead of plain HTTP/1.1 + h2c: one
    /// certificate, or several picked by SNI.
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    /// The oldest TLS version accepted (`"1.2"` by default, or `"1.3"`); needs `tls`.
    #[serde(default)]
    pub tls_min_version: Option<Spanned<TlsVersion>>,
    /// This listener's own access log (else the top-level `[access_log]`).
    #[serde(default)]
    pub access_log: Option<tailguard_access_log::Config>,
    /// Networks whose clients may call this listener (`["10.0.0.0/8", "::1"]`); others get
    /// `403`. The client is the connection's peer, or behind `trusted_proxies` the
    /// forwarded address ([`crate::access`]).
    #[serde(default)]
    pub allow: Option<Spanned<Vec<Spanned<String>>>>,
    /// Networks whose clients get `403` here; deny wins over `allow` ([`crate::access`]).
    #[serde(default)]
    pub deny: Option<Spanned<Vec<Spanned<String>>>>,
    /// A rate limit on everything this listener serves, checked before routing.
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// Response compression for every route it serves that has no `compress` of its own.
    #[serde(default)]
    pub compress: Option<Spanned<CompressConfig>>,
}

impl ListenerConfig {
    /// The listener's `allow` / `deny`.
    pub fn access(&self) -> crate::access::AccessConfig<'_> {
        crate::access::AccessConfig {
            allow: self.allow.as_ref(),
            deny: self.deny.as_ref(),
        }
    }
}
