//! A route's traffic policy, compiled once at config load: the path rewrite, the request
//! and response header operations with their `$variables`, and the answers a route gives
//! by itself (a redirect, a static response) with no upstream.
//!
//! A route without any of these holds `None` and pays one branch per call site. One that
//! has them pays, per request, only what the operations need: static values are prebuilt
//! `HeaderValue`s (a clone is a reference count), `$remote_addr` is the connection's value
//! and `$request_id` the request's (clones as well), `$route` is text fixed at load. What
//! must be written per request (a rewritten path, `$host`, a value mixing text and
//! variables, a redirect's `keep_path` location) is written into a per-thread arena and
//! split off it, as `headers::request_id` does: a reference count per value and one 4 KiB
//! block per many values, not an allocation each. No lock, no hash beyond the header map's
//! own lookups, no formatting.
//!
//! Header operations run in a fixed order, remove, then set, then add (Envoy's and
//! nginx's users expect it), after the gateway's own header work (hop-by-hop removal,
//! forwarding fields, `Via`), so they can override it. The hop-by-hop and framing fields,
//! and `host` (see `host_rewrite`), are the gateway's alone and refused at load.

use std::cell::RefCell;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use serde::Deserialize;
use toml::Spanned;

use crate::body::{RequestBody, ResponseBody};
use crate::config::{PathMatch, RouteConfig};
use crate::error::Error;
use crate::gateway::{ConnCtx, Held, check_forwardable, error_response, host_of};
use crate::headers::{self, Client};
use crate::record::{Finish, RequestRecord};
use crate::route::Route;

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

/// A problem found compiling a route's policy: where, the field after `routes[i]` (empty
/// for the route itself, else starting with `.`), and what is wrong.
pub(crate) type Problem = (Option<Range<usize>>, String, String);

/// A route's compiled policy (`Route::policy`).
#[derive(Debug)]
pub struct Policy {
    rewrite: Option<Rewrite>,
    request: Option<HeaderOps>,
    response: Option<HeaderOps>,
    local: Option<Local>,
    /// Some operation reads `$host`: captured before the gateway's own header work.
    needs_host: bool,
    /// Some operation reads `$request_id`.
    needs_request_id: bool,
}

#[derive(Debug)]
enum Rewrite {
    /// `prefix`: the route's prefix as it matches (trailing `/` trimmed, as the router
    /// does), and what replaces it: `to` as written when the path is the prefix alone,
    /// `to[..trimmed]` (no trailing `/`) before the rest of a longer path, so that neither
    /// `//` nor an empty path is ever made.
    Prefix {
        prefix: Box<str>,
        to: Box<str>,
        trimmed: usize,
    },
    /// `path`: the whole path.
    Path(Box<str>),
}

#[derive(Debug)]
struct HeaderOps {
    remove: Box<[HeaderName]>,
    set: Box<[(HeaderName, Value)]>,
    add: Box<[(HeaderName, Value)]>,
}

/// A header value as compiled: prebuilt, one variable, or text and variables.
#[derive(Debug)]
enum Value {
    Static(HeaderValue),
    RemoteAddr,
    RequestId,
    Host,
    Template(Box<[Part]>),
}

#[derive(Debug)]
enum Part {
    Text(Box<str>),
    RemoteAddr,
    RequestId,
    Host,
}

#[derive(Debug)]
enum Local {
    Redirect {
        status: StatusCode,
        location: HeaderValue,
        /// With `keep_path`: `location` without a trailing `/`, the request's path and
        /// query to follow.
        keep_path: Option<Box<str>>,
    },
    Respond {
        status: StatusCode,
        body: Bytes,
        content_type: Option<HeaderValue>,
        /// The body's length, for a `HEAD` answer (which carries no body).
        length: HeaderValue,
    },
}

/// Fields no operation may touch: hop-by-hop (RFC 9110 §7.6.1) and framing fields are
/// the gateway's to write for each hop, and `host` has `host_rewrite` (on HTTP/2 it is
/// `:authority`, which a header operation would not reach).
const FORBIDDEN: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
];

