//! Header rewriting between downstream and upstream: hop-by-hop removal (RFC 9110 §7.6.1)
//! and the forwarding headers (`X-Forwarded-For`, `X-Forwarded-Proto`, `Via`,
//! `X-Request-Id`); the request's host as routing reads it.

use std::net::IpAddr;

use bytes::{Bytes, BytesMut};

use http::header::Entry;
use http::header::{FORWARDED, UPGRADE, VIA};
use http::{HeaderMap, HeaderName, HeaderValue, Version};

/// `X-Forwarded-For`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Real-IP` (nginx's convention: the client's address, one value).
pub static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
/// `X-Request-Id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub use tailguard_http1::fields::{connection_has, remove_hop_by_hop};

/// The request's host without port: from the URI (HTTP/2 `:authority`, absolute form) or
/// the `Host` header.
pub fn host_of<B>(req: &http::Request<B>) -> &str {
    let raw = req
        .uri()
        .host()
        .or_else(|| {
            req.headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("");
    without_port(raw)
}

/// [`host_of`] for a caller that looked up the `Host` field already (one lookup for two
/// readers).
pub fn host_from<'a>(uri: &'a http::Uri, host_field: Option<&'a HeaderValue>) -> &'a str {
    let raw = uri
        .host()
        .or_else(|| host_field.and_then(|h| h.to_str().ok()))
        .unwrap_or("");
    without_port(raw)
}

fn without_port(raw: &str) -> &str {
    if let Some(rest) = raw.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    // A byte search: `rsplit_once(':')` runs a reverse char searcher (UTF-8 aware), a
    // measurable share of a request for one ASCII byte.
    match raw.as_bytes().iter().rposition(|&b| b == b':') {
        Some(colon) => &raw[..colon],
        None => raw,
    }
}

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

/// What the gateway says of a downstream connection's client in the forwarding fields,
/// made once per connection: its address as an `X-Forwarded-For` / `X-Real-IP` value, its
/// RFC 7239 `Forwarded` element, and whether the peer is a trusted proxy (`trusted_proxies`)
/// whose own forwarding fields are kept.
#[derive(Debug, Clone)]
pub struct Client {
    /// The peer's IP (`127.0.0.1`, `::1`).
    pub ip: HeaderValue,
    /// `for=127.0.0.1;proto=http` (`for="[::1]"` for IPv6, as RFC 7239 §6 quotes it).
    pub forwarded: HeaderValue,
    /// The peer is in `trusted_proxies`.
    pub trusted: bool,
    /// Reached over TLS.
    pub tls: bool,
    /// `X-Forwarded-For`, `X-Real-IP` and `X-Forwarded-Proto` as field lines, for a head
    /// written by the gateway's own HTTP/1.1 client ([`ForwardingLines`]).
    pub lines: Bytes,
}

impl Client {
    /// The fields for a connection from `ip`, over TLS or not, from a trusted peer or not.
    pub fn new(ip: IpAddr, tls: bool, trusted: bool) -> Client {
        let proto = if tls { "https" } else { "http" };
        let forwarded = match ip {
            IpAddr::V4(v4) => format!("for={v4};proto={proto}"),
            IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto={proto}"),
        };
        let ip_value = client_address(ip);
        let mut lines = Vec::with_capacity(128);
        for name in ["x-forwarded-for: ", "x-real-ip: "] {
            lines.extend_from_slice(name.as_bytes());
            lines.extend_from_slice(ip_value.as_bytes());
            lines.extend_from_slice(b"\r\n");
        }
        lines.extend_from_slice(b"x-forwarded-proto: ");
        lines.extend_from_slice(proto.as_bytes());
        lines.extend_from_slice(b"\r\n");
        Client {
            ip: ip_value,
            forwarded: HeaderValue::from_str(&forwarded)
                .expect("an address and a scheme are a valid header value"),
            trusted,
            tls,
            lines: Bytes::from(lines),
        }
    }
}

/// The gateway's own fields for a request whose head its HTTP/1.1 client writes, as field
/// lines: what [`add_forwarding`] and [`request_id`] would put into the header map, written
/// into the head instead. Taken by a request that came with none of the fields they replace
/// or keep (`X-Forwarded-For`, `X-Real-IP`, `X-Forwarded-Proto`, `Forwarded`) from a peer
/// that is not a trusted proxy, on a route without header operations that could read them;
/// any other request takes the map. Saves five hashed inserts and the writing of five map
/// entries (~1,800 instructions a request in callgrind).
#[derive(Debug)]
pub struct ForwardingLines {
    /// `X-Request-Id`, when the gateway made it (`x-request-id: <32 hex>\r\n`).
    request_id: Option<[u8; REQUEST_ID_LINE]>,
    via: &'static [u8],
}

const REQUEST_ID_PREFIX: &[u8] = b"x-request-id: ";
const REQUEST_ID_LINE: usize = REQUEST_ID_PREFIX.len() + ID_LEN + 2;

impl ForwardingLines {
    /// The lines for a request of `version` whose fields are `headers`, if it may take them
    /// (see the type); `None`: add the fields to the map ([`add_forwarding`],
    /// [`request_id`]).
    pub fn for_request(
        headers: &HeaderMap,
        client: &Client,
        version: Version,
    ) -> Option<ForwardingLines> {
        if client.trusted {
            return None;
        }
        // One pass over the names: a request usually carries none of them.
        let mut id_came = false;
        for name in headers.keys() {
            if name == FORWARDED
                || *name == X_FORWARDED_FOR
                || *name == X_REAL_IP
                || *name == X_FORWARDED_PROTO
            {
                return None;
            }
            id_came |= *name == X_REQUEST_ID;
        }
        let request_id = (!id_came).then(|| {
            let mut line = [0u8; REQUEST_ID_LINE];
            line[..REQUEST_ID_PREFIX.len()].copy_from_slice(REQUEST_ID_PREFIX);
            line[REQUEST_ID_PREFIX.len()..REQUEST_ID_PREFIX.len() + ID_LEN]
                .copy_from_slice(&new_id_hex());
            line[REQUEST_ID_LINE - 2..].copy_from_slice(b"\r\n");
            line
        });
        let via: &'static [u8] = match version {
            Version::HTTP_2 => b"via: 2 tailguard\r\n",
            Version::HTTP_10 => b"via: 1.0 tailguard\r\n",
            _ => b"via: 1.1 tailguard\r\n",
        };
        Some(ForwardingLines { request_id, via })
    }

    /// The request's id: the one the gateway made, or the client's from `headers`.
    pub fn request_id(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        match &self.request_id {
            Some(line) => Some(id_value(
                &line[REQUEST_ID_PREFIX.len()..REQUEST_ID_PREFIX.len() + ID_LEN],
            )),
            None => headers.get(&X_REQUEST_ID).cloned(),
        }
    }

    /// The lines, in the order they go after the request's own fields (the connection's
    /// forwarding lines from [`Client::lines`] first).
    pub fn parts<'a>(&'a self, client: &'a Client) -> [&'a [u8]; 3] {
        [
            &client.lines,
            self.via,
            self.request_id.as_ref().map_or(&[][..], |l| &l[..]),
        ]
    }
}

