//! Upgrades (RFC 9110 §7.8; the h2c smuggling research, Bishop Fox 2020): `h2c` never
//! reaches the upstream (the request goes on as a plain one, no `101`); a WebSocket upgrade
//! does, and the upstream's `101` makes a tunnel.

use super::{Answer, Case, case, pass, run, to};

const WS: &[u8] = b"GET /ws HTTP/1.1\r\nHost: gw.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

pub(super) fn cases() -> Vec<Case> {
    let ws = to("GET", "/ws")
        .field("connection", "upgrade")
        .field("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .field("sec-websocket-version", "13")
        .field("upgrade", "websocket");
    vec![
        pass(
            "h2c_is_never_forwarded",
            "RFC 9113 §3.1 (h2c gone); h2c smuggling (Bishop Fox 2020)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "h2c_with_a_body",
            "h2c smuggling",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\nContent-Length: 5\r\n\r\nhello",
            to("POST", "/").sized("hello"),
        ),
        pass(
            "h2c_without_connection_upgrade",
            "RFC 9110 §7.8",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: HTTP2-Settings\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "websocket_and_h2c_offered",
            "RFC 9110 §7.8; only a pure websocket upgrade crosses",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nUpgrade: websocket, h2c\r\nConnection: Upgrade\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "websocket_in_http_1_0",
            "RFC 9110 §7.8 (Upgrade is for HTTP/1.1)",
            b"GET / HTTP/1.0\r\nHost: gw.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            to("GET", "/"),
        )
        .closed(),
        case("websocket_tunnel", "RFC 6455 §4; RFC 9110 §15.2.2")
            .answer(Answer::Upgrade)
            .send(WS)
            .after(200, b"ping through the tunnel")
            .status(&[101])
            .tunnel(b"ping through the tunnel")
            .either()
            .upstream(vec![ws.clone()]),
        case("websocket_declined_by_the_upstream", "RFC 9110 §7.8 (a non-101 answer: no switch)")
            .send(WS)
            .status(&[200])
            .upstream(vec![ws]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("upgrade", cases()).await;
}
