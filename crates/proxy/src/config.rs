//! The config file: TOML parsed with `toml`, validated, and every error reported with
//! `file:line:column: field: message`.
//!
//! Parsing goes in two steps so that one mistake does not hide the next: the document is
//! first parsed into spanned TOML values (collecting every syntax error), then each section
//! and each element of each array is deserialized on its own, and finally the semantic checks
//! (addresses, references between sections, duplicates, certificates) run over everything
//! that did deserialize. `tailguard check` and a SIGHUP reload both print this same list.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use crate::error::Error;

/// The config compiled into the binary: what `tailguard run` serves with no `--config`.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// The name the embedded default config goes by in error messages.
pub const DEFAULT_CONFIG_NAME: &str = "<embedded default config>";

/// One problem in a config file, with its position when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// File name as given (or `<embedded default config>`, or `command line`).
    pub file: String,
    /// 1-based line and column of the offending value, when known.
    pub position: Option<(usize, usize)>,
    /// Dotted path of the field, e.g. `routes[2].upstream`.
    pub field: String,
    /// What is wrong, in one line.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, col)) => write!(f, "{}:{line}:{col}: ", self.file)?,
            None => write!(f, "{}: ", self.file)?,
        }
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A listening socket.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// `IP:PORT` to bind.
    pub address: Spanned<String>,
    /// Serve TLS (with ALPN `h2`, `http/1.1`) instead of plain HTTP/1.1 + h2c: one
    /// certificate, or several picked by SNI.
    #[serde(default)]
    pub tls: Option<crate::tls::ListenerTls>,
    /// The oldest TLS version accepted (`"1.2"` by default, or `"1.3"`); needs `tls`.
    #[serde(default)]
    pub tls_min_version: Option<Spanned<crate::tls::TlsVersion>>,
    /// This listener's own access log (else the top-level `[access_log]`).
    #[serde(default)]
    pub access_log: Option<tailguard_access_log::Config>,
    /// A rate limit on everything this listener serves, checked before routing.
    #[serde(default)]
    pub rate_limit: Option<crate::rate_limit::RateLimitConfig>,
}

/// Certificate chain and private key for a TLS listener, PEM files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate chain (PEM); relative paths are relative to the config file.
    pub cert: Spanned<PathBuf>,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Spanned<PathBuf>,
    /// SNI names this certificate is served for (`a.example`, `*.b.example`); an entry
    /// without any is the listener's default (see [`crate::tls::ListenerTls`]).
    #[serde(default)]
    pub server_names: Vec<Spanned<String>>,
}

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
    pub health: Option<crate::health::HealthConfig>,
}

/// TLS to an upstream's endpoints (`[upstreams.tls]`). Paths are relative to the config
/// file, like a listener's; the files are read at load and on each reload.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// The name sent as SNI and verified in the certificate (default: the endpoint's host,
    /// for an IP literal the IP).
    #[serde(default)]
    pub sni: Option<Spanned<String>>,
    /// CA certificates (PEM) the upstream's certificate must chain to (default: the system
    /// roots).
    #[serde(default)]
    pub ca: Option<Spanned<PathBuf>>,
    /// Verify the upstream's certificate (default true); false accepts any certificate, as
    /// nginx's `proxy_ssl_verify off`, and is warned about at load.
    #[serde(default = "default_verify")]
    pub verify: bool,
    /// Client certificate chain (PEM) for mTLS; needs `client_key`.
    #[serde(default)]
    pub client_cert: Option<Spanned<PathBuf>>,
    /// The client certificate's private key (PEM); needs `client_cert`.
    #[serde(default)]
    pub client_key: Option<Spanned<PathBuf>>,
}

fn default_verify() -> bool {
    true
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

fn default_weight() -> Spanned<u32> {
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

/// How a route matches the request path.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PathMatch {
    /// The path (without query) equals this.
    Exact(String),
    /// The path starts with this, on a segment boundary (`/api` matches `/api` and `/api/x`,
    /// not `/apix`), as in the Gateway API's `PathPrefix`.
    Prefix(String),
}

/// A header the request must carry with exactly this value.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    /// Header name (case-insensitive).
    pub name: Spanned<String>,
    /// Exact value.
    pub value: String,
}

