//! The per-request CORS work of a route with `cors` (`tailguard_policy::cors`): deciding
//! what an actual response carries and writing it into the response's fields, for a
//! request without `Origin` (most traffic: same-origin pages, servers, probes), an allowed
//! exact origin, an allowed wildcard subdomain, a refused origin; and a preflight's answer.
//! The baseline is a route without `cors`: nothing at all, so `no_origin` is the whole
//! cost `cors` adds to a request that is not cross-origin.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use tailguard_config::cors::CorsConfig;
use tailguard_policy::cors::{self, Actual};

/// A response head as an upstream sends it (a `Vary` of its own among its fields).
fn response() -> HeaderMap {
    let mut map = HeaderMap::with_capacity(8);
    map.insert("content-type", HeaderValue::from_static("application/json"));
    map.insert("vary", HeaderValue::from_static("Accept-Encoding"));
    map.insert("via", HeaderValue::from_static("1.1 tailguard"));
    map
}

fn request(origin: Option<&'static str>) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(8);
    map.insert("host", HeaderValue::from_static("api.example"));
    map.insert("accept", HeaderValue::from_static("application/json"));
    map.insert("user-agent", HeaderValue::from_static("bench/1"));
    if let Some(o) = origin {
        map.insert("origin", HeaderValue::from_static(o));
    }
    map
}

fn bench(c: &mut Criterion) {
    let cors = toml::from_str::<CorsConfig>(
        r#"
origins = ["https://app.example", "https://admin.example", "https://*.example.com"]
methods = ["PUT", "DELETE"]
headers = ["content-type", "x-token"]
expose_headers = ["x-request-id"]
credentials = true
max_age_s = 600
"#,
    )
    .expect("parses")
    .compile()
    .expect("valid");
    let mut group = c.benchmark_group("cors");
    let cases = [
        ("actual/no_origin", None),
        ("actual/allowed_exact", Some("https://app.example")),
        (
            "actual/allowed_wildcard",
            Some("https://eu.api.example.com"),
        ),
        ("actual/refused", Some("https://evil.test")),
    ];
    for (name, origin) in cases {
        let req = request(origin);
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                response,
                |resp| Actual::of(&cors, black_box(&req)).apply(resp, None),
                BatchSize::SmallInput,
            )
        });
    }
    group.bench_function("actual/off", |b| {
        b.iter_batched_ref(
            response,
            |resp| {
                black_box(resp);
            },
            BatchSize::SmallInput,
        )
    });
    let mut pre = request(Some("https://app.example"));
    pre.insert(
        "access-control-request-method",
        HeaderValue::from_static("PUT"),
    );
    pre.insert(
        "access-control-request-headers",
        HeaderValue::from_static("content-type,x-token"),
    );
    group.bench_function("preflight/allowed", |b| {
        b.iter_batched_ref(
            HeaderMap::new,
            |out| cors::preflight(&cors, black_box(&pre), out),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
