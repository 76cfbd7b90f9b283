//! `Content-Length` (RFC 9112 §6.3, RFC 9110 §8.6): one valid length is forwarded as one
//! `content-length` the gateway writes; anything else is refused before the upstream.

use super::{Case, case, pass, reject, run, to};

pub(super) fn cases() -> Vec<Case> {
    vec![
        pass(
            "valid_length",
            "RFC 9112 §6.3 ¶6",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5\r\n\r\nhello",
            to("POST", "/").sized("hello"),
        ),
        pass(
            "list_of_equal_values_forwarded_as_one",
            "RFC 9112 §6.3 ¶5; RFC 9110 §8.6",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5, 5\r\n\r\nhello",
            to("POST", "/").sized("hello"),
        ),
        pass(
            "two_identical_lines_forwarded_as_one",
            "RFC 9110 §8.6",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            to("POST", "/").sized("hello"),
        ),
        pass(
            "leading_zeros_rewritten",
            "RFC 9110 §8.6 (1*DIGIT); the head is built, not copied",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 005\r\n\r\nhello",
            to("POST", "/").sized("hello"),
        ),
        pass(
            "zero_length",
            "RFC 9110 §8.6",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 0\r\n\r\n",
            to("POST", "/").field("content-length", "0"),
        ),
        pass(
            "get_with_a_body",
            "RFC 9110 §9.3.1 (content on GET has no defined meaning, but is framed)",
            b"GET / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 3\r\n\r\nabc",
            to("GET", "/").sized("abc"),
        ),
        pass(
            "lowercase_name_and_ows",
            "RFC 9110 §5.1, §5.5",
            b"POST / HTTP/1.1\r\nHost: gw.test\r\ncontent-LENGTH:\t 5 \t\r\n\r\nhello",
            to("POST", "/").sized("hello"),
        ),
        reject(
            "differing_lines",
            "RFC 9112 §6.3 ¶5; Kettle 2019 CL.CL",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        ),
        reject(
            "differing_list",
            "RFC 9112 §6.3 ¶5",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5, 6\r\n\r\nhello!",
        ),
        reject(
            "plus_sign",
            "RFC 9110 §8.6 (1*DIGIT)",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: +5\r\n\r\nhello",
        ),
        reject(
            "minus_sign",
            "RFC 9110 §8.6",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: -5\r\n\r\nhello",
        ),
        reject(
            "hex_prefix",
            "RFC 9110 §8.6",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 0x5\r\n\r\nhello",
        ),
        reject(
            "empty_value",
            "RFC 9110 §8.6",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: \r\n\r\nhello",
        ),
        reject(
            "space_inside_the_number",
            "RFC 9110 §8.6",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 1 0\r\n\r\nhello",
        ),
        reject(
            "empty_list_element",
            "RFC 9112 §6.3 ¶5 (only a list of identical values is one length)",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5,\r\n\r\nhello",
        ),
        reject(
            "overflowing_u64",
            "RFC 9110 §8.6 (anticipate large numerals, never overflow)",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 99999999999999999999999\r\n\r\nhello",
        ),
        reject(
            "decimal_point",
            "RFC 9110 §8.6",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5.0\r\n\r\nhello",
        ),
        case(
            "over_the_body_limit",
            "RFC 9110 §15.5.14 (413 before reading the content)",
        )
        .config("[limits]\nbody_bytes = 1024\n")
        .send(b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 2048\r\n\r\n")
        .status(&[413])
        .closed(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("content_length", cases()).await;
}
