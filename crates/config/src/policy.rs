//! A route's policy compiled from its config: the path rewrite, the request and response
//! header operations with their `$variables` parsed, and the answer a route gives by itself
//! (a redirect, a static response) with its head prebuilt. The compilation is also the
//! check: every problem it meets is reported with its position, so a config that passed
//! compiles whole. The runtime applies the result per request.

use std::ops::Range;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, StatusCode, Uri};
use toml::Spanned;

use crate::route::{
    HeaderEntry, HeaderOpsConfig, PathMatch, RedirectConfig, RespondConfig, RewriteConfig,
    RouteConfig,
};

/// A problem found compiling a route's policy: where, the field after `routes[i]` (empty
/// for the route itself, else starting with `.`), and what is wrong.
pub type Problem = (Option<Range<usize>>, String, String);

/// A route's compiled policy (the runtime's `Route::policy`).
#[derive(Debug)]
pub struct Policy {
    /// The path rewrite.
    pub rewrite: Option<Rewrite>,
    /// Operations on the request sent upstream.
    pub request: Option<HeaderOps>,
    /// Operations on the response sent downstream.
    pub response: Option<HeaderOps>,
    /// The answer the route gives by itself.
    pub local: Option<Local>,
    /// Some operation reads `$host`: captured before the gateway's own header work.
    pub needs_host: bool,
    /// Some operation reads `$request_id`.
    pub needs_request_id: bool,
}

/// A path rewrite, ready to apply.
#[derive(Debug)]
pub enum Rewrite {
    /// `prefix`: the route's prefix as it matches (trailing `/` trimmed, as the router
    /// does), and what replaces it: `to` as written when the path is the prefix alone,
    /// `to[..trimmed]` (no trailing `/`) before the rest of a longer path, so that neither
    /// `//` nor an empty path is ever made.
    Prefix {
        /// The prefix the route matched, without a trailing `/`.
        prefix: Box<str>,
        /// What replaces it.
        to: Box<str>,
        /// `to`'s length without its trailing `/`s.
        trimmed: usize,
    },
    /// `path`: the whole path.
    Path(Box<str>),
}

/// Header operations, ready to apply: remove, then set, then add.
#[derive(Debug)]
pub struct HeaderOps {
    /// Names removed.
    pub remove: Box<[HeaderName]>,
    /// Fields that replace every value of their name.
    pub set: Box<[(HeaderName, Value)]>,
    /// Fields appended.
    pub add: Box<[(HeaderName, Value)]>,
}

/// A header value as compiled: prebuilt, one variable, or text and variables.
#[derive(Debug)]
pub enum Value {
    /// Text only, prebuilt (`$route` is text too).
    Static(HeaderValue),
    /// `$remote_addr` alone.
    RemoteAddr,
    /// `$request_id` alone.
    RequestId,
    /// `$host` alone.
    Host,
    /// Text and variables, concatenated per request.
    Template(Box<[Part]>),
}

/// One piece of a [`Value::Template`].
#[derive(Debug)]
pub enum Part {
    /// Text, valid in a header value.
    Text(Box<str>),
    /// `$remote_addr`: the downstream peer's address.
    RemoteAddr,
    /// `$request_id`: the request's id.
    RequestId,
    /// `$host`: the request's host, lowercase, without port.
    Host,
}

/// The answer a route gives by itself, its head prebuilt.
#[derive(Debug)]
pub enum Local {
    /// `redirect`.
    Redirect {
        /// 301, 302, 303, 307 or 308.
        status: StatusCode,
        /// `location` as written.
        location: HeaderValue,
        /// With `keep_path`: `location` without a trailing `/`, the request's path and
        /// query to follow.
        keep_path: Option<Box<str>>,
    },
    /// `respond`.
    Respond {
        /// 200..=599.
        status: StatusCode,
        /// The body (empty: none).
        body: Bytes,
        /// `Content-Type`, if any.
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
    pub fn build(r: &RouteConfig) -> Option<Box<Policy>> {
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
/// `respond` it has), for the config's validation.
pub fn check(r: &RouteConfig) -> Vec<Problem> {
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
pub fn parse_value(text: &str, route_id: &str) -> Result<Value, String> {
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
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }
}

impl Value {
    /// Whether this value reads the variable `var` (a [`Part`] other than text).
    pub fn reads(&self, var: &Part) -> bool {
        let same = |p: &Part| std::mem::discriminant(p) == std::mem::discriminant(var);
        match self {
            Value::Static(_) => false,
            Value::RemoteAddr => same(&Part::RemoteAddr),
            Value::RequestId => same(&Part::RequestId),
            Value::Host => same(&Part::Host),
            Value::Template(parts) => parts.iter().any(same),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
