//! Pipelining (RFC 9112 §9.3.2): requests in one write answered in order, each forwarded
//! alone; a bad request ends the connection after the good ones before it; nothing after a
//! `Connection: close` request is read.

use super::{Case, case, run, to};

const GET1: &[u8] = b"GET /1 HTTP/1.1\r\nHost: gw.test\r\n\r\n";
const GET2: &[u8] = b"GET /2 HTTP/1.1\r\nHost: gw.test\r\n\r\n";

pub(super) fn cases() -> Vec<Case> {
    let smuggled = b"GET /smuggled HTTP/1.1\r\nHost: gw.test\r\n\r\n";
    vec![
        case("two_in_one_write", "RFC 9112 §9.3.2")
            .send([GET1, GET2].concat())
            .status(&[200, 200])
            .upstream(vec![to("GET", "/1"), to("GET", "/2")]),
        case("three_with_bodies", "RFC 9112 §9.3.2")
            .send(
                [
                    GET1,
                    b"POST /2 HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5\r\n\r\nhello",
                    b"POST /3 HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                ]
                .concat(),
            )
            .status(&[200, 200, 200])
            .upstream(vec![
                to("GET", "/1"),
                to("POST", "/2").sized("hello"),
                to("POST", "/3").chunked("abc"),
            ]),
        case("bad_second_request", "RFC 9112 §9.3.2; RFC 9110 §15.5.1")
            .send([GET1, b"GET /2 HTTP/1.1\r\nHost: gw.test\r\nContent-Length: x\r\n\r\n"].concat())
            .status(&[200, 400])
            .closed()
            .upstream(vec![to("GET", "/1")]),
        case("nothing_after_connection_close", "RFC 9112 §9.6 (MUST NOT process further requests)")
            .send([b"GET /1 HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n", GET2].concat())
            .status(&[200])
            .closed()
            .upstream(vec![to("GET", "/1")]),
        case("nothing_after_http_1_0", "RFC 9112 §9.3")
            .send([b"GET /1 HTTP/1.0\r\nHost: gw.test\r\n\r\n", GET2].concat())
            .status(&[200])
            .closed()
            .upstream(vec![to("GET", "/1")]),
        case("nothing_after_a_refused_desync", "Kettle 2019 CL.TE in a pipeline")
            .send(
                [
                    &b"POST /1 HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..],
                    GET2,
                ]
                .concat(),
            )
            .status(&[400])
            .closed(),
        case("a_body_that_looks_like_a_request_is_a_body", "RFC 9112 §6.3")
            .send(
                [
                    format!("POST /1 HTTP/1.1\r\nHost: gw.test\r\nContent-Length: {}\r\n\r\n", smuggled.len())
                        .as_bytes(),
                    smuggled,
                ]
                .concat(),
            )
            .status(&[200])
            .upstream(vec![to("POST", "/1").sized(smuggled)]),
        case("second_request_split_across_writes", "RFC 9112 §9.3.2")
            .send([GET1, &GET2[..10]].concat())
            .after(100, &GET2[10..])
            .status(&[200, 200])
            .upstream(vec![to("GET", "/1"), to("GET", "/2")]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("pipelining", cases()).await;
}
