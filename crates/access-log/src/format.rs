//! Line formats: nginx `combined`, JSON lines, and templates with nginx variable names.
//!
//! A template is compiled once (at config load) into a list of literal and variable
//! pieces, so formatting a line is a walk over that list with no parsing, hashing or
//! allocation (the output buffer is reused). `combined` is the nginx template itself,
//! compiled the same way, so the two can never disagree.

use std::cell::RefCell;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::escape;
use crate::record::Record;
use crate::time::{self, TimeCache};

/// nginx's predefined `combined` format.
pub const COMBINED: &str = "$remote_addr - $remote_user [$time_local] \"$request\" $status \
                            $body_bytes_sent \"$http_referer\" \"$http_user_agent\"";

/// The variables a template may use, for error messages and docs.
pub const VARIABLES: &str = "remote_addr, remote_user, time_local, time_iso8601, msec, request, \
     request_method, request_uri, uri, args, server_protocol, status, body_bytes_sent, \
     bytes_sent, request_time, upstream_addr, upstream_status, upstream_response_time, \
     upstream_tries, \
     http_referer, http_user_agent, http_<header name>, route, request_id, error, grpc_status, \
     trace_id, span_id, consumer, auth_result";

/// How records become lines. Cheap to clone; build it once per configuration.
#[derive(Debug, Clone)]
pub struct Format {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Template(Vec<Piece>),
    Json,
}

#[derive(Debug, Clone)]
enum Piece {
    Literal(Box<[u8]>),
    Var(Var),
}

#[derive(Debug, Clone)]
enum Var {
    RemoteAddr,
    RemoteUser,
    TimeLocal,
    TimeIso8601,
    Msec,
    Request,
    RequestMethod,
    RequestUri,
    Uri,
    Args,
    ServerProtocol,
    Status,
    BodyBytesSent,
    BytesSent,
    RequestTime,
    UpstreamAddr,
    UpstreamStatus,
    UpstreamResponseTime,
    UpstreamTries,
    HttpReferer,
    HttpUserAgent,
    Header(http::HeaderName),
    Route,
    RequestId,
    Error,
    GrpcStatus,
    TraceId,
    SpanId,
    Consumer,
    AuthResult,
}

impl Var {
    fn parse(name: &str) -> Result<Self, Error> {
        Ok(match name {
            "remote_addr" => Self::RemoteAddr,
            "remote_user" => Self::RemoteUser,
            "time_local" => Self::TimeLocal,
            "time_iso8601" => Self::TimeIso8601,
            "msec" => Self::Msec,
            "request" => Self::Request,
            "request_method" => Self::RequestMethod,
            "request_uri" => Self::RequestUri,
            "uri" => Self::Uri,
            "args" | "query_string" => Self::Args,
            "server_protocol" => Self::ServerProtocol,
            "status" => Self::Status,
            "body_bytes_sent" => Self::BodyBytesSent,
            "bytes_sent" => Self::BytesSent,
            "request_time" => Self::RequestTime,
            "upstream_addr" => Self::UpstreamAddr,
            "upstream_status" => Self::UpstreamStatus,
            "upstream_response_time" => Self::UpstreamResponseTime,
            "upstream_tries" => Self::UpstreamTries,
            "http_referer" => Self::HttpReferer,
            "http_user_agent" => Self::HttpUserAgent,
            "route" => Self::Route,
            "request_id" => Self::RequestId,
            "error" => Self::Error,
            "grpc_status" => Self::GrpcStatus,
            "trace_id" => Self::TraceId,
            "span_id" => Self::SpanId,
            "consumer" => Self::Consumer,
            "auth_result" => Self::AuthResult,
            _ => {
                // nginx maps `$http_x_request_id` to the header `X-Request-Id`.
                let header = name
                    .strip_prefix("http_")
                    .filter(|h| !h.is_empty())
                    .and_then(|h| {
                        http::HeaderName::from_bytes(h.replace('_', "-").as_bytes()).ok()
                    });
                match header {
                    Some(h) => Self::Header(h),
                    None => {
                        return Err(Error::UnknownVariable {
                            name: name.to_owned(),
                            known: VARIABLES,
                        });
                    }
                }
            }
        })
    }
}

