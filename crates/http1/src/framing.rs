//! HTTP/1.1 message-body framing (RFC 9112 §6, §7.1), shared by the upstream client (response
//! bodies) and the downstream server (request bodies): length-delimited, chunked with
//! extensions and trailers, or until close, decoded in place from a read buffer that both
//! sides fill the same way ([`poll_fill`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, HOST};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;
use tokio::io::AsyncRead;

/// Read sizes: start small (most messages are a few hundred bytes), grow while reads fill
/// the buffer (a large body), shrink back when they stop.
pub const MIN_READ: usize = 8 * 1024;
pub(crate) const MAX_READ: usize = 128 * 1024;

/// Reads more bytes into `buf`, sized by how full the last reads came back (`read_size`,
/// adjusted here); `Ok(0)` is the peer's end of stream.
pub fn poll_fill<R: AsyncRead + Unpin + ?Sized>(
    io: &mut R,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
    read_size: &mut usize,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < *read_size / 2 {
        buf.reserve(*read_size);
    }
    let room = buf.capacity() - buf.len();
    let n = ready!(tokio_util::io::poll_read_buf(Pin::new(io), cx, buf))?;
    if n == room {
        *read_size = (*read_size * 2).min(MAX_READ);
    } else if n < room / 4 {
        *read_size = (*read_size / 2).max(MIN_READ);
    }
    Poll::Ready(Ok(n))
}

/// Header lines a head (or trailer section) may have (hyper's default as well).
pub const MAX_HEADERS: usize = 100;
/// A trailer section larger than this is refused as broken.
const MAX_TRAILER_BYTES: usize = 64 * 1024;
/// A chunk-size line (with extensions) longer than this is refused as broken.
const MAX_CHUNK_LINE: usize = 4 * 1024;

/// How much of a message body is left.
#[derive(Debug)]
pub enum Framing {
    /// This many bytes are left.
    Length(u64),
    /// Chunked, the parser where it is.
    Chunked(Chunk),
    /// Until the peer closes (a response without length).
    UntilClose,
    /// The body has ended (or there is none).
    Done,
}

/// Where a chunked body's parser is.
#[derive(Debug, Clone, Copy)]
pub enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk, before the trailer section's end.
    Trailers,
}

/// What one parsing step over the buffered bytes gave.
#[derive(Debug)]
pub enum Step {
    /// A data or trailers frame.
    Frame(Frame<Bytes>),
    /// State moved on without a frame; step again.
    Again,
    /// The buffer holds too little; read more.
    NeedMore,
}

/// Takes the next frame of the body out of `buf` if it holds one.
pub fn step(framing: &mut Framing, buf: &mut BytesMut) -> Result<Step, String> {
    match framing {
        Framing::Done => Ok(Step::Again),
        Framing::UntilClose => {
            if buf.is_empty() {
                return Ok(Step::NeedMore);
            }
            Ok(Step::Frame(Frame::data(buf.split().freeze())))
        }
        Framing::Length(left) => {
            if buf.is_empty() {
                return Ok(Step::NeedMore);
            }
            let take = (*left).min(buf.len() as u64);
            *left -= take;
            let data = buf.split_to(take as usize).freeze();
            if *left == 0 {
                *framing = Framing::Done;
            }
            Ok(Step::Frame(Frame::data(data)))
        }
        Framing::Chunked(chunk) => match *chunk {
            Chunk::Size => {
                let Some(end) = buf.iter().position(|&b| b == b'\n') else {
                    return if buf.len() > MAX_CHUNK_LINE {
                        Err("chunk-size line too long".to_string())
                    } else {
                        Ok(Step::NeedMore)
                    };
                };
                // CRLF only: a bare LF ending a chunk line is where lenient and strict parsers
                // part ways (Kettle 2025), so it is refused, not guessed at.
                let Some(line) = buf[..end].strip_suffix(b"\r") else {
                    return Err("chunk-size line not ended by CRLF".to_string());
                };
                let size = parse_chunk_size(line)?;
                buf.advance(end + 1);
                *chunk = if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                };
                Ok(Step::Again)
            }
            Chunk::Data(left) => {
                if buf.is_empty() {
                    return Ok(Step::NeedMore);
                }
                let take = left.min(buf.len() as u64);
                let data = buf.split_to(take as usize).freeze();
                *chunk = if take == left {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left - take)
                };
                Ok(Step::Frame(Frame::data(data)))
            }
            Chunk::DataEnd => {
                if buf.starts_with(b"\r\n") {
                    buf.advance(2);
                } else if buf.len() >= 2 || (buf.len() == 1 && buf[0] != b'\r') {
                    return Err("chunk data not followed by CRLF".to_string());
                } else {
                    return Ok(Step::NeedMore);
                }
                *chunk = Chunk::Size;
                Ok(Step::Again)
            }
            Chunk::Trailers => {
                let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                match httparse::parse_headers(buf, &mut slots) {
                    Ok(httparse::Status::Complete((len, fields))) => {
                        // CRLF only, as for the chunk lines (httparse takes a bare LF).
                        if (0..len).any(|i| buf[i] == b'\n' && (i == 0 || buf[i - 1] != b'\r')) {
                            return Err("trailer section line not ended by CRLF".to_string());
                        }
                        let mut trailers = HeaderMap::new();
                        for f in fields {
                            if let (Ok(name), Ok(value)) = (
                                HeaderName::from_bytes(f.name.as_bytes()),
                                HeaderValue::from_bytes(f.value),
                            ) {
                                trailers.append(name, value);
                            }
                        }
                        buf.advance(len);
                        *framing = Framing::Done;
                        Ok(if trailers.is_empty() {
                            Step::Again
                        } else {
                            Step::Frame(Frame::trailers(trailers))
                        })
                    }
                    Ok(httparse::Status::Partial) if buf.len() > MAX_TRAILER_BYTES => {
                        Err("trailer section larger than 64 KiB".to_string())
                    }
                    Ok(httparse::Status::Partial) => Ok(Step::NeedMore),
                    Err(e) => Err(format!("invalid trailer section: {e}")),
                }
            }
        },
    }
}

