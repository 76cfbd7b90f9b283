//! A route's traffic policy, applied per request: the path rewrite, the request and
//! response header operations with their `$variables`, and the answers a route gives by
//! itself (a redirect, a static response) with no upstream. The policy is compiled, and
//! checked, once at config load ([`tailguard_config::policy`]).
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

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};

use crate::route::Route;
use tailguard_config::policy::{HeaderOps, Local, Part, Rewrite, Value};
use tailguard_http::body::RequestBody;
use tailguard_http::headers::{self, Client};

pub use tailguard_config::policy::Policy;

/// Remove, then set, then add. A value that comes out empty (the `$host` of an HTTP/1.0
/// request without one) is not sent, as nginx does: `set` then only removes.
fn apply(ops: &HeaderOps, headers: &mut HeaderMap, client: &Client, vars: &Vars) {
    for name in &ops.remove {
        headers.remove(name);
    }
    for (name, value) in &ops.set {
        match resolve(value, client, vars) {
            Some(v) => {
                headers.insert(name, v);
            }
            None => {
                headers.remove(name);
            }
        }
    }
    for (name, value) in &ops.add {
        if let Some(v) = resolve(value, client, vars) {
            headers.append(name, v);
        }
    }
}

/// A value for one request; `None` when it comes out empty.
fn resolve(value: &Value, client: &Client, vars: &Vars) -> Option<HeaderValue> {
    let value = match value {
        Value::Static(v) => v.clone(),
        Value::RemoteAddr => client.ip.clone(),
        Value::RequestId => vars.request_id.clone()?,
        Value::Host => vars.host.clone()?,
        Value::Template(parts) => {
            let len = parts
                .iter()
                .map(|p| part_bytes(p, client, vars).len())
                .sum();
            let bytes = arena(len, |buf| {
                for p in parts.iter() {
                    buf.extend_from_slice(part_bytes(p, client, vars));
                }
            });
            // Every piece is a valid header value, so their concatenation is.
            HeaderValue::from_maybe_shared(bytes).ok()?
        }
    };
    (!value.is_empty()).then_some(value)
}

/// A part's bytes for one request (a variable with no value has none).
fn part_bytes<'a>(part: &'a Part, client: &'a Client, vars: &'a Vars) -> &'a [u8] {
    let of = |v: &'a Option<HeaderValue>| v.as_ref().map_or(&b""[..], HeaderValue::as_bytes);
    match part {
        Part::Text(t) => t.as_bytes(),
        Part::RemoteAddr => client.ip.as_bytes(),
        Part::RequestId => of(&vars.request_id),
        Part::Host => of(&vars.host),
    }
}

/// What a route's `$variables` read that the request may no longer say when they are
/// applied: its host as the client sent it (before `host_rewrite`, and before HTTP/2
/// forwarding drops `Host`) and its id. Nothing is captured for a route whose operations
/// read neither.
#[derive(Debug, Default)]
pub struct Vars {
    host: Option<HeaderValue>,
    /// `$request_id`: set where the request's id is known.
    pub request_id: Option<HeaderValue>,
}

impl Vars {
    /// Captures what `route`'s operations will read of the request as it came; call before
    /// the gateway's own header work.
    pub fn capture<B>(route: &Route, req: &Request<B>) -> Vars {
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
    let host = headers::host_of(req);
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
pub fn on_request<B>(route: &Route, req: &mut Request<B>, client: &Client, vars: &mut Vars) {
    let Some(p) = route.policy.as_deref() else {
        return;
    };
    if let Some(rewrite) = &p.rewrite
        && let Some(path) = rewrite_path(rewrite, req.uri())
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
        apply(ops, req.headers_mut(), client, vars);
    }
}

/// Applies `route`'s response header operations to an upstream response's head.
#[inline]
pub fn on_response(route: &Route, headers: &mut HeaderMap, client: &Client, vars: &Vars) {
    if let Some(ops) = route.policy.as_deref().and_then(|p| p.response.as_ref()) {
        apply(ops, headers, client, vars);
    }
}

/// [`on_response`] for an HTTP/1.1 upstream's response, whose own fields may still be the
/// lines it sent (written out as they are): moved into the map first when an operation
/// must see them (`remove`, `set`); `add` alone appends without that.
pub fn on_response_h1(
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
    apply(ops, resp.headers_mut(), client, vars);
}

/// Whether `route` answers by itself (`redirect`, `respond`) instead of forwarding.
#[inline]
pub fn answers_locally(route: &Route) -> bool {
    route.policy.as_deref().is_some_and(|p| p.local.is_some())
}

/// The head of a local answer and its body (none for `HEAD` and bodiless answers).
pub fn local_response(p: &Policy, req: &Request<RequestBody>) -> Response<Option<Bytes>> {
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

/// The path and query sent upstream for `uri`, if `rewrite` changes it.
fn rewrite_path(rewrite: &Rewrite, uri: &Uri) -> Option<PathAndQuery> {
    let path = uri.path();
    // `OPTIONS *` has no path to rewrite.
    if !path.starts_with('/') {
        return None;
    }
    let (head, rest) = match rewrite {
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
    use tailguard_config::policy::parse_value;

    fn rewrite(prefix: &str, to: &str) -> Rewrite {
        Rewrite::Prefix {
            prefix: prefix.trim_end_matches('/').into(),
            to: to.into(),
            trimmed: to.trim_end_matches('/').len(),
        }
    }

    fn rewritten(rw: &Rewrite, target: &str) -> Option<String> {
        let uri: Uri = target.parse().expect("uri");
        rewrite_path(rw, &uri).map(|p| p.as_str().to_owned())
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
    fn a_template_resolves_into_one_value_and_an_empty_one_is_not_sent() {
        let client = Client::new("10.1.2.3".parse().expect("ip"), false, false);
        let vars = Vars {
            host: Some(HeaderValue::from_static("shop.example")),
            request_id: Some(HeaderValue::from_static("abc")),
        };
        let v = parse_value("${host}|$remote_addr|$request_id|$route", "r7").expect("valid");
        assert_eq!(
            resolve(&v, &client, &vars).expect("a value"),
            "shop.example|10.1.2.3|abc|r7"
        );
        assert!(resolve(&Value::Host, &client, &Vars::default()).is_none());
    }
}
