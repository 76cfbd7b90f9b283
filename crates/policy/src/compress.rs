//! Response compression per request: which coding a request's `Accept-Encoding` picks
//! among the ones a route offers, and whether its response is compressed (the skip rules)
//! and what its fields become then. Decided from a route's or listener's compiled
//! [`Compress`] (`tailguard_config::compress`); the encoding itself is
//! `tailguard-compress`'s, driven by the gateway's response body.
//!
//! Negotiation (RFC 9110 §12.5.3): each coding offered gets the q-value the request gives
//! it by name (`x-gzip` names gzip), else the one of `*`, else 0 (not acceptable); the
//! highest above 0 wins, a tie goes to the coding listed first in `algorithms`. A request
//! without `Accept-Encoding` gets no coding (as nginx and Caddy do, though the RFC would
//! allow any), and one that refuses them all, `identity;q=0` included, gets the body as it
//! is rather than a `406` (what browsers cope with best).
//!
//! A response is sent as it is when: the request is a `HEAD`, asks `no-transform`, or is
//! gRPC; the status is 1xx, `204`, `304` or `206` (or it has `Content-Range`); the upstream
//! encoded it already (`Content-Encoding`); it says `Cache-Control: no-transform`; its
//! media type is not in `types` (none at all, `application/grpc`); its length is known and
//! below `min_bytes`. A response that could be compressed gets `Vary: Accept-Encoding`
//! whether or not this request accepted a coding, so a cache keeps the variants apart.
//! Compressed, it loses `Content-Length` (its length is not known until the end) and
//! `Accept-Ranges` (ranges of the coded body are not offered), its strong `ETag` becomes
//! weak (the bytes differ from the upstream's; RFC 9110 §8.8.1), and `Content-Encoding`
//! names the coding.
//!
//! `text/event-stream` is compressed only when `types` lists it by name (a `text/*` does
//! not cover it), and then every frame from the upstream is flushed as it comes (a sync
//! flush): an event reaches the page at once, for a worse ratio.

use http::header::{
    ACCEPT_ENCODING, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE,
    CONTENT_TYPE, ETAG, Entry, VARY,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

pub use tailguard_config::compress::{Coding, Compress};

/// What a request of a route with compression accepts, decided from its head before it is
/// forwarded (the head is gone by the time the answer comes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// The coding its `Accept-Encoding` picked (none: the body goes as it is, but an
    /// eligible response still gets `Vary`).
    pub coding: Option<Coding>,
}

/// What a request accepts, or `None` when its response is never compressed nor varied
/// (`HEAD`, `Cache-Control: no-transform`, gRPC). One or two header lookups for a request
/// without `Accept-Encoding`; allocates nothing.
pub fn asked(c: &Compress, method: &Method, headers: &HeaderMap) -> Option<Asked> {
    if method == Method::HEAD || tailguard_http::grpc::is_grpc(headers) || has_no_transform(headers)
    {
        return None;
    }
    let mut accepts = headers.get_all(ACCEPT_ENCODING).iter().peekable();
    if accepts.peek().is_none() {
        return Some(Asked { coding: None });
    }
    Some(Asked {
        coding: negotiate(&c.algorithms, accepts.map(HeaderValue::as_bytes)),
    })
}

