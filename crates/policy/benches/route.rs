//! The cost of routing one request head: `Router::find` (the index) against
//! `Router::scan` (every route tested in precedence order, the router before issue 46) on
//! tables of 1, 10,000 and 100,000 routes shaped as `tailguard lab routes` builds them (half
//! prefixes `/t{i}/api`, half exact paths `/t{i}/x`, and a tenth as many host routes), the
//! request going to the prefix route in the middle of the table.

// A benchmark has no one to report an error to: failing loudly is the right answer.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, Method};
use tailguard_config::PathMatch;
use tailguard_policy::route::{HostMatch, Route, Router};

fn route(id: String, host: HostMatch, path: PathMatch) -> Route {
    Route {
        id: id.into(),
        upstream: 0,
        priority: 0,
        host,
        path,
        method: None,
        headers: Vec::new(),
        host_rewrite: None,
        policy: None,
        tries: Default::default(),
        cors: None,
        access: None,
        compress: None,
    }
}

fn table(n: usize) -> Router {
    let mut routes: Vec<Route> = (0..n)
        .map(|i| {
            let path = if i % 2 == 0 {
                PathMatch::Prefix(format!("/t{i}/api"))
            } else {
                PathMatch::Exact(format!("/t{i}/x"))
            };
            route(format!("r{i}"), HostMatch::Any, path)
        })
        .collect();
    routes.extend((0..n / 10).map(|j| {
        route(
            format!("h{j}"),
            HostMatch::Exact(format!("h{j}.example.com")),
            PathMatch::Prefix("/".into()),
        )
    }));
    Router::new(routes)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("route");
    let headers = HeaderMap::new();
    for n in [1, 10_000, 100_000] {
        let router = table(n);
        let path = format!("/t{}/api/items", (n / 2) & !1);
        assert_eq!(
            router.find("lab", &path, &Method::GET, &headers),
            router.scan("lab", &path, &Method::GET, &headers)
        );
        group.bench_function(format!("find/routes_{n}"), |b| {
            b.iter(|| router.find(black_box("lab"), black_box(&path), &Method::GET, &headers))
        });
        // The scan of 100,000 routes takes milliseconds: fewer samples.
        if n <= 10_000 {
            group.bench_function(format!("scan/routes_{n}"), |b| {
                b.iter(|| router.scan(black_box("lab"), black_box(&path), &Method::GET, &headers))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
