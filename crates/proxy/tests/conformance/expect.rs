//! `Expect: 100-continue` (RFC 9110 §10.1.1, RFC 9112 §9.3): `100 Continue` then the final
//! status when a body is coming; never a `100` to an HTTP/1.0 client; a body the gateway
//! will refuse gets its final status without a `100`.

use super::{Case, case, run, to};

const HEAD: &[u8] =
    b"POST / HTTP/1.1\r\nHost: gw.test\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";

pub(super) fn cases() -> Vec<Case> {
    let forwarded = to("POST", "/")
        .field("expect", "100-continue")
        .sized("hello");
    vec![
        case("continue_then_body", "RFC 9110 §10.1.1")
            .send(HEAD)
            .after(200, b"hello")
            .status(&[100, 200])
            .upstream(vec![forwarded.clone()]),
        case(
            "body_sent_without_waiting",
            "RFC 9110 §10.1.1 (a server MAY omit 100 once content arrived)",
        )
        .send([HEAD, b"hello"].concat())
        .status(&[100, 200])
        .or_status(&[200])
        .upstream(vec![forwarded]),
        case("no_body_no_continue_needed", "RFC 9110 §10.1.1")
            .send(b"GET / HTTP/1.1\r\nHost: gw.test\r\nExpect: 100-continue\r\n\r\n")
            .status(&[200])
            .or_status(&[100, 200])
            .upstream(vec![to("GET", "/").field("expect", "100-continue")]),
        case(
            "never_to_http_1_0",
            "RFC 9110 §10.1.1 (MUST NOT send 100 to an HTTP/1.0 client)",
        )
        .send(b"POST / HTTP/1.0\r\nHost: gw.test\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        .after(200, b"hello")
        .status(&[200])
        .closed()
        .upstream(vec![to("POST", "/").sized("hello")])
        // Forwarding a 1.0 request's Expect or not are both right (§10.1.1: it is ignored).
        .ignoring("expect"),
        case(
            "too_large_gets_413_without_continue",
            "RFC 9110 §10.1.1 (a final status instead of 100)",
        )
        .config("[limits]\nbody_bytes = 1024\n")
        .send(b"POST / HTTP/1.1\r\nHost: gw.test\r\nExpect: 100-continue\r\nContent-Length: 2048\r\n\r\n")
        .status(&[413])
        .closed(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("expect", cases()).await;
}
