//! CORS per request, by the Fetch standard's CORS protocol: whether a request is a
//! preflight and the gateway's answer to it, and the fields an actual response gets for the
//! request's `Origin`. Decided from a route's compiled [`Cors`] (`tailguard_config::cors`).
//!
//! A request without `Origin` costs one header lookup here and allocates nothing: its
//! response only gets `Vary: Origin` (a static value), so a cache never hands it to a
//! cross-origin request, or the other way round (the standard's "CORS protocol and HTTP
//! caches").
//!
//! A preflight that asks for what the route does not allow (an origin, a method, a header)
//! is answered `204` without any CORS field, as the standard expects of a server: the
//! browser then refuses the actual request. Envoy forwards such a preflight to the upstream
//! by default (`forward_not_matching_preflights`) and never checks the method or headers
//! asked for; here the route's `cors` is the whole policy, so an upstream never sees a
//! preflight of a route with `cors` and cannot widen what the route allows.

use http::header::Entry;
use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use tailguard_http1::client::RawFields;

pub use tailguard_config::cors::Cors;

/// `Vary` of a preflight's answer: it depends on all three of what the browser asked.
/// (Functions, not `const`s: a `HeaderValue` holds `Bytes`, whose `const`s clippy flags as
/// interior-mutable; `from_static` is as cheap.)
fn preflight_vary() -> HeaderValue {
    HeaderValue::from_static(
        "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    )
}

fn vary_origin() -> HeaderValue {
    HeaderValue::from_static("Origin")
}

fn yes() -> HeaderValue {
    HeaderValue::from_static("true")
}

/// The fields a response may carry that only the gateway writes on a route with `cors`.
fn answer_fields() -> [HeaderName; 6] {
    [
        ACCESS_CONTROL_ALLOW_ORIGIN,
        ACCESS_CONTROL_ALLOW_CREDENTIALS,
        ACCESS_CONTROL_EXPOSE_HEADERS,
        ACCESS_CONTROL_ALLOW_METHODS,
        ACCESS_CONTROL_ALLOW_HEADERS,
        ACCESS_CONTROL_MAX_AGE,
    ]
}

/// The method a preflight announces, when `method` and `headers` are a preflight's: an
/// `OPTIONS` with `Origin` and `Access-Control-Request-Method`. An `OPTIONS` without them
/// is an ordinary request, for the upstream.
#[inline]
pub fn preflight_method(method: &Method, headers: &HeaderMap) -> Option<Method> {
    if method != Method::OPTIONS || !headers.contains_key(ORIGIN) {
        return None;
    }
    let asked = headers.get(ACCESS_CONTROL_REQUEST_METHOD)?;
    Method::from_bytes(asked.as_bytes()).ok()
}

/// Answers a preflight: fills `out` (the `204`'s fields) and says whether it was allowed.
/// Refused, `out` gets only `Vary`.
pub fn preflight(cors: &Cors, headers: &HeaderMap, out: &mut HeaderMap) -> bool {
    out.insert(VARY, preflight_vary());
    let Some(origin) = headers.get(ORIGIN) else {
        return false;
    };
    if !cors.origins.allows(origin.as_bytes()) {
        return false;
    }
    let method_allowed = headers
        .get(ACCESS_CONTROL_REQUEST_METHOD)
        .is_some_and(|m| method_allowed(cors, m.as_bytes()));
    if !method_allowed {
        return false;
    }
    let headers_allowed = headers
        .get_all(ACCESS_CONTROL_REQUEST_HEADERS)
        .iter()
        .all(|list| headers_allowed(cors, list.as_bytes()));
    if !headers_allowed {
        return false;
    }
    out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin(cors, origin));
    if cors.credentials {
        out.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, yes());
    }
    if let Some(v) = &cors.allow_methods {
        out.insert(ACCESS_CONTROL_ALLOW_METHODS, v.clone());
    }
    if let Some(v) = &cors.allow_headers {
        out.insert(ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
    }
    if let Some(v) = &cors.max_age {
        out.insert(ACCESS_CONTROL_MAX_AGE, v.clone());
    }
    true
}

