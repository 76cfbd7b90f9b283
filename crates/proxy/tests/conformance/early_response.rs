//! Early responses (RFC 9112 §9.3, §9.6; RFC 9110 §15.5.14): an upstream that answers
//! before reading the body. The client gets that answer; the unread body is discarded or the
//! connection closed, and never read as a next request (the "0.CL"/early-response desync of
//! Kettle 2025).

use super::{Answer, Case, case, run, to};

const TOO_LARGE: &[u8] =
    b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
const OK_NOW: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

fn post(body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "POST /up HTTP/1.1\r\nHost: gw.test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

pub(super) fn cases() -> Vec<Case> {
    let large = vec![b'a'; 256 * 1024];
    let smuggled: &[u8] = b"GET /smuggled HTTP/1.1\r\nHost: gw.test\r\n\r\n";
    let head = |n: usize| {
        to("POST", "/up")
            .field("content-length", n.to_string())
            .partial()
    };
    vec![
        case("413_before_a_large_body", "RFC 9110 §15.5.14; RFC 9112 §9.6")
            .answer(Answer::EarlyClose(TOO_LARGE))
            .send(post(&large))
            .status(&[413])
            .either()
            .upstream(vec![head(large.len())]),
        case("413_before_a_body_that_is_a_request", "Kettle 2025 (early-response desync)")
            .answer(Answer::EarlyClose(TOO_LARGE))
            .send(post(smuggled))
            .status(&[413])
            .either()
            .upstream(vec![head(smuggled.len())]),
        case("413_before_a_chunked_body_that_is_a_request", "Kettle 2025")
            .answer(Answer::EarlyClose(TOO_LARGE))
            .send(
                [
                    &b"POST /up HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
                    format!("{:x}\r\n", smuggled.len()).as_bytes(),
                    smuggled,
                    b"\r\n0\r\n\r\n",
                ]
                .concat(),
            )
            .status(&[413])
            .either()
            .upstream(vec![to("POST", "/up").field("transfer-encoding", "chunked").partial()]),
        case("200_before_the_body_then_read", "RFC 9112 §9.3 (a response may precede the end of the request)")
            .answer(Answer::Early(OK_NOW))
            .send(post(smuggled))
            .status(&[200])
            .either()
            .upstream(vec![to("POST", "/up").sized(smuggled)]),
        case("upstream_closes_without_answering", "RFC 9110 §15.6.3 (502)")
            .answer(Answer::EarlyClose(b""))
            .send(post(smuggled))
            .status(&[502])
            .either()
            .upstream(vec![head(smuggled.len())]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("early_response", cases()).await;
}
