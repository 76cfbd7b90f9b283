//! The checks that run over a config once it has deserialized: addresses, references
//! between sections, duplicates, and each feature's own check (TLS files, upstream TLS,
//! health, DNS, policy, retries, rate limits, CORS), every problem at its field's position.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::ops::Range;

use toml::Spanned;

use crate::diagnostic::Diags;
use crate::dns::{Target, parse_server};
use crate::file::Config;
use crate::rate_limit::Scope;
use crate::route::PathMatch;
use crate::upstream::{Protocol, UpstreamConfig};
use crate::upstream_tls::{self, UpstreamTlsConfig};
use crate::{policy, retry, tls};

/// File index of each element that deserialized, per array section.
#[derive(Default)]
pub(crate) struct FileIndexes {
    pub(crate) listeners: Vec<usize>,
    pub(crate) upstreams: Vec<usize>,
    pub(crate) routes: Vec<usize>,
    /// The file has a `[redis]` section (even one that did not deserialize: a global limit
    /// is then not reported as lacking one).
    pub(crate) redis: bool,
    pub(crate) auth: Vec<usize>,
    /// Every `[[auth]]` name written, those of elements that failed to deserialize too.
    pub(crate) declared_auth: HashSet<String>,
}

/// Runs every check over `config`; `listeners_span` is where `[[listeners]]` is, `declared`
/// every upstream name the file declares (those that failed to deserialize too).
pub(crate) fn validate(
    config: &Config,
    d: &mut Diags<'_>,
    listeners_span: Option<Range<usize>>,
    declared: &HashSet<String>,
    idx: &FileIndexes,
) {
    if let Some(redis) = &config.redis {
        for (span, field, message) in redis.check() {
            d.push(span, format!("redis.{field}"), message);
        }
    }
    if config.listeners.is_empty() {
        d.push(
            listeners_span,
            "listeners",
            "at least one listener is required",
        );
    }
    let mut seen_addrs = HashSet::new();
    for (&i, l) in idx.listeners.iter().zip(&config.listeners) {
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
        for (span, field, message) in l.access().check() {
            d.push(span, format!("listeners[{i}].{field}"), message);
        }
        if let Some(limit) = &l.rate_limit {
            for (span, field, message) in limit.check(Scope::Listener, idx.redis) {
                d.push(span, format!("listeners[{i}].rate_limit.{field}"), message);
            }
        }
        if let Some(compress) = &l.compress {
            for (span, field, message) in compress.get_ref().check() {
                d.push(
                    span.or(Some(compress.span())),
                    format!("listeners[{i}].compress.{field}"),
                    message,
                );
            }
        }
        for p in tls::check(
            &config.base_dir,
            i,
            l.tls.as_ref(),
            l.tls_min_version.as_ref(),
        ) {
            d.push(p.span, p.field, p.message);
        }
    }

    let mut names = HashSet::new();
    for (&i, u) in idx.upstreams.iter().zip(&config.upstreams) {
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
            validate_upstream_tls(config, d, i, u, tls);
        }
        if let Some(h) = &u.health {
            for (span, field, message) in h.check() {
                d.push(span, format!("upstreams[{i}].health.{field}"), message);
            }
        }
        for (j, e) in u.endpoints.iter().enumerate() {
            if let Err(message) = Target::parse(e.address.get_ref()) {
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

    for (i, server) in config.dns.servers.iter().enumerate() {
        if let Err(message) = parse_server(server.get_ref()) {
            d.push(Some(server.span()), format!("dns.servers[{i}]"), message);
        }
    }
    if config.dns.hosts_file.get_ref().trim().is_empty() {
        d.push(
            Some(config.dns.hosts_file.span()),
            "dns.hosts_file",
            "must be a file's path (the default is /etc/hosts)",
        );
    }
    if config.dns.timeout_ms == 0 || config.dns.attempts == 0 {
        d.push(
            None,
            "dns",
            "`timeout_ms` and `attempts` must be at least 1",
        );
    }

    let mut auth_names = HashSet::new();
    for (&i, a) in idx.auth.iter().zip(&config.auth) {
        let name = a.name.get_ref();
        if !auth_names.insert(name.as_str()) {
            d.push(
                Some(a.name.span()),
                format!("auth[{i}].name"),
                format!("duplicate auth name `{name}`"),
            );
        }
        for (span, field, message) in a.check(&config.base_dir) {
            d.push(
                span.or(Some(a.name.span())),
                format!("auth[{i}]{field}"),
                message,
            );
        }
    }

    let mut ids = HashSet::new();
    for (&i, r) in idx.routes.iter().zip(&config.routes) {
        check_route_auth(d, i, r, &idx.declared_auth);
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
        for (span, field, message) in policy::check(r) {
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
        for (span, field, message) in
            retry::check(r.retry.as_ref(), r.timeouts.as_ref(), &config.timeouts)
        {
            d.push(
                span.or(Some(r.id.span())),
                format!("routes[{i}].{field}"),
                message,
            );
        }
        if let Some(limit) = &r.rate_limit {
            for (span, field, message) in limit.check(Scope::Route, idx.redis) {
                d.push(span, format!("routes[{i}].rate_limit.{field}"), message);
            }
        }
        for (span, field, message) in r.access().check() {
            d.push(span, format!("routes[{i}].{field}"), message);
        }
        if let Some(compress) = &r.compress {
            for (span, field, message) in compress.get_ref().check() {
                d.push(
                    span.or(Some(compress.span())),
                    format!("routes[{i}].compress.{field}"),
                    message,
                );
            }
        }
        if let Some(cors) = &r.cors {
            for (span, field, message) in cors.get_ref().check() {
                d.push(
                    span.or(Some(cors.span())),
                    format!("routes[{i}].cors.{field}"),
                    message,
                );
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
    if config.limits.header_bytes < 1024 {
        d.push(None, "limits.header_bytes", "must be at least 1024");
    }
    if config.limits.connections == 0 {
        d.push(None, "limits.connections", "must be at least 1");
    }
    if config.limits.http2_max_streams == 0 {
        d.push(None, "limits.http2_max_streams", "must be at least 1");
    }
    if let Err(e) = config.overload.validate() {
        d.push(None, "overload", e.to_string());
    }
    for id in config.overload.classes.keys() {
        if !config.routes.iter().any(|r| r.id.get_ref() == id) {
            d.push(
                None,
                format!("overload.classes.{id}"),
                format!("no route with id `{id}`"),
            );
        }
    }
}

/// A route's `auth`: names of declared authenticators, at least one, none twice; and a
/// rate limit keyed by `consumer` only where there is a consumer.
fn check_route_auth(
    d: &mut Diags<'_>,
    i: usize,
    r: &crate::route::RouteConfig,
    declared: &HashSet<String>,
) {
    if let Some(auth) = &r.auth {
        if auth.get_ref().0.is_empty() {
            d.push(
                Some(auth.span()),
                format!("routes[{i}].auth"),
                "lists no authenticator; remove `auth` for an open route",
            );
        }
        let mut seen = HashSet::new();
        for (span, name) in crate::auth::StringList::items(auth) {
            if !declared.contains(name) {
                d.push(
                    Some(span),
                    format!("routes[{i}].auth"),
                    format!("unknown auth `{name}` (no `[[auth]]` with that name)"),
                );
            } else if !seen.insert(name) {
                d.push(
                    Some(span),
                    format!("routes[{i}].auth"),
                    format!("`{name}` is listed twice"),
                );
            }
        }
    }
    if let Some(limit) = &r.rate_limit
        && limit.key.get_ref() == "consumer"
        && r.auth.is_none()
    {
        d.push(
            Some(limit.key.span()),
            format!("routes[{i}].rate_limit.key"),
            "`consumer` needs the route's `auth` (an open route has no consumer)",
        );
    }
}

/// `upstreams[i].tls`: mTLS files come in pairs, and every file loads (the errors name
/// the field and the file, at the field's position).
fn validate_upstream_tls(
    config: &Config,
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
    if let Err(e) = upstream_tls::load(&config.base_dir, tls) {
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