impl Format {
    /// nginx `combined`:
    /// `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"`.
    pub fn combined() -> Self {
        Self::template(COMBINED).expect("the combined template uses only known variables")
    }

    /// One JSON object per line. Keys are nginx variable names; unset values are `null`,
    /// numbers are JSON numbers, times are seconds with millisecond resolution.
    pub fn json() -> Self {
        Self { kind: Kind::Json }
    }

    /// A template with nginx variable names (`$status` or `${status}`); see [`VARIABLES`].
    ///
    /// Variable values are escaped like nginx's `escape=default` (`"`, `\`, control and
    /// non-ASCII bytes become `\xHH`). Literal text is written as given, but may not
    /// contain control characters, so a template can never produce two lines.
    pub fn template(src: &str) -> Result<Self, Error> {
        let bytes = src.as_bytes();
        let mut pieces = Vec::new();
        let mut literal = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if b != b'$' {
                if b < 0x20 || b == 0x7f {
                    return Err(Error::Template {
                        offset: i,
                        reason: "control character in template text",
                    });
                }
                literal.push(b);
                i += 1;
                continue;
            }
            let (name, next) = if bytes.get(i + 1) == Some(&b'{') {
                let close = src[i + 2..].find('}').ok_or(Error::Template {
                    offset: i,
                    reason: "`${` without a closing `}`",
                })?;
                (&src[i + 2..i + 2 + close], i + 3 + close)
            } else {
                let len = bytes[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                    .count();
                (&src[i + 1..i + 1 + len], i + 1 + len)
            };
            if name.is_empty() {
                return Err(Error::Template {
                    offset: i,
                    reason: "`$` is not followed by a variable name",
                });
            }
            let var = Var::parse(name)?;
            if !literal.is_empty() {
                pieces.push(Piece::Literal(
                    std::mem::take(&mut literal).into_boxed_slice(),
                ));
            }
            pieces.push(Piece::Var(var));
            i = next;
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal.into_boxed_slice()));
        }
        Ok(Self {
            kind: Kind::Template(pieces),
        })
    }

    /// Appends `record` as one line (ending in `\n`) to `out`.
    pub fn write(&self, record: &Record<'_>, out: &mut Vec<u8>) {
        thread_local! {
            static TIMES: RefCell<TimeCache> = RefCell::new(TimeCache::default());
        }
        let cached = TIMES.try_with(|times| match times.try_borrow_mut() {
            Ok(mut times) => {
                self.write_cached(record, out, &mut times);
                true
            }
            Err(_) => false,
        });
        if cached != Ok(true) {
            self.write_cached(record, out, &mut TimeCache::default());
        }
    }

    /// Like [`Format::write`], with this thread's cached timestamp rendering.
    pub(crate) fn write_cached(
        &self,
        record: &Record<'_>,
        out: &mut Vec<u8>,
        times: &mut TimeCache,
    ) {
        match &self.kind {
            Kind::Template(pieces) => {
                for piece in pieces {
                    match piece {
                        Piece::Literal(text) => out.extend_from_slice(text),
                        Piece::Var(var) => write_var(var, record, out, times),
                    }
                }
            }
            Kind::Json => write_json(record, out, times),
        }
        out.push(b'\n');
    }

    /// The line the writer adds after it had to drop lines, in this format.
    pub(crate) fn dropped_record(&self, dropped: u64, now: SystemTime) -> Vec<u8> {
        let mut times = TimeCache::default();
        let mut out = Vec::with_capacity(96);
        match self.kind {
            Kind::Json => {
                out.extend_from_slice(b"{\"time_iso8601\":\"");
                out.extend_from_slice(times.iso(now));
                out.extend_from_slice(b"\",\"tailguard_dropped_lines\":");
                out.extend_from_slice(itoa::Buffer::new().format(dropped).as_bytes());
                out.extend_from_slice(b"}\n");
            }
            Kind::Template(_) => {
                out.extend_from_slice(b"# tailguard access log: dropped ");
                out.extend_from_slice(itoa::Buffer::new().format(dropped).as_bytes());
                out.extend_from_slice(b" lines [");
                out.extend_from_slice(times.local(now));
                out.extend_from_slice(b"]\n");
            }
        }
        out
    }
}

