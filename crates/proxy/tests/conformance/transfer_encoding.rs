//! `Transfer-Encoding` (RFC 9112 §6.1-6.3) and Kettle's CL.TE / TE.CL desyncs and TE
//! obfuscations (2019, 2022): only `chunked`, alone, in HTTP/1.1 and without a length,
//! is a body; every other combination is refused.

use super::{Case, pass, reject, run, to};

const CHUNKED_HELLO: &[u8] = b"5\r\nhello\r\n0\r\n\r\n";

fn te(value: &str) -> Vec<u8> {
    let mut out = format!("POST / HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: {value}\r\n\r\n")
        .into_bytes();
    out.extend_from_slice(CHUNKED_HELLO);
    out
}

pub(super) fn cases() -> Vec<Case> {
    vec![
        pass(
            "chunked",
            "RFC 9112 §7.1",
            te("chunked"),
            to("POST", "/").chunked("hello"),
        ),
        pass(
            "chunked_any_case",
            "RFC 9112 §7 (coding names are case-insensitive)",
            te("CHUNKED"),
            to("POST", "/").chunked("hello"),
        ),
        pass(
            "chunked_with_trailing_ows",
            "RFC 9110 §5.5 (OWS around a value is not part of it)",
            te("chunked \t"),
            to("POST", "/").chunked("hello"),
        ),
        reject(
            "cl_te",
            "Kettle 2019 CL.TE; RFC 9112 §6.3 ¶3",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
        ),
        reject(
            "te_cl",
            "Kettle 2019 TE.CL",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\nGPOST / HTTP/1.1\r\nContent-Length: 15\r\n\r\nx=1\r\n0\r\n\r\n",
        ),
        reject(
            "cl_zero_te",
            "RFC 9112 §6.3 ¶3",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        reject(
            "chunked_twice_in_a_list",
            "RFC 9112 §6.1 (chunked only once)",
            400,
            te("chunked, chunked"),
        ),
        reject(
            "chunked_on_two_lines",
            "RFC 9112 §6.1",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        reject(
            "gzip_then_chunked",
            "RFC 9112 §6.1; a coding the gateway cannot re-frame",
            400,
            te("gzip, chunked"),
        ),
        reject(
            "chunked_then_gzip",
            "RFC 9112 §6.3 ¶4 (chunked not last: length unknown)",
            400,
            te("chunked, gzip"),
        ),
        reject("xchunked", "Kettle 2019 TE obfuscation", 400, te("xchunked")),
        reject("identity", "RFC 9112 §6.1 (identity is gone)", 400, te("identity")),
        reject("quoted", "Kettle 2019 TE obfuscation", 400, te("\"chunked\"")),
        reject("empty_value", "RFC 9112 §6.1", 400, te("")),
        reject(
            "vertical_tab_before",
            "Kettle 2019 TE obfuscation (\\x0b is not OWS)",
            400,
            te("\x0bchunked"),
        ),
        reject(
            "form_feed_after",
            "Kettle 2019 TE obfuscation (\\x0c is not OWS)",
            400,
            te("chunked\x0c"),
        ),
        reject(
            "space_before_colon",
            "RFC 9112 §5.1; Kettle 2019 (`Transfer-Encoding : chunked`)",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        reject(
            "obs_folded",
            "RFC 9112 §5.2; Kettle 2019 (line-wrapped TE)",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding:\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        reject(
            "in_http_1_0",
            "RFC 9112 §6.1 (a 1.0 message with TE is faulty framing)",
            400,
            b"POST / HTTP/1.0\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        reject(
            "cl_te_smuggled_get",
            "Kettle 2019 CL.TE with a whole request behind it",
            400,
            b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: gw.test\r\n\r\n",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("transfer_encoding", cases()).await;
}
