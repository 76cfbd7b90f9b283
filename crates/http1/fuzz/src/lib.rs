//! The fuzz targets' oracle: a strict HTTP/1.1 reader written apart from the engine (httparse
//! for heads, its own framing), which frames only what RFC 9112 allows without doubt. What
//! the engine sends upstream must read the same here; what it cannot read is a finding.

/// One request as the strict reader framed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The method.
    pub method: String,
    /// The request-target.
    pub target: String,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// What the strict reader made of the front of a buffer.
#[derive(Debug)]
pub enum Strict {
    /// A whole message, and the bytes it took.
    Message(Message, usize),
    /// Not yet whole.
    Partial,
    /// Not a message a strict server would frame as the sender meant.
    Invalid(String),
}

/// Fields that never cross a hop (RFC 9110 §7.6.1; `HTTP2-Settings` is connection-specific
/// by RFC 9113 §3.2.1's predecessor, and half of an h2c upgrade).
const FORBIDDEN: [&str; 4] = ["keep-alive", "proxy-connection", "te", "http2-settings"];

/// Reads one request from the front of `buf`, strictly.
pub fn read_request(buf: &[u8]) -> Strict {
    let mut slots = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut slots);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Strict::Partial,
        Err(e) => return Strict::Invalid(format!("head: {e}")),
    };
    if let Some(at) = bare_lf(&buf[..len]) {
        return Strict::Invalid(format!("bare LF in the head at {at}"));
    }
    if req.version != Some(1) {
        return Strict::Invalid("not HTTP/1.1".into());
    }
    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default().to_string();
    if !(target.starts_with('/') || target == "*") {
        return Strict::Invalid(format!("target not origin-form: {target:?}"));
    }
    let (mut hosts, mut lengths, mut codings) = (0, Vec::new(), Vec::new());
    let (mut connection, mut upgrade) = (None, None);
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(h.value).into_owned();
        match name.as_str() {
            "host" => hosts += 1,
            "content-length" => lengths.push(value),
            "transfer-encoding" => codings.push(value),
            "connection" => connection = Some(value.to_ascii_lowercase()),
            "upgrade" => upgrade = Some(value.to_ascii_lowercase()),
            other if FORBIDDEN.contains(&other) => {
                return Strict::Invalid(format!("hop-by-hop field {other} forwarded"));
            }
            _ => {}
        }
    }
    if hosts != 1 {
        return Strict::Invalid(format!("{hosts} Host fields"));
    }
    match (connection.as_deref(), upgrade.as_deref()) {
        (None, None) | (Some("upgrade"), Some("websocket")) => {}
        (c, u) => return Strict::Invalid(format!("connection {c:?} with upgrade {u:?}")),
    }
    let framing = match (lengths.as_slice(), codings.as_slice()) {
        ([], []) => Framing::None,
        ([n], []) => match parse_length(n) {
            Some(n) => Framing::Length(n),
            None => return Strict::Invalid(format!("content-length {n:?}")),
        },
        ([], [c]) if c == "chunked" => Framing::Chunked,
        (l, c) => {
            return Strict::Invalid(format!(
                "framing: content-length {l:?}, transfer-encoding {c:?}"
            ));
        }
    };
    let rest = &buf[len..];
    let (body, used) = match framing {
        Framing::None => (Vec::new(), 0),
        Framing::Length(n) => {
            let Ok(n) = usize::try_from(n) else {
                return Strict::Invalid("length".into());
            };
            if rest.len() < n {
                return Strict::Partial;
            }
            (rest[..n].to_vec(), n)
        }
        Framing::Chunked => match dechunk(rest, false) {
            Dechunked::Whole(body, used) => (body, used),
            Dechunked::Partial => return Strict::Partial,
            Dechunked::Invalid(why) => return Strict::Invalid(format!("chunked: {why}")),
        },
    };
    Strict::Message(
        Message {
            method,
            target,
            body,
        },
        len + used,
    )
}

enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// A strictly chunked body's end.
#[derive(Debug, PartialEq, Eq)]
pub enum Dechunked {
    /// The data, and the bytes the body took (last chunk and trailers included).
    Whole(Vec<u8>, usize),
    /// Not yet whole.
    Partial,
    /// Not chunked as RFC 9112 §7.1 has it.
    Invalid(String),
}

