//! Header rewriting between downstream and upstream: hop-by-hop removal (RFC 9110 §7.6.1)
//! and the forwarding headers (`X-Forwarded-For`, `X-Forwarded-Proto`, `Via`,
//! `X-Request-Id`).

use std::net::IpAddr;

use bytes::{Bytes, BytesMut};

use http::header::Entry;
use http::header::{UPGRADE, VIA};
use http::{HeaderMap, HeaderName, HeaderValue, Version};

/// `X-Forwarded-For`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Request-Id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub use tailguard_http1::fields::{connection_has, remove_hop_by_hop};

/// The protocol an HTTP/1.1 request asks to switch to (`Upgrade`, with `upgrade` among the
/// `Connection` tokens), if it does.
pub fn upgrade_requested<B>(req: &http::Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let protocol = req.headers().get(UPGRADE)?;
    connection_has(req.headers(), "upgrade").then(|| protocol.clone())
}

/// The `Via` entry this gateway adds for a message received with `version`.
pub fn via_value(version: Version) -> HeaderValue {
    HeaderValue::from_static(match version {
        Version::HTTP_2 => "2 tailguard",
        Version::HTTP_10 => "1.0 tailguard",
        _ => "1.1 tailguard",
    })
}

/// Adds `X-Forwarded-For` (appending the client to any list already there),
/// `X-Forwarded-Proto` (replacing it: only this hop knows the scheme it was reached by) and
/// `Via` (appending). `client` is the client's address as a header value
/// ([`client_address`]).
pub fn add_forwarding(headers: &mut HeaderMap, client: &HeaderValue, tls: bool, version: Version) {
    // Through the entry: the name is hashed once for the lookup and the insert.
    match headers.entry(&X_FORWARDED_FOR) {
        Entry::Occupied(mut prior) => {
            // One buffer, handed to the header value without a second copy: earlier hops'
            // values (joined, whatever number of header lines they came in), then this
            // client.
            let mut xff = Vec::with_capacity(64);
            for value in prior.iter() {
                xff.extend_from_slice(value.as_bytes());
                xff.extend_from_slice(b", ");
            }
            xff.extend_from_slice(client.as_bytes());
            if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(xff)) {
                prior.insert(v);
            }
        }
        // The common case: the connection's address, formatted once per connection.
        Entry::Vacant(slot) => {
            slot.insert(client.clone());
        }
    }
    headers.insert(
        &X_FORWARDED_PROTO,
        HeaderValue::from_static(if tls { "https" } else { "http" }),
    );
    headers.append(VIA, via_value(version));
}

/// A client's IP address as an `X-Forwarded-For` element, made once per connection.
pub fn client_address(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&ip.to_string()).expect("an IP address is a valid header value")
}

thread_local! {
    /// Where new request ids are written (see [`request_id`]).
    static ID_ARENA: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// The request's id: the client's `X-Request-Id` if it sent one, else a new random one
/// (128 bits, hex), which is also set on the request. Borrowed from the headers: a caller
/// that keeps it pays for the clone (two atomic reference count changes) only then.
pub fn request_id(headers: &mut HeaderMap) -> &HeaderValue {
    let slot = match headers.entry(&X_REQUEST_ID) {
        Entry::Occupied(id) => return id.into_mut(),
        Entry::Vacant(slot) => slot,
    };
    // Hex digits written into a per-thread arena and split off it: an id costs a reference
    // count, not an allocation of its own (one 4 KiB block per 128 ids).
    const HEX: &[u8; 16] = b"0123456789abcdef";
    const ID_LEN: usize = 32;
    let random = fastrand::u128(..).to_be_bytes();
    let mut hex = [0u8; ID_LEN];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(random) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    let bytes = ID_ARENA.with_borrow_mut(|arena| {
        if arena.capacity() - arena.len() < ID_LEN {
            *arena = BytesMut::with_capacity(ID_LEN * 128);
        }
        arena.extend_from_slice(&hex);
        arena.split().freeze()
    });
    let id = HeaderValue::from_maybe_shared(bytes).expect("hex digits are a valid header value");
    slot.insert(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_forwarded_for() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.2"));
        add_forwarding(
            &mut h,
            &client_address("127.0.0.1".parse().expect("ip")),
            true,
            Version::HTTP_11,
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["via"], "1.1 tailguard");
    }

    #[test]
    fn new_request_ids_are_distinct_hex_across_arena_blocks_and_a_clients_id_is_kept() {
        let mut seen = std::collections::HashSet::new();
        // 300 ids: more than two arena blocks of 128.
        for _ in 0..300 {
            let mut h = HeaderMap::new();
            let id = request_id(&mut h).clone();
            assert_eq!(h[&X_REQUEST_ID], id);
            let text = id.to_str().expect("ascii");
            assert_eq!(text.len(), 32);
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert!(seen.insert(text.to_string()), "duplicate id {text}");
        }
        let mut h = HeaderMap::new();
        h.insert(&X_REQUEST_ID, HeaderValue::from_static("abc"));
        assert_eq!(request_id(&mut h), "abc");
        assert_eq!(h.len(), 1);
    }
}
