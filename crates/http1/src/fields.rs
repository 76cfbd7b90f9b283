//! Field rules both sides share: RFC 9110 §7.6.1's hop-by-hop fields, the `Connection`
//! tokens, and the fields that frame a message, none of which ever crosses the gateway as
//! the peer sent it.

use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName};

static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// Removes the hop-by-hop fields: the fixed list of RFC 9110 §7.6.1 and every field the
/// `Connection` field names (a name that frames or routes the message, `Content-Length`,
/// `Transfer-Encoding` or `Host`, is not the client's to remove: it is left alone).
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass comparing names (standard names compare as enum
    // tags) is cheaper than hashing each of the six names to look it up.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    if headers.contains_key(CONNECTION) {
        // Collected first because the map cannot be changed while its values are borrowed;
        // this allocation happens only when a client sends `Connection`.
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .filter_map(|t| HeaderName::from_bytes(t.trim_ascii()).ok())
            .filter(|name| !is_framing(name) && name != http::header::HOST)
            .collect();
        for name in named {
            headers.remove(name);
        }
        headers.remove(CONNECTION);
    }
    headers.remove(&KEEP_ALIVE);
    headers.remove(&PROXY_CONNECTION);
    headers.remove(&HTTP2_SETTINGS);
    headers.remove(TE);
    headers.remove(TRANSFER_ENCODING);
    headers.remove(UPGRADE);
}

/// Whether `token` is among the `Connection` field's comma-separated tokens (any case).
pub fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Whether `name` is one of RFC 9110 §7.6.1's fixed hop-by-hop fields, or `HTTP2-Settings`
/// (connection-specific by its definition, RFC 7540 §3.2.1, and half of an h2c upgrade).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    is_hop_by_hop_name(name.as_str().as_bytes())
}

/// [`is_hop_by_hop`] for a name as received (any case): a length test, then at most two
/// case-insensitive compares.
pub fn is_hop_by_hop_name(name: &[u8]) -> bool {
    let is = |hop: &str| name.eq_ignore_ascii_case(hop.as_bytes());
    match name.len() {
        2 => is("te"),
        7 => is("upgrade"),
        10 => is("connection") || is("keep-alive"),
        14 => is("http2-settings"),
        16 => is("proxy-connection"),
        17 => is("transfer-encoding"),
        _ => false,
    }
}

/// Whether `name` frames a message body (`Content-Length`, `Transfer-Encoding`): the
/// gateway writes these itself, from the framing it parsed, never as a peer sent them.
pub fn is_framing(name: &HeaderName) -> bool {
    name == http::header::CONTENT_LENGTH || name == TRANSFER_ENCODING
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn removes_fixed_and_connection_named_fields_but_never_framing_or_host() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, X-Secret, content-length, host"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.insert("content-length", HeaderValue::from_static("5"));
        h.insert("host", HeaderValue::from_static("a.example"));
        remove_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "host", "x-kept"]);
    }
}
