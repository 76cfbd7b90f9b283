//! Request heads (RFC 9112 §2-3, §6): parsed from the front of a connection's buffer into an
//! `http::Request` whose values are slices of that buffer, every rule a proxy must hold
//! checked on the way, and the body's framing decided once, here.
//!
//! What is refused, and why (each is a desync or routing-confusion vector when a proxy
//! and its upstream read the same bytes differently):
//! - framing that is not exactly one of: no body, one `Content-Length` (a list of equal
//!   values counts as one), or `Transfer-Encoding: chunked` alone; `Content-Length` beside
//!   `Transfer-Encoding`; a transfer coding in HTTP/1.0 (§6.1, §6.3);
//! - a request-target that is not origin-form, absolute-form (`http`/`https`, no userinfo),
//!   or `*` for `OPTIONS` (authority-form is for `CONNECT`, §3.2.3);
//! - not exactly one `Host` in HTTP/1.1, or a `Host` that is not `uri-host [":" port]`
//!   (RFC 9110 §4.2.4, RFC 9112 §3.2);
//! - whatever httparse refuses: bare CR, obs-fold, whitespace before a colon, CTLs.
//!
//! The framing fields are parsed and dropped: the message goes on with its framing in
//! [`Meta`] and [`Framing`], and whoever forwards it writes the one framing field itself.

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderName, HeaderValue, Method, Request, Uri, Version};

use crate::error::RequestError;
use crate::fields;
use crate::framing::{Chunk, Framing, MAX_HEADERS};

/// What the connection learned from a request head, beyond the request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// HTTP/1.0 or HTTP/1.1 (a 1.x above 1 is read as 1.1, RFC 9112 §2.3).
    pub version: Version,
    /// The client takes another request after this one.
    pub keep_alive: bool,
    /// A `HEAD` request: its response has no body.
    pub head_request: bool,
    /// `Expect: 100-continue` (HTTP/1.1).
    pub expect_continue: bool,
    /// The declared body length, if any.
    pub declared: Option<u64>,
    /// A WebSocket upgrade (`Upgrade: websocket` with `Connection: upgrade`): the only
    /// protocol the gateway tunnels. Any other `Upgrade` (`h2c`) is dropped as hop-by-hop.
    pub websocket: bool,
}

/// A parsed request head: the request (its body the caller's empty one), what the
/// connection needs to know of it, and where its body ends.
pub type Parsed<B> = (Box<Request<B>>, Meta, Framing);

/// Framing fields a head carried, noted while its fields are copied.
const SEEN_CONNECTION: u8 = 1;
const SEEN_EXPECT: u8 = 2;
const SEEN_UPGRADE: u8 = 4;

/// Parses a whole request head from the front of `buf` (consuming it), or `None` for more
/// bytes. `limit` bounds the head (`limits.header_bytes`); `new_request` gives the empty
/// request to fill (a recycled one, with room for this many fields).
pub fn parse<B>(
    buf: &mut BytesMut,
    limit: usize,
    mut new_request: impl FnMut(usize) -> Box<Request<B>>,
) -> Result<Option<Parsed<B>>, RequestError> {
    // Most heads have a handful of fields: parsed with room for 16 first (the slots are
    // initialised on every call), and only a head with more pays for the full 100.
    match parse_with::<16, B>(buf, limit, &mut new_request) {
        Err(RequestError::HeadTooLarge) if buf.len() <= limit => {
            parse_with::<MAX_HEADERS, B>(buf, limit, &mut new_request)
        }
        other => other,
    }
}

