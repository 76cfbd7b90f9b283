//! Line endings (RFC 9112 §2.2, §5.2): bare CR is refused; bare LF is accepted as a line end
//! (the gateway's choice where the RFC says MAY) but the upstream always gets CRLF; obs-fold
//! is refused.

use super::{Case, pass, reject, run, to};

pub(super) fn cases() -> Vec<Case> {
    vec![
        reject(
            "bare_cr_in_the_request_line",
            "RFC 9112 §2.2 (bare CR: invalid or replaced by SP)",
            400,
            b"GET /\r HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "bare_cr_as_a_line_end",
            "RFC 9112 §2.2",
            400,
            b"GET / HTTP/1.1\rHost: gw.test\r\n\r\n",
        ),
        reject(
            "bare_cr_in_a_value",
            "RFC 9112 §2.2; RFC 9110 §5.5",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: a\rb\r\n\r\n",
        ),
        pass(
            "bare_lf_line_ends",
            "RFC 9112 §2.2 (a recipient MAY take LF as a line end)",
            b"GET / HTTP/1.1\nHost: gw.test\nX-A: 1\n\n",
            to("GET", "/").field("x-a", "1"),
        ),
        pass(
            "mixed_crlf_and_lf",
            "RFC 9112 §2.2",
            b"GET / HTTP/1.1\r\nHost: gw.test\nX-A: 1\r\n\n",
            to("GET", "/").field("x-a", "1"),
        ),
        pass(
            "bare_lf_head_with_a_body",
            "RFC 9112 §2.2",
            b"POST / HTTP/1.1\nHost: gw.test\nContent-Length: 5\n\nhello",
            to("POST", "/").sized("hello"),
        ),
        pass(
            "empty_lines_before_the_request_line",
            "RFC 9112 §2.2 (SHOULD ignore at least one empty line before)",
            b"\r\nGET / HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            to("GET", "/"),
        ),
        reject(
            "obs_fold_with_space",
            "RFC 9112 §5.2 (a proxy may reject obs-fold with 400)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: one\r\n two\r\n\r\n",
        ),
        reject(
            "obs_fold_with_tab",
            "RFC 9112 §5.2",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: one\r\n\ttwo\r\n\r\n",
        ),
        reject(
            "whitespace_line_after_the_request_line",
            "RFC 9112 §2.2 (whitespace before the first field: reject)",
            400,
            b"GET / HTTP/1.1\r\n Host: gw.test\r\n\r\n",
        ),
        reject(
            "nul_in_the_request_line",
            "RFC 9112 §3",
            400,
            b"GET /\0 HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("line_endings", cases()).await;
}