/// The coding of `offered` (most preferred first) that `Accept-Encoding` lines pick.
pub fn negotiate<'a>(offered: &[Coding], lines: impl Iterator<Item = &'a [u8]>) -> Option<Coding> {
    // q-values in thousandths, per coding offered and for `*`; `None`: not named.
    let mut named: [Option<u16>; 3] = [None; 3];
    let mut star: Option<u16> = None;
    for line in lines {
        for element in line.split(|&b| b == b',') {
            let mut parts = element.split(|&b| b == b';');
            let token = parts.next().unwrap_or_default().trim_ascii();
            if token.is_empty() {
                continue;
            }
            let mut q = Some(1000);
            for param in parts {
                let param = param.trim_ascii();
                if let Some(value) = param
                    .strip_prefix(b"q=")
                    .or_else(|| param.strip_prefix(b"Q="))
                {
                    q = qvalue(value);
                }
            }
            // An element whose q-value does not parse is ignored, as RFC 9110 lets a
            // recipient do with what it cannot read.
            let Some(q) = q else { continue };
            let slot = if token == b"*" {
                &mut star
            } else if token.eq_ignore_ascii_case(b"gzip") || token.eq_ignore_ascii_case(b"x-gzip") {
                &mut named[0]
            } else if token.eq_ignore_ascii_case(b"br") {
                &mut named[1]
            } else if token.eq_ignore_ascii_case(b"zstd") {
                &mut named[2]
            } else {
                continue;
            };
            // Named twice: the higher counts (a sender that repeats itself means it).
            *slot = Some(slot.map_or(q, |old| old.max(q)));
        }
    }
    let mut best: Option<(Coding, u16)> = None;
    for &coding in offered {
        let index = match coding {
            Coding::Gzip => 0,
            Coding::Br => 1,
            Coding::Zstd => 2,
        };
        let q = named[index].or(star).unwrap_or(0);
        // Strictly greater: a tie keeps the coding offered first.
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((coding, q));
        }
    }
    best.map(|(c, _)| c)
}

/// A q-value (`0`, `0.5`, `1`, `1.000`: RFC 9110 §12.4.2) in thousandths.
fn qvalue(text: &[u8]) -> Option<u16> {
    let (int, frac) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (&text[..dot], &text[dot + 1..]),
        None => (text, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths: u16 = 0;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// `Cache-Control` says `no-transform`.
fn has_no_transform(headers: &HeaderMap) -> bool {
    headers.get_all(CACHE_CONTROL).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|d| d.trim_ascii().eq_ignore_ascii_case(b"no-transform"))
    })
}

/// How a response is to be compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compressing {
    /// The coding, named in its `Content-Encoding`.
    pub coding: Coding,
    /// Flush after every frame (an event stream).
    pub flush: bool,
}

/// What a response gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Sent as it is, its fields untouched (a skip rule that holds whatever the request).
    AsIs,
    /// Sent as it is, with `Vary: Accept-Encoding` (it could be compressed, but this
    /// request accepts no coding offered).
    Vary,
    /// Compressed.
    Compress(Compressing),
}

/// Decides a response's compression by the skip rules, from its status and fields;
/// `length` is the body's length when known (its `Content-Length`, or a body that knows
/// its size). Changes nothing: [`rewrite`] then writes what was decided.
pub fn decide(
    c: &Compress,
    asked: Asked,
    status: StatusCode,
    headers: &HeaderMap,
    length: Option<u64>,
) -> Decision {
    if status.is_informational()
        || matches!(
            status,
            StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED | StatusCode::PARTIAL_CONTENT
        )
        || headers.contains_key(CONTENT_RANGE)
        || headers
            .get_all(CONTENT_ENCODING)
            .iter()
            .any(|v| !v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"identity"))
        || has_no_transform(headers)
    {
        return Decision::AsIs;
    }
    let Some(content_type) = headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes) else {
        return Decision::AsIs;
    };
    if !c.types.matches(content_type) || content_type.starts_with(b"application/grpc") {
        return Decision::AsIs;
    }
    if length
        .or_else(|| length_of(headers))
        .is_some_and(|n| n < c.min_bytes)
    {
        return Decision::AsIs;
    }
    match asked.coding {
        None => Decision::Vary,
        Some(coding) => Decision::Compress(Compressing {
            coding,
            flush: media_type_is(content_type, b"text/event-stream"),
        }),
    }
}

