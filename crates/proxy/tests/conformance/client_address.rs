//! Client-address fields (RFC 7239; the de-facto `X-Forwarded-For` / `X-Real-IP`): from an
//! untrusted peer the client's values are dropped and the gateway's own written; from a
//! peer in `trusted_proxies` the client's values are kept and the gateway's element
//! appended. The tests connect from 127.0.0.1, so trusting 127.0.0.1/32 or no one covers both.

use super::{Case, case, run, to};

const TRUSTED: &str = "trusted_proxies = [\"127.0.0.1/32\"]\n";

fn get(fields: &str) -> Vec<u8> {
    format!("GET / HTTP/1.1\r\nHost: gw.test\r\n{fields}\r\n").into_bytes()
}

fn addressed(name: &'static str, reference: &'static str, fields: &str) -> Case {
    case(name, reference).send(get(fields)).address_fields()
}

pub(super) fn cases() -> Vec<Case> {
    let base = || to("GET", "/").field("x-forwarded-proto", "http");
    let own = || {
        base()
            .field("x-forwarded-for", "127.0.0.1")
            .field("x-real-ip", "127.0.0.1")
    };
    vec![
        addressed("untrusted_plain", "RFC 7239 §4", "").upstream(vec![own()]),
        addressed(
            "untrusted_x_forwarded_for_dropped",
            "XFF spoofing",
            "X-Forwarded-For: 1.2.3.4\r\n",
        )
        .upstream(vec![own()]),
        addressed(
            "untrusted_two_x_forwarded_for_lines_dropped",
            "XFF spoofing",
            "X-Forwarded-For: 1.2.3.4\r\nx-forwarded-FOR: 5.6.7.8\r\n",
        )
        .upstream(vec![own()]),
        addressed(
            "untrusted_forwarded_replaced",
            "RFC 7239 §4, §5.2",
            "Forwarded: for=1.2.3.4;proto=https\r\n",
        )
        .upstream(vec![own().field("forwarded", "for=127.0.0.1;proto=http")]),
        addressed(
            "untrusted_x_real_ip_replaced",
            "X-Real-IP spoofing",
            "X-Real-IP: 1.2.3.4\r\n",
        )
        .upstream(vec![own()]),
        addressed(
            "untrusted_x_forwarded_proto_replaced",
            "scheme spoofing",
            "X-Forwarded-Proto: https\r\n",
        )
        .upstream(vec![own()]),
        addressed(
            "connection_cannot_strip_x_forwarded_for",
            "RFC 9110 §7.6.1; hop-by-hop abuse (Connection: X-Forwarded-For)",
            "Connection: X-Forwarded-For, X-Real-IP\r\nX-Forwarded-For: 1.2.3.4\r\n",
        )
        .upstream(vec![own()]),
        addressed("trusted_plain", "RFC 7239 §4", "")
            .config(TRUSTED)
            .upstream(vec![own()]),
        addressed(
            "trusted_x_forwarded_for_appended",
            "XFF from a trusted proxy",
            "X-Forwarded-For: 1.2.3.4, 5.6.7.8\r\n",
        )
        .config(TRUSTED)
        .upstream(vec![
            base()
                .field("x-forwarded-for", "1.2.3.4, 5.6.7.8, 127.0.0.1")
                .field("x-real-ip", "127.0.0.1"),
        ]),
        addressed(
            "trusted_two_x_forwarded_for_lines_joined",
            "RFC 9110 §5.3 (lines of a list field combine in order)",
            "X-Forwarded-For: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8\r\n",
        )
        .config(TRUSTED)
        .upstream(vec![
            base()
                .field("x-forwarded-for", "1.2.3.4, 5.6.7.8, 127.0.0.1")
                .field("x-real-ip", "127.0.0.1"),
        ]),
        addressed(
            "trusted_forwarded_appended",
            "RFC 7239 §4 (each proxy appends its element)",
            "Forwarded: for=1.2.3.4;proto=https\r\n",
        )
        .config(TRUSTED)
        .upstream(vec![own().field(
            "forwarded",
            "for=1.2.3.4;proto=https, for=127.0.0.1;proto=http",
        )]),
        addressed(
            "trusted_x_real_ip_kept",
            "X-Real-IP from a trusted proxy",
            "X-Real-IP: 1.2.3.4\r\n",
        )
        .config(TRUSTED)
        .upstream(vec![
            base()
                .field("x-forwarded-for", "127.0.0.1")
                .field("x-real-ip", "1.2.3.4"),
        ]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("client_address", cases()).await;
}