/// The CORS-safelisted methods, which a browser sends without the server listing them.
fn method_allowed(cors: &Cors, asked: &[u8]) -> bool {
    // Byte for byte, as the browser compares `Access-Control-Allow-Methods` (it uppercases
    // only the standard methods it sends, so `patch` is not `PATCH`).
    matches!(asked, b"GET" | b"HEAD" | b"POST")
        || cors.any_method
        || cors.methods.iter().any(|m| m.as_str().as_bytes() == asked)
}

/// Every name of an `Access-Control-Request-Headers` list is allowed (`*` covers all but
/// `Authorization`, as it does in a browser).
fn headers_allowed(cors: &Cors, list: &[u8]) -> bool {
    list.split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|name| !name.is_empty())
        .all(|name| {
            cors.headers
                .iter()
                .any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(name))
                || (cors.any_header && !name.eq_ignore_ascii_case(b"authorization"))
        })
}

/// `Access-Control-Allow-Origin` for an allowed `origin`: `*` when every origin is allowed
/// (never with credentials: the config refuses that), else the origin itself.
fn allow_origin(cors: &Cors, origin: &HeaderValue) -> HeaderValue {
    if cors.origins.any {
        HeaderValue::from_static("*")
    } else {
        origin.clone()
    }
}

/// What an actual (not preflight) request of a route with `cors` gets on its response,
/// decided from its head before it is forwarded (the head is gone by the time the answer
/// comes), and applied to whatever answers it: the upstream, the route's own answer, or an
/// error (a page can then read a `429` or a `503`).
#[derive(Debug)]
pub struct Actual {
    /// The request carried `Origin`: the upstream's own CORS fields are replaced.
    cross_origin: bool,
    /// The origin is allowed: the fields that let the page read the response.
    allowed: Option<Allowed>,
}

#[derive(Debug)]
struct Allowed {
    origin: HeaderValue,
    credentials: bool,
    expose: Option<HeaderValue>,
}

impl Actual {
    /// Decides for a request's `headers`. Without `Origin`: one lookup, nothing allocated.
    #[inline]
    pub fn of(cors: &Cors, headers: &HeaderMap) -> Actual {
        let Some(origin) = headers.get(ORIGIN) else {
            return Actual {
                cross_origin: false,
                allowed: None,
            };
        };
        let allowed = cors.origins.allows(origin.as_bytes()).then(|| Allowed {
            origin: allow_origin(cors, origin),
            credentials: cors.credentials,
            expose: cors.expose_headers.clone(),
        });
        Actual {
            cross_origin: true,
            allowed,
        }
    }

    /// Whether the upstream's fields kept as lines (`raw`) must be moved into the map
    /// first, so that [`Actual::apply`] can remove the CORS fields among them.
    pub fn must_see(&self, raw: &RawFields) -> bool {
        // The parser noted such a field: the lines are never scanned here.
        self.cross_origin && raw.has_access_control
    }

    /// Writes the CORS fields into a response's `headers`; `raw` are the upstream's fields
    /// still kept as lines (read for their `Vary`).
    pub fn apply(&self, headers: &mut HeaderMap, raw: Option<&RawFields>) {
        if self.cross_origin
            && headers
                .keys()
                .any(|k| k.as_str().starts_with("access-control-"))
        {
            // The route's `cors` is the whole policy: an upstream that reflects any origin
            // (or allows credentials) is not believed. (Looked for first: a walk over the
            // few names costs less than six hashed removals.)
            for name in answer_fields() {
                headers.remove(name);
            }
        }
        if let Some(allowed) = &self.allowed {
            headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allowed.origin.clone());
            if allowed.credentials {
                headers.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, yes());
            }
            if let Some(expose) = &allowed.expose {
                headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
            }
        }
        // Scanned only when the parser saw a `Vary` among the lines.
        let raw_varies = raw.is_some_and(|raw| {
            raw.has_vary
                && raw.end_to_end().any(|(name, value)| {
                    name.eq_ignore_ascii_case(b"vary") && varies_by_origin(value)
                })
        });
        // One hashed lookup for both the look and the append. Appended: the upstream's
        // `Vary` stays as it was, beside this one (RFC 9110 §5.3: field lines of one name
        // are one list).
        match headers.entry(VARY) {
            Entry::Occupied(mut e) => {
                if !raw_varies && !e.iter().any(|v| varies_by_origin(v.as_bytes())) {
                    e.append(vary_origin());
                }
            }
            Entry::Vacant(e) => {
                if !raw_varies {
                    e.insert(vary_origin());
                }
            }
        }
    }
}