const VARIABLES: &str = "`$remote_addr`, `$request_id`, `$host`, `$route`";

impl Policy {
    /// Compiles a route's policy; `None` when it has none. The config was validated
    /// ([`check`] runs this same compilation), so nothing is dropped here.
    pub(crate) fn build(r: &RouteConfig) -> Option<Box<Policy>> {
        Policy::compile(r, &mut Vec::new())
    }

    fn compile(r: &RouteConfig, problems: &mut Vec<Problem>) -> Option<Box<Policy>> {
        let mut push = |span: Option<Range<usize>>, field: &str, message: String| {
            problems.push((span, field.to_owned(), message));
        };
        let id = r.id.get_ref();
        let local = match (&r.upstream, &r.redirect, &r.respond) {
            (Some(_), None, None) => None,
            (None, Some(redirect), None) => redirect_of(redirect, &mut push),
            (None, None, Some(respond)) => respond_of(respond, &mut push),
            (None, None, None) => {
                push(
                    Some(r.id.span()),
                    "",
                    "needs one of `upstream`, `redirect` or `respond`".to_owned(),
                );
                None
            }
            _ => {
                push(
                    Some(r.id.span()),
                    "",
                    "has more than one of `upstream`, `redirect` and `respond`; choose one"
                        .to_owned(),
                );
                None
            }
        };
        if r.upstream.is_none() && (r.redirect.is_some() || r.respond.is_some()) {
            // What only a forwarded request has.
            let upstream_only = [
                ("rewrite", r.rewrite.as_ref().map(Spanned::span)),
                (
                    "request_headers",
                    r.request_headers.as_ref().map(Spanned::span),
                ),
                ("host_rewrite", r.host_rewrite.as_ref().map(Spanned::span)),
                ("timeouts", r.timeouts.as_ref().map(Spanned::span)),
                ("retry", r.retry.as_ref().map(Spanned::span)),
            ];
            for (field, span) in upstream_only {
                if let Some(span) = span {
                    push(
                        Some(span),
                        &format!(".{field}"),
                        "this route answers by itself (`redirect`/`respond`) and sends \
                         nothing upstream"
                            .to_owned(),
                    );
                }
            }
        }
        let rewrite = r
            .rewrite
            .as_ref()
            .and_then(|rw| rewrite_of(rw, r.path.as_ref(), &mut push));
        let mut ops = |field: &str, cfg: &Option<Spanned<HeaderOpsConfig>>| {
            cfg.as_ref()
                .map(|c| header_ops(c.get_ref(), id, field, &mut push))
                .filter(|o| !o.is_empty())
        };
        let request = ops(".request_headers", &r.request_headers);
        let response = ops(".response_headers", &r.response_headers);
        if rewrite.is_none() && request.is_none() && response.is_none() && local.is_none() {
            return None;
        }
        let values = || {
            [&request, &response]
                .into_iter()
                .flatten()
                .flat_map(|o| o.set.iter().chain(o.add.iter()).map(|(_, v)| v))
        };
        let needs_host = values().any(|v| v.reads(&Part::Host));
        let needs_request_id = values().any(|v| v.reads(&Part::RequestId));
        Some(Box::new(Policy {
            rewrite,
            request,
            response,
            local,
            needs_host,
            needs_request_id,
        }))
    }
}

/// The problems in route `r`'s policy fields (and in which of `upstream`, `redirect` and
/// `respond` it has), for `Config::validate`.
pub(crate) fn check(r: &RouteConfig) -> Vec<Problem> {
    let mut problems = Vec::new();
    Policy::compile(r, &mut problems);
    problems
}

