//! Request-target forms (RFC 9112 §3.2) and request-line syntax (§3): origin-form;
//! absolute-form forwarded as origin-form with the target's authority as Host; `*` only for
//! OPTIONS; authority-form only for CONNECT; one SP between the three parts.

use super::{Case, pass, reject, req, run, to};

pub(super) fn cases() -> Vec<Case> {
    vec![
        pass(
            "origin_form_with_query",
            "RFC 9112 §3.2.1",
            b"GET /a/b?c=d&e HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            to("GET", "/a/b?c=d&e"),
        ),
        pass(
            "absolute_form",
            "RFC 9112 §3.2.2 (the target's authority replaces Host)",
            b"GET http://other.test/p?q=1 HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            req("GET", "/p?q=1").field("host", "other.test"),
        ),
        pass(
            "absolute_form_with_port",
            "RFC 9112 §3.2.2",
            b"GET http://other.test:8080/p HTTP/1.1\r\nHost: other.test:8080\r\n\r\n",
            req("GET", "/p").field("host", "other.test:8080"),
        ),
        pass(
            "absolute_form_without_path",
            "RFC 9112 §3.2.2; RFC 9110 §4.2.1 (empty path is /)",
            b"GET http://other.test HTTP/1.1\r\nHost: other.test\r\n\r\n",
            req("GET", "/").field("host", "other.test"),
        ),
        pass(
            "absolute_form_with_a_query_and_no_path",
            "RFC 9112 §3.2.2 (found by the differential fuzz target: went up as `GET ?q`)",
            b"GET http://other.test?q=1 HTTP/1.1\r\nHost: other.test\r\n\r\n",
            req("GET", "/?q=1").field("host", "other.test"),
        ),
        pass(
            "absolute_form_https_scheme",
            "RFC 9112 §3.2.2",
            b"GET https://other.test/s HTTP/1.1\r\nHost: other.test\r\n\r\n",
            req("GET", "/s").field("host", "other.test"),
        ),
        reject(
            "absolute_form_with_userinfo",
            "RFC 9110 §4.2.4 (userinfo is not allowed)",
            400,
            b"GET http://user@other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
        ),
        reject(
            "absolute_form_other_scheme",
            "RFC 9112 §3.2.2 (an http(s) proxy)",
            400,
            b"GET ftp://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
        ),
        reject(
            "absolute_form_empty_host",
            "RFC 9110 §4.2.1 (http URI with empty host is invalid)",
            400,
            b"GET http:///p HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "authority_form_on_get",
            "RFC 9112 §3.2.3 (authority-form is only for CONNECT)",
            400,
            b"GET gw.test:80 HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        pass(
            "asterisk_form_options",
            "RFC 9112 §3.2.4",
            b"OPTIONS * HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            to("OPTIONS", "*"),
        ),
        reject(
            "asterisk_form_on_get",
            "RFC 9112 §3.2.4 (only OPTIONS)",
            400,
            b"GET * HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "relative_path",
            "RFC 9112 §3.2",
            400,
            b"GET a/b HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "fragment",
            "RFC 9112 §3.2.1 (origin-form has no fragment)",
            400,
            b"GET /a#frag HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "non_ascii_target",
            "RFC 9112 §3.2; RFC 3986 §2",
            400,
            b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        pass(
            "double_slash_stays_a_path",
            "RFC 9112 §3.2.1 (origin-form: never read as an authority)",
            b"GET //evil.test/x HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            to("GET", "//evil.test/x"),
        ),
        reject(
            "two_spaces_before_the_target",
            "RFC 9112 §3 (single SP; whitespace-split parsing is unsafe)",
            400,
            b"GET  / HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "space_inside_the_target",
            "RFC 9112 §3.2",
            400,
            b"GET /a b HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "tab_separators",
            "RFC 9112 §3",
            400,
            b"GET\t/\tHTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "trailing_space_after_the_version",
            "RFC 9112 §3",
            400,
            b"GET / HTTP/1.1 \r\nHost: gw.test\r\n\r\n",
        ),
        reject(
            "empty_target",
            "RFC 9112 §3",
            400,
            b"GET  HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("target", cases()).await;
}
