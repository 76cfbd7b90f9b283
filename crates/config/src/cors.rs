//! `cors = { origins, methods, headers, expose_headers, credentials, max_age_s }` of a
//! route: the config as written, and the form it compiles to at load (origins sorted for a
//! binary search, wildcard subdomains split into scheme, suffix and port, every response
//! field's value prebuilt), so a request's check allocates nothing and runs no regex. The
//! compilation is also the check: every problem it meets has its field and position.
//!
//! The rules are the Fetch standard's CORS protocol (fetch.spec.whatwg.org, "CORS
//! protocol"); what a request gets from them is decided per request by
//! `tailguard_policy::cors`.

use std::ops::Range;

use http::{HeaderName, HeaderValue, Method};
use serde::Deserialize;
use toml::Spanned;

/// Largest `max_age_s`: a day. Firefox caps a preflight's cache there, Chromium at two
/// hours; a longer value only misleads whoever reads the config.
pub const MAX_AGE_S: u64 = 86_400;

/// `cors = { .. }` of a route, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsConfig {
    /// Origins allowed: `scheme://host[:port]` exactly, `scheme://*.domain[:port]` for any
    /// subdomain of `domain`, or `*` alone for any origin (not with `credentials`).
    pub origins: Vec<Spanned<String>>,
    /// Methods a preflight may ask for besides the CORS-safelisted `GET`, `HEAD`, `POST`
    /// (`*`: any, not with `credentials`).
    #[serde(default)]
    pub methods: Vec<Spanned<String>>,
    /// Request headers a preflight may ask for (`*`: any but `Authorization`, not with
    /// `credentials`).
    #[serde(default)]
    pub headers: Vec<Spanned<String>>,
    /// Response headers a page may read besides the CORS-safelisted ones (`*`: all, not
    /// with `credentials`).
    #[serde(default)]
    pub expose_headers: Vec<Spanned<String>>,
    /// Requests with credentials (cookies, HTTP authentication) may read the response.
    #[serde(default)]
    pub credentials: bool,
    /// How long a browser may cache a preflight's answer, in seconds (none: the browser's
    /// default, 5 s).
    #[serde(default)]
    pub max_age_s: Option<Spanned<u64>>,
}

/// A problem found compiling `cors`: where, the field after `cors.`, and what is wrong.
pub type Problem = (Option<Range<usize>>, String, String);

/// A route's CORS policy, compiled (the runtime's `Route::cors`).
#[derive(Debug)]
pub struct Cors {
    /// The origins allowed.
    pub origins: Origins,
    /// Methods allowed besides the safelisted ones.
    pub methods: Box<[Method]>,
    /// `methods = ["*"]`.
    pub any_method: bool,
    /// Request headers allowed, lowercase.
    pub headers: Box<[HeaderName]>,
    /// `headers = ["*"]`.
    pub any_header: bool,
    /// `credentials = true`.
    pub credentials: bool,
    /// `Access-Control-Allow-Methods` of an allowed preflight (none: no methods listed).
    pub allow_methods: Option<HeaderValue>,
    /// `Access-Control-Allow-Headers` of an allowed preflight.
    pub allow_headers: Option<HeaderValue>,
    /// `Access-Control-Expose-Headers` of an allowed actual response.
    pub expose_headers: Option<HeaderValue>,
    /// `Access-Control-Max-Age` of an allowed preflight.
    pub max_age: Option<HeaderValue>,
}

/// The origins a route allows.
#[derive(Debug, Default)]
pub struct Origins {
    /// `*`: every origin (never with credentials: the config refuses it).
    pub any: bool,
    /// Exact origins, lowercase, sorted for a binary search.
    pub exact: Box<[Box<str>]>,
    /// Wildcard-subdomain patterns.
    pub wildcards: Box<[Wildcard]>,
}

/// `scheme://*.domain[:port]`: an origin of that scheme and port whose host is a
/// subdomain (at any depth) of `domain`.
#[derive(Debug)]
pub struct Wildcard {
    /// `https://`, the scheme with its `://`.
    pub scheme: Box<str>,
    /// `.domain`, lowercase, with its leading dot.
    pub suffix: Box<str>,
    /// `:port`, or empty for the scheme's default.
    pub port: Box<str>,
}

