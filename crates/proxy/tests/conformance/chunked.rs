//! The chunked coding (RFC 9112 §7.1) and Kettle's 2025 chunk-parsing desyncs ("funky
//! chunks"): sizes of hex digits only, extensions parsed and dropped, CRLF after data,
//! trailers forwarded without framing or routing fields; the upstream gets canonical
//! chunks from the gateway.

use super::{Case, Req, pass, reject_body, run, to};

fn head() -> Req {
    to("POST", "/").field("transfer-encoding", "chunked")
}

fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out =
        b"POST / HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    out.extend_from_slice(body);
    out
}

pub(super) fn cases() -> Vec<Case> {
    vec![
        pass(
            "several_chunks",
            "RFC 9112 §7.1",
            chunked(b"3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n"),
            to("POST", "/").chunked("hello"),
        ),
        pass(
            "uppercase_hex_size",
            "RFC 9112 §7.1 (HEXDIG is case-insensitive)",
            chunked(b"A\r\n0123456789\r\n0\r\n\r\n"),
            to("POST", "/").chunked("0123456789"),
        ),
        pass(
            "leading_zeros_in_size",
            "RFC 9112 §7.1 (1*HEXDIG)",
            chunked(b"005\r\nhello\r\n0\r\n\r\n"),
            to("POST", "/").chunked("hello"),
        ),
        pass(
            "extension_dropped",
            "RFC 9112 §7.1.1 (a recipient ignores unknown extensions)",
            chunked(b"5;ext=1\r\nhello\r\n0;last\r\n\r\n"),
            to("POST", "/").chunked("hello"),
        ),
        pass(
            "quoted_extension_dropped",
            "RFC 9112 §7.1.1 (chunk-ext-val = token / quoted-string)",
            chunked(b"5;a=\"b;c\"\r\nhello\r\n0\r\n\r\n"),
            to("POST", "/").chunked("hello"),
        ),
        pass(
            "empty_body",
            "RFC 9112 §7.1",
            chunked(b"0\r\n\r\n"),
            // The gateway waits for a body's first bytes or its end before it forwards
            // (`stream_request` off): this one has ended by then, so its length is known.
            to("POST", "/").sized(""),
        ),
        pass(
            "trailer_forwarded",
            "RFC 9112 §7.1.2; RFC 9110 §6.5",
            chunked(b"5\r\nhello\r\n0\r\nX-Checksum: abc\r\n\r\n"),
            to("POST", "/")
                .chunked("hello")
                .trailer("x-checksum", "abc"),
        ),
        pass(
            "trailer_content_length_dropped",
            "RFC 9110 §6.5.1 (framing fields are not allowed in trailers)",
            chunked(b"5\r\nhello\r\n0\r\nContent-Length: 50\r\nX-Ok: 1\r\n\r\n"),
            to("POST", "/").chunked("hello").trailer("x-ok", "1"),
        ),
        pass(
            "trailer_transfer_encoding_dropped",
            "RFC 9110 §6.5.1",
            chunked(b"5\r\nhello\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            to("POST", "/").chunked("hello"),
        ),
        pass(
            "trailer_host_dropped",
            "RFC 9110 §6.5.1 (routing fields are not allowed in trailers)",
            chunked(b"5\r\nhello\r\n0\r\nHost: evil.test\r\n\r\n"),
            to("POST", "/").chunked("hello"),
        ),
        reject_body(
            "size_with_leading_space",
            "RFC 9112 §7.1; Kettle 2025",
            chunked(b" 5\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "size_with_trailing_junk",
            "RFC 9112 §7.1",
            chunked(b"5x\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "size_with_trailing_space",
            "RFC 9112 §7.1 (BWS only before ';')",
            chunked(b"5 \r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "size_with_0x_prefix",
            "RFC 9112 §7.1",
            chunked(b"0x5\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "negative_size",
            "RFC 9112 §7.1",
            chunked(b"-5\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "size_overflowing_u64",
            "RFC 9112 §7.1 (anticipate large numerals, never overflow)",
            chunked(b"10000000000000005\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "too_many_hex_digits",
            "RFC 9112 §7.1; an implementation limit",
            chunked(b"00000000000000000000005\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "empty_size",
            "RFC 9112 §7.1",
            chunked(b"\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "extension_with_bare_lf",
            "Kettle 2025 (a bare LF inside a chunk line)",
            chunked(b"5;a\nb\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "size_line_with_bare_lf",
            "RFC 9112 §7.1 (CRLF); Kettle 2025 (TERM.EXT / EXT.TERM)",
            chunked(b"5\nhello\r\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "data_followed_by_junk",
            "RFC 9112 §7.1 (chunk-data CRLF)",
            chunked(b"5\r\nhelloXX0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "data_followed_by_bare_lf",
            "Kettle 2025 (a lone LF after chunk data)",
            chunked(b"5\r\nhello\n0\r\n\r\n"),
            head(),
        ),
        reject_body(
            "unterminated_quoted_extension",
            "RFC 9112 §7.1.1 (quoted-string)",
            chunked(b"5;a=\"b\r\nhello\r\n0\r\n\r\n"),
            head(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("chunked", cases()).await;
}
