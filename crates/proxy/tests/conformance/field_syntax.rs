//! Field syntax (RFC 9110 §5.1-5.6, RFC 9112 §5): names are tokens with no whitespace before
//! the colon, values have no CTLs; valid fields cross with their values trimmed of OWS and
//! same-named fields in order.

use super::{Case, pass, reject, run, to};

pub(super) fn cases() -> Vec<Case> {
    vec![
        reject(
            "space_before_colon",
            "RFC 9112 §5.1 (MUST reject with 400)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A : 1\r\n\r\n",
        ),
        reject(
            "tab_before_colon",
            "RFC 9112 §5.1",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A\t: 1\r\n\r\n",
        ),
        reject(
            "empty_name",
            "RFC 9110 §5.1 (field-name = token)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\n: 1\r\n\r\n",
        ),
        reject(
            "no_colon",
            "RFC 9112 §5",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A 1\r\n\r\n",
        ),
        reject(
            "slash_in_name",
            "RFC 9110 §5.6.2 (tchar)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX/A: 1\r\n\r\n",
        ),
        reject(
            "brace_in_name",
            "RFC 9110 §5.6.2",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX{A}: 1\r\n\r\n",
        ),
        reject(
            "non_ascii_name",
            "RFC 9110 §5.6.2",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX\xc3\xa9: 1\r\n\r\n",
        ),
        reject(
            "nul_in_value",
            "RFC 9110 §5.5 (NUL: reject or replace)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: a\0b\r\n\r\n",
        ),
        reject(
            "ctl_in_value",
            "RFC 9110 §5.5",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: a\x01b\r\n\r\n",
        ),
        reject(
            "del_in_value",
            "RFC 9110 §5.5 (DEL is a CTL)",
            400,
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: a\x7fb\r\n\r\n",
        ),
        pass(
            "obs_text_value_forwarded_as_is",
            "RFC 9110 §5.5 (obs-text)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: caf\xe9\r\n\r\n",
            to("GET", "/").field("x-a", b"caf\xe9"),
        ),
        pass(
            "ows_trimmed_inner_space_kept",
            "RFC 9110 §5.5",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: \t a  b \t\r\n\r\n",
            to("GET", "/").field("x-a", "a  b"),
        ),
        pass(
            "empty_value",
            "RFC 9110 §5.5 (field-value may be empty)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A:\r\n\r\n",
            to("GET", "/").field("x-a", ""),
        ),
        pass(
            "same_name_order_kept",
            "RFC 9110 §5.3",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-A: 1\r\nX-B: 2\r\nx-a: 3\r\n\r\n",
            to("GET", "/")
                .field("x-a", "1")
                .field("x-a", "3")
                .field("x-b", "2"),
        ),
        pass(
            "lowercase_method_is_a_token",
            "RFC 9110 §9.1 (methods are case-sensitive tokens)",
            b"get / HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            to("get", "/"),
        ),
        pass(
            "extension_method",
            "RFC 9110 §9.1, §16.1",
            b"PURGE /x HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            to("PURGE", "/x"),
        ),
        reject(
            "method_with_a_non_token_char",
            "RFC 9110 §9.1",
            400,
            b"GE(T / HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("field_syntax", cases()).await;
}
