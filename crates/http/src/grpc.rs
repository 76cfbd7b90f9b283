//! gRPC as the gateway sees it: which requests are gRPC calls, their `grpc-timeout`, the
//! `grpc-status` of their answers, and the trailers-only answer the gateway makes itself.
//!
//! A gRPC client reads its call's outcome from `grpc-status`, not from the HTTP status, so
//! an error the gateway makes for a gRPC call is sent as gRPC does it: HTTP 200 with
//! `grpc-status` and `grpc-message` in a head that ends the stream (a "trailers-only"
//! response), as Envoy does.

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};

/// `grpc-status`.
pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-timeout`.
pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// gRPC status codes the gateway itself answers with.
pub mod code {
    /// The deadline passed before the call completed.
    pub const DEADLINE_EXCEEDED: u8 = 4;
    /// Nothing serves the method (no route).
    pub const UNIMPLEMENTED: u8 = 12;
    /// A limit was exceeded (request too large).
    pub const RESOURCE_EXHAUSTED: u8 = 8;
    /// The gateway or the request is broken.
    pub const INTERNAL: u8 = 13;
    /// The upstream could not be reached or failed; the call may be retried.
    pub const UNAVAILABLE: u8 = 14;
    /// The caller may not call this (a refused client address).
    pub const PERMISSION_DENIED: u8 = 7;
    /// A status outside the codes gRPC defines is read as this one (gRPC's own rule).
    pub const UNKNOWN: u8 = 2;
}

/// The largest status code gRPC defines (`UNAUTHENTICATED`); the metric label is bounded
/// by it.
pub const MAX_CODE: u8 = 16;

/// Whether a request is a gRPC call: its `content-type` is `application/grpc` or one of
/// its `+proto`/`+json` forms.
#[inline]
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The call's `grpc-timeout` (1 to 8 digits and a unit: `H`, `M`, `S`, `m`, `u`, `n`), if
/// it sent a valid one.
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    parse_timeout(headers.get(&GRPC_TIMEOUT)?.as_bytes())
}

fn parse_timeout(v: &[u8]) -> Option<Duration> {
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The `grpc-status` in a head or trailers, if any (a code gRPC does not define reads as
/// `UNKNOWN`, so the metric label stays bounded).
pub fn status(headers: &HeaderMap) -> Option<u8> {
    let v = headers.get(&GRPC_STATUS)?.to_str().ok()?;
    Some(match v.parse::<u32>() {
        Ok(n) if n <= u32::from(MAX_CODE) => n as u8,
        _ => code::UNKNOWN,
    })
}

/// The headers of a status: `grpc-status` and, when there is one, `grpc-message`
/// (`message` must need no percent-encoding: the gateway's own are plain ASCII words).
pub fn put_status(headers: &mut HeaderMap, code: u8, message: &'static str) {
    headers.insert(
        &GRPC_STATUS,
        HeaderValue::from_str(itoa::Buffer::new().format(code))
            .expect("digits are a valid header value"),
    );
    if !message.is_empty() {
        headers.insert(&GRPC_MESSAGE, HeaderValue::from_static(message));
    }
}

/// The trailers that end a stream with `code`.
pub fn trailers(code: u8, message: &'static str) -> HeaderMap {
    let mut t = HeaderMap::new();
    put_status(&mut t, code, message);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_every_unit_and_refuse_the_malformed() {
        let ms = |s: &str| parse_timeout(s.as_bytes()).map(|d| d.as_nanos());
        assert_eq!(ms("1H"), Some(3_600_000_000_000));
        assert_eq!(ms("2M"), Some(120_000_000_000));
        assert_eq!(ms("3S"), Some(3_000_000_000));
        assert_eq!(ms("250m"), Some(250_000_000));
        assert_eq!(ms("7u"), Some(7_000));
        assert_eq!(ms("99999999n"), Some(99_999_999));
        for bad in ["", "S", "100", "123456789m", "1x", "-1S", "1.5S", " 1S"] {
            assert_eq!(ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn statuses_outside_the_defined_codes_read_as_unknown() {
        let of = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(&GRPC_STATUS, HeaderValue::from_static(v));
            status(&h)
        };
        assert_eq!(of("0"), Some(0));
        assert_eq!(of("16"), Some(16));
        assert_eq!(of("17"), Some(code::UNKNOWN));
        assert_eq!(of("abc"), Some(code::UNKNOWN));
        assert_eq!(status(&HeaderMap::new()), None);
    }

    #[test]
    fn only_grpc_content_types_are_calls() {
        let with = |ct: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            is_grpc(&h)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(!with("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }
}
