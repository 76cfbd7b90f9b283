//! Scrape-path benchmarks: rendering 10k / 100k / 1M counter series, with and without gzip,
//! against `prometheus-client`'s encoder; and memory per series, printed before the
//! benchmarks run (`memory/...` lines).
//!
//! Time is the rendering thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`), so that time
//! spent descheduled on a shared machine is not counted.

// A benchmark has no one to report an error to: failing loudly is the right answer.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flate2::Compression;
use flate2::write::GzEncoder;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter as PcCounter;
use prometheus_client::metrics::family::Family as PcFamily;
use tailguard_metrics::{Format, Registry, Render};

/// The research notes' workload: `requests_total{route,status}` with 100 statuses per route.
fn ours(series: usize) -> Registry {
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let family = registry
        .counter("gw_requests", "Requests.", &["route", "status"])
        .unwrap();
    for i in 0..series {
        family
            .get_or_create(&[&format!("/route/{}", i / 100), &(100 + i % 100).to_string()])
            .unwrap()
            .add(i as u64);
    }
    registry
}

fn theirs(series: usize) -> prometheus_client::registry::Registry {
    let mut registry = prometheus_client::registry::Registry::default();
    let family: PcFamily<Vec<(String, String)>, PcCounter> = PcFamily::default();
    for i in 0..series {
        family
            .get_or_create(&vec![
                ("route".to_owned(), format!("/route/{}", i / 100)),
                ("status".to_owned(), (100 + i % 100).to_string()),
            ])
            .inc_by(i as u64);
    }
    registry.register("gw_requests", "Requests.", family);
    registry
}

fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs `op` `iters` times and returns the CPU time it took on this thread.
fn cpu_time(iters: u64, mut op: impl FnMut()) -> Duration {
    let start = thread_cpu_time();
    for _ in 0..iters {
        op();
    }
    thread_cpu_time() - start
}

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn report_memory() {
    const SERIES: usize = 1_000_000;
    let before = rss_bytes();
    let registry = ours(SERIES);
    let after = rss_bytes();
    println!(
        "memory/tailguard/series_1M: {:.0} B/series RSS growth, {:.0} B/series heap accounted ({} shards)",
        (after - before) as f64 / SERIES as f64,
        registry.heap_bytes() as f64 / SERIES as f64,
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .next_power_of_two(),
    );
    drop(registry);
    let before = rss_bytes();
    let registry = theirs(SERIES);
    let after = rss_bytes();
    println!(
        "memory/prometheus_client/series_1M: {:.0} B/series RSS growth",
        (after.saturating_sub(before)) as f64 / SERIES as f64
    );
    drop(registry);
}

fn bench_render(c: &mut Criterion) {
    report_memory();
    let mut group = c.benchmark_group("render");
    group.sample_size(10);
    for (name, series) in [("10k", 10_000), ("100k", 100_000), ("1M", 1_000_000)] {
        let registry = ours(series);
        let mut buf = Vec::new();
        registry.render_into(Format::Text, &mut buf);
        let capacity = buf.len();
        group.bench_function(BenchmarkId::new("tailguard/text", name), |b| {
            b.iter_custom(|iters| {
                cpu_time(iters, || {
                    buf.clear();
                    registry.render_into(Format::Text, &mut buf);
                    black_box(buf.len());
                })
            })
        });
        group.bench_function(BenchmarkId::new("tailguard/text_gzip", name), |b| {
            // As the exporter does it: 64 KiB pieces through a fast-level gzip encoder.
            let mut piece = Vec::with_capacity(80 * 1024);
            b.iter_custom(|iters| {
                cpu_time(iters, || {
                    let mut render = Render::new(registry.snapshot(), Format::Text);
                    let mut gz =
                        GzEncoder::new(Vec::with_capacity(capacity / 8), Compression::fast());
                    loop {
                        piece.clear();
                        let done = render.fill(&mut piece, 64 * 1024);
                        gz.write_all(&piece).unwrap();
                        if done {
                            break;
                        }
                    }
                    black_box(gz.finish().unwrap().len());
                })
            })
        });
        drop(registry);
        if series <= 100_000 {
            let pc = theirs(series);
            let mut out = String::with_capacity(capacity);
            group.bench_function(BenchmarkId::new("prometheus_client/text", name), |b| {
                b.iter_custom(|iters| {
                    cpu_time(iters, || {
                        out.clear();
                        encode(&mut out, &pc).unwrap();
                        black_box(out.len());
                    })
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_render);
criterion_main!(benches);