fn opt_text(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        Some(v) => escape::text(out, v),
        None => out.push(b'-'),
    }
}

fn int(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Seconds with millisecond resolution, as nginx prints `$request_time`.
fn secs_ms(out: &mut Vec<u8>, d: Duration) {
    // as_secs + subsec_millis: no 128-bit division (as_millis would need one).
    out.extend_from_slice(itoa::Buffer::new().format(d.as_secs()).as_bytes());
    let frac = d.subsec_millis();
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

fn ip(out: &mut Vec<u8>, addr: IpAddr) {
    let mut text = [0u8; 39];
    out.extend_from_slice(ip_text(addr, &mut text));
}

/// `addr` as text in `buf`, without allocating, as the log writes a client address: IPv4
/// digit by digit into the array, then one copy by the caller (a quarter of the
/// instructions of four itoa calls and seven small copies, and of `fmt`, in callgrind);
/// IPv6 through `fmt`. The gateway's spans print their addresses with it too.
///
/// ```
/// let mut buf = [0u8; 39];
/// let ip = std::net::IpAddr::from([192, 0, 2, 7]);
/// assert_eq!(tailguard_access_log::ip_text(ip, &mut buf), b"192.0.2.7");
/// ```
pub fn ip_text(addr: IpAddr, buf: &mut [u8; 39]) -> &[u8] {
    match addr {
        IpAddr::V4(v4) => {
            let mut len = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[len] = b'.';
                    len += 1;
                }
                if octet >= 100 {
                    buf[len] = b'0' + octet / 100;
                    len += 1;
                }
                if octet >= 10 {
                    buf[len] = b'0' + octet / 10 % 10;
                    len += 1;
                }
                buf[len] = b'0' + octet % 10;
                len += 1;
            }
            &buf[..len]
        }
        IpAddr::V6(v6) => {
            // 39 bytes hold the longest IPv6 text; a write into the array cannot fail then.
            let mut cursor = std::io::Cursor::new(&mut buf[..]);
            let _ = write!(cursor, "{v6}");
            let len = usize::try_from(cursor.position()).unwrap_or(0);
            &buf[..len]
        }
    }
}

