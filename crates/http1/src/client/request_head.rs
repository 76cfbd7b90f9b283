//! The request head sent upstream, built by one rule: origin form, the gateway's fields less
//! every hop-by-hop and framing field, then exactly one framing field chosen from the body.

use http::header::UPGRADE;
use http::{Method, Request};

use crate::fields;
use crate::framing;

/// Methods whose requests carry a body by definition: sent with `Content-Length: 0` when
/// they have none, as an HTTP/1.1 server may otherwise wait for one (411 or a hang).
pub(super) fn expects_body(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PUT || *method == Method::PATCH
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RequestFraming {
    /// No body, and a method that needs no length.
    None,
    /// `Content-Length` (`0` for a method that expects a body and has none).
    Length(u64),
    /// A body of unknown length (HTTP/2 without `content-length`, or chunked from an
    /// HTTP/1.1 client): sent chunked.
    Chunked,
}

/// The request head on the wire, built from the parsed message by one rule: origin form,
/// HTTP/1.1, the fields as the gateway left them less every hop-by-hop and framing field
/// (whatever a peer sent of those never crosses), then exactly one framing field chosen from
/// the body, and `Upgrade` only for a WebSocket the gateway tunnels (never `h2c`). The
/// caller's `extra` field lines follow the request's fields as given. Says whether the
/// request asks for that upgrade.
pub(super) fn write_head<B>(
    buf: &mut Vec<u8>,
    req: &Request<B>,
    framing: RequestFraming,
    extra: &[&[u8]],
) -> bool {
    buf.clear();
    buf.extend_from_slice(req.method().as_str().as_bytes());
    buf.push(b' ');
    // Origin form starts with `/` (RFC 9112 §3.2.1). An absolute-form request with an
    // empty path (`GET http://h?q`) parses to the path-and-query `?q`: its origin form is
    // `/?q` (§3.2.2: an empty path is `/`), never a target an upstream cannot frame.
    // `*` (asterisk form, `OPTIONS *`) goes as it came.
    let target = req.uri().path_and_query().map_or("", |p| p.as_str());
    if !target.starts_with('/') && target != "*" {
        buf.push(b'/');
    }
    buf.extend_from_slice(target.as_bytes());
    buf.extend_from_slice(b" HTTP/1.1\r\n");
    let mut websocket = false;
    for (name, value) in req.headers() {
        if fields::is_hop_by_hop(name) || fields::is_framing(name) {
            websocket |= name == UPGRADE && value.as_bytes().eq_ignore_ascii_case(b"websocket");
            continue;
        }
        framing::push_field(buf, name, value);
    }
    for lines in extra {
        debug_assert!(
            lines.is_empty() || lines.ends_with(b"\r\n"),
            "extra field lines end with CRLF"
        );
        buf.extend_from_slice(lines);
    }
    if websocket {
        buf.extend_from_slice(b"connection: upgrade\r\nupgrade: websocket\r\n");
    }
    match framing {
        RequestFraming::None => {}
        RequestFraming::Length(n) => {
            buf.extend_from_slice(b"content-length: ");
            buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => buf.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    buf.extend_from_slice(b"\r\n");
    websocket
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_head_is_origin_form_with_its_framing_header() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/a?b=1")
            .header("host", "x")
            .body(())
            .expect("request");
        let mut buf = Vec::new();
        write_head(&mut buf, &req, RequestFraming::Chunked, &[]);
        assert_eq!(
            buf,
            b"POST /a?b=1 HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        write_head(&mut buf, &req, RequestFraming::Length(0), &[]);
        assert!(buf.ends_with(b"content-length: 0\r\n\r\n"));
    }

    #[test]
    fn an_absolute_target_with_an_empty_path_goes_upstream_as_slash() {
        // Found by the differential fuzz target: `GET http://h?q` went up as `GET ?q`.
        for (uri, line) in [
            ("http://a.example?q=1", &b"GET /?q=1 HTTP/1.1\r\n"[..]),
            ("http://a.example", b"GET / HTTP/1.1\r\n"),
            ("*", b"GET * HTTP/1.1\r\n"),
        ] {
            let req = Request::builder().uri(uri).body(()).expect("request");
            let mut buf = Vec::new();
            write_head(&mut buf, &req, RequestFraming::None, &[]);
            assert!(
                buf.starts_with(line),
                "{uri}: {}",
                String::from_utf8_lossy(&buf)
            );
        }
    }

    #[test]
    fn a_peers_framing_and_hop_by_hop_fields_never_reach_the_head_and_only_websocket_upgrades() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/")
            .header("host", "x")
            .header("content-length", "5, 5")
            .header("transfer-encoding", "chunked")
            .header("connection", "upgrade, http2-settings")
            .header("upgrade", "h2c")
            .header("te", "trailers")
            .header("x-kept", "1")
            .body(())
            .expect("request");
        let mut buf = Vec::new();
        let upgrade = write_head(&mut buf, &req, RequestFraming::Length(5), &[]);
        assert!(!upgrade);
        assert_eq!(
            String::from_utf8_lossy(&buf),
            "POST / HTTP/1.1\r\nhost: x\r\nx-kept: 1\r\ncontent-length: 5\r\n\r\n"
        );
        let ws = Request::builder()
            .uri("/chat")
            .header("host", "x")
            .header("upgrade", "websocket")
            .header("connection", "upgrade")
            .body(())
            .expect("request");
        assert!(write_head(&mut buf, &ws, RequestFraming::None, &[]));
        assert_eq!(
            String::from_utf8_lossy(&buf),
            "GET /chat HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
        );
    }

    #[test]
    fn extra_field_lines_follow_the_requests_fields_before_the_framing_field() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/")
            .header("host", "x")
            .body(())
            .expect("request");
        let mut buf = Vec::new();
        write_head(
            &mut buf,
            &req,
            RequestFraming::Length(2),
            &[
                b"x-forwarded-for: 10.0.0.1\r\nvia: 1.1 tailguard\r\n",
                b"",
                b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n",
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&buf),
            "POST / HTTP/1.1\r\nhost: x\r\n\
             x-forwarded-for: 10.0.0.1\r\nvia: 1.1 tailguard\r\n\
             traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\
             content-length: 2\r\n\r\n"
        );
    }
}