/// The hex size of a chunk-size line without its CRLF (`1a;ext=1`), its extensions checked
/// against RFC 9112 §7.1.1 and ignored: `chunk-size *( BWS ";" BWS name [ BWS "=" BWS
/// ( token / quoted-string ) ] )`. Whitespace is allowed only where that grammar has it,
/// never around a bare size.
fn parse_chunk_size(line: &[u8]) -> Result<u64, String> {
    let invalid = || "invalid chunk size".to_string();
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(invalid());
    }
    let size = line[..digits].iter().fold(0u64, |size, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        size * 16 + u64::from(v)
    });
    if !extensions_valid(&line[digits..]) {
        return Err("invalid chunk extension".to_string());
    }
    Ok(size)
}

/// Whether `rest` is a well-formed (possibly empty) list of chunk extensions.
fn extensions_valid(mut rest: &[u8]) -> bool {
    let bws = |s: &[u8]| -> usize { s.iter().take_while(|&&b| b == b' ' || b == b'\t').count() };
    let token = |s: &[u8]| -> usize { s.iter().take_while(|&&b| is_tchar(b)).count() };
    while !rest.is_empty() {
        rest = &rest[bws(rest)..];
        let Some(after) = rest.strip_prefix(b";") else {
            return false;
        };
        rest = &after[bws(after)..];
        let name = token(rest);
        if name == 0 {
            return false;
        }
        rest = &rest[name..];
        let ws = bws(rest);
        if rest[ws..].first() != Some(&b'=') {
            continue;
        }
        rest = &rest[ws + 1..];
        rest = &rest[bws(rest)..];
        if let Some(quoted) = rest.strip_prefix(b"\"") {
            let Some(len) = quoted_string_len(quoted) else {
                return false;
            };
            rest = &quoted[len..];
        } else {
            let value = token(rest);
            if value == 0 {
                return false;
            }
            rest = &rest[value..];
        }
    }
    true
}

/// The length of a quoted-string's rest after its opening quote, through its closing quote
/// (RFC 9110 §5.6.4: qdtext or quoted-pair), or `None` if it does not close.
fn quoted_string_len(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'"' => return Some(i + 1),
            b'\\'
                if s.get(i + 1)
                    .is_some_and(|&b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80) =>
            {
                i += 2
            }
            b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff => i += 1,
            _ => return None,
        }
    }
    None
}