/// A `Vary` value already names `Origin`, or `*` (which covers it).
fn varies_by_origin(value: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .any(|v| v == b"*" || v.eq_ignore_ascii_case(b"origin"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two origins of the tests, and `extra` (TOML lines).
    fn cors(extra: &str) -> Cors {
        let text =
            format!("origins = [\"https://app.example\", \"https://*.example.com\"]\n{extra}");
        toml::from_str::<tailguard_config::cors::CorsConfig>(&text)
            .expect("parses")
            .compile()
            .expect("valid")
    }

    fn head(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in fields {
            map.append(*n, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn a_preflight_is_allowed_only_for_what_the_route_lists() {
        let c = cors("methods = [\"PUT\"]\nheaders = [\"x-token\"]\nmax_age_s = 60");
        let ask = |origin, method, hdrs| {
            let mut out = HeaderMap::new();
            let req = head(&[
                ("origin", origin),
                ("access-control-request-method", method),
                ("access-control-request-headers", hdrs),
            ]);
            (preflight(&c, &req, &mut out), out)
        };
        let (ok, out) = ask("https://a.example.com", "PUT", "x-token");
        assert!(ok);
        assert_eq!(out["access-control-allow-origin"], "https://a.example.com");
        assert_eq!(out["access-control-allow-methods"], "PUT");
        assert_eq!(out["access-control-allow-headers"], "x-token");
        assert_eq!(out["access-control-max-age"], "60");
        assert!(out.get("access-control-allow-credentials").is_none());
        assert!(ask("https://app.example", "GET", "").0, "GET is safelisted");
        for (origin, method, hdrs) in [
            ("https://evil.example", "PUT", ""),
            ("https://app.example", "DELETE", ""),
            ("https://app.example", "put", ""),
            ("https://app.example", "PUT", "x-token, x-other"),
        ] {
            let (ok, out) = ask(origin, method, hdrs);
            assert!(!ok, "{origin} {method} {hdrs}");
            assert_eq!(out.len(), 1, "only Vary: {out:?}");
        }
    }

    #[test]
    fn an_actual_response_reflects_an_allowed_origin_only_and_merges_vary() {
        let c = cors("credentials = true\nexpose_headers = [\"x-id\"]");
        let mut resp = head(&[
            ("vary", "Accept-Encoding"),
            ("access-control-allow-origin", "*"),
        ]);
        Actual::of(&c, &head(&[("origin", "https://app.example")])).apply(&mut resp, None);
        assert_eq!(resp["access-control-allow-origin"], "https://app.example");
        assert_eq!(resp["access-control-allow-credentials"], "true");
        assert_eq!(resp["access-control-expose-headers"], "x-id");
        let vary: Vec<_> = resp.get_all("vary").iter().collect();
        assert_eq!(vary, ["Accept-Encoding", "Origin"]);

        let mut resp = head(&[("access-control-allow-origin", "https://evil.example")]);
        Actual::of(&c, &head(&[("origin", "https://evil.example")])).apply(&mut resp, None);
        assert!(resp.get("access-control-allow-origin").is_none());
        assert_eq!(resp["vary"], "Origin");

        let mut resp = head(&[("vary", "origin, accept")]);
        Actual::of(&c, &HeaderMap::new()).apply(&mut resp, None);
        assert_eq!(resp.len(), 1, "Vary already names Origin: {resp:?}");
    }

    #[test]
    fn a_request_without_origin_is_not_a_preflight() {
        let req = head(&[("access-control-request-method", "PUT")]);
        assert_eq!(preflight_method(&Method::OPTIONS, &req), None);
        let req = head(&[("origin", "https://app.example")]);
        assert_eq!(preflight_method(&Method::OPTIONS, &req), None);
        let req = head(&[
            ("origin", "https://app.example"),
            ("access-control-request-method", "PUT"),
        ]);
        assert_eq!(preflight_method(&Method::OPTIONS, &req), Some(Method::PUT));
        assert_eq!(preflight_method(&Method::GET, &req), None);
    }
}