impl Origins {
    /// Whether `origin` (an `Origin` field's value, as a browser serializes it) is allowed.
    /// Never allocates: a binary search over the exact origins, then a suffix test per
    /// wildcard.
    pub fn allows(&self, origin: &[u8]) -> bool {
        if self.any {
            return true;
        }
        if self
            .exact
            .binary_search_by(|o| o.as_bytes().cmp(origin))
            .is_ok()
        {
            return true;
        }
        self.wildcards.iter().any(|w| w.matches(origin))
    }
}

impl Wildcard {
    fn matches(&self, origin: &[u8]) -> bool {
        let Some(rest) = origin.strip_prefix(self.scheme.as_bytes()) else {
            return false;
        };
        let Some(host) = rest.strip_suffix(self.port.as_bytes()) else {
            return false;
        };
        // `host` must be one label or more, then the suffix: `a.example.com` for
        // `.example.com`, never `example.com` itself, and never a host with a port left
        // over (`a.example.com:8443` against a pattern without a port).
        host.len() > self.suffix.len()
            && host.ends_with(self.suffix.as_bytes())
            && !host.contains(&b':')
            && !host.contains(&b'/')
            && host[..host.len() - self.suffix.len()]
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    }
}

impl CorsConfig {
    /// Compiles the policy; every problem with its field (after `cors.`) and position.
    pub fn compile(&self) -> Result<Cors, Vec<Problem>> {
        let mut problems: Vec<Problem> = Vec::new();
        let credentials = self.credentials;
        let star_with_credentials = |what: &str| {
            format!(
                "`*` with `credentials = true`: browsers read `*` as a literal {what} when \
                 credentials are sent, so list them"
            )
        };

        if self.origins.is_empty() {
            // No span for an empty array; the route's own span is added by the caller.
            problems.push((
                None,
                "origins".to_owned(),
                "needs at least one origin".to_owned(),
            ));
        }
        let mut push = |span: Range<usize>, field: String, message: String| {
            problems.push((Some(span), field, message));
        };
        let mut origins = Origins::default();
        let mut exact = Vec::new();
        let mut wildcards = Vec::new();
        for (i, o) in self.origins.iter().enumerate() {
            let field = format!("origins[{i}]");
            let text = o.get_ref().as_str();
            if text == "*" {
                if self.origins.len() > 1 {
                    push(
                        o.span(),
                        field,
                        "`*` allows every origin; list it alone".to_owned(),
                    );
                } else if credentials {
                    push(
                        o.span(),
                        field,
                        "`*` with `credentials = true` would let every site read answers \
                         meant for a signed-in user; list the origins"
                            .to_owned(),
                    );
                } else {
                    origins.any = true;
                }
                continue;
            }
            match parse_origin(text) {
                Ok(Parsed::Exact(origin)) => exact.push(origin.into_boxed_str()),
                Ok(Parsed::Wildcard(w)) => wildcards.push(w),
                Err(message) => push(o.span(), field, message),
            }
        }
        exact.sort();
        exact.dedup();
        origins.exact = exact.into_boxed_slice();
        origins.wildcards = wildcards.into_boxed_slice();

        let mut methods = Vec::new();
        let mut any_method = false;
        for (i, m) in self.methods.iter().enumerate() {
            let field = format!("methods[{i}]");
            let text = m.get_ref().as_str();
            if text == "*" {
                if credentials {
                    push(m.span(), field, star_with_credentials("method"));
                }
                any_method = true;
                continue;
            }
            // Methods are compared byte for byte, as browsers compare them; a browser
            // uppercases only the standard ones, so a config lists them uppercase.
            match Method::from_bytes(text.as_bytes()) {
                Ok(method) if !text.bytes().any(|b| b.is_ascii_lowercase()) => {
                    methods.push(method);
                }
                _ => push(
                    m.span(),
                    field,
                    format!("`{text}` is not an uppercase HTTP method"),
                ),
            }
        }

        let mut names = |list: &[Spanned<String>], what: &str, any: &mut bool| {
            let mut out = Vec::new();
            for (i, h) in list.iter().enumerate() {
                let field = format!("{what}[{i}]");
                let text = h.get_ref().as_str();
                if text == "*" {
                    if credentials {
                        problems.push((
                            Some(h.span()),
                            field,
                            star_with_credentials("header name"),
                        ));
                    }
                    *any = true;
                    continue;
                }
                match HeaderName::from_bytes(text.as_bytes()) {
                    Ok(name) => out.push(name),
                    Err(_) => problems.push((
                        Some(h.span()),
                        field,
                        format!("`{text}` is not a header name"),
                    )),
                }
            }
            out
        };
        let mut any_header = false;
        let headers = names(&self.headers, "headers", &mut any_header);
        let mut any_exposed = false;
        let exposed = names(&self.expose_headers, "expose_headers", &mut any_exposed);

        let max_age = match &self.max_age_s {
            Some(age) if *age.get_ref() > MAX_AGE_S => {
                problems.push((
                    Some(age.span()),
                    "max_age_s".to_owned(),
                    format!(
                        "{} is above {MAX_AGE_S} (a day), where browsers cap it",
                        age.get_ref()
                    ),
                ));
                None
            }
            Some(age) => Some(HeaderValue::from(*age.get_ref())),
            None => None,
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        let list = |any: bool, items: &mut dyn Iterator<Item = &str>| {
            let mut text = String::new();
            if any {
                text.push('*');
            }
            for item in items {
                if !text.is_empty() {
                    text.push_str(", ");
                }
                text.push_str(item);
            }
            // Names and methods are tokens, so the list is a valid value.
            if text.is_empty() {
                None
            } else {
                HeaderValue::from_str(&text).ok()
            }
        };
        Ok(Cors {
            allow_methods: list(any_method, &mut methods.iter().map(Method::as_str)),
            allow_headers: list(any_header, &mut headers.iter().map(HeaderName::as_str)),
            expose_headers: list(any_exposed, &mut exposed.iter().map(HeaderName::as_str)),
            max_age,
            origins,
            methods: methods.into_boxed_slice(),
            any_method,
            headers: headers.into_boxed_slice(),
            any_header,
            credentials,
        })
    }

    /// The problems of this policy (its compilation's), each with the field after `cors.`.
    pub fn check(&self) -> Vec<Problem> {
        self.compile().err().unwrap_or_default()
    }
}

enum Parsed {
    Exact(String),
    Wildcard(Wildcard),
}

/// Parses an origin as written in `origins`: `scheme://host[:port]` (lowercased, as a
/// browser serializes it), the host possibly `*.domain`.
fn parse_origin(text: &str) -> Result<Parsed, String> {
    let bad = |why: &str| Err(format!("`{text}` is not an origin: {why}"));
    if text == "null" {
        return Err(
            "`null` is the origin of sandboxed frames and local files, which any \
                    site can make; it cannot be allowed"
                .to_owned(),
        );
    }
    let Some((scheme, rest)) = text.split_once("://") else {
        return bad("expected `scheme://host[:port]`, like `https://app.example`");
    };
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        return bad("the scheme is not one");
    }
    if rest.contains(['/', '?', '#', '@', ' ']) {
        return bad("an origin has no path, query, user or trailing `/`");
    }
    let (host, port) = if let Some(close) = rest.strip_prefix('[').and_then(|r| r.find(']')) {
        // `[v6]` or `[v6]:port`.
        let (host, after) = rest.split_at(close + 2);
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return bad("expected `:port` after the address"),
            },
        }
    } else {
        match rest.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return bad("an IPv6 address goes in brackets");
            }
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if let Some(port) = port {
        let Ok(n) = port.parse::<u16>() else {
            return bad("the port is not a number up to 65535");
        };
        let default = match scheme.to_ascii_lowercase().as_str() {
            "https" | "wss" => Some(443),
            "http" | "ws" => Some(80),
            _ => None,
        };
        if default == Some(n) || port.starts_with('0') {
            return Err(format!(
                "`{text}`: browsers send the origin without its scheme's default port (and \
                 without leading zeros), so this never matches; write `{scheme}://{host}{}`",
                if default == Some(n) {
                    String::new()
                } else {
                    format!(":{n}")
                }
            ));
        }
    }
    if host.is_empty() {
        return bad("the host is empty");
    }
    let scheme = scheme.to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    let port = port.map_or(String::new(), |p| format!(":{p}"));
    if let Some(domain) = host.strip_prefix("*.") {
        if domain.is_empty() || domain.contains('*') || !is_host(domain) {
            return bad("a wildcard is `*.` before a domain, like `https://*.example.com`");
        }
        return Ok(Parsed::Wildcard(Wildcard {
            scheme: format!("{scheme}://").into_boxed_str(),
            suffix: format!(".{domain}").into_boxed_str(),
            port: port.into_boxed_str(),
        }));
    }
    if host.contains('*') {
        return bad("a wildcard is `*.` before a domain, like `https://*.example.com`");
    }
    if !(is_host(&host) || (host.starts_with('[') && host.ends_with(']'))) {
        return bad("the host is not a host name or address");
    }
    Ok(Parsed::Exact(format!("{scheme}://{host}{port}")))
}