/// A response's `Content-Length`, when it is one number.
pub fn length_of(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Writes a [`Decision`] into a response's fields: `Vary` unless [`Decision::AsIs`], and
/// when compressing `Content-Encoding`, no `Content-Length` nor `Accept-Ranges`, a weak
/// `ETag`.
pub fn rewrite(headers: &mut HeaderMap, decision: Decision) {
    let coding = match decision {
        Decision::AsIs => return,
        Decision::Vary => {
            add_vary(headers);
            return;
        }
        Decision::Compress(how) => how.coding,
    };
    add_vary(headers);
    headers.remove(CONTENT_LENGTH);
    headers.remove(ACCEPT_RANGES);
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    if let Entry::Occupied(mut e) = headers.entry(ETAG) {
        for etag in e.iter_mut() {
            if let Some(weak) = weaken(etag) {
                *etag = weak;
            }
        }
    }
}

/// `Vary: Accept-Encoding`, appended beside the upstream's own `Vary` unless it names it
/// already (or `*`, which covers it).
fn add_vary(headers: &mut HeaderMap) {
    match headers.entry(VARY) {
        Entry::Occupied(mut e) => {
            let named = e.iter().any(|v| {
                v.as_bytes()
                    .split(|&b| b == b',')
                    .map(<[u8]>::trim_ascii)
                    .any(|v| v == b"*" || v.eq_ignore_ascii_case(b"accept-encoding"))
            });
            if !named {
                e.append(HeaderValue::from_static("Accept-Encoding"));
            }
        }
        Entry::Vacant(e) => {
            e.insert(HeaderValue::from_static("Accept-Encoding"));
        }
    }
}

/// A strong entity tag made weak (`"x"` → `W/"x"`); `None` for one weak already.
fn weaken(etag: &HeaderValue) -> Option<HeaderValue> {
    let bytes = etag.as_bytes();
    if bytes.starts_with(b"W/") {
        return None;
    }
    let mut weak = Vec::with_capacity(bytes.len() + 2);
    weak.extend_from_slice(b"W/");
    weak.extend_from_slice(bytes);
    HeaderValue::from_bytes(&weak).ok()
}

/// A `Content-Type` value's media type is `name` (any case, parameters ignored).
fn media_type_is(content_type: &[u8], name: &[u8]) -> bool {
    content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii()
        .eq_ignore_ascii_case(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decides and rewrites, as the gateway does; what was decided to compress with.
    fn respond(
        c: &Compress,
        asked: Asked,
        status: StatusCode,
        headers: &mut HeaderMap,
        length: Option<u64>,
    ) -> Option<Compressing> {
        let decision = decide(c, asked, status, headers, length);
        rewrite(headers, decision);
        match decision {
            Decision::Compress(how) => Some(how),
            _ => None,
        }
    }

    fn compress(text: &str) -> Compress {
        toml::from_str::<tailguard_config::compress::CompressConfig>(text)
            .expect("parses")
            .compile()
            .expect("valid")
    }

    fn pick(offered: &[Coding], accept: &str) -> Option<Coding> {
        negotiate(offered, std::iter::once(accept.as_bytes()))
    }

    const ALL: [Coding; 3] = [Coding::Zstd, Coding::Br, Coding::Gzip];

    #[test]
    fn q_values_pick_the_coding_and_ties_go_to_the_configured_order() {
        use Coding::*;
        for (accept, want) in [
            ("gzip, deflate, br, zstd", Some(Zstd)),
            ("gzip, br", Some(Br)),
            ("gzip", Some(Gzip)),
            ("x-gzip", Some(Gzip)),
            ("GZIP;Q=0.5", Some(Gzip)),
            ("br;q=0.5, gzip;q=0.8", Some(Gzip)),
            ("br;q=1.0, gzip;q=0.999", Some(Br)),
            ("*", Some(Zstd)),
            ("*;q=0.5, br;q=0.4", Some(Zstd)),
            ("*, zstd;q=0", Some(Br)),
            ("gzip;q=0, *;q=0.1", Some(Zstd)),
            ("identity;q=0", None),
            ("identity", None),
            ("", None),
            ("deflate", None),
            ("gzip;q=0", None),
            ("gzip;q=2", None),
            ("gzip;q=0.1234", None),
            ("gzip;q=abc, br", Some(Br)),
            (" , ;q=1, br ; q=0.3 ", Some(Br)),
        ] {
            assert_eq!(pick(&ALL, accept), want, "{accept:?}");
        }
        assert_eq!(pick(&[Gzip, Br], "br, gzip"), Some(Gzip), "our order");
        assert_eq!(pick(&[Gzip], "br, zstd"), None, "only what is offered");
    }

    #[test]
    fn a_head_a_grpc_call_and_no_transform_are_never_compressed() {
        let c = compress("");
        let mut h = HeaderMap::new();
        h.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(asked(&c, &Method::HEAD, &h).is_none());
        assert_eq!(
            asked(&c, &Method::GET, &h),
            Some(Asked {
                coding: Some(Coding::Gzip)
            })
        );
        h.insert(
            CACHE_CONTROL,
            HeaderValue::from_static("max-age=0, No-Transform"),
        );
        assert!(asked(&c, &Method::GET, &h).is_none());
        h.remove(CACHE_CONTROL);
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        assert!(asked(&c, &Method::POST, &h).is_none());
        assert_eq!(
            asked(&c, &Method::GET, &HeaderMap::new()),
            Some(Asked { coding: None })
        );
    }

    fn head(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in fields {
            map.append(*n, HeaderValue::from_static(v));
        }
        map
    }

    const GZIP: Asked = Asked {
        coding: Some(Coding::Gzip),
    };

    #[test]
    fn a_compressed_response_gets_its_coding_vary_and_a_weak_etag() {
        let c = compress("");
        let mut h = head(&[
            ("content-type", "application/json"),
            ("content-length", "5000"),
            ("etag", "\"v1\""),
            ("vary", "Origin"),
            ("accept-ranges", "bytes"),
        ]);
        let out = respond(&c, GZIP, StatusCode::OK, &mut h, None);
        assert_eq!(
            out,
            Some(Compressing {
                coding: Coding::Gzip,
                flush: false
            })
        );
        assert_eq!(h["content-encoding"], "gzip");
        assert!(h.get("content-length").is_none() && h.get("accept-ranges").is_none());
        assert_eq!(h["etag"], "W/\"v1\"");
        let vary: Vec<_> = h.get_all("vary").iter().collect();
        assert_eq!(vary, ["Origin", "Accept-Encoding"]);

        let mut h = head(&[
            ("content-type", "text/html"),
            ("etag", "W/\"v1\""),
            ("vary", "accept-encoding"),
        ]);
        assert!(respond(&c, GZIP, StatusCode::NOT_FOUND, &mut h, None).is_some());
        assert_eq!(h["etag"], "W/\"v1\"", "weak already");
        assert_eq!(h.get_all("vary").iter().count(), 1, "named already");
    }

    #[test]
    fn every_skip_rule_leaves_the_response_as_it_is() {
        let c = compress("");
        let json = ("content-type", "application/json");
        for (status, fields, length) in [
            (204, vec![json], None),
            (304, vec![json], None),
            (206, vec![json, ("content-range", "bytes 0-9/100")], None),
            (200, vec![json, ("content-range", "bytes */100")], None),
            (200, vec![json, ("content-encoding", "br")], None),
            (
                200,
                vec![json, ("cache-control", "public, no-transform")],
                None,
            ),
            (200, vec![("content-type", "image/png")], None),
            (200, vec![("content-type", "application/grpc")], None),
            (200, vec![], None),
            (200, vec![json, ("content-length", "1023")], None),
            (200, vec![json], Some(10)),
            (200, vec![("content-type", "text/event-stream")], None),
        ] {
            let mut h = head(&fields);
            let before = h.clone();
            let status = StatusCode::from_u16(status).expect("status");
            assert_eq!(
                respond(&c, GZIP, status, &mut h, length),
                None,
                "{status} {fields:?}"
            );
            assert_eq!(h, before, "{status} {fields:?}");
        }
    }

    #[test]
    fn an_eligible_response_varies_even_when_the_request_accepted_nothing() {
        let c = compress("");
        let mut h = head(&[("content-type", "application/json")]);
        assert_eq!(
            respond(&c, Asked { coding: None }, StatusCode::OK, &mut h, None),
            None
        );
        assert_eq!(h["vary"], "Accept-Encoding");
        assert!(h.get("content-encoding").is_none());
    }

    #[test]
    fn an_event_stream_listed_by_name_is_flushed_per_frame() {
        let c = compress(r#"types = ["text/event-stream"]"#);
        let mut h = head(&[("content-type", "text/event-stream; charset=utf-8")]);
        assert_eq!(
            respond(&c, GZIP, StatusCode::OK, &mut h, None),
            Some(Compressing {
                coding: Coding::Gzip,
                flush: true
            })
        );
    }
}