fn rewrite_of(
    rw: &Spanned<RewriteConfig>,
    path: Option<&Spanned<PathMatch>>,
    push: &mut impl FnMut(Option<Range<usize>>, &str, String),
) -> Option<Rewrite> {
    let (RewriteConfig::Prefix(to) | RewriteConfig::Path(to)) = rw.get_ref();
    let valid = to.starts_with('/')
        && !to.contains(['?', '#'])
        && PathAndQuery::try_from(to.as_str()).is_ok_and(|p| p.as_str() == to);
    if !valid {
        push(
            Some(rw.span()),
            ".rewrite",
            format!("`{to}` is not a path: it must start with `/` and have no query or `#`"),
        );
        return None;
    }
    match rw.get_ref() {
        RewriteConfig::Path(_) => Some(Rewrite::Path(to.as_str().into())),
        RewriteConfig::Prefix(_) => {
            // No `path` matches every path, as `prefix = "/"` does.
            let prefix = match path.map(Spanned::get_ref) {
                None => "",
                Some(PathMatch::Prefix(p)) => p.trim_end_matches('/'),
                Some(PathMatch::Exact(_)) => {
                    push(
                        Some(rw.span()),
                        ".rewrite.prefix",
                        "replaces the prefix the route matched and needs \
                         `path = { prefix = .. }`; with an exact path use `rewrite = { path = .. }`"
                            .to_owned(),
                    );
                    return None;
                }
            };
            Some(Rewrite::Prefix {
                prefix: prefix.into(),
                to: to.as_str().into(),
                trimmed: to.trim_end_matches('/').len(),
            })
        }
    }
}

fn redirect_of(
    redirect: &Spanned<RedirectConfig>,
    push: &mut impl FnMut(Option<Range<usize>>, &str, String),
) -> Option<Local> {
    let r = redirect.get_ref();
    let code = *r.status.get_ref();
    let status = match code {
        301 | 302 | 303 | 307 | 308 => StatusCode::from_u16(code).ok(),
        _ => None,
    };
    if status.is_none() {
        push(
            Some(r.status.span()),
            ".redirect.status",
            format!("{code} is not a redirect status (301, 302, 303, 307 or 308)"),
        );
    }
    let Some(location) = &r.location else {
        push(
            Some(redirect.span()),
            ".redirect",
            "needs `location`".to_owned(),
        );
        return None;
    };
    let text = location.get_ref();
    let absolute = text
        .parse::<Uri>()
        .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
    let value = HeaderValue::from_str(text)
        .ok()
        .filter(|_| !text.contains(' ') && (absolute || text.starts_with('/')));
    let Some(value) = value else {
        push(
            Some(location.span()),
            ".redirect.location",
            format!("`{text}` is not an absolute http(s) URL or a path starting with `/`"),
        );
        return None;
    };
    if r.keep_path && text.contains(['?', '#']) {
        push(
            Some(location.span()),
            ".redirect.location",
            "with `keep_path` the request's path and query are appended: no `?` or `#` here"
                .to_owned(),
        );
        return None;
    }
    Some(Local::Redirect {
        status: status?,
        location: value,
        keep_path: r.keep_path.then(|| text.trim_end_matches('/').into()),
    })
}

fn respond_of(
    respond: &Spanned<RespondConfig>,
    push: &mut impl FnMut(Option<Range<usize>>, &str, String),
) -> Option<Local> {
    let r = respond.get_ref();
    let code = *r.status.get_ref();
    // Not 1xx: an interim status cannot end an exchange.
    let Some(status) = StatusCode::from_u16(code)
        .ok()
        .filter(|_| (200..=599).contains(&code))
    else {
        push(
            Some(r.status.span()),
            ".respond.status",
            format!("{code} is not a final HTTP status (200..=599)"),
        );
        return None;
    };
    if matches!(code, 204 | 205 | 304) && !r.body.is_empty() {
        push(
            Some(respond.span()),
            ".respond.body",
            format!("a {code} answer has no body"),
        );
        return None;
    }
    let content_type = match &r.content_type {
        Some(ct) => match HeaderValue::from_str(ct.get_ref()) {
            Ok(v) if !ct.get_ref().is_empty() => Some(v),
            _ => {
                push(
                    Some(ct.span()),
                    ".respond.content_type",
                    format!("`{}` is not a header value", ct.get_ref()),
                );
                return None;
            }
        },
        None if !r.body.is_empty() => Some(HeaderValue::from_static("text/plain; charset=utf-8")),
        None => None,
    };
    Some(Local::Respond {
        status,
        length: HeaderValue::from(r.body.len()),
        body: Bytes::from(r.body.clone().into_bytes()),
        content_type,
    })
}

