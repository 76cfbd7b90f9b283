//! Where a credential is read from (`header:NAME`, `query:NAME`, `cookie:NAME`), read
//! from a request's head without allocating, and removed from the request sent upstream.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Uri};

/// One place a credential may be: parsed once at load, read per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The value of a request header. `Authorization` is special: its `Bearer` scheme
    /// (case-insensitive, RFC 6750 §2.1) is stripped, and a value with another scheme is
    /// no credential of this source.
    Header(HeaderName),
    /// A query parameter, compared by its name as sent (not percent-decoded; its value is
    /// percent-decoded only when it contains a `%`, which keys and tokens do not).
    Query(Arc<str>),
    /// A cookie of the `Cookie` header.
    Cookie(Arc<str>),
}

impl Source {
    /// Parses `header:NAME`, `query:NAME` or `cookie:NAME`. `kinds` lists the kinds the
    /// authenticator type allows (an API key comes from a header or the query only).
    pub fn parse(text: &str, kinds: &[&str]) -> Result<Source, String> {
        let Some((kind, name)) = text.split_once(':') else {
            return Err(format!(
                "`{text}` is not a source; expected {}",
                expected(kinds)
            ));
        };
        if !kinds.contains(&kind) {
            return Err(format!(
                "`{kind}:` is not a source here; expected {}",
                expected(kinds)
            ));
        }
        if name.is_empty() {
            return Err(format!("`{kind}:` needs a name, like `{kind}:x-api-key`"));
        }
        match kind {
            "header" => HeaderName::from_bytes(name.as_bytes())
                .map(Source::Header)
                .map_err(|_| format!("`{name}` is not a header name")),
            "query" if name.bytes().all(is_query_name_byte) => Ok(Source::Query(Arc::from(name))),
            "cookie" if name.bytes().all(is_cookie_name_byte) => {
                Ok(Source::Cookie(Arc::from(name)))
            }
            _ => Err(format!("`{name}` is not a {kind} name")),
        }
    }

    /// The credential this source finds in a request's head, if any. Borrowed: nothing is
    /// allocated unless a query value is percent-encoded.
    pub fn find<'a>(&self, uri: &'a Uri, headers: &'a HeaderMap) -> Option<Credential<'a>> {
        match self {
            Source::Header(name) => {
                let value = headers.get(name)?.as_bytes();
                let value = if *name == http::header::AUTHORIZATION {
                    bearer(value)?
                } else {
                    value
                };
                non_empty(value).map(Credential::Borrowed)
            }
            Source::Query(name) => {
                let value = query_param(uri.query()?, name)?;
                let value = non_empty(value)?;
                if value.contains(&b'%') {
                    percent_decode(value).map(Credential::Decoded)
                } else {
                    Some(Credential::Borrowed(value))
                }
            }
            Source::Cookie(name) => headers
                .get_all(http::header::COOKIE)
                .iter()
                .find_map(|v| cookie(v.as_bytes(), name.as_bytes()))
                .and_then(non_empty)
                .map(Credential::Borrowed),
        }
    }

    /// Removes this source's credential from a request about to be sent upstream: the
    /// header, the query parameter, or the cookie (the `Cookie` header rewritten without
    /// it, or dropped when it was the only one).
    pub fn remove(&self, uri: &mut Uri, headers: &mut HeaderMap) {
        match self {
            Source::Header(name) => {
                headers.remove(name);
            }
            Source::Query(name) => {
                if let Some(stripped) = without_query_param(uri, name) {
                    *uri = stripped;
                }
            }
            Source::Cookie(name) => {
                let values: Vec<HeaderValue> = headers
                    .get_all(http::header::COOKIE)
                    .iter()
                    .filter_map(|v| without_cookie(v, name.as_bytes()))
                    .collect();
                headers.remove(http::header::COOKIE);
                for v in values {
                    headers.append(http::header::COOKIE, v);
                }
            }
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Header(n) => write!(f, "header:{n}"),
            Source::Query(n) => write!(f, "query:{n}"),
            Source::Cookie(n) => write!(f, "cookie:{n}"),
        }
    }
}

/// A credential as found: the request's own bytes, or a percent-decoded copy.
#[derive(Debug)]
pub enum Credential<'a> {
    /// The bytes as they are in the request.
    Borrowed(&'a [u8]),
    /// A decoded query value.
    Decoded(Vec<u8>),
}

impl Credential<'_> {
    /// The credential's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Credential::Borrowed(b) => b,
            Credential::Decoded(v) => v,
        }
    }
}

fn expected(kinds: &[&str]) -> String {
    let list: Vec<String> = kinds.iter().map(|k| format!("`{k}:NAME`")).collect();
    list.join(" or ")
}

fn non_empty(b: &[u8]) -> Option<&[u8]> {
    (!b.is_empty()).then_some(b)
}

