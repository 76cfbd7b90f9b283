//! `[[routes]]` as written: what a route matches (path, host, method, headers), where it
//! sends a request (an upstream) or how it answers by itself (a redirect, a static
//! response), and the policy fields its policy is compiled from (rewrites, header
//! operations), its own timeouts, retries, rate limit, CORS and compression.

use serde::Deserialize;
use toml::Spanned;

use crate::compress::CompressConfig;
use crate::cors::CorsConfig;
use crate::rate_limit::RateLimitConfig;
use crate::retry::{RetryConfig, RouteTimeouts};
use crate::trace::RouteTracing;

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
    pub rewrite: Option<Spanned<RewriteConfig>>,
    /// Answer with a redirect, with no upstream.
    #[serde(default)]
    pub redirect: Option<Spanned<RedirectConfig>>,
    /// Answer with a static response, with no upstream.
    #[serde(default)]
    pub respond: Option<Spanned<RespondConfig>>,
    /// Header operations on the request sent upstream.
    #[serde(default)]
    pub request_headers: Option<Spanned<HeaderOpsConfig>>,
    /// Header operations on the response sent downstream.
    #[serde(default)]
    pub response_headers: Option<Spanned<HeaderOpsConfig>>,
    /// The route's own `connect_ms`, `request_ms`, `read_ms` (each overrides `[timeouts]`).
    #[serde(default)]
    pub timeouts: Option<Spanned<RouteTimeouts>>,
    /// Retries of a failed try on another endpoint ([`crate::retry`]).
    #[serde(default)]
    pub retry: Option<Spanned<RetryConfig>>,
    /// Networks whose clients may call this route (`["10.0.0.0/8", "::1"]`); others get
    /// `403`. The client is the connection's peer, or behind `trusted_proxies` the
    /// forwarded address ([`crate::access`]).
    #[serde(default)]
    pub allow: Option<Spanned<Vec<Spanned<String>>>>,
    /// Networks whose clients get `403` here; deny wins over `allow` ([`crate::access`]).
    #[serde(default)]
    pub deny: Option<Spanned<Vec<Spanned<String>>>>,
    /// A rate limit on this route's requests, checked right after routing.
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// `tracing = false` (no span, no `traceparent` sent) or `{ sample_ratio = .. }`.
    #[serde(default)]
    pub tracing: Option<Spanned<RouteTracing>>,
    /// CORS: the gateway answers preflights and adds the CORS fields to responses
    /// ([`crate::cors`]).
    #[serde(default)]
    pub cors: Option<Spanned<CorsConfig>>,
    /// Response compression negotiated from `Accept-Encoding` ([`crate::compress`]); it
    /// replaces the listener's `compress`, if any, for this route's responses.
    #[serde(default)]
    pub compress: Option<Spanned<CompressConfig>>,
    /// Forward a request as soon as its head is routed, before its body's first bytes
    /// arrive (streaming uploads; gRPC calls always are). Otherwise a request with a body is
    /// held until its first bytes or its end, up to `timeouts.body_ms`, before an upstream is
    /// chosen.
    #[serde(default)]
    pub stream_request: bool,
    /// The authenticators (`[[auth]]` names) of which any one must accept a request:
    /// `auth = "users"` or `auth = ["users", "partners"]`; none: the route is open.
    #[serde(default)]
    pub auth: Option<Spanned<crate::auth::StringList>>,
}

/// `rewrite`: the path sent upstream instead of the client's (the query is kept).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RewriteConfig {
    /// Replaces the part of the path the route's `path = { prefix = .. }` matched.
    Prefix(String),
    /// Replaces the whole path.
    Path(String),
}

/// `redirect`: the route answers with a redirect itself.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedirectConfig {
    /// 301, 302 (default), 303, 307 or 308.
    #[serde(default = "default_redirect_status")]
    pub status: Spanned<u16>,
    /// Where to: an absolute URL (`https://example.com/x`) or an absolute path (`/x`).
    /// Required.
    #[serde(default)]
    pub location: Option<Spanned<String>>,
    /// Append the request's path and query to `location`.
    #[serde(default)]
    pub keep_path: bool,
}

fn default_redirect_status() -> Spanned<u16> {
    // 302: temporary, so a mistake is not cached by every browser that followed it.
    Spanned::new(0..0, 302)
}

/// `respond`: the route answers with a static response itself.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespondConfig {
    /// 200..=599; default 200.
    #[serde(default = "default_respond_status")]
    pub status: Spanned<u16>,
    /// The body (none on 204, 205 and 304).
    #[serde(default)]
    pub body: String,
    /// `Content-Type`; default `text/plain; charset=utf-8` when there is a body.
    #[serde(default)]
    pub content_type: Option<Spanned<String>>,
}

fn default_respond_status() -> Spanned<u16> {
    Spanned::new(0..0, 200)
}

/// `request_headers` / `response_headers`: applied in the order remove, set, add.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderOpsConfig {
    /// Names removed.
    #[serde(default)]
    pub remove: Vec<Spanned<String>>,
    /// Fields that replace every value of their name.
    #[serde(default)]
    pub set: Vec<HeaderEntry>,
    /// Fields appended (after any value already there).
    #[serde(default)]
    pub add: Vec<HeaderEntry>,
}

/// One field of `set` or `add`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEntry {
    /// Field name (case-insensitive).
    pub name: Spanned<String>,
    /// Static text, variables (`$remote_addr`, `$request_id`, `$host`, `$route`, or
    /// `${host}` next to text), or both; `$$` is a `$`.
    pub value: Spanned<String>,
}

impl RouteConfig {
    /// The route's `allow` / `deny`.
    pub fn access(&self) -> crate::access::AccessConfig<'_> {
        crate::access::AccessConfig {
            allow: self.allow.as_ref(),
            deny: self.deny.as_ref(),
        }
    }
}