/// A route: what requests it matches and the upstream it sends them to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Unique id, used in logs and metrics.
    pub id: Spanned<String>,
    /// Name of the upstream. Exactly one of `upstream`, `redirect` and `respond`.
    #[serde(default)]
    pub upstream: Option<Spanned<String>>,
    /// Higher wins before any other precedence rule; default 0.
    #[serde(default)]
    pub priority: i32,
    /// Host to match (exact, or `*.example.com` for any subdomain); none matches any host.
    #[serde(default)]
    pub host: Option<Spanned<String>>,
    /// Path match; none matches every path (same as `prefix = "/"`).
    #[serde(default)]
    pub path: Option<Spanned<PathMatch>>,
    /// Method to match (`GET`, ...); none matches any.
    #[serde(default)]
    pub method: Option<Spanned<String>>,
    /// Headers that must all be present with these values.
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
    /// Replace the `Host` header sent upstream.
    #[serde(default)]
    pub host_rewrite: Option<Spanned<String>>,
    /// Replace the path sent upstream: `{ prefix = ".." }` or `{ path = ".." }`.
    #[serde(default)]
    pub rewrite: Option<Spanned<crate::policy::RewriteConfig>>,
    /// Answer with a redirect, with no upstream.
    #[serde(default)]
    pub redirect: Option<Spanned<crate::policy::RedirectConfig>>,
    /// Answer with a static response, with no upstream.
    #[serde(default)]
    pub respond: Option<Spanned<crate::policy::RespondConfig>>,
    /// Header operations on the request sent upstream.
    #[serde(default)]
    pub request_headers: Option<Spanned<crate::policy::HeaderOpsConfig>>,
    /// Header operations on the response sent downstream.
    #[serde(default)]
    pub response_headers: Option<Spanned<crate::policy::HeaderOpsConfig>>,
    /// The route's own `connect_ms`, `request_ms`, `read_ms` (each overrides `[timeouts]`).
    #[serde(default)]
    pub timeouts: Option<Spanned<crate::retry::RouteTimeouts>>,
    /// Retries of a failed try on another endpoint (`crate::retry`).
    #[serde(default)]
    pub retry: Option<Spanned<crate::retry::RetryConfig>>,
    /// A rate limit on this route's requests, checked right after routing.
    #[serde(default)]
    pub rate_limit: Option<crate::rate_limit::RateLimitConfig>,
}

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

/// A validated config. Only [`Config::parse`] and [`Config::load`] make one, so every
/// `Config` has passed every check.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name used in messages (the file path).
    pub source: String,
    /// Directory relative paths (certificates) are resolved against.
    pub base_dir: PathBuf,
    /// Listening sockets (at least one).
    pub listeners: Vec<ListenerConfig>,
    /// Upstreams.
    pub upstreams: Vec<UpstreamConfig>,
    /// Routes, in file order.
    pub routes: Vec<RouteConfig>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Limits.
    pub limits: Limits,
    /// The access log of every listener without its own (`[access_log]`; off by default).
    pub access_log: tailguard_access_log::Config,
    /// The metrics exporter (`[metrics]`; read at startup, a reload does not move it).
    pub metrics: tailguard_metrics::MetricsConfig,
    /// Overload protection (`[overload]`).
    pub overload: tailguard_overload::OverloadConfig,
    /// Peers whose `X-Forwarded-For`, `Forwarded` and `X-Real-IP` are kept (the gateway's
    /// own values appended); from anyone else they are dropped (`trusted_proxies`).
    pub trusted_proxies: Vec<crate::cidr::Cidr>,
    /// How endpoint names are resolved (`[dns]`).
    pub dns: crate::dns::DnsConfig,
    /// Where each listener's address came from, for errors found after parsing (a reload
    /// that cannot bind): its line and column in the file, or the `--listen` override.
    listen_origins: Vec<ListenOrigin>,
}

/// Where a listener's address was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListenOrigin {
    /// In the file, at this line and column.
    File(Option<(usize, usize)>),
    /// `tailguard run --listen`.
    CommandLine,
}

