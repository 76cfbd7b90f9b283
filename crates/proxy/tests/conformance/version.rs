//! HTTP versions (RFC 9112 §2.3, §9.3; RFC 9110 §6.2, §15.6.6): 1.0 and 1.1 with their
//! persistence rules, a higher 1.x read as 1.1, another major version `505`, garbage `400`.
//! The upstream is always spoken to in HTTP/1.1.

use super::{Case, case, pass, reject, run, to};

pub(super) fn cases() -> Vec<Case> {
    vec![
        pass(
            "http_1_0_closes_after_the_response",
            "RFC 9112 §9.3 (1.0 without keep-alive is not persistent)",
            b"GET / HTTP/1.0\r\nHost: gw.test\r\n\r\n",
            to("GET", "/"),
        )
        .closed(),
        pass(
            "http_1_0_keep_alive_persists",
            "RFC 9112 §9.3, Appendix C.2.2",
            b"GET / HTTP/1.0\r\nHost: gw.test\r\nConnection: keep-alive\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "http_1_1_close_closes",
            "RFC 9112 §9.6",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n",
            to("GET", "/"),
        )
        .closed(),
        pass(
            "http_1_2_served_as_1_1",
            "RFC 9110 §2.5 (a higher minor version is served as the highest spoken)",
            b"GET / HTTP/1.2\r\nHost: gw.test\r\n\r\n",
            to("GET", "/"),
        ),
        reject(
            "http_2_0_on_an_http_1_connection",
            "RFC 9110 §15.6.6",
            505,
            b"GET / HTTP/2.0\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "http_3_1",
            "RFC 9110 §15.6.6",
            505,
            b"GET / HTTP/3.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "garbage_version",
            "RFC 9112 §2.3",
            400,
            b"GET / HTTP/x.y\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "lowercase_http_name",
            "RFC 9112 §2.3 (HTTP-name is case-sensitive)",
            400,
            b"GET / http/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "two_digit_minor",
            "RFC 9112 §2.3 (DIGIT \".\" DIGIT)",
            400,
            b"GET / HTTP/1.10\r\nHost: gw.test\r\n\r\n",
        ),
        case(
            "http_0_9_request",
            "RFC 9112 §2.3, Appendix C.1 (0.9 is not served)",
        )
        .send(b"GET /\r\n\r\n")
        .status(&[400])
        .or_status(&[505])
        .closed(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("version", cases()).await;
}