fn header_ops(
    c: &HeaderOpsConfig,
    route_id: &str,
    field: &str,
    push: &mut impl FnMut(Option<Range<usize>>, &str, String),
) -> HeaderOps {
    let remove = c
        .remove
        .iter()
        .enumerate()
        .filter_map(|(j, n)| header_name(n, &format!("{field}.remove[{j}]"), push))
        .collect();
    let mut entries = |list: &[HeaderEntry], op: &str| -> Box<[(HeaderName, Value)]> {
        let mut out = Vec::with_capacity(list.len());
        for (j, e) in list.iter().enumerate() {
            let name = header_name(&e.name, &format!("{field}.{op}[{j}].name"), push);
            let value = match parse_value(e.value.get_ref(), route_id) {
                Ok(v) => Some(v),
                Err(message) => {
                    push(
                        Some(e.value.span()),
                        &format!("{field}.{op}[{j}].value"),
                        message,
                    );
                    None
                }
            };
            if let (Some(name), Some(value)) = (name, value) {
                out.push((name, value));
            }
        }
        out.into_boxed_slice()
    };
    let set = entries(&c.set, "set");
    let add = entries(&c.add, "add");
    HeaderOps { remove, set, add }
}

/// A header operation's name, if it is one and not one of the [`FORBIDDEN`].
fn header_name(
    name: &Spanned<String>,
    field: &str,
    push: &mut impl FnMut(Option<Range<usize>>, &str, String),
) -> Option<HeaderName> {
    let text = name.get_ref();
    match HeaderName::from_bytes(text.as_bytes()) {
        Ok(n) if FORBIDDEN.contains(&n.as_str()) => {
            let why = if n == http::header::HOST {
                "is set by the gateway (use the route's `host_rewrite`)"
            } else {
                "is a hop-by-hop or framing field the gateway writes for each hop"
            };
            push(Some(name.span()), field, format!("`{text}` {why}"));
            None
        }
        Ok(n) => Some(n),
        Err(_) => {
            push(
                Some(name.span()),
                field,
                format!("`{text}` is not a header name"),
            );
            None
        }
    }
}

/// Parses a value: text with `$name` or `${name}` variables, `$$` for a `$`. `$route` is
/// this route's id, written in at load.
fn parse_value(text: &str, route_id: &str) -> Result<Value, String> {
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        literal.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(next) = after.strip_prefix('$') {
            literal.push('$');
            rest = next;
            continue;
        }
        let (name, next) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced
                    .find('}')
                    .ok_or_else(|| "`${` without its closing `}`".to_owned())?;
                (&braced[..end], &braced[end + 1..])
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                after.split_at(end)
            }
        };
        let part = match name {
            "remote_addr" => Part::RemoteAddr,
            "request_id" => Part::RequestId,
            "host" => Part::Host,
            "route" => {
                literal.push_str(route_id);
                rest = next;
                continue;
            }
            "" => {
                return Err(format!(
                    "a `$` starts a variable ({VARIABLES}, or `${{host}}` next to text); \
                     `$$` is a `$`"
                ));
            }
            other => {
                return Err(format!(
                    "unknown variable `${other}`; known: {VARIABLES} (`$$` is a `$`)"
                ));
            }
        };
        if !literal.is_empty() {
            parts.push(Part::Text(std::mem::take(&mut literal).into()));
        }
        parts.push(part);
        rest = next;
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        parts.push(Part::Text(literal.into()));
    }
    for part in &parts {
        if let Part::Text(t) = part
            && HeaderValue::from_str(t).is_err()
        {
            return Err(format!("`{t}` is not valid in a header value"));
        }
    }
    Ok(match parts.as_slice() {
        [] => return Err("empty; to drop a header use `remove`".to_owned()),
        [Part::Text(t)] => {
            Value::Static(HeaderValue::from_str(t).map_err(|_| "not a header value")?)
        }
        [Part::RemoteAddr] => Value::RemoteAddr,
        [Part::RequestId] => Value::RequestId,
        [Part::Host] => Value::Host,
        _ => Value::Template(parts.into_boxed_slice()),
    })
}

