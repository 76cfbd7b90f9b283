//! The response head: parsed from the connection's buffer (interim 1xx skipped), its fields
//! kept as lines or in a map, and its body's framing decided by RFC 9112 §6.3.

use bytes::{Buf, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};

use super::raw_fields::RawFields;
use crate::fields;
use crate::framing::{Chunk, Framing, MAX_HEADERS};
use crate::recycle;

/// A response head (or trailer section) larger than this is refused as broken.
pub(super) const MAX_HEAD_BYTES: usize = 64 * 1024;
pub(super) const TOO_LARGE: &str = "response head larger than 64 KiB";

/// A parsed response head, and how its body is framed.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    pub(super) fields: Fields,
    pub(super) framing: Framing,
    pub(super) keep_alive: bool,
}

/// A response head's fields: as the upstream sent them, or in a map.
#[derive(Debug)]
pub(super) enum Fields {
    /// The common head (no `Connection`, not a `101`): kept as its lines, which an HTTP/1.1
    /// downstream writes out as they are, without a `HeaderMap` being built and torn down.
    Raw(RawFields),
    Map(HeaderMap),
}

/// The response-head parser as the client runs it, for the fuzz targets: the status, how
/// the body is framed and whether the connection may be reused, or `None` for more bytes.
#[doc(hidden)]
pub fn parse_response_head(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<(StatusCode, Framing, bool)>, String> {
    Ok(parse_head(buf, head_request)?.map(|head| (head.status, head.framing, head.keep_alive)))
}

/// Parses a whole response head from the front of `buf` (consuming it) or returns `None`
/// for more bytes. Interim 1xx heads are consumed and skipped.
pub(super) fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, String> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        // Most heads have a handful of fields: parse with room for 16 first (its slots are
        // initialised on every call), and only a head with more pays for the full 100.
        let parsed = match parse_with::<16>(buf, head_request) {
            Err(Parse::TooManyHeaders) => parse_with::<MAX_HEADERS>(buf, head_request),
            other => other,
        };
        match parsed {
            Ok(Some(head)) => return Ok(Some(head)),
            Ok(None) => return Ok(None),
            Err(Parse::Interim) => continue,
            Err(Parse::TooManyHeaders) => {
                return Err(format!("more than {MAX_HEADERS} response header fields"));
            }
            Err(Parse::Invalid(reason)) => return Err(reason),
        }
    }
}

/// Why [`parse_with`] gave no head.
#[derive(Debug)]
enum Parse {
    /// A 1xx other than 101 was consumed: parse again.
    Interim,
    TooManyHeaders,
    Invalid(String),
}

/// What a response's framing and its writing downstream depend on, read from its fields in
/// one pass over the parsed names (a length test and a case-insensitive compare each).
#[derive(Debug)]
struct FramingFields {
    /// A `Connection` field names a field that must be removed beyond the fixed hop-by-hop
    /// ones (which the raw writer leaves out anyway): only then does the response need a map.
    /// `Connection: keep-alive` (nginx sends it on every HTTP/1.1 response) names none.
    connection_names_more: bool,
    /// `close` is among its tokens.
    close: bool,
    /// A field named `Close` is present (which a `close` token would name).
    close_field: bool,
    /// With `Transfer-Encoding`: whether the last coding of the last such field is chunked.
    chunked_last: Option<bool>,
    /// A `Content-Length` field is present.
    content_length: bool,
    /// More than one `Content-Length` field, or a list in one.
    length_repeated: bool,
    /// Its value (one number, however many fields and comma-separated copies carry it), or
    /// why it is invalid.
    length: Result<Option<u64>, &'static str>,
    /// A `Date` field is present.
    date: bool,
    /// A `Vary` field is present.
    vary: bool,
    /// A field named `Access-Control-*` (CORS) is present.
    access_control: bool,
}

