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