impl HeaderOps {
    fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }

    /// Remove, then set, then add. A value that comes out empty (the `$host` of an
    /// HTTP/1.0 request without one) is not sent, as nginx does: `set` then only removes.
    fn apply(&self, headers: &mut HeaderMap, client: &Client, vars: &Vars) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            match value.resolve(client, vars) {
                Some(v) => {
                    headers.insert(name, v);
                }
                None => {
                    headers.remove(name);
                }
            }
        }
        for (name, value) in &self.add {
            if let Some(v) = value.resolve(client, vars) {
                headers.append(name, v);
            }
        }
    }
}

impl Value {
    fn reads(&self, var: &Part) -> bool {
        let same = |p: &Part| std::mem::discriminant(p) == std::mem::discriminant(var);
        match self {
            Value::Static(_) => false,
            Value::RemoteAddr => same(&Part::RemoteAddr),
            Value::RequestId => same(&Part::RequestId),
            Value::Host => same(&Part::Host),
            Value::Template(parts) => parts.iter().any(same),
        }
    }

    fn resolve(&self, client: &Client, vars: &Vars) -> Option<HeaderValue> {
        let value = match self {
            Value::Static(v) => v.clone(),
            Value::RemoteAddr => client.ip.clone(),
            Value::RequestId => vars.request_id.clone()?,
            Value::Host => vars.host.clone()?,
            Value::Template(parts) => {
                let len = parts.iter().map(|p| p.bytes(client, vars).len()).sum();
                let bytes = arena(len, |buf| {
                    for p in parts.iter() {
                        buf.extend_from_slice(p.bytes(client, vars));
                    }
                });
                // Every piece is a valid header value, so their concatenation is.
                HeaderValue::from_maybe_shared(bytes).ok()?
            }
        };
        (!value.is_empty()).then_some(value)
    }
}

impl Part {
    /// This part's bytes for one request (a variable with no value has none).
    fn bytes<'a>(&'a self, client: &'a Client, vars: &'a Vars) -> &'a [u8] {
        let of = |v: &'a Option<HeaderValue>| v.as_ref().map_or(&b""[..], HeaderValue::as_bytes);
        match self {
            Part::Text(t) => t.as_bytes(),
            Part::RemoteAddr => client.ip.as_bytes(),
            Part::RequestId => of(&vars.request_id),
            Part::Host => of(&vars.host),
        }
    }
}

/// What a route's `$variables` read that the request may no longer say when they are
/// applied: its host as the client sent it (before `host_rewrite`, and before HTTP/2
/// forwarding drops `Host`) and its id. Nothing is captured for a route whose operations
/// read neither.
#[derive(Debug, Default)]
pub(crate) struct Vars {
    host: Option<HeaderValue>,
    request_id: Option<HeaderValue>,
}

impl Vars {
    /// Captures what `route`'s operations will read of the request as it came; call before
    /// the gateway's own header work.
    pub(crate) fn capture<B>(route: &Route, req: &Request<B>) -> Vars {
        match route.policy.as_deref() {
            Some(p) if p.needs_host => Vars {
                host: host_value(req),
                request_id: None,
            },
            _ => Vars::default(),
        }
    }
}