/// Writes the forwarding fields. From a trusted peer the client's `X-Forwarded-For` and
/// `Forwarded` are kept with this hop's element appended, and its `X-Real-IP` kept (else
/// set); from any other peer all three are the gateway's alone (a client could otherwise
/// tell upstreams any address it likes), and `Forwarded` is written only where the client
/// sent one (so the common request pays nothing for it). `X-Forwarded-Proto` is replaced
/// (only this hop knows the scheme it was reached by) and `Via` appended.
pub fn add_forwarding(headers: &mut HeaderMap, client: &Client, version: Version) {
    if client.trusted {
        // Through the entry: the name is hashed once for the lookup and the insert.
        append_element(headers.entry(&X_FORWARDED_FOR), &client.ip, true);
        append_element(headers.entry(FORWARDED), &client.forwarded, false);
        headers
            .entry(&X_REAL_IP)
            .or_insert_with(|| client.ip.clone());
    } else {
        headers.insert(&X_FORWARDED_FOR, client.ip.clone());
        headers.insert(&X_REAL_IP, client.ip.clone());
        if let Entry::Occupied(mut sent) = headers.entry(FORWARDED) {
            sent.insert(client.forwarded.clone());
        }
    }
    headers.insert(
        &X_FORWARDED_PROTO,
        HeaderValue::from_static(if client.tls { "https" } else { "http" }),
    );
    headers.append(VIA, via_value(version));
}

/// Appends `element` to a list field: after the values already there (joined into one line,
/// whatever number of lines they came in), or alone, if `or_alone`, when there are none.
fn append_element(entry: Entry<'_, HeaderValue>, element: &HeaderValue, or_alone: bool) {
    match entry {
        Entry::Occupied(mut prior) => {
            // One buffer, handed to the header value without a second copy.
            let mut list = Vec::with_capacity(64);
            for value in prior.iter() {
                list.extend_from_slice(value.as_bytes());
                list.extend_from_slice(b", ");
            }
            list.extend_from_slice(element.as_bytes());
            if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(list)) {
                prior.insert(v);
            }
        }
        // The common case: the connection's value, made once per connection.
        Entry::Vacant(slot) => {
            if or_alone {
                slot.insert(element.clone());
            }
        }
    }
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
    slot.insert(id_value(&new_id_hex()))
}

/// Hex digits of a request id.
const ID_LEN: usize = 32;

/// A new request id: 128 random bits as lowercase hex.
fn new_id_hex() -> [u8; ID_LEN] {
    let mut hex = [0u8; ID_LEN];
    tailguard_access_log::hex_into(&fastrand::u128(..).to_be_bytes(), &mut hex);
    hex
}

