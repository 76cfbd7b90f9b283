//! The index proven equal to the scan: random tables and requests, drawn from small
//! alphabets so that hosts, wildcards, prefixes and exact paths overlap often.

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use proptest::prelude::*;
use tailguard_config::PathMatch;

use super::{HostMatch, Route, Router};

const HOSTS: &[&str] = &[
    "a.test",
    "example.com",
    "b.example.com",
    "x.b.example.com",
    "xexample.com",
    "m",
    "é.test",
];
/// Wildcard suffixes as `Route::build` keeps them (`*.example.com` is `.example.com`);
/// `""` is `*`, and suffixes without a dot are allowed by the config too.
const SUFFIXES: &[&str] = &[
    ".example.com",
    ".b.example.com",
    "example.com",
    ".test",
    "",
    "m",
    "t",
];
const SEGMENTS: &[&str] = &["a", "b", "ab", "v1", "", "é"];
const HEADERS: &[(&str, &str)] = &[("x-a", "1"), ("x-a", "2"), ("x-b", "1")];

fn path() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop::sample::select(SEGMENTS), 0..4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(segments, leading, trailing)| {
            let mut p = if leading {
                "/".to_owned()
            } else {
                String::new()
            };
            p.push_str(&segments.join("/"));
            if trailing {
                p.push('/');
            }
            p
        })
}

fn host_match() -> impl Strategy<Value = HostMatch> {
    prop_oneof![
        Just(HostMatch::Any),
        prop::sample::select(HOSTS).prop_map(|h| HostMatch::Exact(h.to_owned())),
        prop::sample::select(SUFFIXES).prop_map(|s| HostMatch::Suffix(s.to_owned())),
    ]
}

fn route() -> impl Strategy<Value = Route> {
    (
        0..3i32,
        host_match(),
        (any::<bool>(), path()),
        prop::option::of(prop::sample::select(&[Method::GET, Method::POST][..])),
        prop::sample::subsequence(HEADERS, 0..=2),
    )
        .prop_map(|(priority, host, (exact, path), method, headers)| Route {
            id: "r".into(),
            upstream: 0,
            priority,
            host,
            path: if exact {
                PathMatch::Exact(path)
            } else {
                PathMatch::Prefix(path)
            },
            method,
            headers: headers
                .iter()
                .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
                .collect(),
            host_rewrite: None,
            policy: None,
            tries: Default::default(),
            cors: None,
            access: None,
            compress: None,
        })
}

/// A request: host (the table's hosts, in upper case too, and others), path, method,
/// headers.
fn request() -> impl Strategy<Value = (String, String, Method, HeaderMap)> {
    (
        prop_oneof![
            prop::sample::select(HOSTS).prop_map(str::to_owned),
            prop::sample::select(HOSTS).prop_map(|h| h.to_ascii_uppercase()),
            prop::sample::select(&["", "a.b.example.com", "B.Example.COM", "x.test", "mm"][..])
                .prop_map(str::to_owned),
        ],
        path(),
        prop::sample::select(&[Method::GET, Method::POST, Method::PUT][..]),
        prop::sample::subsequence(HEADERS, 0..=3),
    )
        .prop_map(|(host, path, method, headers)| {
            let mut map = HeaderMap::new();
            for (n, v) in headers {
                map.append(n, HeaderValue::from_static(v));
            }
            (host, path, method, map)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn index_finds_what_the_scan_finds(
        routes in prop::collection::vec(route(), 0..40),
        requests in prop::collection::vec(request(), 1..40),
    ) {
        let router = Router::new(routes);
        for (host, path, method, headers) in &requests {
            prop_assert_eq!(
                router.find(host, path, method, headers),
                router.scan(host, path, method, headers),
                "{} {}{} {:?}", method, host, path, headers
            );
        }
    }
}

/// A request that no host or path of the table can match looks at no route at all, and a
/// large table answers like a small one (the scan is the reference, not a timer).
#[test]
fn a_large_table_matches_like_the_scan() {
    let routes = (0..20_000)
        .map(|i| Route {
            id: format!("r{i}").into(),
            upstream: 0,
            priority: 0,
            host: match i % 4 {
                0 => HostMatch::Exact(format!("h{}.test", i % 97)),
                1 => HostMatch::Suffix(format!(".w{}.test", i % 13)),
                _ => HostMatch::Any,
            },
            path: if i % 2 == 0 {
                PathMatch::Exact(format!("/t{i}/x"))
            } else {
                PathMatch::Prefix(format!("/t{i}"))
            },
            method: None,
            headers: Vec::new(),
            host_rewrite: None,
            policy: None,
            tries: Default::default(),
            cors: None,
            access: None,
            compress: None,
        })
        .collect();
    let router = Router::new(routes);
    let none = HeaderMap::new();
    for (host, path) in [
        ("H3.test", "/t100/x"),
        ("a.w1.test", "/t1/y"),
        ("a.w1.test", "/t5/y"),
        ("other", "/t7/deep/er"),
        ("other", "/nothing"),
        ("h0.test", "/t0/x"),
    ] {
        assert_eq!(
            router.find(host, path, &Method::GET, &none),
            router.scan(host, path, &Method::GET, &none),
            "{host}{path}"
        );
    }
}
