//! What the status page costs the exporter thread at scale: one tick (the registry read
//! into the window) plus one `/status.json` build, as every second with the page open, for
//! 1,000 routes and 100 upstreams of 10 endpoints (the target: under 50 ms).
//! Baseline: a plain text scrape of the same registry.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use tailguard_proxy::{Config, GatewayMetrics, Server};
use tailguard_status::{Info, StatusPage};

/// A config of `routes` routes over `upstreams` upstreams of `endpoints` endpoints each
/// (addresses on 127.0.0.2, never dialled: no request is sent).
pub fn config(routes: usize, upstreams: usize, endpoints: usize) -> String {
    let mut text = String::from("[[listeners]]\naddress = \"127.0.0.1:0\"\n\n");
    for u in 0..upstreams {
        let eps: Vec<String> = (0..endpoints)
            .map(|e| {
                format!(
                    "{{ address = \"127.0.0.2:{}\" }}",
                    10000 + u * endpoints + e
                )
            })
            .collect();
        text.push_str(&format!(
            "[[upstreams]]\nname = \"u{u}\"\nendpoints = [{}]\n\n",
            eps.join(", ")
        ));
    }
    for r in 0..routes {
        text.push_str(&format!(
            "[[routes]]\nid = \"r{r}\"\nupstream = \"u{}\"\npath = {{ prefix = \"/r{r}/\" }}\n\n",
            r % upstreams
        ));
    }
    text.push_str("[overload]\nmode = \"adaptive\"\n");
    text
}

fn bench(c: &mut Criterion) {
    let text = config(1000, 100, 10);
    let config = Config::parse(&text, "bench.toml", std::path::Path::new(".")).expect("valid");
    let registry = tailguard_metrics::Registry::new();
    let metrics = GatewayMetrics::register(&registry).expect("metrics");
    let server = Server::start_with_metrics(config, metrics, 1).expect("gateway starts");
    let info = Info {
        version: "bench".into(),
        threads: 1,
        started: Instant::now(),
    };
    let page = StatusPage::new(registry.clone(), info, tailguard_config::StatusAccess::Open);
    page.attach(server.gateway());
    for _ in 0..12 {
        page.tick_at(Instant::now());
    }
    let bytes = page.json(false).expect("a document").len();
    eprintln!("status/build: /status.json is {bytes} bytes at 1000 routes, 1000 endpoints");
    let mut group = c.benchmark_group("status/build");
    group.sample_size(20);
    group.bench_function("tick_and_json/routes_1000_endpoints_1000", |b| {
        b.iter(|| {
            page.tick_at(Instant::now());
            black_box(page.json(false))
        })
    });
    group.bench_function("baseline_scrape_text/routes_1000_endpoints_1000", |b| {
        b.iter(|| black_box(registry.render(tailguard_metrics::Format::Text)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
