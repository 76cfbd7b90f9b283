//! Host (RFC 9112 §3.2, RFC 9110 §7.2): exactly one valid `uri-host [":" port]` in HTTP/1.1,
//! the absolute-form authority winning over it; the upstream always gets one Host.

use super::{Case, pass, reject, req, run, to};

pub(super) fn cases() -> Vec<Case> {
    vec![
        pass(
            "with_port",
            "RFC 9110 §7.2",
            b"GET / HTTP/1.1\r\nHost: gw.test:8080\r\n\r\n",
            req("GET", "/").field("host", "gw.test:8080"),
        ),
        pass(
            "ipv6_literal",
            "RFC 3986 §3.2.2",
            b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
            req("GET", "/").field("host", "[::1]:80"),
        ),
        pass(
            "ows_around_the_value",
            "RFC 9110 §5.5",
            b"GET / HTTP/1.1\r\nHost:\t gw.test \t\r\n\r\n",
            to("GET", "/"),
        ),
        pass(
            "absolute_form_authority_wins",
            "RFC 9112 §3.2.2 (MUST ignore Host, use the target's authority)",
            b"GET http://other.test/ HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            req("GET", "/").field("host", "other.test"),
        ),
        pass(
            "http_1_0_without_host",
            "RFC 9112 §3.2 (an HTTP/1.1 request upstream needs one Host)",
            b"GET / HTTP/1.0\r\n\r\n",
            req("GET", "/").any("host"),
        )
        .closed(),
        reject(
            "missing_in_http_1_1",
            "RFC 9112 §3.2 (MUST respond 400)",
            400,
            b"GET / HTTP/1.1\r\n\r\n",
        ),
        reject(
            "two_lines",
            "RFC 9112 §3.2 (more than one Host: 400)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nHost: evil.test\r\n\r\n",
        ),
        reject(
            "two_identical_lines",
            "RFC 9112 §3.2",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "a_list",
            "RFC 9112 §3.2 (Host is a singleton)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test, evil.test\r\n\r\n",
        ),
        reject(
            "userinfo",
            "RFC 9110 §4.2.4, §7.2",
            400,
            b"GET / HTTP/1.1\r\nHost: user@gw.test\r\n\r\n",
        ),
        reject(
            "space_inside",
            "RFC 9112 §3.2 (invalid Host: 400)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw test\r\n\r\n",
        ),
        reject(
            "path_in_host",
            "RFC 9110 §7.2",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test/evil\r\n\r\n",
        ),
        reject(
            "non_numeric_port",
            "RFC 3986 §3.2.3",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test:80x\r\n\r\n",
        ),
        reject(
            "unclosed_ipv6_literal",
            "RFC 3986 §3.2.2",
            400,
            b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("host", cases()).await;
}