fn sock(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(v4) => {
            ip(out, IpAddr::V4(*v4.ip()));
            out.push(b':');
            int(out, u64::from(v4.port()));
        }
        SocketAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

fn split_target(target: &[u8]) -> (&[u8], Option<&[u8]>) {
    match target.iter().position(|&b| b == b'?') {
        Some(q) => (&target[..q], Some(&target[q + 1..])),
        None => (target, None),
    }
}

fn write_var(var: &Var, r: &Record<'_>, out: &mut Vec<u8>, times: &mut TimeCache) {
    match var {
        Var::RemoteAddr => match r.remote_addr {
            Some(a) => ip(out, a),
            None => out.push(b'-'),
        },
        Var::RemoteUser => opt_text(out, r.remote_user),
        Var::TimeLocal => out.extend_from_slice(times.local(r.time)),
        Var::TimeIso8601 => out.extend_from_slice(times.iso(r.time)),
        Var::Msec => secs_ms(out, time::unix(r.time)),
        Var::Request => {
            escape::text(out, r.method);
            out.push(b' ');
            escape::text(out, r.target);
            out.push(b' ');
            escape::text(out, r.protocol.as_bytes());
        }
        Var::RequestMethod => escape::text(out, r.method),
        Var::RequestUri => escape::text(out, r.target),
        Var::Uri => escape::text(out, split_target(r.target).0),
        Var::Args => opt_text(out, split_target(r.target).1),
        Var::ServerProtocol => escape::text(out, r.protocol.as_bytes()),
        Var::Status => int(out, u64::from(r.status)),
        Var::BodyBytesSent => int(out, r.body_bytes_sent),
        Var::BytesSent => int(out, r.bytes_sent),
        Var::RequestTime => secs_ms(out, r.request_time),
        Var::UpstreamAddr => {
            for t in r.earlier_tries {
                sock(out, t.addr);
                out.extend_from_slice(b", ");
            }
            match r.upstream_addr {
                Some(a) => sock(out, a),
                None => out.push(b'-'),
            }
        }
        Var::UpstreamStatus => {
            for t in r.earlier_tries {
                int(out, u64::from(t.status));
                out.extend_from_slice(b", ");
            }
            match r.upstream_status {
                Some(s) => int(out, u64::from(s)),
                None => out.push(b'-'),
            }
        }
        Var::UpstreamTries => match tries(r) {
            0 => out.push(b'-'),
            n => int(out, n),
        },
        Var::UpstreamResponseTime => match r.upstream_response_time {
            Some(d) => secs_ms(out, d),
            None => out.push(b'-'),
        },
        Var::HttpReferer => opt_text(out, r.referer),
        Var::HttpUserAgent => opt_text(out, r.user_agent),
        Var::Header(name) => opt_text(out, header(r, name)),
        Var::Route => opt_text(out, r.route.map(str::as_bytes)),
        Var::RequestId => opt_text(out, r.request_id),
        Var::Error => opt_text(out, r.error.map(str::as_bytes)),
        Var::GrpcStatus => match r.grpc_status {
            Some(s) => int(out, u64::from(s)),
            None => out.push(b'-'),
        },
        Var::TraceId => opt_hex(out, r.trace_id.as_ref().map(<[u8; 16]>::as_slice)),
        Var::SpanId => opt_hex(out, r.span_id.as_ref().map(<[u8; 8]>::as_slice)),
        Var::Consumer => opt_text(out, r.consumer.map(str::as_bytes)),
        Var::AuthResult => opt_text(out, r.auth_result.map(str::as_bytes)),
    }
}

/// Lowercase hex, as W3C `traceparent` and nginx's otel module (`$otel_trace_id`) print
/// ids; `-` when there is none.
fn opt_hex(out: &mut Vec<u8>, id: Option<&[u8]>) {
    match id {
        Some(id) => hex(out, id),
        None => out.push(b'-'),
    }
}

fn hex(out: &mut Vec<u8>, id: &[u8]) {
    let start = out.len();
    out.resize(start + 2 * id.len(), 0);
    hex_into(id, &mut out[start..]);
}

/// `bytes` as lowercase hex digits into `out` (twice as long; what is beyond is left as it
/// is). Public for the gateway's other writers of ids (its request ids), as [`ip_text`] is:
/// one table, not a copy per crate.
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    // Both digits of a byte in one lookup, and no index to check.
    for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
    }
}

/// The two lowercase hex digits of every byte.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        pairs[b] = [DIGITS[b >> 4], DIGITS[b & 0xf]];
        b += 1;
    }
    pairs
};

