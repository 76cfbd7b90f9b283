//! Hop-by-hop fields (RFC 9110 §7.6.1): `Connection` and the fields it names, `Keep-Alive`,
//! `Proxy-Connection`, `TE`, `Upgrade` never cross; a `Connection` naming a framing or
//! routing field (the hop-by-hop abuse) does not strip the body's framing or Host.

use super::{Case, pass, run, to};

pub(super) fn cases() -> Vec<Case> {
    vec![
        pass(
            "close_and_a_named_field",
            "RFC 9110 §7.6.1",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nX-Kept: 1\r\n\r\n",
            to("GET", "/").field("x-kept", "1"),
        )
        .closed(),
        pass(
            "named_fields_on_two_lines",
            "RFC 9110 §7.6.1",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nConnection: X-A\r\nConnection: x-b\r\nX-A: 1\r\nX-B: 2\r\nX-C: 3\r\n\r\n",
            to("GET", "/").field("x-c", "3"),
        ),
        pass(
            "naming_authorization_strips_it",
            "RFC 9110 §7.6.1; hop-by-hop abuse (Connection-named credentials)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nConnection: Authorization\r\nAuthorization: Basic eDp5\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "naming_content_length_keeps_the_framing",
            "RFC 9110 §7.6.1; hop-by-hop abuse",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello",
            to("POST", "/").sized("hello"),
        ),
        pass(
            "naming_transfer_encoding_keeps_the_framing",
            "RFC 9110 §7.6.1; hop-by-hop abuse",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            to("POST", "/").chunked("hello"),
        ),
        pass(
            "naming_host_keeps_host",
            "RFC 9110 §7.6.1; hop-by-hop abuse",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nConnection: Host\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "keep_alive_field",
            "RFC 9112 Appendix C.2.2",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "keep_alive_field_not_named",
            "RFC 9110 §7.6.1 (Keep-Alive is hop-by-hop by name)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nKeep-Alive: timeout=5\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "proxy_connection",
            "RFC 9110 §7.6.1 (Proxy-Connection)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nProxy-Connection: keep-alive\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "te_trailers",
            "RFC 9110 §10.1.4 (TE is hop-by-hop)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nTE: trailers\r\nConnection: TE\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "upgrade_without_connection_upgrade",
            "RFC 9110 §7.8 (Upgrade must be named by Connection)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nUpgrade: websocket\r\n\r\n",
            to("GET", "/"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("hop_by_hop", cases()).await;
}