/// RFC 9110 §5.6.2's tchar.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// One field line, `name: value\r\n`, as heads and trailer sections carry it.
#[inline]
pub fn push_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked body: the last chunk, the trailer fields that may be forwarded, and
/// the final empty line. Fields that frame, route or control the connection are not
/// forwarded in a trailer section (RFC 9110 §6.5.1: they must be known before the content).
pub fn push_last_chunk(out: &mut Vec<u8>, trailers: Option<&HeaderMap>) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        if !crate::fields::is_hop_by_hop(name) && name != CONTENT_LENGTH && name != HOST {
            push_field(out, name, value);
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// A chunk's size line, `<hex>\r\n`, without the formatting machinery of `format!`.
pub fn chunk_size_line(len: usize) -> Bytes {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut line = [0u8; 18];
    let mut at = 16;
    let mut rest = len;
    loop {
        at -= 1;
        line[at] = HEX[rest & 0xf];
        rest >>= 4;
        if rest == 0 {
            break;
        }
    }
    line[16] = b'\r';
    line[17] = b'\n';
    Bytes::copy_from_slice(&line[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(framing: &mut Framing, buf: &mut BytesMut) -> (Vec<u8>, Option<HeaderMap>, bool) {
        let mut data = Vec::new();
        let mut trailers = None;
        loop {
            match step(framing, buf).expect("valid framing") {
                Step::Frame(f) => match f.into_data() {
                    Ok(d) => data.extend_from_slice(&d),
                    Err(f) => trailers = f.into_trailers().ok(),
                },
                Step::Again if matches!(framing, Framing::Done) => return (data, trailers, true),
                Step::Again => {}
                Step::NeedMore => return (data, trailers, false),
            }
        }
    }

    #[test]
    fn chunked_body_decodes_across_any_split_with_extensions_and_trailers() {
        let wire = b"5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-sum: 9\r\n\r\n";
        // Every split point: the parser must give the same result however reads fall.
        for cut in 0..wire.len() {
            let mut framing = Framing::Chunked(Chunk::Size);
            let mut buf = BytesMut::from(&wire[..cut]);
            let (mut data, mut trailers, done) = drain(&mut framing, &mut buf);
            assert!(!done || cut == wire.len());
            buf.extend_from_slice(&wire[cut..]);
            let (rest, more, done) = drain(&mut framing, &mut buf);
            data.extend_from_slice(&rest);
            trailers = trailers.or(more);
            assert!(done, "cut at {cut}");
            assert_eq!(data, b"helloabcdefghijklmnopqrstuvwxyz", "cut at {cut}");
            assert_eq!(trailers.expect("trailers")["x-sum"], "9");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn chunk_size_lines_are_lowercase_hex_and_parse_back() {
        for len in [
            1usize,
            9,
            10,
            255,
            4096,
            65_536,
            0xdead_beef,
            usize::MAX >> 4,
        ] {
            let line = chunk_size_line(len);
            assert_eq!(&line[..], format!("{len:x}\r\n").as_bytes());
            assert_eq!(parse_chunk_size(&line[..line.len() - 2]), Ok(len as u64));
        }
    }

    #[test]
    fn bad_chunk_sizes_are_errors() {
        for line in [
            &b"zz"[..],
            b"",
            b"1234567890abcdef0",
            b";ext",
            b" 5",
            b"5 ",
            b"0x5",
            b"-5",
            b"5;",
            b"5;a=",
            b"5;a=\"b",
            b"5;a b",
            b"5\r",
            b"5;a=\"\x01\"",
            // BWS in the grammar always leads to a `;` or an `=`: none may end the line.
            b"0;a ",
            b"0;a=b\t",
            b"0;a=\"b\" ",
        ] {
            assert!(
                parse_chunk_size(line).is_err(),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(parse_chunk_size(b"fF ; x=y"), Ok(255));
        assert_eq!(parse_chunk_size(b"5;a;b=c ;d = \"q \\\" r\""), Ok(5));
    }

    #[test]
    fn chunk_lines_end_in_crlf_only() {
        for wire in [&b"5\nhello\r\n0\r\n\r\n"[..], b"5\r\nhello\n0\r\n\r\n"] {
            let mut framing = Framing::Chunked(Chunk::Size);
            let mut buf = BytesMut::from(wire);
            let failed = loop {
                match step(&mut framing, &mut buf) {
                    Err(_) => break true,
                    Ok(Step::NeedMore) => break false,
                    Ok(_) if matches!(framing, Framing::Done) => break false,
                    Ok(_) => {}
                }
            };
            assert!(failed, "{}", String::from_utf8_lossy(wire));
        }
    }
}
