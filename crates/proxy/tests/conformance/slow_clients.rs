//! Slow clients (slowloris; nginx's `client_header_timeout` / `client_body_timeout`):
//! `timeouts.header_ms` bounds a whole request head, `timeouts.body_ms` each wait for body
//! bytes, `timeouts.request_ms` a trickling body; each is a `408` (RFC 9110 §15.5.9) blamed
//! on the client, and the connection closes.

use super::{Case, case, run, to};

const TIMEOUTS: &str = "[timeouts]\nheader_ms = 300\nbody_ms = 300\n";

pub(super) fn cases() -> Vec<Case> {
    let head = b"GET / HTTP/1.1\r\nHost: gw.test\r\nX-Slow: 1\r\n\r\n";
    // A byte every 50 ms: never a pause of header_ms, but the whole head takes over 2 s.
    let trickled_head = head
        .iter()
        .fold(case("head_trickles", "slowloris"), |c, b| c.after(50, [*b]));
    let trickled_body = (0..20).fold(
        case(
            "body_trickles_past_request_ms",
            "RFC 9110 §15.5.9 (the client is slow: 408, not 504)",
        )
        .send(b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 20\r\n\r\n"),
        |c, _| c.after(100, b"x"),
    );
    vec![
        case("head_never_finishes", "RFC 9110 §15.5.9; slowloris")
            .send(b"GET / HTTP/1.1\r\nHost: gw")
            .status(&[408])
            .closed(),
        trickled_head.status(&[408]).closed(),
        case(
            "silent_connection_closed_without_an_answer",
            "RFC 9112 §9.5 (a server may close an idle connection)",
        )
        .status(&[])
        .closed(),
        case("head_slow_but_in_time", "RFC 9112 §9.5")
            .send(&head[..10])
            .after(80, &head[10..25])
            .after(80, &head[25..])
            .upstream(vec![to("GET", "/").field("x-slow", "1")]),
        case("body_stalls", "RFC 9110 §15.5.9")
            .send(b"POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 10\r\n\r\nhello")
            .status(&[408])
            .closed()
            .nothing_or_cut(to("POST", "/").field("content-length", "10")),
        case("chunked_body_stalls", "RFC 9110 §15.5.9")
            .send(b"POST / HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            .status(&[408])
            .closed()
            .nothing_or_cut(to("POST", "/").field("transfer-encoding", "chunked")),
        trickled_body
            .config("[timeouts]\nrequest_ms = 500\nbody_ms = 300\nheader_ms = 300\n")
            .status(&[408])
            .closed()
            .nothing_or_cut(to("POST", "/").field("content-length", "20")),
        case("second_head_never_finishes", "RFC 9110 §15.5.9 (from the request's first byte)")
            .send(b"GET /1 HTTP/1.1\r\nHost: gw.test\r\n\r\n")
            .after(50, b"GET /2 HTTP/1.1\r\nHo")
            .status(&[200, 408])
            .closed()
            .upstream(vec![to("GET", "/1")]),
    ]
    .into_iter()
    .map(|c| if c.has_config() { c } else { c.config(TIMEOUTS) })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("slow_clients", cases()).await;
}