fn json_opt_hex(out: &mut Vec<u8>, id: Option<&[u8]>) {
    match id {
        Some(id) => {
            out.push(b'"');
            hex(out, id);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// Endpoints the request was sent to (0: none).
fn tries(r: &Record<'_>) -> u64 {
    r.earlier_tries.len() as u64 + u64::from(r.upstream_addr.is_some())
}

fn header<'a>(r: &Record<'a>, name: &http::HeaderName) -> Option<&'a [u8]> {
    r.headers
        .and_then(|h| h.get(name))
        .map(http::HeaderValue::as_bytes)
}

fn json_opt_str(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        Some(v) => escape::json_str(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_json(r: &Record<'_>, out: &mut Vec<u8>, times: &mut TimeCache) {
    out.extend_from_slice(b"{\"time_iso8601\":\"");
    out.extend_from_slice(times.iso(r.time));
    out.extend_from_slice(b"\",\"remote_addr\":");
    match r.remote_addr {
        Some(a) => {
            out.push(b'"');
            ip(out, a);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"remote_user\":");
    json_opt_str(out, r.remote_user);
    out.extend_from_slice(b",\"request_method\":");
    escape::json_str(out, r.method);
    out.extend_from_slice(b",\"request_uri\":");
    escape::json_str(out, r.target);
    out.extend_from_slice(b",\"server_protocol\":");
    escape::json_str(out, r.protocol.as_bytes());
    out.extend_from_slice(b",\"status\":");
    int(out, u64::from(r.status));
    out.extend_from_slice(b",\"body_bytes_sent\":");
    int(out, r.body_bytes_sent);
    out.extend_from_slice(b",\"bytes_sent\":");
    int(out, r.bytes_sent);
    out.extend_from_slice(b",\"request_time\":");
    secs_ms(out, r.request_time);
    out.extend_from_slice(b",\"upstream_addr\":");
    match r.upstream_addr {
        Some(a) => {
            // A retried request's earlier endpoints first, as in the text formats.
            out.push(b'"');
            for t in r.earlier_tries {
                sock(out, t.addr);
                out.extend_from_slice(b", ");
            }
            sock(out, a);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"upstream_status\":");
    match r.upstream_status {
        Some(s) => int(out, u64::from(s)),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"upstream_response_time\":");
    match r.upstream_response_time {
        Some(d) => secs_ms(out, d),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"upstream_tries\":");
    match tries(r) {
        0 => out.extend_from_slice(b"null"),
        n => int(out, n),
    }
    out.extend_from_slice(b",\"http_referer\":");
    json_opt_str(out, r.referer);
    out.extend_from_slice(b",\"http_user_agent\":");
    json_opt_str(out, r.user_agent);
    out.extend_from_slice(b",\"route\":");
    json_opt_str(out, r.route.map(str::as_bytes));
    out.extend_from_slice(b",\"request_id\":");
    json_opt_str(out, r.request_id);
    out.extend_from_slice(b",\"error\":");
    json_opt_str(out, r.error.map(str::as_bytes));
    out.extend_from_slice(b",\"grpc_status\":");
    match r.grpc_status {
        Some(s) => int(out, u64::from(s)),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"trace_id\":");
    json_opt_hex(out, r.trace_id.as_ref().map(<[u8; 16]>::as_slice));
    out.extend_from_slice(b",\"span_id\":");
    json_opt_hex(out, r.span_id.as_ref().map(<[u8; 8]>::as_slice));
    out.extend_from_slice(b",\"consumer\":");
    json_opt_str(out, r.consumer.map(str::as_bytes));
    out.extend_from_slice(b",\"auth_result\":");
    json_opt_str(out, r.auth_result.map(str::as_bytes));
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_variable_is_named() {
        let err = Format::template("$remote_addr $bogus_thing").unwrap_err();
        assert!(
            matches!(&err, Error::UnknownVariable { name, .. } if name == "bogus_thing"),
            "{err}"
        );
        assert!(err.to_string().contains("$bogus_thing"), "{err}");
        assert!(Format::template("${nope}").is_err());
        assert!(Format::template("$http_").is_err());
    }

    #[test]
    fn malformed_templates_are_rejected() {
        assert!(matches!(
            Format::template("a $ b"),
            Err(Error::Template { offset: 2, .. })
        ));
        assert!(matches!(
            Format::template("${status"),
            Err(Error::Template { offset: 0, .. })
        ));
        assert!(matches!(
            Format::template("a\nb"),
            Err(Error::Template { offset: 1, .. })
        ));
    }

    #[test]
    fn braces_and_headers() {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-request-id", http::HeaderValue::from_static("abc"));
        let r = Record {
            status: 404,
            target: b"/p?q=1",
            headers: Some(&headers),
            ..Record::default()
        };
        let f =
            Format::template("${status}x $uri|$args|$http_x_request_id|$http_x_missing").unwrap();
        let mut out = Vec::new();
        f.write(&r, &mut out);
        assert_eq!(out, b"404x /p|q=1|abc|-\n");
    }
}