fn is_host(host: &str) -> bool {
    !host.starts_with('.')
        && !host.ends_with('.')
        && !host.contains("..")
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles `cors = { .. }` as written in a route; the problems as `field: message`.
    fn cors(text: &str) -> Result<Cors, Vec<String>> {
        #[derive(Deserialize)]
        struct Doc {
            cors: CorsConfig,
        }
        let doc: Doc = toml::from_str(text).expect("parses");
        doc.cors
            .compile()
            .map_err(|p| p.into_iter().map(|(_, f, m)| format!("{f}: {m}")).collect())
    }

    #[test]
    fn exact_and_wildcard_origins_match_as_browsers_send_them() {
        let c = cors(
            r#"cors = { origins = ["https://App.Example", "https://*.example.com", "http://localhost:3000"] }"#,
        )
        .expect("valid");
        let allows = |o: &str| c.origins.allows(o.as_bytes());
        assert!(allows("https://app.example"));
        assert!(allows("https://a.example.com"));
        assert!(allows("https://a.b.example.com"));
        assert!(allows("http://localhost:3000"));
        assert!(!allows("https://example.com"), "the domain itself");
        assert!(!allows("https://evil-example.com"));
        assert!(!allows("https://a.example.com.evil"));
        assert!(!allows("http://a.example.com"), "another scheme");
        assert!(!allows("https://a.example.com:8443"), "another port");
        assert!(!allows("https://app.example:443"));
        assert!(!allows("http://localhost:30000"));
        assert!(!allows("null"));
        assert!(!allows(""));
    }

    #[test]
    fn response_values_are_prebuilt() {
        let c = cors(
            r#"cors = { origins = ["https://a.example"], methods = ["PUT", "DELETE"], headers = ["X-Token", "content-type"], expose_headers = ["x-id"], credentials = true, max_age_s = 600 }"#,
        )
        .expect("valid");
        assert_eq!(c.allow_methods.expect("methods"), "PUT, DELETE");
        assert_eq!(c.allow_headers.expect("headers"), "x-token, content-type");
        assert_eq!(c.expose_headers.expect("expose"), "x-id");
        assert_eq!(c.max_age.expect("max age"), "600");
        assert!(c.credentials);
    }

    #[test]
    fn every_mistake_is_named_by_its_field() {
        let errors = cors(
            r#"cors = { origins = ["https://a.example/", "null", "https://a.example:443", "*.example.com", "https://x.*.com"], methods = ["get", "*"], headers = ["bad name", "*"], credentials = true, max_age_s = 100000 }"#,
        )
        .expect_err("invalid");
        let fields: Vec<&str> = errors
            .iter()
            .map(|e| e.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            fields,
            [
                "origins[0]",
                "origins[1]",
                "origins[2]",
                "origins[3]",
                "origins[4]",
                "methods[0]",
                "methods[1]",
                "headers[0]",
                "headers[1]",
                "max_age_s"
            ],
            "{errors:#?}"
        );
        let star = cors(r#"cors = { origins = ["*"], credentials = true }"#).expect_err("invalid");
        assert!(star[0].starts_with("origins[0]: `*` with `credentials = true`"));
        assert!(cors(r#"cors = { origins = [] }"#).is_err());
        assert!(
            cors(r#"cors = { origins = ["*"] }"#)
                .expect("valid")
                .origins
                .any
        );
    }
}