/// `$host`: the request's host, lowercase, without port (nginx's `$host`).
fn host_value<B>(req: &Request<B>) -> Option<HeaderValue> {
    let host = host_of(req);
    if host.is_empty() {
        return None;
    }
    let bytes = arena(host.len(), |buf| {
        let start = buf.len();
        buf.extend_from_slice(host.as_bytes());
        buf[start..].make_ascii_lowercase();
    });
    HeaderValue::from_maybe_shared(bytes).ok()
}

/// Applies `route`'s rewrite and request header operations to a request about to go
/// upstream, after the gateway's own header work; keeps its id in `vars` if the response's
/// operations read it. Infallible: called after an endpoint was picked, where an early
/// return would leave the pick uncompleted.
pub(crate) fn on_request<B>(route: &Route, req: &mut Request<B>, client: &Client, vars: &mut Vars) {
    let Some(p) = route.policy.as_deref() else {
        return;
    };
    if let Some(rewrite) = &p.rewrite
        && let Some(path) = rewrite.apply(req.uri())
    {
        // Scheme and authority (HTTP/2's `:authority`) stay (reference counts); only the
        // path changes.
        let mut parts = http::uri::Parts::default();
        parts.scheme = req.uri().scheme().cloned();
        parts.authority = req.uri().authority().cloned();
        parts.path_and_query = Some(path);
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
    if p.needs_request_id {
        vars.request_id = Some(headers::request_id(req.headers_mut()).clone());
    }
    if let Some(ops) = &p.request {
        ops.apply(req.headers_mut(), client, vars);
    }
}

/// Applies `route`'s response header operations to an upstream response's head.
pub(crate) fn on_response(route: &Route, headers: &mut HeaderMap, client: &Client, vars: &Vars) {
    if let Some(ops) = route.policy.as_deref().and_then(|p| p.response.as_ref()) {
        ops.apply(headers, client, vars);
    }
}

/// [`on_response`] for an HTTP/1.1 upstream's response, whose own fields may still be the
/// lines it sent (written out as they are): moved into the map first when an operation
/// must see them (`remove`, `set`); `add` alone appends without that.
pub(crate) fn on_response_h1(
    route: &Route,
    resp: &mut Response<tailguard_http1::client::UpstreamBody<RequestBody>>,
    client: &Client,
    vars: &Vars,
) {
    let Some(ops) = route.policy.as_deref().and_then(|p| p.response.as_ref()) else {
        return;
    };
    if !ops.remove.is_empty() || !ops.set.is_empty() {
        let mut map = std::mem::take(resp.headers_mut());
        resp.body_mut().fields_into(&mut map);
        *resp.headers_mut() = map;
    }
    ops.apply(resp.headers_mut(), client, vars);
}

/// Whether `route` answers by itself (`redirect`, `respond`) instead of forwarding.
pub(crate) fn answers_locally(route: &Route) -> bool {
    route.policy.as_deref().is_some_and(|p| p.local.is_some())
}

/// Answers a request routed to a route that answers by itself. Called right after
/// routing, before admission: the answer costs less than a shed request's `503` would, and
/// it never reaches an upstream, whose limits and breakers admission guards. It is counted
/// (`tailguard_requests_total` with its route) and logged like any request.
pub(crate) fn answer(
    conn: &ConnCtx,
    held: Held,
    mut req: Box<Request<RequestBody>>,
    route_index: usize,
    mut record: RequestRecord,
) -> Response<ResponseBody> {
    record.route = Some(route_index);
    // Refused as a forwarded request would be (a 2xx answer to a CONNECT would tell the
    // client it has a tunnel).
    if let Err(e) = check_forwardable(&held.snapshot().config.limits, &req) {
        return error_response(e, record, held, None);
    }
    let logged = !held.access_log().is_off();
    let resp = {
        let route = held.snapshot().router.get(route_index);
        let Some(p) = route.policy.as_deref() else {
            return error_response(Error::NoRoute, record, held, None);
        };
        let mut vars = Vars::capture(route, &req);
        if logged || p.needs_request_id {
            let id = headers::request_id(req.headers_mut()).clone();
            if logged {
                record.request_id = Some(id.clone());
            }
            vars.request_id = Some(id);
        }
        let mut resp = local_response(p, &req);
        on_response(route, resp.headers_mut(), &conn.client, &vars);
        resp
    };
    record.status = resp.status().as_u16();
    let (parts, body) = resp.into_parts();
    let finish = Some(Finish {
        record,
        held,
        upstream_conn: None,
        _admitted: None,
    });
    let body = match body {
        Some(b) => ResponseBody::local(b, finish),
        None => ResponseBody::empty(finish),
    };
    Response::from_parts(parts, body)
}

/// The head of a local answer and its body (none for `HEAD` and bodiless answers).
fn local_response(p: &Policy, req: &Request<RequestBody>) -> Response<Option<Bytes>> {
    let mut resp = Response::new(None);
    match &p.local {
        Some(Local::Redirect {
            status,
            location,
            keep_path,
        }) => {
            *resp.status_mut() = *status;
            let target = req.uri().path_and_query().map(PathAndQuery::as_str);
            let location = match (keep_path, target) {
                (Some(base), Some(target)) if target.starts_with('/') => {
                    let bytes = arena(base.len() + target.len(), |buf| {
                        buf.extend_from_slice(base.as_bytes());
                        buf.extend_from_slice(target.as_bytes());
                    });
                    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| location.clone())
                }
                _ => location.clone(),
            };
            resp.headers_mut().insert(LOCATION, location);
        }
        Some(Local::Respond {
            status,
            body,
            content_type,
            length,
        }) => {
            *resp.status_mut() = *status;
            if let Some(ct) = content_type {
                resp.headers_mut().insert(CONTENT_TYPE, ct.clone());
            }
            if req.method() == Method::HEAD {
                // What a GET would say of the body it does not carry.
                if !body.is_empty() {
                    resp.headers_mut().insert(CONTENT_LENGTH, length.clone());
                }
            } else if !body.is_empty() {
                *resp.body_mut() = Some(body.clone());
            }
        }
        None => {}
    }
    resp
}

