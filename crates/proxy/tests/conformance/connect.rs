//! CONNECT (RFC 9110 §9.3.6): the gateway is no tunnel: `501` and the connection closed,
//! the bytes after the head (a tunnel's, or a smuggled request) never processed.

use super::{Case, reject, run};

pub(super) fn cases() -> Vec<Case> {
    vec![
        reject(
            "authority_form",
            "RFC 9110 §9.3.6; RFC 9112 §3.2.3",
            501,
            b"CONNECT gw.test:443 HTTP/1.1\r\nHost: gw.test:443\r\n\r\n",
        ),
        reject(
            "with_a_request_behind_it",
            "RFC 9110 §9.3.6 (what follows is tunnel data)",
            501,
            b"CONNECT gw.test:443 HTTP/1.1\r\nHost: gw.test:443\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "with_a_content_length",
            "RFC 9110 §9.3.6 (CONNECT content has no meaning)",
            501,
            b"CONNECT gw.test:443 HTTP/1.1\r\nHost: gw.test:443\r\nContent-Length: 5\r\n\r\nhello",
        ),
        reject(
            "origin_form",
            "RFC 9112 §3.2.3",
            501,
            b"CONNECT / HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        )
        .or_status(&[400]),
        reject(
            "http_1_0",
            "RFC 9110 §9.3.6",
            501,
            b"CONNECT gw.test:443 HTTP/1.0\r\n\r\n",
        ),
        reject(
            "lowercase_is_another_method",
            "RFC 9110 §9.1 (case-sensitive); authority-form is only for CONNECT",
            400,
            b"connect gw.test:443 HTTP/1.1\r\nHost: gw.test:443\r\n\r\n",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("connect", cases()).await;
}
