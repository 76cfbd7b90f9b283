//! Size limits (RFC 9110 §15.5.15, RFC 6585 §5, RFC 9112 §3): a request-target over the head
//! limit is `414`, a header section over it `431`, and nothing reaches the upstream.

use super::{Case, case, pass, reject, run, to};

const SMALL: &str = "[limits]\nheader_bytes = 1024\n";

fn get_with(target: &str, fields: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: gw.test\r\n{fields}\r\n").into_bytes()
}

pub(super) fn cases() -> Vec<Case> {
    let long_target = format!("/{}", "a".repeat(2000));
    let many_fields: String = (0..30)
        .map(|i| format!("X-F{i}: {}\r\n", "v".repeat(40)))
        .collect();
    let too_many: String = (0..120).map(|i| format!("X-N{i}: 1\r\n")).collect();
    let near = "v".repeat(900);
    vec![
        reject(
            "target_too_long",
            "RFC 9112 §3; RFC 9110 §15.5.15",
            414,
            get_with(&long_target, ""),
        )
        .config(SMALL),
        reject(
            "header_section_too_large",
            "RFC 6585 §5",
            431,
            get_with("/", &many_fields),
        )
        .config(SMALL),
        reject(
            "one_huge_field",
            "RFC 6585 §5",
            431,
            get_with("/", &format!("X-Big: {}\r\n", "v".repeat(2000))),
        )
        .config(SMALL),
        reject(
            "too_many_fields",
            "RFC 6585 §5 (an implementation's field count limit)",
            431,
            get_with("/", &too_many),
        ),
        pass(
            "head_just_under_the_limit",
            "RFC 9112 §3",
            get_with("/", &format!("X-Near: {near}\r\n")),
            to("GET", "/").field("x-near", &near),
        )
        .config(SMALL),
        case(
            "long_method_over_the_limit",
            "RFC 9110 §9.1; RFC 9112 §3 (414/400/501 all refuse)",
        )
        .config(SMALL)
        .send(format!(
            "{} / HTTP/1.1\r\nHost: gw.test\r\n\r\n",
            "M".repeat(2000)
        ))
        .status(&[414])
        .or_status(&[400])
        .or_status(&[501])
        .closed(),
        pass(
            "long_method_within_the_limit",
            "RFC 9110 §9.1 (a method is any token)",
            format!("{} / HTTP/1.1\r\nHost: gw.test\r\n\r\n", "M".repeat(500)),
            to(&"M".repeat(500), "/"),
        ),
        case("body_over_the_limit", "RFC 9110 §15.5.14")
            .config("[limits]\nbody_bytes = 1024\n")
            .send(format!(
                "POST / HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 2048\r\n\r\n{}",
                "b".repeat(2048)
            ))
            .status(&[413])
            // The body came whole: reading it to its end and going on is right too.
            .either(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance() {
    run("limits", cases()).await;
}