/// The token of an `Authorization: Bearer TOKEN` value (scheme case-insensitive, RFC 6750
/// §2.1 and RFC 9110 §11.1), or `None` for another scheme.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let start = rest.iter().position(|&b| b != b' ')?;
    let rest = &rest[start..];
    let end = rest.iter().rposition(|&b| b != b' ' && b != b'\t')? + 1;
    Some(&rest[..end])
}

fn is_query_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~')
}

fn is_cookie_name_byte(b: u8) -> bool {
    // RFC 6265 §4.1.1: a token.
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The first value of parameter `name` in `query`.
fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a [u8]> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v.as_bytes())
    })
}

fn without_query_param(uri: &Uri, name: &str) -> Option<Uri> {
    let query = uri.query()?;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| pair.split_once('=').map_or(*pair, |(k, _)| k) != name)
        .collect();
    let path = uri.path();
    let pq = if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// The value of cookie `name` in one `Cookie` header value (`a=1; b=2`).
fn cookie<'a>(header: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    header.split(|&b| b == b';').find_map(|pair| {
        let pair = trim(pair);
        let eq = pair.iter().position(|&b| b == b'=')?;
        let value = &pair[eq + 1..];
        // RFC 6265 §4.1.1: a value may be quoted.
        let value = value
            .strip_prefix(b"\"")
            .and_then(|v| v.strip_suffix(b"\""))
            .unwrap_or(value);
        (&pair[..eq] == name).then_some(value)
    })
}

fn without_cookie(header: &HeaderValue, name: &[u8]) -> Option<HeaderValue> {
    let kept: Vec<&[u8]> = header
        .as_bytes()
        .split(|&b| b == b';')
        .map(trim)
        .filter(|pair| !pair.is_empty())
        .filter(|pair| pair.split(|&b| b == b'=').next() != Some(name))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&kept.join(&b"; "[..])).ok()
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |e| e + 1);
    &b[start..end]
}

fn percent_decode(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let text = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(text, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, headers: &[(&str, &str)]) -> (Uri, HeaderMap) {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        (uri.parse().unwrap(), map)
    }

    fn found(s: &Source, uri: &str, headers: &[(&str, &str)]) -> Option<Vec<u8>> {
        let (u, h) = req(uri, headers);
        s.find(&u, &h).map(|c| c.as_bytes().to_vec())
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_others_are_not_tokens() {
        let s = Source::parse("header:authorization", &["header"]).unwrap();
        for v in ["Bearer abc", "bearer abc", "BEARER  abc "] {
            assert_eq!(
                found(&s, "/", &[("authorization", v)]).as_deref(),
                Some(&b"abc"[..]),
                "{v}"
            );
        }
        assert_eq!(found(&s, "/", &[("authorization", "Basic abc")]), None);
        assert_eq!(found(&s, "/", &[("authorization", "Bearer ")]), None);
    }

    #[test]
    fn query_and_cookie_values_are_found_and_removed() {
        let q = Source::parse("query:api_key", &["header", "query"]).unwrap();
        assert_eq!(
            found(&q, "/x?a=1&api_key=k%2B1&b=2", &[]).as_deref(),
            Some(&b"k+1"[..])
        );
        assert_eq!(found(&q, "/x?api_keyx=1", &[]), None);
        let (mut u, mut h) = req("/x?a=1&api_key=k&b=2", &[]);
        q.remove(&mut u, &mut h);
        assert_eq!(u.to_string(), "/x?a=1&b=2");
        let (mut u, mut h) = req("/x?api_key=k", &[]);
        q.remove(&mut u, &mut h);
        assert_eq!(u.to_string(), "/x");

        let c = Source::parse("cookie:session", &["cookie"]).unwrap();
        let cookies = [("cookie", "a=1; session=\"tok\"; b=2")];
        assert_eq!(found(&c, "/", &cookies).as_deref(), Some(&b"tok"[..]));
        let (mut u, mut h) = req("/", &cookies);
        c.remove(&mut u, &mut h);
        assert_eq!(h.get("cookie").unwrap(), "a=1; b=2");
        let (mut u, mut h) = req("/", &[("cookie", "session=tok")]);
        c.remove(&mut u, &mut h);
        assert!(h.get("cookie").is_none());
    }

    #[test]
    fn parse_refuses_kinds_the_type_does_not_allow() {
        assert!(Source::parse("cookie:x", &["header", "query"]).is_err());
        assert!(Source::parse("header:", &["header"]).is_err());
        assert!(Source::parse("header:bad name", &["header"]).is_err());
        assert!(Source::parse("x-api-key", &["header"]).is_err());
        assert_eq!(
            Source::parse("header:X-Api-Key", &["header"])
                .unwrap()
                .to_string(),
            "header:x-api-key"
        );
    }
}