impl Rewrite {
    /// The path and query sent upstream for `uri`, if this rewrite changes it.
    fn apply(&self, uri: &Uri) -> Option<PathAndQuery> {
        let path = uri.path();
        // `OPTIONS *` has no path to rewrite.
        if !path.starts_with('/') {
            return None;
        }
        let (head, rest) = match self {
            Rewrite::Path(to) => (&**to, ""),
            Rewrite::Prefix {
                prefix,
                to,
                trimmed,
            } => {
                // The router matched the prefix on a segment boundary: what follows it is
                // empty or starts with `/`.
                let rest = path.strip_prefix(&**prefix)?;
                if rest.is_empty() {
                    (&**to, "")
                } else {
                    (&to[..*trimmed], rest)
                }
            }
        };
        let query = uri.query();
        let len = head.len() + rest.len() + query.map_or(0, |q| q.len() + 1);
        let bytes = arena(len, |buf| {
            buf.extend_from_slice(head.as_bytes());
            buf.extend_from_slice(rest.as_bytes());
            if let Some(q) = query {
                buf.extend_from_slice(b"?");
                buf.extend_from_slice(q.as_bytes());
            }
        });
        PathAndQuery::from_maybe_shared(bytes).ok()
    }
}

/// 4 KiB: a block holds dozens of typical values (a host, a path, a tenant tag) before the
/// next one is allocated; a block is freed when the last value cut from it is dropped.
const ARENA_BLOCK: usize = 4096;

