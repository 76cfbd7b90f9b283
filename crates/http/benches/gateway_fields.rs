//! The gateway's own request fields (issue 25), both ways a request can take them, each
//! through to the bytes of the head:
//! - `map`: `request_id` and `add_forwarding` insert five fields into the request's header
//!   map, then every field is written out (what every request did before);
//! - `lines`: `ForwardingLines` checks the names once and the fields go out as ready lines
//!   after the request's own (what a request from an untrusted peer without forwarding
//!   fields, on a route without a policy, does now).

// A benchmark has no one to report an error to: failing loudly is the right answer.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Version};
use tailguard_http::headers::{Client, ForwardingLines, add_forwarding, request_id};

/// A request's fields as `tailguard load` and curl send them.
fn request_fields() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("host", HeaderValue::from_static("127.0.0.1:8080"));
    h.insert("user-agent", HeaderValue::from_static("curl/8.5.0"));
    h.insert("accept", HeaderValue::from_static("*/*"));
    h
}

/// Field lines as the HTTP/1.1 client writes them.
fn write_fields(out: &mut Vec<u8>, h: &HeaderMap) {
    for (name, value) in h {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

fn gateway_fields(c: &mut Criterion) {
    let client = Client::new("127.0.0.1".parse().unwrap(), false, false);
    let fields = request_fields();
    let mut out = Vec::with_capacity(1024);
    let mut group = c.benchmark_group("gateway_fields");
    group.bench_function("map", |b| {
        b.iter_batched(
            || fields.clone(),
            |mut h| {
                black_box(request_id(&mut h));
                add_forwarding(&mut h, &client, Version::HTTP_11);
                out.clear();
                write_fields(&mut out, &h);
                black_box(&out);
                h
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("lines", |b| {
        b.iter_batched(
            || fields.clone(),
            |h| {
                let lines = ForwardingLines::for_request(&h, &client, Version::HTTP_11).unwrap();
                out.clear();
                write_fields(&mut out, &h);
                for part in lines.parts(&client) {
                    out.extend_from_slice(part);
                }
                black_box(&out);
                h
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, gateway_fields);
criterion_main!(benches);