fn parse_with<const N: usize, B>(
    buf: &mut BytesMut,
    limit: usize,
    new_request: &mut impl FnMut(usize) -> Box<Request<B>>,
) -> Result<Option<Parsed<B>>, RequestError> {
    let mut slots = [httparse::EMPTY_HEADER; N];
    let mut parsed = httparse::Request::new(&mut slots);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > limit => return Err(too_large(buf, limit)),
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > limit => return Err(too_large(buf, limit)),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::HeadTooLarge),
        Err(httparse::Error::Version) => {
            return match version_token(buf) {
                // HTTP/1.2 and up: served as 1.1, the highest 1.x spoken (RFC 9112 §2.3).
                Some((at, b'1', minor)) if minor.is_ascii_digit() => {
                    buf[at + 7] = b'1';
                    parse_with::<N, B>(buf, limit, new_request)
                }
                Some((_, major, _)) if major.is_ascii_digit() => {
                    Err(RequestError::VersionUnsupported)
                }
                Some(_) => Err(RequestError::Malformed("malformed request line")),
                None if buf.len() > limit => Err(too_large(buf, limit)),
                None => Ok(None),
            };
        }
        Err(_) => return Err(RequestError::Malformed("malformed request head")),
    };
    let method = Method::from_bytes(parsed.method.unwrap_or_default().as_bytes())
        .map_err(|_| RequestError::Malformed("invalid method"))?;
    // A CONNECT is refused before anything else about it matters: the bytes after its head
    // are a tunnel's, never another request (RFC 9110 §9.3.6).
    if method == Method::CONNECT {
        return Err(RequestError::Connect);
    }
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Offsets first (the parsed slices borrow `buf`), then the head becomes shared bytes and
    // the target and each value a slice of it: no copy.
    let base = buf.as_ptr() as usize;
    let span = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        (start, start + s.len())
    };
    let target = span(parsed.path.unwrap_or_default().as_bytes());
    let mut spans = [((0usize, 0usize), (0usize, 0usize)); N];
    let count = parsed.headers.len();
    for (slot, h) in spans.iter_mut().zip(parsed.headers.iter()) {
        *slot = (span(h.name.as_bytes()), span(h.value));
    }
    let head = buf.split_to(len).freeze();
    let uri = target_uri(&method, head.slice(target.0..target.1))?;

    // A request box and header map that served an earlier request (the caller's recycling),
    // with room for the fields the gateway adds (forwarding, request id) without a regrow.
    let mut req = new_request(count + 6);
    let map = req.headers_mut();
    let mut seen = 0u8;
    let mut host = None;
    let mut hosts = 0u32;
    let mut length = Length::default();
    let mut codings = Codings::None;
    for &((n0, n1), (v0, v1)) in &spans[..count] {
        let name = HeaderName::from_bytes(&head[n0..n1])
            .map_err(|_| RequestError::Malformed("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
            .map_err(|_| RequestError::Malformed("invalid header value"))?;
        if name == HOST {
            hosts += 1;
            if !valid_host(value.as_bytes()) {
                return Err(RequestError::Malformed("invalid host"));
            }
            host = Some(value);
            continue;
        } else if name == CONTENT_LENGTH {
            length.add(value.as_bytes())?;
            continue;
        } else if name == TRANSFER_ENCODING {
            codings.add(value.as_bytes());
            continue;
        } else if name == CONNECTION {
            seen |= SEEN_CONNECTION;
        } else if name == EXPECT {
            seen |= SEEN_EXPECT;
        } else if name == UPGRADE {
            seen |= SEEN_UPGRADE;
        }
        map.append(name, value);
    }
    // RFC 9112 §3.2: exactly one Host in HTTP/1.1 (1.0 may have none).
    if hosts > 1 || (hosts == 0 && version == Version::HTTP_11) {
        return Err(RequestError::Malformed(
            "an HTTP/1.1 request needs exactly one Host header",
        ));
    }
    // RFC 9112 §3.2.2: an absolute-form target's authority replaces the Host header (which
    // routing already prefers), so the upstream sees the host the request was routed by.
    if let Some(authority) = uri.authority() {
        host = Some(
            HeaderValue::from_str(authority.as_str())
                .map_err(|_| RequestError::Malformed("invalid request target"))?,
        );
    }
    let (framing, declared) = request_framing(length, codings, version)?;
    if let Some(host) = host {
        map.insert(HOST, host);
    }
    let connection_has = |token: &str| fields::connection_has(map, token);
    let keep_alive = if seen & SEEN_CONNECTION == 0 {
        version == Version::HTTP_11
    } else if version == Version::HTTP_11 {
        !connection_has("close")
    } else {
        connection_has("keep-alive")
    };
    let expect_continue = seen & SEEN_EXPECT != 0
        && version == Version::HTTP_11
        && map
            .get(EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let websocket = seen & SEEN_UPGRADE != 0
        && seen & SEEN_CONNECTION != 0
        && version == Version::HTTP_11
        && connection_has("upgrade")
        && map
            .get_all(UPGRADE)
            .iter()
            .all(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket"));
    let meta = Meta {
        version,
        keep_alive,
        head_request: method == Method::HEAD,
        expect_continue,
        declared,
        websocket,
    };
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = version;
    Ok(Some((req, meta, framing)))
}

/// A head over the limit: `414` when its request line alone does not fit, else `431`.
fn too_large(buf: &[u8], limit: usize) -> RequestError {
    let line = buf.iter().take(limit + 1).position(|&b| b == b'\n');
    if line.is_none_or(|end| end > limit) {
        RequestError::TargetTooLong
    } else {
        RequestError::HeadTooLarge
    }
}

/// Where the request line's version token starts, with its major and minor digits, once
/// the whole token (`HTTP/x.y`, 8 bytes) is in `buf`; `None` before then. A token that is
/// not `HTTP/` followed by digit, dot, digit gives a non-digit major.
fn version_token(buf: &[u8]) -> Option<(usize, u8, u8)> {
    let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    let line = &buf[..line_end];
    let first = line.iter().position(|&b| b == b' ')?;
    let second = first + 1 + line[first + 1..].iter().position(|&b| b == b' ')?;
    let at = second + 1;
    let token = line.get(at..at + 8)?;
    if &token[..5] != b"HTTP/" || token[6] != b'.' || !token[7].is_ascii_digit() {
        return Some((at, b'x', b'x'));
    }
    Some((at, token[5], token[7]))
}

/// The request-target in one of the forms a proxy's server side takes (RFC 9112 §3.2):
/// origin-form; absolute-form with an `http`/`https` scheme and a host without userinfo;
/// asterisk-form for `OPTIONS`. Authority-form belongs to `CONNECT`, refused before this.
fn target_uri(method: &Method, target: Bytes) -> Result<Uri, RequestError> {
    const BAD: RequestError = RequestError::Malformed("invalid request target");
    // Visible ASCII only, and no fragment (RFC 9112 §3.2: a target has none; RFC 3986 §2):
    // a byte the upstream may decode or cut differently is refused, not passed on.
    if !target
        .iter()
        .all(|&b| (0x21..0x7f).contains(&b) && b != b'#')
    {
        return Err(BAD);
    }
    if target.as_ref() == b"*" {
        return if *method == Method::OPTIONS {
            Uri::from_maybe_shared(target).map_err(|_| BAD)
        } else {
            Err(BAD)
        };
    }
    let origin = target.first() == Some(&b'/');
    let uri = Uri::from_maybe_shared(target).map_err(|_| BAD)?;
    if origin {
        return Ok(uri);
    }
    let scheme_ok = uri
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"));
    match uri.authority() {
        Some(authority) if scheme_ok && valid_host(authority.as_str().as_bytes()) => Ok(uri),
        _ => Err(BAD),
    }
}

/// `uri-host [":" port]` (RFC 3986 §3.2.2-3.2.3): an IP literal in brackets, or a reg-name
/// of unreserved characters, sub-delims and percent-encodings; the port all digits. An
/// empty value is allowed (RFC 9112 §3.2: a target without authority sends one).
pub fn valid_host(host: &[u8]) -> bool {
    let (name, port) = if let Some(rest) = host.strip_prefix(b"[") {
        let Some(close) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        let literal = &rest[..close];
        if literal.is_empty()
            || !literal
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return false;
        }
        match &rest[close + 1..] {
            [] => return true,
            [b':', port @ ..] => (&[][..], port),
            _ => return false,
        }
    } else {
        match host.iter().rposition(|&b| b == b':') {
            Some(colon) => (&host[..colon], &host[colon + 1..]),
            None => (host, &[][..]),
        }
    };
    if !port.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let mut i = 0;
    while i < name.len() {
        match name[i] {
            b'%' => {
                let hex = name.get(i + 1..i + 3);
                if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
                continue;
            }
            b if b.is_ascii_alphanumeric() => {}
            b'-' | b'.' | b'_' | b'~' => {}
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' => {}
            _ => return false,
        }
        i += 1;
    }
    true
}

/// The `Content-Length` values of a head: one number, however many fields and
/// comma-separated copies carry it (RFC 9112 §6.3 item 5).
#[derive(Debug, Default, Clone, Copy)]
struct Length {
    seen: bool,
    value: Option<u64>,
}

impl Length {
    fn add(&mut self, value: &[u8]) -> Result<(), RequestError> {
        self.seen = true;
        for part in value.split(|&b| b == b',') {
            let n = parse_length(part.trim_ascii())
                .ok_or(RequestError::Malformed("invalid content-length"))?;
            if self.value.is_some_and(|l| l != n) {
                return Err(RequestError::Malformed("conflicting content-length values"));
            }
            self.value = Some(n);
        }
        Ok(())
    }
}

/// The transfer codings of a head, as far as framing needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codings {
    None,
    /// Exactly one coding, `chunked`.
    Chunked,
    /// Anything else: a coding the gateway cannot decode and re-frame, or `chunked` twice.
    Other,
}

impl Codings {
    fn add(&mut self, value: &[u8]) {
        for coding in value
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .filter(|c| !c.is_empty())
        {
            *self = match (*self, coding.eq_ignore_ascii_case(b"chunked")) {
                (Codings::None, true) => Codings::Chunked,
                _ => Codings::Other,
            };
        }
        // A field with no coding at all (`Transfer-Encoding:` empty) is no framing either.
        if *self == Codings::None {
            *self = Codings::Other;
        }
    }
}

/// RFC 9112 §6.1-6.3 for a request: chunked when the only transfer coding is chunked, else
/// `Content-Length`, else no body. Anything ambiguous is refused.
fn request_framing(
    length: Length,
    codings: Codings,
    version: Version,
) -> Result<(Framing, Option<u64>), RequestError> {
    if codings != Codings::None {
        if version == Version::HTTP_10 {
            return Err(RequestError::Malformed(
                "transfer-encoding in an HTTP/1.0 request",
            ));
        }
        if length.seen {
            return Err(RequestError::Malformed(
                "both transfer-encoding and content-length in a request",
            ));
        }
        // Only `chunked`, once: a coding the gateway cannot decode or re-encode upstream
        // (it re-frames the body) is refused rather than passed on wrong.
        return match codings {
            Codings::Chunked => Ok((Framing::Chunked(Chunk::Size), None)),
            _ => Err(RequestError::Malformed("unsupported transfer-encoding")),
        };
    }
    match (length.seen, length.value) {
        (false, _) => Ok((Framing::Done, None)),
        (true, Some(0)) => Ok((Framing::Done, Some(0))),
        (true, Some(n)) => Ok((Framing::Length(n), Some(n))),
        (true, None) => Err(RequestError::Malformed("invalid content-length")),
    }
}

/// A `Content-Length` value: decimal digits only, at most 18 of them.
fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_one(head: &[u8]) -> Result<Option<Parsed<()>>, RequestError> {
        parse(&mut BytesMut::from(head), 8192, |_| {
            Box::new(Request::new(()))
        })
    }

    #[test]
    fn framing_fields_are_parsed_and_never_kept() {
        let (req, meta, framing) = parse_one(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\n",
        )
        .expect("valid")
        .expect("whole");
        assert!(req.headers().get(CONTENT_LENGTH).is_none());
        assert_eq!(meta.declared, Some(5));
        assert!(matches!(framing, Framing::Length(5)));
        let (req, _, framing) =
            parse_one(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
                .expect("valid")
                .expect("whole");
        assert!(req.headers().get(TRANSFER_ENCODING).is_none());
        assert!(matches!(framing, Framing::Chunked(_)));
    }

    #[test]
    fn ambiguous_heads_are_refused_with_their_status() {
        let cases: &[(&[u8], u16)] = &[
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", 400),
            (b"GET a.example:80 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"GET http://u@a/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/3.1\r\nHost: a\r\n\r\n", 505),
            (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
            (b"GET / http/1.1\r\nHost: a\r\n\r\n", 400),
            (b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 501),
        ];
        for (head, status) in cases {
            let err = parse_one(head).expect_err(&String::from_utf8_lossy(head));
            assert_eq!(err.status(), *status, "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn http_1_2_is_served_as_1_1_and_options_star_is_taken() {
        let (req, meta, _) = parse_one(b"GET / HTTP/1.2\r\nHost: a\r\n\r\n")
            .expect("valid")
            .expect("whole");
        assert_eq!(meta.version, Version::HTTP_11);
        assert_eq!(req.uri(), "/");
        let (req, _, _) = parse_one(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n")
            .expect("valid")
            .expect("whole");
        assert_eq!(req.uri(), "*");
    }

    #[test]
    fn an_oversized_target_is_414_and_an_oversized_header_section_431() {
        let mut long_target = b"GET /".to_vec();
        long_target.extend(std::iter::repeat_n(b'a', 9000));
        let err = parse(&mut BytesMut::from(&long_target[..]), 8192, |_| {
            Box::new(Request::new(()))
        })
        .expect_err("too long");
        assert_eq!(err.status(), 414);
        let mut long_field = b"GET / HTTP/1.1\r\nHost: a\r\nx-big: ".to_vec();
        long_field.extend(std::iter::repeat_n(b'a', 9000));
        let err = parse(&mut BytesMut::from(&long_field[..]), 8192, |_| {
            Box::new(Request::new(()))
        })
        .expect_err("too large");
        assert_eq!(err.status(), 431);
    }

    #[test]
    fn only_a_websocket_upgrade_is_one() {
        let (_, meta, _) = parse_one(
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        )
        .expect("valid")
        .expect("whole");
        assert!(meta.websocket);
        let (_, meta, _) = parse_one(
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n",
        )
        .expect("valid")
        .expect("whole");
        assert!(!meta.websocket);
    }

    #[test]
    fn hosts_follow_the_uri_host_grammar() {
        for good in [
            &b"a.example"[..],
            b"a.example:8080",
            b"[::1]:80",
            b"[::1]",
            b"127.0.0.1",
            b"x%41y",
            b"",
        ] {
            assert!(valid_host(good), "{}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"user@a"[..],
            b"a b",
            b"a/b",
            b"a:8x",
            b"[::1",
            b"[zz]",
            b"x%4",
            b"a\\b",
        ] {
            assert!(!valid_host(bad), "{}", String::from_utf8_lossy(bad));
        }
    }
}