thread_local! {
    /// Where per-request values are written (see [`arena`]).
    static ARENA: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// `len` bytes written by `fill` into this thread's arena and split off it: a reference
/// count, not an allocation, per value.
fn arena(len: usize, fill: impl FnOnce(&mut BytesMut)) -> Bytes {
    ARENA.with_borrow_mut(|arena| {
        if arena.capacity() - arena.len() < len {
            *arena = BytesMut::with_capacity(len.max(ARENA_BLOCK));
        }
        fill(arena);
        debug_assert_eq!(arena.len(), len, "fill wrote what it announced");
        arena.split().freeze()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(prefix: &str, to: &str) -> Rewrite {
        Rewrite::Prefix {
            prefix: prefix.trim_end_matches('/').into(),
            to: to.into(),
            trimmed: to.trim_end_matches('/').len(),
        }
    }

    fn rewritten(rw: &Rewrite, target: &str) -> Option<String> {
        let uri: Uri = target.parse().expect("uri");
        rw.apply(&uri).map(|p| p.as_str().to_owned())
    }

    #[test]
    fn a_prefix_rewrite_replaces_the_matched_segments_and_never_makes_an_empty_path_or_a_double_slash()
     {
        let rw = rewrite("/api", "/v2");
        assert_eq!(rewritten(&rw, "/api").as_deref(), Some("/v2"));
        assert_eq!(rewritten(&rw, "/api/").as_deref(), Some("/v2/"));
        assert_eq!(rewritten(&rw, "/api/x?q=1").as_deref(), Some("/v2/x?q=1"));
        let slash = rewrite("/api/", "/");
        assert_eq!(rewritten(&slash, "/api").as_deref(), Some("/"));
        assert_eq!(rewritten(&slash, "/api/x/y").as_deref(), Some("/x/y"));
        assert_eq!(rewritten(&slash, "/api?a").as_deref(), Some("/?a"));
        let trailing = rewrite("/api", "/v2/");
        assert_eq!(rewritten(&trailing, "/api").as_deref(), Some("/v2/"));
        assert_eq!(rewritten(&trailing, "/api/x").as_deref(), Some("/v2/x"));
        let root = rewrite("/", "/base");
        assert_eq!(rewritten(&root, "/").as_deref(), Some("/base/"));
        assert_eq!(rewritten(&root, "/x").as_deref(), Some("/base/x"));
        let path = Rewrite::Path("/exact".into());
        assert_eq!(rewritten(&path, "/a/b?k=v").as_deref(), Some("/exact?k=v"));
    }

    #[test]
    fn values_are_text_variables_or_both_and_unknown_ones_are_refused() {
        assert!(matches!(parse_value("blue", "r"), Ok(Value::Static(v)) if v == "blue"));
        assert!(matches!(parse_value("$route", "r1"), Ok(Value::Static(v)) if v == "r1"));
        assert!(matches!(parse_value("$$5", "r"), Ok(Value::Static(v)) if v == "$5"));
        assert!(matches!(parse_value("$host", "r"), Ok(Value::Host)));
        assert!(matches!(
            parse_value("${remote_addr}", "r"),
            Ok(Value::RemoteAddr)
        ));
        let Ok(Value::Template(parts)) = parse_value("t-${host}.$route:$request_id", "r") else {
            panic!("a template");
        };
        assert_eq!(parts.len(), 4, "{parts:?}");
        assert!(
            parse_value("$hots", "r")
                .unwrap_err()
                .starts_with("unknown variable `$hots`")
        );
        assert!(parse_value("a $ b", "r").is_err());
        assert!(parse_value("${host", "r").is_err());
        assert!(parse_value("", "r").is_err());
        assert!(parse_value("a\nb", "r").is_err());
    }

    #[test]
    fn a_template_resolves_into_one_value_and_an_empty_one_is_not_sent() {
        let client = Client::new("10.1.2.3".parse().expect("ip"), false, false);
        let vars = Vars {
            host: Some(HeaderValue::from_static("shop.example")),
            request_id: Some(HeaderValue::from_static("abc")),
        };
        let v = parse_value("${host}|$remote_addr|$request_id|$route", "r7").expect("valid");
        assert_eq!(
            v.resolve(&client, &vars).expect("a value"),
            "shop.example|10.1.2.3|abc|r7"
        );
        assert!(Value::Host.resolve(&client, &Vars::default()).is_none());
    }
}