/// Decodes a chunked body: sizes in hex (1-15 digits), every line ended by CRLF. A client's
/// body (`from_client`) may have extensions (as §7.1.1's grammar allows) and any trailer
/// field; a body the gateway wrote has no extensions and no trailer that frames or routes.
pub fn dechunk(buf: &[u8], from_client: bool) -> Dechunked {
    // The engine's limits, which a well-formed body may also exceed (then either answer is
    // right): a chunk line of 4 KiB, a trailer section of 100 fields or 64 KiB.
    const LINE: usize = 4 * 1024;
    const TRAILER_FIELDS: usize = 100;
    const TRAILER_BYTES: usize = 64 * 1024;
    let mut at = 0;
    let mut data = Vec::new();
    loop {
        if find_crlf(&buf[at..]).map_or(buf.len() - at, |n| n) > LINE {
            return Dechunked::Invalid("a chunk line over the limit".into());
        }
        let Some(line_len) = find_crlf(&buf[at..]) else {
            return if buf[at..].contains(&b'\n') {
                Dechunked::Invalid("a chunk line without CRLF".into())
            } else {
                Dechunked::Partial
            };
        };
        let line = &buf[at..at + line_len];
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 || digits > 15 {
            return Dechunked::Invalid(format!("size {:?}", String::from_utf8_lossy(line)));
        }
        let ext = &line[digits..];
        if !ext.is_empty() && !(from_client && ext_ok(ext)) {
            return Dechunked::Invalid(format!("extension {:?}", String::from_utf8_lossy(ext)));
        }
        let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).unwrap_or("x"), 16)
            .unwrap_or(u64::MAX);
        at += line_len + 2;
        if size == 0 {
            // Trailer fields, each `name: value` CRLF, then CRLF.
            let (start, mut fields) = (at, 0);
            loop {
                if at - start > TRAILER_BYTES || fields > TRAILER_FIELDS {
                    return Dechunked::Invalid("a trailer section over the limit".into());
                }
                fields += 1;
                let Some(len) = find_crlf(&buf[at..]) else {
                    return if buf[at..].contains(&b'\n') {
                        Dechunked::Invalid("a trailer line without CRLF".into())
                    } else {
                        Dechunked::Partial
                    };
                };
                let line = &buf[at..at + len];
                at += len + 2;
                if line.is_empty() {
                    return Dechunked::Whole(data, at);
                }
                let Some(colon) = line.iter().position(|&b| b == b':') else {
                    return Dechunked::Invalid("a trailer line without a colon".into());
                };
                let name = &line[..colon];
                if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
                    return Dechunked::Invalid("a trailer name".into());
                }
                let lower = String::from_utf8_lossy(name).to_ascii_lowercase();
                if !from_client
                    && ["content-length", "transfer-encoding", "host"].contains(&lower.as_str())
                {
                    return Dechunked::Invalid(format!("a framing or routing trailer: {lower}"));
                }
                if line[colon + 1..]
                    .iter()
                    .any(|&b| b < 0x20 && b != b'\t' || b == 0x7f)
                {
                    return Dechunked::Invalid("a control byte in a trailer".into());
                }
            }
        }
        let Ok(size) = usize::try_from(size) else {
            return Dechunked::Invalid("size".into());
        };
        let end = at + size;
        match buf.get(end..end + 2) {
            Some(b"\r\n") => {}
            Some(_) => return Dechunked::Invalid("chunk data not followed by CRLF".into()),
            None if buf.len() > end && buf[end] != b'\r' => {
                return Dechunked::Invalid("chunk data not followed by CRLF".into());
            }
            None => return Dechunked::Partial,
        }
        data.extend_from_slice(&buf[at..at + size]);
        at += size + 2;
    }
}

/// `*( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )`, written apart from
/// the engine's version of it. Whitespace may stand before a `;` or an `=` and after them,
/// never at the end: BWS in the grammar always leads to something.
fn ext_ok(ext: &[u8]) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum S {
        /// Before the first `;`, whitespace allowed.
        BeforeSemi,
        BeforeName,
        Name,
        /// Whitespace after a name: an `=` or a `;` must follow.
        AfterName,
        BeforeValue,
        Token,
        Quoted,
        Escaped,
        /// Just past a quoted-string's closing quote.
        Closed,
        /// Whitespace after a value: a `;` must follow.
        AfterValue,
    }
    let mut s = S::BeforeSemi;
    for &b in ext {
        let ws = b == b' ' || b == b'\t';
        s = match (s, b) {
            (
                S::BeforeSemi | S::Name | S::AfterName | S::Token | S::Closed | S::AfterValue,
                b';',
            ) => S::BeforeName,
            (S::BeforeSemi, _) if ws => S::BeforeSemi,
            (S::BeforeName, _) if ws => S::BeforeName,
            (S::BeforeName | S::Name, _) if is_tchar(b) => S::Name,
            (S::Name | S::AfterName, _) if ws => S::AfterName,
            (S::Name | S::AfterName, b'=') => S::BeforeValue,
            (S::BeforeValue, _) if ws => S::BeforeValue,
            (S::BeforeValue, b'"') => S::Quoted,
            (S::BeforeValue | S::Token, _) if is_tchar(b) => S::Token,
            (S::Token | S::Closed | S::AfterValue, _) if ws => S::AfterValue,
            (S::Quoted, b'"') => S::Closed,
            (S::Quoted, b'\\') => S::Escaped,
            (S::Quoted, _) if b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80 => S::Quoted,
            (S::Escaped, _) if b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80 => S::Quoted,
            _ => return false,
        };
    }
    matches!(s, S::Name | S::Token | S::Closed)
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    let lf = buf.iter().position(|&b| b == b'\n')?;
    (lf > 0 && buf[lf - 1] == b'\r' && !buf[..lf - 1].contains(&b'\r')).then(|| lf - 1)
}

fn bare_lf(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find(|&i| buf[i] == b'\n' && (i == 0 || buf[i - 1] != b'\r'))
}

fn parse_length(n: &str) -> Option<u64> {
    (!n.is_empty() && n.len() <= 18 && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_refuses_what_is_ambiguous_and_frames_what_is_not() {
        for bad in [
            &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhello",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x\r\nhello\r\n0\r\n\r\n",
        ] {
            assert!(matches!(read_request(bad), Strict::Invalid(_)), "{}", String::from_utf8_lossy(bad));
        }
        let good = b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-t: 1\r\n\r\nGET";
        match read_request(good) {
            Strict::Message(m, used) => {
                assert_eq!(m.body, b"hello");
                assert_eq!(&good[used..], b"GET");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            dechunk(b"5;a=\"b\\\"c\"; d\r\nhello\r\n0\r\n\r\n", true),
            Dechunked::Whole(b"hello".to_vec(), 30)
        );
    }
}
