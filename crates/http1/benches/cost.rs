//! The pieces of the request path issue 25 changed, each against what it replaced:
//! - `response_head/*`: parsing an upstream's response head. nginx sends
//!   `Connection: keep-alive` on every HTTP/1.1 response; such a head now keeps its lines
//!   raw (`connection_keep_alive`), as a head without the field always did
//!   (`no_connection`), where it used to take the map path, which a `Connection` field
//!   naming another field still takes (`connection_names_a_field`, the old cost).
//! - `read_buffer/*`: a connection's read buffer for one request, taken from the thread's
//!   list and given back (`kept`), against one allocated and freed per request
//!   (`allocated`, what releasing the buffer between requests costs without the list).

// A benchmark has no one to report an error to: failing loudly is the right answer.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, criterion_group, criterion_main};
use tailguard_http1::client::parse_response_head;
use tailguard_http1::framing::MIN_READ;
use tailguard_http1::recycle;

const NGINX: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 13:00:00 GMT\r\nContent-Type: application/octet-stream\r\nContent-Length: 13\r\nConnection: keep-alive\r\n\r\n";
const NO_CONNECTION: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 13:00:00 GMT\r\nContent-Type: application/octet-stream\r\nContent-Length: 13\r\nX-Padding: keep-alive\r\n\r\n";
const NAMES_A_FIELD: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 13:00:00 GMT\r\nContent-Type: application/octet-stream\r\nContent-Length: 13\r\nConnection: x-hop\r\n\r\n";

fn response_head(c: &mut Criterion) {
    let mut group = c.benchmark_group("response_head");
    for (name, head) in [
        ("connection_keep_alive", NGINX),
        ("no_connection", NO_CONNECTION),
        ("connection_names_a_field", NAMES_A_FIELD),
    ] {
        let mut buf = BytesMut::with_capacity(4096);
        group.bench_function(name, |b| {
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(head);
                black_box(parse_response_head(black_box(&mut buf), false).unwrap());
            })
        });
    }
    group.finish();
}

fn read_buffer(c: &mut Criterion) {
    let mut group = c.benchmark_group("read_buffer");
    group.bench_function("kept", |b| {
        b.iter(|| {
            let mut buf = recycle::read_buf();
            buf.extend_from_slice(black_box(b"GET / HTTP/1.1\r\n\r\n"));
            let head = buf.split_to(buf.len()).freeze();
            black_box(&head);
            drop(head);
            recycle::give_read_buf(buf);
        })
    });
    group.bench_function("allocated", |b| {
        b.iter(|| {
            let mut buf = BytesMut::with_capacity(MIN_READ);
            buf.extend_from_slice(black_box(b"GET / HTTP/1.1\r\n\r\n"));
            let head = buf.split_to(buf.len()).freeze();
            black_box(&head);
            drop(head);
            drop(buf);
        })
    });
    group.finish();
}

criterion_group!(benches, response_head, read_buffer);
criterion_main!(benches);
