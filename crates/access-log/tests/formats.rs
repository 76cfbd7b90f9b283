//! Each format's output for a table of requests, hostile ones included.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, UNIX_EPOCH};

use tailguard_access_log::{Format, Record, UpstreamTry};

struct Case {
    name: &'static str,
    record: Record<'static>,
    combined: &'static str,
    /// The user agent a JSON parser must read back.
    json_user_agent: Option<&'static str>,
}

/// The trace id of the W3C Trace Context examples
/// (`traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`).
const W3C_TRACE_ID: [u8; 16] = [
    0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36,
];
/// The parent id of the same example.
const W3C_SPAN_ID: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];

fn base() -> Record<'static> {
    Record {
        time: UNIX_EPOCH + Duration::from_secs(1_795_295_993),
        remote_addr: Some([192, 0, 2, 7].into()),
        method: b"GET",
        target: b"/api/users?id=7",
        status: 200,
        body_bytes_sent: 512,
        bytes_sent: 700,
        request_time: Duration::from_millis(12),
        upstream_addr: Some(SocketAddr::from(([127, 0, 0, 1], 9000))),
        upstream_status: Some(200),
        upstream_response_time: Some(Duration::from_micros(11_400)),
        referer: Some(b"https://example.com/"),
        user_agent: Some(b"curl/8.5.0"),
        route: Some("users"),
        ..Record::default()
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "plain",
            record: base(),
            combined: "192.0.2.7 - - [21/Nov/2026:21:19:53 +0000] \"GET /api/users?id=7 HTTP/1.1\" 200 512 \
                       \"https://example.com/\" \"curl/8.5.0\"",
            json_user_agent: Some("curl/8.5.0"),
        },
        Case {
            // A user agent that tries to close the field and forge a second line.
            name: "injection",
            record: Record {
                user_agent: Some(
                    b"x\" 200 0 \"-\" \"y\n6.6.6.6 - - [01/Jan/2000:00:00:00 +0000] \"GET /admin",
                ),
                ..base()
            },
            combined: "192.0.2.7 - - [21/Nov/2026:21:19:53 +0000] \"GET /api/users?id=7 HTTP/1.1\" 200 512 \
                       \"https://example.com/\" \"x\\x22 200 0 \\x22-\\x22 \\x22y\\x0A6.6.6.6 - - \
                       [01/Jan/2000:00:00:00 +0000] \\x22GET /admin\"",
            json_user_agent: Some(
                "x\" 200 0 \"-\" \"y\n6.6.6.6 - - [01/Jan/2000:00:00:00 +0000] \"GET /admin",
            ),
        },
        Case {
            name: "non_utf8_and_controls",
            record: Record {
                user_agent: Some(b"bad\xff\xfe\x00\x1b[31mred\r\x7f"),
                referer: Some(b"\tq\\"),
                ..base()
            },
            combined: "192.0.2.7 - - [21/Nov/2026:21:19:53 +0000] \"GET /api/users?id=7 HTTP/1.1\" 200 512 \
                       \"\\x09q\\x5C\" \"bad\\xFF\\xFE\\x00\\x1B[31mred\\x0D\\x7F\"",
            json_user_agent: Some("bad\\xFF\\xFE\u{0}\u{1b}[31mred\r\u{7f}"),
        },
        Case {
            name: "unicode_ipv6_unset_fields",
            record: Record {
                remote_addr: Some("2001:db8::1".parse::<IpAddr>().unwrap()),
                remote_user: Some(b"al\"ice"),
                method: b"POST",
                target: b"/caf\xc3\xa9",
                protocol: "HTTP/2.0",
                status: 503,
                body_bytes_sent: 0,
                referer: None,
                user_agent: Some("Mözilla ✓".as_bytes()),
                upstream_addr: None,
                upstream_status: None,
                upstream_response_time: None,
                route: None,
                grpc_status: Some(4),
                ..base()
            },
            combined: "2001:db8::1 - al\\x22ice [21/Nov/2026:21:19:53 +0000] \"POST /caf\\xC3\\xA9 HTTP/2.0\" 503 0 \
                       \"-\" \"M\\xC3\\xB6zilla \\xE2\\x9C\\x93\"",
            json_user_agent: Some("Mözilla ✓"),
        },
        Case {
            name: "no_user_agent",
            record: Record {
                user_agent: None,
                remote_addr: None,
                ..base()
            },
            combined: "- - - [21/Nov/2026:21:19:53 +0000] \"GET /api/users?id=7 HTTP/1.1\" 200 512 \
                       \"https://example.com/\" \"-\"",
            json_user_agent: None,
        },
    ]
}