/// An id's hex digits as a header value, written into a per-thread arena and split off it:
/// an id costs a reference count, not an allocation of its own (one 4 KiB block per 128
/// ids).
fn id_value(hex: &[u8]) -> HeaderValue {
    let bytes = ID_ARENA.with_borrow_mut(|arena| {
        if arena.capacity() - arena.len() < hex.len() {
            *arena = BytesMut::with_capacity(ID_LEN * 128);
        }
        arena.extend_from_slice(hex);
        arena.split().freeze()
    });
    HeaderValue::from_maybe_shared(bytes).expect("hex digits are a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields `lines` carry, as a map (lines parsed back).
    fn parsed(lines: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for line in lines
            .concat()
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            let line = line.strip_suffix(b"\r").expect("CRLF");
            let colon = line.iter().position(|&b| b == b':').expect("a colon");
            h.append(
                HeaderName::from_bytes(&line[..colon]).expect("name"),
                HeaderValue::from_bytes(line[colon + 1..].trim_ascii()).expect("value"),
            );
        }
        h
    }

    #[test]
    fn the_lines_say_what_the_map_would_for_a_request_that_may_take_them() {
        for (ip, tls, version) in [
            ("127.0.0.1", false, Version::HTTP_11),
            ("::1", true, Version::HTTP_2),
            ("10.1.2.3", false, Version::HTTP_10),
        ] {
            let client = Client::new(ip.parse().expect("ip"), tls, false);
            let mut came = HeaderMap::new();
            came.insert("host", HeaderValue::from_static("a.example"));
            came.insert("via", HeaderValue::from_static("1.1 edge"));
            let lines = ForwardingLines::for_request(&came, &client, version).expect("takes lines");
            let made = lines.request_id(&came).expect("an id was made");
            // The map path, with the same id.
            let mut by_map = came.clone();
            by_map.insert(&X_REQUEST_ID, made.clone());
            add_forwarding(&mut by_map, &client, version);
            let mut by_lines = came.clone();
            for (name, value) in &parsed(&lines.parts(&client)) {
                by_lines.append(name, value.clone());
            }
            assert_eq!(by_lines, by_map, "{ip} {version:?}");
            assert_eq!(made.len(), 32);
            // A client's own id is kept, and no line is made for it.
            came.insert(&X_REQUEST_ID, HeaderValue::from_static("abc"));
            let lines = ForwardingLines::for_request(&came, &client, version).expect("takes lines");
            assert_eq!(lines.request_id(&came).expect("the client's"), "abc");
            assert!(!parsed(&lines.parts(&client)).contains_key(&X_REQUEST_ID));
        }
    }

    #[test]
    fn a_request_carrying_a_forwarding_field_or_from_a_trusted_peer_takes_the_map() {
        let client = Client::new("127.0.0.1".parse().expect("ip"), false, false);
        for name in [
            "x-forwarded-for",
            "X-Real-IP",
            "x-forwarded-proto",
            "forwarded",
        ] {
            let mut h = HeaderMap::new();
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_static("1"),
            );
            assert!(
                ForwardingLines::for_request(&h, &client, Version::HTTP_11).is_none(),
                "{name}"
            );
        }
        let trusted = Client::new("127.0.0.1".parse().expect("ip"), false, true);
        assert!(
            ForwardingLines::for_request(&HeaderMap::new(), &trusted, Version::HTTP_11).is_none()
        );
    }

    fn sent() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.2"));
        h.append("forwarded", HeaderValue::from_static("for=10.0.0.1"));
        h.append("x-real-ip", HeaderValue::from_static("10.0.0.1"));
        h.append("x-forwarded-proto", HeaderValue::from_static("http"));
        h
    }

    #[test]
    fn a_trusted_peers_fields_are_kept_with_this_hop_appended() {
        let mut h = sent();
        let client = Client::new("::1".parse().expect("ip"), true, true);
        add_forwarding(&mut h, &client, Version::HTTP_11);
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, ::1");
        assert_eq!(h["forwarded"], "for=10.0.0.1, for=\"[::1]\";proto=https");
        assert_eq!(h["x-real-ip"], "10.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["via"], "1.1 tailguard");
    }

    #[test]
    fn an_untrusted_peers_fields_are_replaced_and_forwarded_only_written_where_sent() {
        let client = Client::new("127.0.0.1".parse().expect("ip"), false, false);
        let mut h = sent();
        add_forwarding(&mut h, &client, Version::HTTP_11);
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        assert_eq!(h["forwarded"], "for=127.0.0.1;proto=http");
        assert_eq!(h["x-real-ip"], "127.0.0.1");
        let mut plain = HeaderMap::new();
        add_forwarding(&mut plain, &client, Version::HTTP_11);
        assert!(!plain.contains_key("forwarded"));
        assert_eq!(plain["x-real-ip"], "127.0.0.1");
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