impl FramingFields {
    fn scan<'a>(fields: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> FramingFields {
        let mut f = FramingFields {
            connection_names_more: false,
            close: false,
            close_field: false,
            chunked_last: None,
            content_length: false,
            length_repeated: false,
            length: Ok(None),
            date: false,
            vary: false,
            access_control: false,
        };
        for (name, value) in fields {
            if name.eq_ignore_ascii_case(b"content-length") {
                f.length_repeated |= f.content_length || value.contains(&b',');
                f.content_length = true;
                for part in value.split(|&b| b == b',') {
                    let n = std::str::from_utf8(part.trim_ascii())
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok());
                    f.length = match (f.length, n) {
                        (Err(e), _) => Err(e),
                        (_, None) => Err("invalid content-length"),
                        (Ok(Some(l)), Some(n)) if l != n => {
                            Err("conflicting content-length values")
                        }
                        (Ok(_), Some(n)) => Ok(Some(n)),
                    };
                }
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                let last = value.rsplit(|&b| b == b',').next().unwrap_or(&[]);
                f.chunked_last = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        f.close = true;
                    } else if !token.is_empty() && !fields::is_hop_by_hop_name(token) {
                        f.connection_names_more = true;
                    }
                }
            } else if name.eq_ignore_ascii_case(b"date") {
                f.date = true;
            } else if name.eq_ignore_ascii_case(b"close") {
                f.close_field = true;
            } else if name.eq_ignore_ascii_case(b"vary") {
                f.vary = true;
            } else if name.len() > 15 && name[..15].eq_ignore_ascii_case(b"access-control-") {
                f.access_control = true;
            }
        }
        // `Connection: close` with a `Close` field names that field too.
        f.connection_names_more |= f.close && f.close_field;
        f
    }
}

fn parse_with<const N: usize>(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<Head>, Parse> {
    let mut slots = [httparse::EMPTY_HEADER; N];
    let mut parsed = httparse::Response::new(&mut slots);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD_BYTES => {
            return Err(Parse::Invalid(TOO_LARGE.to_string()));
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Parse::TooManyHeaders),
        Err(e) => return Err(Parse::Invalid(format!("invalid response head: {e}"))),
    };
    let code = parsed.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| Parse::Invalid(format!("invalid response status {code}")))?;
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        buf.advance(len);
        return Err(Parse::Interim);
    }
    let found = FramingFields::scan(parsed.headers.iter().map(|h| (h.name.as_bytes(), h.value)));
    let (framing, keep_alive) =
        response_framing(status, version, &found, head_request).map_err(Parse::Invalid)?;
    let base = buf.as_ptr() as usize;
    if !found.connection_names_more && status != StatusCode::SWITCHING_PROTOCOLS {
        // The field lines, from the first name to before the head's empty line, kept as
        // they are: no map, no value slices (each a reference count taken and dropped).
        let first = parsed
            .headers
            .first()
            .map_or(len, |h| h.name.as_ptr() as usize - base);
        // Each line's start (from the first name) and whether it is hop-by-hop, taken while
        // the parsed names still borrow `buf`.
        let mut starts = [(0u32, false); N];
        let count = parsed.headers.len();
        let mut any_hop = false;
        for (start, h) in starts.iter_mut().zip(parsed.headers.iter()) {
            let hop = fields::is_hop_by_hop_name(h.name.as_bytes());
            any_hop |= hop;
            *start = ((h.name.as_ptr() as usize - base - first) as u32, hop);
        }
        let blank = if buf[..len].ends_with(b"\r\n") { 2 } else { 1 };
        let mut lines = buf.split_to(len);
        lines.truncate(len - blank);
        lines.advance(first.min(lines.len()));
        // The hop-by-hop lines (nginx's `Connection: keep-alive`) are taken out here, once,
        // by moving the later lines down over them (the lines are contiguous: the parser
        // refuses obsolete line folding). Then the usual head, every line ending in CRLF,
        // is written downstream in one copy instead of a scan for lines to leave out.
        let mut crlf = true;
        let mut kept = 0;
        for i in 0..count {
            let (start, hop) = (starts[i].0 as usize, starts[i].1);
            let end = starts
                .get(i + 1)
                .filter(|_| i + 1 < count)
                .map_or(lines.len(), |s| s.0 as usize);
            if hop {
                continue;
            }
            crlf &= lines[..end].ends_with(b"\r\n");
            if any_hop && kept != start {
                lines.copy_within(start..end, kept);
            }
            kept += end - start;
        }
        lines.truncate(kept);
        return Ok(Some(Head {
            status,
            version,
            fields: Fields::Raw(RawFields {
                lines: lines.freeze(),
                crlf,
                has_length: found.content_length,
                length_exact: found.content_length
                    && !found.length_repeated
                    && found.chunked_last.is_none()
                    && matches!(found.length, Ok(Some(_))),
                has_date: found.date,
                has_vary: found.vary,
                has_access_control: found.access_control,
            }),
            framing,
            keep_alive,
        }));
    }
    // A `Connection` field that names more hop-by-hop fields, and a `101`, looked into by
    // the gateway: both get a map. Offsets first (the parsed slices borrow `buf`), then the
    // head becomes shared bytes and each value a slice of it: no copy per header value.
    let mut spans = [(0u32, 0u32, 0u32, 0u32); N];
    let count = parsed.headers.len();
    for (span, h) in spans.iter_mut().zip(parsed.headers.iter()) {
        let name = h.name.as_ptr() as usize - base;
        let value = h.value.as_ptr() as usize - base;
        *span = (
            name as u32,
            (name + h.name.len()) as u32,
            value as u32,
            (value + h.value.len()) as u32,
        );
    }
    let head = buf.split_to(len).freeze();
    // Room for the `Via` the gateway appends without a regrow; a map that served an
    // earlier response if the thread has one (`recycle`).
    let mut headers = recycle::header_map(count + 1);
    for &(n0, n1, v0, v1) in &spans[..count] {
        let name = HeaderName::from_bytes(&head[n0 as usize..n1 as usize])
            .map_err(|_| Parse::Invalid("invalid response header name".to_string()))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0 as usize..v1 as usize))
            .map_err(|_| Parse::Invalid("invalid response header value".to_string()))?;
        headers.append(name, value);
    }
    Ok(Some(Head {
        status,
        version,
        fields: Fields::Map(headers),
        framing,
        keep_alive,
    }))
}

