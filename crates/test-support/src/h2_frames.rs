//! A raw HTTP/2 client: writes exact frames (HPACK by hand) and reads what comes back, for
//! requests a real client refuses to send (connection-specific fields, a `content-length`
//! that disagrees with the DATA).
//!
//! Header blocks use only HPACK's "literal field without indexing, new name" with plain
//! (non-Huffman) strings (RFC 7541 §6.2.2): every field is spelled out, no table is touched,
//! so the bytes on the wire are exactly the fields given. Responses are read far enough to
//! tell a status from a reset.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// The error code of `PROTOCOL_ERROR` (RFC 9113 §7).
pub const PROTOCOL_ERROR: u32 = 0x1;

/// One frame: its 9-byte header's fields and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Frame {
    /// Frame type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream identifier.
    pub stream: u32,
    /// Payload.
    pub payload: Vec<u8>,
}

/// A frame with its header.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a test frame is under 16 MiB");
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `n`-bit prefix, the prefix's other bits set to `high`.
fn hpack_int(out: &mut Vec<u8>, high: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// An HPACK header block: each field a literal without indexing with a new name, strings
/// not Huffman-coded. Names and values go out exactly as given (pseudo-fields included).
pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        hpack_int(&mut out, 0x00, 7, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_int(&mut out, 0x00, 7, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// A HEADERS frame carrying `fields` whole (END_HEADERS), ending the stream if `end_stream`.
pub fn headers_frame(stream: u32, fields: &[(&str, &str)], end_stream: bool) -> Vec<u8> {
    let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
    frame(HEADERS, flags, stream, &header_block(fields))
}

/// A DATA frame, ending the stream if `end_stream`.
pub fn data_frame(stream: u32, data: &[u8], end_stream: bool) -> Vec<u8> {
    frame(DATA, if end_stream { END_STREAM } else { 0 }, stream, data)
}

/// How the server ended a stream, as far as the client saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// A response head with this status.
    Status(u16),
    /// RST_STREAM with this error code.
    Reset(u32),
    /// GOAWAY (the whole connection) with this error code.
    GoAway(u32),
    /// The connection closed with no answer on the stream.
    Closed,
}

/// A raw HTTP/2 connection (h2c with prior knowledge).
#[derive(Debug)]
pub struct H2Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl H2Client {
    /// Connects, and sends the preface and an empty SETTINGS frame.
    pub async fn connect(addr: SocketAddr) -> H2Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let _ = stream.set_nodelay(true);
        let mut client = H2Client {
            stream,
            buf: Vec::new(),
        };
        let mut opening = PREFACE.to_vec();
        opening.extend_from_slice(&frame(SETTINGS, 0, 0, &[]));
        client.send(&opening).await;
        client
    }

    /// Writes `bytes` (frames) in one write.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write frames");
    }

    /// The next frame from the server (a SETTINGS frame is acknowledged as it passes);
    /// `None` when the connection closed.
    pub async fn next_frame(&mut self) -> Option<H2Frame> {
        loop {
            if self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + len {
                    let head: Vec<u8> = self.buf.drain(..9).collect();
                    let payload = self.buf.drain(..len).collect();
                    let f = H2Frame {
                        kind: head[3],
                        flags: head[4],
                        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]])
                            & 0x7fff_ffff,
                        payload,
                    };
                    if f.kind == SETTINGS && f.flags & ACK == 0 {
                        self.send(&frame(SETTINGS, ACK, 0, &[])).await;
                    }
                    return Some(f);
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads until `stream` gets a response head or a reset, or the connection ends.
    pub async fn end_of(&mut self, stream: u32) -> StreamEnd {
        while let Some(f) = self.next_frame().await {
            let code = |p: &[u8]| u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
            match f.kind {
                HEADERS if f.stream == stream => return StreamEnd::Status(status_of(&f.payload)),
                RST_STREAM if f.stream == stream => return StreamEnd::Reset(code(&f.payload)),
                GOAWAY => return StreamEnd::GoAway(code(&f.payload[4..])),
                _ => {}
            }
        }
        StreamEnd::Closed
    }
}

/// The `:status` of a response header block, which a server sends first (RFC 9113
/// §8.3): an indexed static entry (8..=14), or a literal with such a name and a plain or
/// Huffman-coded value. Panics on anything else (this client never lets the dynamic table
/// be needed: each connection reads one response head per status).
fn status_of(block: &[u8]) -> u16 {
    const STATIC: [u16; 7] = [200, 204, 206, 304, 400, 404, 500];
    let first = block[0];
    if first & 0x80 != 0 {
        let index = usize::from(first & 0x7f);
        if (8..=14).contains(&index) {
            return STATIC[index - 8];
        }
    } else {
        // Literal: 6-bit name index with incremental indexing, else a 4-bit one.
        let index = if first & 0x40 != 0 {
            first & 0x3f
        } else {
            first & 0x0f
        };
        if (8..=14).contains(&index) && block.len() >= 2 {
            let len = usize::from(block[1] & 0x7f);
            let value = &block[2..2 + len];
            let digits = if block[1] & 0x80 != 0 {
                huffman_digits(value)
            } else {
                String::from_utf8_lossy(value).into_owned()
            };
            if let Ok(status) = digits.parse() {
                return status;
            }
        }
    }
    panic!("cannot read :status from header block {block:02x?}");
}

/// Decodes a Huffman-coded string of ASCII digits (RFC 7541 Appendix B: `0`-`2` are 5-bit
/// codes 0-2, `3`-`9` are 6-bit codes 0x19-0x1f); stops at the padding.
fn huffman_digits(bytes: &[u8]) -> String {
    let bits: Vec<u8> = bytes
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
        .collect();
    let mut out = String::new();
    let mut i = 0;
    while i + 5 <= bits.len() {
        let five = bits[i..i + 5].iter().fold(0u8, |a, b| a << 1 | b);
        if five <= 2 {
            out.push(char::from(b'0' + five));
            i += 5;
            continue;
        }
        if i + 6 > bits.len() {
            break;
        }
        let six = five << 1 | bits[i + 5];
        if !(0x19..=0x1f).contains(&six) {
            break;
        }
        out.push(char::from(b'3' + six - 0x19));
        i += 6;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_block_spells_every_field_out() {
        assert_eq!(
            header_block(&[(":method", "GET"), ("te", "trailers")]),
            b"\x00\x07:method\x03GET\x00\x02te\x08trailers".to_vec()
        );
        let long = "x".repeat(130);
        let block = header_block(&[("a", &long)]);
        // 130 = 127 + 3: the prefix is full, then 3 in one continuation byte.
        assert_eq!(&block[..5], b"\x00\x01a\x7f\x03");
    }

    #[test]
    fn statuses_are_read_indexed_literal_and_huffman_coded() {
        assert_eq!(status_of(&[0x88]), 200);
        assert_eq!(status_of(&[0x8c]), 400);
        assert_eq!(status_of(b"\x08\x03413"), 413);
        // "413" Huffman-coded: 011010 00001 011001, padded with ones.
        assert_eq!(status_of(&[0x48, 0x83, 0x68, 0x2c, 0xff]), 413);
    }

    #[test]
    fn frames_have_the_nine_byte_header() {
        assert_eq!(
            data_frame(3, b"hi", true),
            b"\x00\x00\x02\x00\x01\x00\x00\x00\x03hi".to_vec()
        );
    }
}
