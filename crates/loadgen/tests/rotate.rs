//! A rotating header: each request carries the next of the given values, round and round,
//! so that a gateway sees many distinct credentials (the auth lab's 1,000 tokens).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body_util::Full;
use hyper::Response;
use tailguard_loadgen::load::{LoadConfig, run};
use tailguard_test_support::blocking;

use crate::support;

#[test]
fn each_request_carries_the_next_value_in_turn() {
    let seen = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let log = seen.clone();
    let server = blocking::start(move |listener| {
        support::serve_requests(listener, move |req, _| {
            let log = log.clone();
            async move {
                let value = |name: &str| {
                    let all: Vec<_> = req
                        .headers()
                        .get_all(name)
                        .iter()
                        .map(|v| v.to_str().unwrap().to_owned())
                        .collect();
                    all.join(",")
                };
                log.lock()
                    .unwrap()
                    .push((value("authorization"), value("x-fixed")));
                Response::new(Full::new(Bytes::from_static(b"ok")))
            }
        })
    });
    // One connection: the requests arrive in the order they were built.
    let mut config = LoadConfig::new(&server.url("/"), 200.0, Duration::from_secs(1), 1);
    config.headers = vec![(
        HeaderName::from_static("x-fixed"),
        HeaderValue::from_static("same"),
    )];
    let values: Vec<HeaderValue> = ["Bearer a", "Bearer b", "Bearer c"]
        .into_iter()
        .map(HeaderValue::from_static)
        .collect();
    config.rotate = Some((HeaderName::from_static("authorization"), values.into()));
    let report = run(&config).unwrap();
    assert!(report.completed >= 10, "{} completed", report.completed);
    let seen = seen.lock().unwrap();
    for (i, (auth, fixed)) in seen.iter().enumerate() {
        let want = ["Bearer a", "Bearer b", "Bearer c"][i % 3];
        assert_eq!(
            (auth.as_str(), fixed.as_str()),
            (want, "same"),
            "request {i}"
        );
    }
}

#[test]
fn answers_are_counted_per_value_and_window() {
    // The upstream answers by the key: a 200, b 429, c 500.
    let server = blocking::start(move |listener| {
        support::serve_requests(listener, move |req, _| async move {
            let status = match req.headers().get("x-api-key").map(|v| v.as_bytes()) {
                Some(b"a") => 200,
                Some(b"b") => 429,
                _ => 500,
            };
            let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
            *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
            resp
        })
    });
    let mut config = LoadConfig::new(&server.url("/"), 300.0, Duration::from_secs(1), 2);
    let values: Vec<HeaderValue> = ["a", "b", "c"]
        .into_iter()
        .map(HeaderValue::from_static)
        .collect();
    config.rotate = Some((HeaderName::from_static("x-api-key"), values.into()));
    config.count_values = Some(Duration::from_secs(60));
    let report = run(&config).unwrap();
    let keys = report.keys.clone().expect("counted per value");
    assert_eq!(
        (keys.keys, keys.window_ms, keys.header.as_str()),
        (3, 60_000, "x-api-key")
    );
    let mut per_value = [[0u32; 3]; 3];
    for counts in keys.windows.values() {
        for (v, c) in counts.iter().enumerate() {
            for i in 0..3 {
                per_value[v][i] += c[i];
            }
        }
    }
    let (a, b, c) = (per_value[0], per_value[1], per_value[2]);
    assert_eq!(
        (a[1], a[2], b[0], b[2], c[0], c[1]),
        (0, 0, 0, 0, 0, 0),
        "{per_value:?}"
    );
    // Every answer is counted, each value a third of them (in turn, one thread).
    let total: u32 = a[0] + b[1] + c[2];
    assert_eq!(u64::from(total), report.completed);
    assert!(
        a[0].abs_diff(c[2]) <= 1 && a[0].abs_diff(b[1]) <= 1,
        "{per_value:?}"
    );
    assert!(
        report.render().contains("x-api-key (3 values)"),
        "{}",
        report.render()
    );
}