fn line(format: &Format, record: &Record<'_>) -> String {
    let mut out = Vec::new();
    format.write(record, &mut out);
    let text = String::from_utf8(out).expect("every format writes UTF-8");
    assert!(text.ends_with('\n'));
    assert_eq!(text.matches('\n').count(), 1, "exactly one line: {text:?}");
    text
}

#[test]
fn combined_matches_nginx_for_every_case() {
    let f = Format::combined();
    for case in cases() {
        let text = line(&f, &case.record);
        assert_eq!(
            text.trim_end_matches('\n'),
            case.combined,
            "case {}",
            case.name
        );
        assert!(
            text.trim_end_matches('\n')
                .bytes()
                .all(|b| (0x20..0x7f).contains(&b)),
            "case {}: text formats are printable ASCII",
            case.name
        );
    }
}

#[test]
fn combined_template_is_the_same_as_combined() {
    let named = Format::combined();
    let template = Format::template(tailguard_access_log::COMBINED).unwrap();
    for case in cases() {
        assert_eq!(
            line(&named, &case.record),
            line(&template, &case.record),
            "case {}",
            case.name
        );
    }
}

#[test]
fn template_with_every_variable() {
    let f = Format::template(
        "$remote_addr|$remote_user|$time_local|$time_iso8601|$msec|$request|$request_method|\
         $request_uri|$uri|$args|$server_protocol|$status|$body_bytes_sent|$bytes_sent|\
         $request_time|$upstream_addr|$upstream_status|$upstream_response_time|$upstream_tries|\
         $http_referer|$http_user_agent|$http_x_request_id|$route|$request_id|$error|$grpc_status|\
         $trace_id|$span_id",
    )
    .unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "x-request-id",
        http::HeaderValue::from_bytes(b"id\"1").unwrap(),
    );
    let r = Record {
        headers: Some(&headers),
        request_id: Some(b"r-7"),
        error: Some("upstream_timeout"),
        grpc_status: Some(14),
        trace_id: Some(W3C_TRACE_ID),
        span_id: Some(W3C_SPAN_ID),
        consumer: None,
        auth_result: None,
        ..base()
    };
    assert_eq!(
        line(&f, &r),
        "192.0.2.7|-|21/Nov/2026:21:19:53 +0000|2026-11-21T21:19:53+00:00|1795295993.000|\
         GET /api/users?id=7 HTTP/1.1|GET|/api/users?id=7|/api/users|id=7|HTTP/1.1|200|512|700|\
         0.012|127.0.0.1:9000|200|0.011|1|https://example.com/|curl/8.5.0|id\\x221|users|r-7|\
         upstream_timeout|14|4bf92f3577b34da6a3ce929d0e0e4736|00f067aa0ba902b7\n"
    );
    let r = Record {
        target: b"/x",
        upstream_addr: None,
        upstream_status: None,
        upstream_response_time: None,
        ..base()
    };
    let f = Format::template(
        "$args $upstream_addr $upstream_status $upstream_response_time $upstream_tries \
         $http_x_request_id $grpc_status $trace_id $span_id",
    )
    .unwrap();
    assert_eq!(line(&f, &r), "- - - - - - - - -\n");
}