/// Collects diagnostics with positions computed from byte offsets.
struct Diags<'a> {
    file: &'a str,
    text: &'a str,
    list: Vec<(usize, Diagnostic)>,
}

impl Diags<'_> {
    fn push(
        &mut self,
        span: Option<Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        let offset = span.as_ref().map_or(usize::MAX, |s| s.start);
        let position = span.map(|s| line_col(self.text, s.start));
        self.list.push((
            offset,
            Diagnostic {
                file: self.file.to_owned(),
                position,
                field: field.into(),
                message: message.into(),
            },
        ));
    }

    fn de_error(&mut self, field: &str, err: &toml::de::Error) {
        self.push(
            err.span(),
            field,
            err.message().trim_end().replace('\n', " "),
        );
    }
}

/// A list of networks (`["10.0.0.0/8", "::1"]`), each error at its element.
fn cidrs(
    diags: &mut Diags<'_>,
    field: &str,
    value: &Spanned<DeValue<'_>>,
) -> Vec<crate::cidr::Cidr> {
    let Some(items) = value.get_ref().as_array() else {
        diags.push(
            Some(value.span()),
            field,
            "expected a list of CIDRs, like [\"10.0.0.0/8\", \"::1\"]",
        );
        return Vec::new();
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let parsed = match item.get_ref().as_str() {
            Some(text) => text.parse(),
            None => Err("expected a string, like \"10.0.0.0/8\"".to_string()),
        };
        match parsed {
            Ok(cidr) => out.push(cidr),
            Err(message) => diags.push(Some(item.span()), format!("{field}[{i}]"), message),
        }
    }
    out
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().map(Path::to_owned).unwrap_or_default();
        Config::parse(&text, &path.display().to_string(), &base)
    }

    /// The embedded default config.
    pub fn embedded_default() -> Config {
        Config::parse(DEFAULT_CONFIG, DEFAULT_CONFIG_NAME, Path::new("."))
            .expect("the embedded default config is checked by a test")
    }

    /// Parses and validates config text. `name` is used in messages; relative certificate
    /// paths are resolved against `base_dir`. On failure every error found is returned.
    pub fn parse(text: &str, name: &str, base_dir: &Path) -> Result<Config, Error> {
        let mut diags = Diags {
            file: name,
            text,
            list: Vec::new(),
        };
        let (root, syntax_errors) = DeTable::parse_recoverable(text);
        for err in &syntax_errors {
            diags.de_error("(syntax)", err);
        }
        if !syntax_errors.is_empty() {
            return Err(diags.finish());
        }
        let root = root.into_inner();

        let mut listeners = Vec::new();
        let mut upstreams = Vec::new();
        let mut routes = Vec::new();
        let mut timeouts = Timeouts::default();
        let mut limits = Limits::default();
        let mut access_log = tailguard_access_log::Config::default();
        let mut metrics = tailguard_metrics::MetricsConfig::default();
        let mut overload = tailguard_overload::OverloadConfig::default();
        let mut trusted_proxies = Vec::new();
        let mut dns = crate::dns::DnsConfig::default();
        let mut listeners_span = None;
        let mut declared_upstreams = HashSet::new();
        let mut idx = FileIndexes::default();

        for (key, value) in root.iter() {
            let key_name: &str = key.get_ref();
            match key_name {
                "listeners" => {
                    listeners_span = Some(value.span());
                    (idx.listeners, listeners) = array_of(&mut diags, "listeners", value);
                }
                "upstreams" => {
                    (idx.upstreams, upstreams) = array_of(&mut diags, "upstreams", value);
                    // Names of upstreams that failed to deserialize still count as declared,
                    // so a route naming one is not reported a second time.
                    if let Some(items) = value.get_ref().as_array() {
                        for item in items.iter() {
                            if let Some(name) = item
                                .get_ref()
                                .get("name")
                                .and_then(|n| n.get_ref().as_str())
                            {
                                declared_upstreams.insert(name.to_owned());
                            }
                        }
                    }
                }
                "routes" => (idx.routes, routes) = array_of(&mut diags, "routes", value),
                "timeouts" => {
                    if let Some(t) = one_of(&mut diags, "timeouts", value) {
                        timeouts = t;
                    }
                }
                "limits" => {
                    if let Some(l) = one_of(&mut diags, "limits", value) {
                        limits = l;
                    }
                }
                "access_log" => {
                    if let Some(a) = one_of(&mut diags, "access_log", value) {
                        access_log = a;
                    }
                }
                "metrics" => {
                    if let Some(m) = one_of(&mut diags, "metrics", value) {
                        metrics = m;
                    }
                }
                "overload" => {
                    if let Some(o) = one_of(&mut diags, "overload", value) {
                        overload = o;
                    }
                }
                "trusted_proxies" => trusted_proxies = cidrs(&mut diags, "trusted_proxies", value),
                "dns" => {
                    if let Some(d) = one_of(&mut diags, "dns", value) {
                        dns = d;
                    }
                }
                other => diags.push(
                    Some(key.span()),
                    other,
                    "unknown section, expected one of `listeners`, `upstreams`, `routes`, \
                     `timeouts`, `limits`, `access_log`, `metrics`, `overload`, \
                     `trusted_proxies`, `dns`",
                ),
            }
        }

        dns.locate(base_dir);
        let listen_origins = listeners
            .iter()
            .map(|l: &ListenerConfig| {
                ListenOrigin::File(Some(line_col(text, l.address.span().start)))
            })
            .collect();
        let config = Config {
            listen_origins,
            source: name.to_owned(),
            base_dir: base_dir.to_owned(),
            listeners,
            upstreams,
            routes,
            timeouts,
            limits,
            access_log,
            metrics,
            overload,
            trusted_proxies,
            dns,
        };
        for (field, message) in config.metrics.check() {
            diags.push(None, field, message);
        }
        for (field, message) in crate::access_log::check(&config) {
            diags.push(None, field, message);
        }
        config.validate(&mut diags, listeners_span, &declared_upstreams, &idx);
        if diags.list.is_empty() {
            Ok(config)
        } else {
            Err(diags.finish())
        }
    }

    fn validate(
        &self,
        d: &mut Diags<'_>,
        listeners_span: Option<Range<usize>>,
        declared: &HashSet<String>,
        idx: &FileIndexes,
    ) {
        if self.listeners.is_empty() {
            d.push(
                listeners_span,
                "listeners",
                "at least one listener is required",
            );
        }
        let mut seen_addrs = HashSet::new();
        for (&i, l) in idx.listeners.iter().zip(&self.listeners) {
            match l.address.get_ref().parse::<SocketAddr>() {
                Ok(addr) => {
                    if !seen_addrs.insert(addr) && addr.port() != 0 {
                        d.push(
                            Some(l.address.span()),
                            format!("listeners[{i}].address"),
                            format!("duplicate listener address {addr}"),
                        );
                    }
                }
                Err(_) => d.push(
                    Some(l.address.span()),
                    format!("listeners[{i}].address"),
                    format!("`{}` is not an IP:PORT address", l.address.get_ref()),
                ),
            }
            if let Some(limit) = &l.rate_limit {
                for (span, field, message) in limit.check(crate::rate_limit::Scope::Listener) {
                    d.push(span, format!("listeners[{i}].rate_limit.{field}"), message);
                }
            }
            for p in crate::tls::check(&self.base_dir, i, l) {
                d.push(p.span, p.field, p.message);
            }
        }

        let mut names = HashSet::new();
        for (&i, u) in idx.upstreams.iter().zip(&self.upstreams) {
            let name = u.name.get_ref();
            if !names.insert(name.as_str()) {
                d.push(
                    Some(u.name.span()),
                    format!("upstreams[{i}].name"),
                    format!("duplicate upstream name `{name}`"),
                );
            }
            match (u.endpoints.is_empty(), &u.builtin) {
                (true, None) => d.push(
                    Some(u.name.span()),
                    format!("upstreams[{i}]"),
                    "needs `endpoints` or `builtin`",
                ),
                (false, Some(_)) => d.push(
                    Some(u.name.span()),
                    format!("upstreams[{i}]"),
                    "has both `endpoints` and `builtin`; choose one",
                ),
                _ => {}
            }
            let protocol = *u.protocol.get_ref();
            match (protocol, &u.tls) {
                (Protocol::H2, None) => d.push(
                    Some(u.protocol.span()),
                    format!("upstreams[{i}].protocol"),
                    "`h2` is HTTP/2 over TLS and needs `[upstreams.tls]`; \
                     for plaintext HTTP/2 use `h2c`",
                ),
                (Protocol::H2c, Some(_)) => d.push(
                    Some(u.protocol.span()),
                    format!("upstreams[{i}].protocol"),
                    "`h2c` is plaintext HTTP/2; with `[upstreams.tls]` use `h2`",
                ),
                _ => {}
            }
            if protocol != Protocol::Http1 && u.builtin.is_some() {
                d.push(
                    Some(u.protocol.span()),
                    format!("upstreams[{i}].protocol"),
                    "a `builtin` upstream speaks HTTP/1.1 only",
                );
            }
            if *u.max_concurrent_streams.get_ref() == 0 {
                d.push(
                    Some(u.max_concurrent_streams.span()),
                    format!("upstreams[{i}].max_concurrent_streams"),
                    "must be at least 1",
                );
            }
            if let Some(b) = &u.builtin
                && http::StatusCode::from_u16(b.status).is_err()
            {
                d.push(
                    Some(u.name.span()),
                    format!("upstreams[{i}].builtin.status"),
                    format!("{} is not an HTTP status", b.status),
                );
            }
            if u.dns_refresh_ms < 100 {
                d.push(
                    Some(u.name.span()),
                    format!("upstreams[{i}].dns_refresh_ms"),
                    format!("{} ms is below the 100 ms floor", u.dns_refresh_ms),
                );
            }
            if let Some(tls) = &u.tls {
                self.validate_upstream_tls(d, i, u, tls);
            }
            if let Some(h) = &u.health {
                for (span, field, message) in h.check() {
                    d.push(span, format!("upstreams[{i}].health.{field}"), message);
                }
            }
            for (j, e) in u.endpoints.iter().enumerate() {
                if let Err(message) = crate::dns::Target::parse(e.address.get_ref()) {
                    d.push(
                        Some(e.address.span()),
                        format!("upstreams[{i}].endpoints[{j}].address"),
                        message,
                    );
                }
                let w = *e.weight.get_ref();
                if !(1..=1000).contains(&w) {
                    d.push(
                        Some(e.weight.span()),
                        format!("upstreams[{i}].endpoints[{j}].weight"),
                        format!("{w} is outside 1..=1000"),
                    );
                }
            }
        }

        for (i, server) in self.dns.servers.iter().enumerate() {
            if let Err(message) = crate::dns::parse_server(server.get_ref()) {
                d.push(Some(server.span()), format!("dns.servers[{i}]"), message);
            }
        }
        if self.dns.hosts_file.get_ref().trim().is_empty() {
            d.push(
                Some(self.dns.hosts_file.span()),
                "dns.hosts_file",
                "must be a file's path (the default is /etc/hosts)",
            );
        }
        if self.dns.timeout_ms == 0 || self.dns.attempts == 0 {
            d.push(
                None,
                "dns",
                "`timeout_ms` and `attempts` must be at least 1",
            );
        }

        let mut ids = HashSet::new();
        for (&i, r) in idx.routes.iter().zip(&self.routes) {
            let id = r.id.get_ref();
            if !ids.insert(id.as_str()) {
                d.push(
                    Some(r.id.span()),
                    format!("routes[{i}].id"),
                    format!("duplicate route id `{id}`"),
                );
            }
            if let Some(up) = &r.upstream
                && !declared.contains(up.get_ref())
            {
                d.push(
                    Some(up.span()),
                    format!("routes[{i}].upstream"),
                    format!("unknown upstream `{}`", up.get_ref()),
                );
            }
            for (span, field, message) in crate::policy::check(r) {
                d.push(span, format!("routes[{i}]{field}"), message);
            }
            if let Some(p) = &r.path {
                let (PathMatch::Exact(s) | PathMatch::Prefix(s)) = p.get_ref();
                if !s.starts_with('/') {
                    d.push(
                        Some(p.span()),
                        format!("routes[{i}].path"),
                        format!("`{s}` must start with `/`"),
                    );
                }
            }
            if let Some(m) = &r.method
                && (m.get_ref().is_empty() || !m.get_ref().bytes().all(|b| b.is_ascii_uppercase()))
            {
                d.push(
                    Some(m.span()),
                    format!("routes[{i}].method"),
                    format!("`{}` is not an uppercase HTTP method", m.get_ref()),
                );
            }
            for (field, host) in [("host", &r.host), ("host_rewrite", &r.host_rewrite)] {
                if let Some(h) = host
                    && (h.get_ref().is_empty()
                        || http::HeaderValue::from_str(h.get_ref()).is_err()
                        || h.get_ref().contains(['/', ' ']))
                {
                    d.push(
                        Some(h.span()),
                        format!("routes[{i}].{field}"),
                        format!("`{}` is not a host name", h.get_ref()),
                    );
                }
            }
            for (span, field, message) in crate::retry::check(r, &self.timeouts) {
                d.push(
                    span.or(Some(r.id.span())),
                    format!("routes[{i}].{field}"),
                    message,
                );
            }
            if let Some(limit) = &r.rate_limit {
                for (span, field, message) in limit.check(crate::rate_limit::Scope::Route) {
                    d.push(span, format!("routes[{i}].rate_limit.{field}"), message);
                }
            }
            for (j, h) in r.headers.iter().enumerate() {
                if http::HeaderName::from_bytes(h.name.get_ref().as_bytes()).is_err() {
                    d.push(
                        Some(h.name.span()),
                        format!("routes[{i}].headers[{j}].name"),
                        format!("`{}` is not a header name", h.name.get_ref()),
                    );
                }
                if http::HeaderValue::from_str(&h.value).is_err() {
                    d.push(
                        Some(h.name.span()),
                        format!("routes[{i}].headers[{j}].value"),
                        "not a valid header value",
                    );
                }
            }
        }
        if self.limits.header_bytes < 1024 {
            d.push(None, "limits.header_bytes", "must be at least 1024");
        }
        if self.limits.connections == 0 {
            d.push(None, "limits.connections", "must be at least 1");
        }
        if let Err(e) = self.overload.validate() {
            d.push(None, "overload", e.to_string());
        }
        for id in self.overload.classes.keys() {
            if !self.routes.iter().any(|r| r.id.get_ref() == id) {
                d.push(
                    None,
                    format!("overload.classes.{id}"),
                    format!("no route with id `{id}`"),
                );
            }
        }
    }

    /// `upstreams[i].tls`: mTLS files come in pairs, and every file loads (the errors name
    /// the field and the file, at the field's position).
    fn validate_upstream_tls(
        &self,
        d: &mut Diags<'_>,
        i: usize,
        u: &UpstreamConfig,
        tls: &UpstreamTlsConfig,
    ) {
        let field = |name: &str| format!("upstreams[{i}].tls.{name}");
        if u.builtin.is_some() {
            d.push(
                Some(u.name.span()),
                format!("upstreams[{i}].tls"),
                "a `builtin` upstream is plain HTTP; remove `tls`",
            );
            return;
        }
        match (&tls.client_cert, &tls.client_key) {
            (Some(cert), None) => {
                d.push(
                    Some(cert.span()),
                    field("client_key"),
                    "`client_cert` needs `client_key`",
                );
                return;
            }
            (None, Some(key)) => {
                d.push(
                    Some(key.span()),
                    field("client_cert"),
                    "`client_key` needs `client_cert`",
                );
                return;
            }
            _ => {}
        }
        if let Err(e) = crate::upstream_tls::UpstreamTls::load(
            &self.base_dir,
            tls,
            crate::upstream_tls::ALPN_HTTP1,
        ) {
            let span = match e.field {
                "sni" => tls.sni.as_ref().map(Spanned::span),
                "ca" => tls.ca.as_ref().map(Spanned::span),
                "client_cert" => tls.client_cert.as_ref().map(Spanned::span),
                "client_key" => tls.client_key.as_ref().map(Spanned::span),
                _ => None,
            }
            .or(Some(u.name.span()));
            d.push(span, field(e.field), e.message);
        }
    }

    /// Sets the overload mode (`tailguard run --overload off|adaptive|gozero`).
    pub fn override_overload(&mut self, mode: tailguard_overload::OverloadMode) {
        self.overload.mode = mode;
    }

    /// Replaces the first listener's address (`tailguard run --listen`).
    pub fn override_listen(&mut self, addr: SocketAddr) {
        if let Some(first) = self.listeners.first_mut() {
            first.address = Spanned::new(0..0, addr.to_string());
        }
        if let Some(first) = self.listen_origins.first_mut() {
            *first = ListenOrigin::CommandLine;
        }
    }

    /// A problem with listener `i`'s address found after parsing (it cannot be bound),
    /// reported like the parser's own: file, line and column, field; or `command line`,
    /// `--listen` when the address came from there.
    pub fn listener_diagnostic(&self, i: usize, message: impl Into<String>) -> Diagnostic {
        match self.listen_origins.get(i) {
            Some(ListenOrigin::CommandLine) => Diagnostic {
                file: "command line".to_owned(),
                position: None,
                field: "--listen".to_owned(),
                message: message.into(),
            },
            other => Diagnostic {
                file: self.source.clone(),
                position: match other {
                    Some(ListenOrigin::File(p)) => *p,
                    _ => None,
                },
                field: format!("listeners[{i}].address"),
                message: message.into(),
            },
        }
    }

    /// Replaces the endpoints of upstream `name` (`tailguard run --upstream NAME=ADDR,...`),
    /// each with weight 1.
    pub fn override_upstream(&mut self, name: &str, addrs: &[SocketAddr]) -> Result<(), Error> {
        let Some(u) = self.upstreams.iter_mut().find(|u| u.name.get_ref() == name) else {
            return Err(Error::Config(vec![Diagnostic {
                file: "command line".to_owned(),
                position: None,
                field: "--upstream".to_owned(),
                message: format!("no upstream named `{name}` in {}", self.source),
            }]));
        };
        u.builtin = None;
        u.endpoints = addrs
            .iter()
            .map(|a| EndpointConfig {
                address: Spanned::new(0..0, a.to_string()),
                weight: default_weight(),
            })
            .collect();
        Ok(())
    }
}

