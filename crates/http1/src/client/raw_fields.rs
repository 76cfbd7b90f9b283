//! A response's field lines kept as the upstream sent them, written downstream as they are
//! (hop-by-hop lines left out) or put in a map for a downstream that needs one.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::fields;

/// A response's field lines as the upstream sent them (names and values validated by the
/// parser), with what the downstream writer needs to know of them.
#[derive(Debug)]
pub struct RawFields {
    /// The field lines between the status line and the head's empty line, each ending in
    /// CRLF (or a bare LF, which the parser accepts).
    pub(super) lines: Bytes,
    /// Every line ends in CRLF and none is hop-by-hop (the parser took those out): the lines
    /// can be written as they are, in one copy.
    pub(super) crlf: bool,
    /// A `Content-Length` field is among them.
    pub has_length: bool,
    /// It is the one framing field, once, a plain number: the line is what the downstream
    /// would write itself, so it may be copied as it is.
    pub length_exact: bool,
    /// A `Date` field is among them.
    pub has_date: bool,
    /// A `Vary` field is among them (a stage that adds to `Vary` looks at the lines only
    /// then).
    pub has_vary: bool,
    /// A field named `Access-Control-*` is among them (CORS: a route that writes its own
    /// moves the lines into a map only then).
    pub has_access_control: bool,
}

impl RawFields {
    /// The fields, hop-by-hop ones (RFC 9110 §7.6.1) left out, each as `(name, value)`.
    pub fn end_to_end(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines.split(|&b| b == b'\n').filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            let name = &line[..colon];
            (!fields::is_hop_by_hop_name(name)).then(|| (name, line[colon + 1..].trim_ascii()))
        })
    }

    /// Appends the end-to-end fields as head lines, as the upstream wrote them: runs of lines
    /// that need no change (usually the whole section) are copied in one piece; a hop-by-hop
    /// line is left out, and a line ending in a bare LF gets its CRLF. `Content-Length` lines
    /// are left out too unless `keep_length` (the downstream frames the body itself; a
    /// response without a body keeps the length it announces).
    pub fn write_to(&self, out: &mut Vec<u8>, keep_length: bool) {
        let bytes = &self.lines[..];
        if self.crlf && (keep_length || !self.has_length) {
            out.extend_from_slice(bytes);
            return;
        }
        // Start of the lines not yet copied, and of the line looked at.
        let (mut run, mut at) = (0, 0);
        while at < bytes.len() {
            let end = bytes[at..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |i| at + i + 1);
            let line = &bytes[at..end];
            let content = line.strip_suffix(b"\n").unwrap_or(line);
            let crlf = content.ends_with(b"\r");
            let name_end = content.iter().position(|&b| b == b':').unwrap_or(0);
            let name = &content[..name_end];
            let hop_by_hop = fields::is_hop_by_hop_name(name)
                || (!keep_length && name.eq_ignore_ascii_case(b"content-length"));
            if hop_by_hop || !crlf {
                out.extend_from_slice(&bytes[run..at]);
                if !hop_by_hop {
                    out.extend_from_slice(content);
                    out.extend_from_slice(b"\r\n");
                }
                run = end;
            }
            at = end;
        }
        out.extend_from_slice(&bytes[run..]);
    }

    /// Appends the end-to-end fields to `map` (for a downstream that needs a map: HTTP/2).
    pub fn append_to(&self, map: &mut HeaderMap) {
        for (name, value) in self.end_to_end() {
            // The parser validated both, so neither conversion fails in practice.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name),
                HeaderValue::from_maybe_shared(self.lines.slice_ref(value)),
            ) {
                map.append(name, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_fields_are_written_as_sent_without_hop_by_hop_lines_and_with_crlf() {
        let raw = RawFields {
            lines: Bytes::from_static(
                b"A: 1\r\nKeep-Alive: timeout=5\r\nB: 2\nC:  3 \r\nTRANSFER-ENCODING: chunked\r\n",
            ),
            crlf: false,
            has_length: false,
            length_exact: false,
            has_date: false,
            has_vary: false,
            has_access_control: false,
        };
        let mut out = Vec::new();
        raw.write_to(&mut out, true);
        assert_eq!(String::from_utf8_lossy(&out), "A: 1\r\nB: 2\r\nC:  3 \r\n");
        let mut map = HeaderMap::new();
        raw.append_to(&mut map);
        assert_eq!(map.len(), 3);
        assert_eq!(map["c"], "3");
    }
}