#[test]
fn json_lines_parse_and_round_trip_every_field() {
    let f = Format::json();
    for case in cases() {
        let text = line(&f, &case.record);
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("case {}: {e}: {text}", case.name));
        let r = &case.record;
        assert_eq!(v["time_iso8601"], "2026-11-21T21:19:53+00:00");
        match r.remote_addr {
            Some(a) => assert_eq!(v["remote_addr"], a.to_string()),
            None => assert!(v["remote_addr"].is_null()),
        }
        assert_eq!(v["status"], r.status);
        assert_eq!(v["body_bytes_sent"], r.body_bytes_sent);
        assert_eq!(v["bytes_sent"], r.bytes_sent);
        assert_eq!(v["request_time"].as_f64().unwrap(), 0.012);
        assert_eq!(
            v["request_method"],
            String::from_utf8_lossy(r.method).as_ref()
        );
        assert_eq!(v["server_protocol"], r.protocol);
        match case.json_user_agent {
            Some(ua) => assert_eq!(v["http_user_agent"], ua, "case {}", case.name),
            None => assert!(v["http_user_agent"].is_null()),
        }
        match r.upstream_addr {
            Some(a) => {
                assert_eq!(v["upstream_addr"], a.to_string());
                assert_eq!(v["upstream_response_time"].as_f64().unwrap(), 0.011);
                assert_eq!(v["upstream_status"], 200);
                assert_eq!(v["upstream_tries"], 1);
            }
            None => {
                assert!(v["upstream_addr"].is_null());
                assert!(v["upstream_status"].is_null());
                assert!(v["upstream_tries"].is_null());
            }
        }
        assert_eq!(v["route"].as_str(), r.route);
        match r.grpc_status {
            Some(code) => assert_eq!(v["grpc_status"], code),
            None => assert!(v["grpc_status"].is_null()),
        }
        assert!(v["trace_id"].is_null(), "tracing off: {text}");
        assert!(v["span_id"].is_null(), "tracing off: {text}");
        assert!(v["consumer"].is_null(), "no auth: {text}");
        assert!(v["auth_result"].is_null(), "no auth: {text}");
        assert_eq!(
            v.as_object().unwrap().len(),
            24,
            "case {}: {text}",
            case.name
        );
    }
    let v: serde_json::Value = serde_json::from_str(&line(&f, &cases()[3].record)).unwrap();
    assert_eq!(v["request_uri"], "/café");
    assert_eq!(v["remote_user"], "al\"ice");
}

#[test]
fn a_retried_request_lists_every_try_as_nginx_does() {
    let earlier = [
        UpstreamTry {
            addr: SocketAddr::from(([10, 0, 0, 1], 80)),
            status: 503,
        },
        UpstreamTry {
            addr: SocketAddr::from(([10, 0, 0, 2], 80)),
            status: 502,
        },
    ];
    let r = Record {
        earlier_tries: &earlier,
        ..base()
    };
    let f = Format::template("$upstream_addr|$upstream_status|$upstream_tries").unwrap();
    assert_eq!(
        line(&f, &r),
        "10.0.0.1:80, 10.0.0.2:80, 127.0.0.1:9000|503, 502, 200|3\n"
    );
    let v: serde_json::Value = serde_json::from_str(&line(&Format::json(), &r)).unwrap();
    assert_eq!(
        v["upstream_addr"],
        "10.0.0.1:80, 10.0.0.2:80, 127.0.0.1:9000"
    );
    assert_eq!(v["upstream_status"], 200, "the status that answered");
    assert_eq!(v["upstream_tries"], 3);
}

#[test]
fn trace_and_span_ids_print_as_lowercase_hex_in_every_format() {
    let r = Record {
        trace_id: Some(W3C_TRACE_ID),
        span_id: Some(W3C_SPAN_ID),
        consumer: None,
        auth_result: None,
        ..base()
    };
    let f = Format::template("trace=$trace_id span=${span_id}").unwrap();
    assert_eq!(
        line(&f, &r),
        "trace=4bf92f3577b34da6a3ce929d0e0e4736 span=00f067aa0ba902b7\n"
    );
    let v: serde_json::Value = serde_json::from_str(&line(&Format::json(), &r)).unwrap();
    assert_eq!(v["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(v["span_id"], "00f067aa0ba902b7");
    // Every byte value, so a wrong nibble order or digit table cannot pass.
    let mut every = [0u8; 16];
    for (i, b) in every.iter_mut().enumerate() {
        *b = (i as u8) * 0x11;
    }
    let r = Record {
        trace_id: Some(every),
        span_id: Some([0xff, 0xfe, 0xa0, 0x0a, 0x10, 0x01, 0x9c, 0xc9]),
        consumer: None,
        auth_result: None,
        ..base()
    };
    assert_eq!(
        line(&f, &r),
        "trace=00112233445566778899aabbccddeeff span=fffea00a10019cc9\n"
    );
    // `combined` is nginx's own and stays so: no ids in it.
    assert!(!line(&Format::combined(), &r).contains("0011"));
}