impl Diags<'_> {
    fn finish(mut self) -> Error {
        self.list.sort_by_key(|(offset, _)| *offset);
        Error::Config(self.list.into_iter().map(|(_, d)| d).collect())
    }
}

fn one_of<T: for<'de> Deserialize<'de>>(
    d: &mut Diags<'_>,
    field: &str,
    value: &Spanned<DeValue<'_>>,
) -> Option<T> {
    match T::deserialize(ValueDeserializer::from(value.clone())) {
        Ok(v) => Some(v),
        Err(e) => {
            let span = e.span().or(Some(value.span()));
            d.push(span, field, e.message().trim_end().replace('\n', " "));
            None
        }
    }
}

/// Deserializes each element on its own; returns the good ones with their index in the
/// file, so later messages name the element the user wrote (`routes[3]`), not its position
/// among the ones that parsed.
fn array_of<T: for<'de> Deserialize<'de>>(
    d: &mut Diags<'_>,
    field: &str,
    value: &Spanned<DeValue<'_>>,
) -> (Vec<usize>, Vec<T>) {
    let Some(items) = value.get_ref().as_array() else {
        d.push(
            Some(value.span()),
            field,
            format!("expected an array (`[[{field}]]`)"),
        );
        return (Vec::new(), Vec::new());
    };
    let mut indexes = Vec::new();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(v) = one_of(d, &format!("{field}[{i}]"), item) {
            indexes.push(i);
            out.push(v);
        }
    }
    (indexes, out)
}

/// File index of each element that deserialized, per array section.
#[derive(Default)]
struct FileIndexes {
    listeners: Vec<usize>,
    upstreams: Vec<usize>,
    routes: Vec<usize>,
}