/// RFC 9112 §6.3: how the response body is delimited, and whether the connection may carry
/// another exchange after it.
fn response_framing(
    status: StatusCode,
    version: Version,
    found: &FramingFields,
    head_request: bool,
) -> Result<(Framing, bool), String> {
    let mut keep_alive = version == Version::HTTP_11 && !found.close;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Ok((Framing::Done, false));
    }
    if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((Framing::Done, keep_alive));
    }
    if let Some(chunked_last) = found.chunked_last {
        // With both, Transfer-Encoding wins and the connection cannot be trusted after.
        if found.content_length {
            keep_alive = false;
        }
        return Ok(if chunked_last {
            (Framing::Chunked(Chunk::Size), keep_alive)
        } else {
            (Framing::UntilClose, false)
        });
    }
    Ok(match found.length.map_err(str::to_string)? {
        Some(0) => (Framing::Done, keep_alive),
        Some(n) => (Framing::Length(n), keep_alive),
        None => (Framing::UntilClose, false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_framing_follows_rfc_9112() {
        let h = |pairs: &[(&str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(
                    HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                );
            }
            m
        };
        let ok = StatusCode::OK;
        let v11 = Version::HTTP_11;
        let framing = |s, v, m: &HeaderMap, head| {
            let found =
                FramingFields::scan(m.iter().map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes())));
            response_framing(s, v, &found, head)
        };
        let (f, keep) = framing(ok, v11, &h(&[("content-length", "5")]), false).expect("ok");
        assert!(matches!(f, Framing::Length(5)) && keep);
        let (f, keep) = framing(ok, v11, &h(&[("content-length", "5")]), true).expect("ok");
        assert!(matches!(f, Framing::Done) && keep, "HEAD has no body");
        let (f, _) = framing(
            StatusCode::NOT_MODIFIED,
            v11,
            &h(&[("content-length", "5")]),
            false,
        )
        .expect("ok");
        assert!(matches!(f, Framing::Done));
        let te = h(&[
            ("transfer-encoding", "gzip, chunked"),
            ("content-length", "5"),
        ]);
        let (f, keep) = framing(ok, v11, &te, false).expect("ok");
        assert!(
            matches!(f, Framing::Chunked(_)) && !keep,
            "TE wins, connection closed after"
        );
        let (f, keep) = framing(ok, v11, &h(&[("transfer-encoding", "gzip")]), false).expect("ok");
        assert!(matches!(f, Framing::UntilClose) && !keep);
        let (f, keep) = framing(ok, v11, &h(&[]), false).expect("ok");
        assert!(matches!(f, Framing::UntilClose) && !keep);
        let (_, keep) = framing(
            ok,
            v11,
            &h(&[("connection", "Close"), ("content-length", "0")]),
            false,
        )
        .expect("ok");
        assert!(!keep);
        let (_, keep) =
            framing(ok, Version::HTTP_10, &h(&[("content-length", "1")]), false).expect("ok");
        assert!(!keep, "HTTP/1.0 responses close");
        assert!(framing(ok, v11, &h(&[("content-length", "5, 6")]), false).is_err());
        assert!(framing(ok, v11, &h(&[("content-length", "x")]), false).is_err());
        let (f, _) = framing(ok, v11, &h(&[("content-length", "7, 7")]), false).expect("ok");
        assert!(matches!(f, Framing::Length(7)));
    }

    /// A parsed head's fields in a map, however they were kept.
    fn map_of(head: Head) -> HeaderMap {
        match head.fields {
            Fields::Raw(raw) => {
                let mut map = HeaderMap::new();
                raw.append_to(&mut map);
                map
            }
            Fields::Map(map) => map,
        }
    }

    #[test]
    fn interim_responses_are_skipped_and_values_share_the_head() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhi"[..],
        );
        let head = parse_head(&mut buf, false)
            .expect("valid")
            .expect("complete");
        assert_eq!(head.status, StatusCode::OK);
        assert!(matches!(head.framing, Framing::Length(2)));
        let headers = map_of(head);
        assert_eq!(headers["x-a"], "b");
        assert!(!headers.contains_key("link"));
        assert_eq!(&buf[..], b"hi");
        let mut partial = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Le"[..]);
        assert!(parse_head(&mut partial, false).expect("valid").is_none());
        let mut bad = BytesMut::from(&b"HTTP/1.1 2x0 OK\r\n\r\n"[..]);
        assert!(parse_head(&mut bad, false).is_err());
    }

    #[test]
    fn the_lines_say_whether_a_vary_or_a_cors_field_is_among_them() {
        let raw = |head: &str| {
            let head = parse_head(&mut BytesMut::from(head.as_bytes()), false)
                .expect("valid")
                .expect("complete");
            let Fields::Raw(raw) = head.fields else {
                panic!("raw lines");
            };
            (raw.has_vary, raw.has_access_control)
        };
        assert_eq!(
            raw("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            (false, false)
        );
        assert_eq!(
            raw(
                "HTTP/1.1 200 OK\r\nVARY: Origin\r\nAccess-Control-Allow-Origin: *\r\nContent-Length: 0\r\n\r\n"
            ),
            (true, true)
        );
        // `Access-Control` alone is no CORS field; `Varying` is no `Vary`.
        assert_eq!(
            raw("HTTP/1.1 200 OK\r\nVarying: 1\r\nAccess-Control-: 1\r\nContent-Length: 0\r\n\r\n"),
            (false, false)
        );
    }

    #[test]
    fn a_connection_field_naming_only_hop_by_hop_fields_keeps_the_lines_raw() {
        let parse = |head: &str| {
            parse_head(&mut BytesMut::from(head.as_bytes()), false)
                .expect("valid")
                .expect("complete")
        };
        // nginx's `Connection: keep-alive` (and a `Keep-Alive` it names): no map, and neither
        // line is written downstream.
        let head = parse(
            "HTTP/1.1 200 OK\r\nServer: nginx\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(head.keep_alive);
        let Fields::Raw(raw) = &head.fields else {
            panic!("a map for `Connection: keep-alive`");
        };
        let mut out = Vec::new();
        raw.write_to(&mut out, true);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "Server: nginx\r\nContent-Length: 0\r\n"
        );
        out.clear();
        raw.write_to(&mut out, false);
        assert_eq!(String::from_utf8_lossy(&out), "Server: nginx\r\n");
        // Bare LF line ends, hop-by-hop lines first, last and in between: the same lines
        // leave, each with CRLF.
        let bare = parse(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive\nA: 1\nTE: trailers\r\nB:  2 \r\nContent-Length: 0\nKeep-Alive: timeout=5\r\n\r\n",
        );
        let Fields::Raw(raw) = &bare.fields else {
            panic!("a map for `Connection: keep-alive`");
        };
        let mut out = Vec::new();
        raw.write_to(&mut out, true);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "A: 1\r\nB:  2 \r\nContent-Length: 0\r\n"
        );
        let closing = parse("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
        assert!(!closing.keep_alive);
        assert!(matches!(closing.fields, Fields::Raw(_)));
        // A field the `Connection` field names is removed from a map, as before.
        for named in [
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nConnection: close\r\nClose: 1\r\nContent-Length: 0\r\n\r\n",
        ] {
            assert!(matches!(parse(named).fields, Fields::Map(_)), "{named}");
        }
    }

    #[test]
    fn heads_with_many_fields_parse_up_to_the_limit() {
        let head = |fields: usize| {
            let mut h = b"HTTP/1.1 200 OK\r\n".to_vec();
            for i in 0..fields {
                h.extend_from_slice(format!("x-f{i}: {i}\r\n").as_bytes());
            }
            h.extend_from_slice(b"content-length: 0\r\n\r\n");
            BytesMut::from(&h[..])
        };
        let parsed = parse_head(&mut head(40), false)
            .expect("valid")
            .expect("complete");
        let headers = map_of(parsed);
        assert_eq!(headers.len(), 41);
        assert_eq!(headers["x-f39"], "39");
        assert!(parse_head(&mut head(MAX_HEADERS), false).is_err());
    }
}
