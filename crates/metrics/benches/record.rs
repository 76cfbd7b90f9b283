//! Hot-path benchmarks: counter `inc` and histogram `observe` on 1 and 2 threads, against
//! a bare `AtomicU64`, the `prometheus-client` crate and a `Mutex<HashMap>` lookup.
//!
//! With 2 threads, each thread does `iters` records at once on the same series; the time
//! reported is per record while another thread records too.
//!
//! Time is each recording thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`; the slowest
//! thread's with 2 threads), not wall time: on a shared 2-core machine a thread descheduled
//! in the middle of a sample would otherwise add other processes' time to the record.

// A benchmark has no one to report an error to: failing loudly is the right answer.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use prometheus_client::metrics::counter::Counter as PcCounter;
use prometheus_client::metrics::family::Family as PcFamily;
use prometheus_client::metrics::histogram::Histogram as PcHistogram;
use tailguard_metrics::{LATENCY_BUCKETS, Registry};

fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs `op` `iters` times on each of `threads` threads at once; returns the largest CPU
/// time a thread spent.
fn on_threads(threads: usize, iters: u64, op: &(impl Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = thread_cpu_time();
                    for _ in 0..iters {
                        op();
                    }
                    thread_cpu_time() - start
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap_or_default()
    })
}

fn bench_counter(c: &mut Criterion) {
    let registry = Registry::new();
    let ours = registry
        .counter("requests", "Requests.", &["route", "status"])
        .unwrap()
        .get_or_create(&["/a", "200"])
        .unwrap();
    let atomic = AtomicU64::new(0);
    let pc: PcFamily<Vec<(String, String)>, PcCounter> = PcFamily::default();
    let pc_labels = vec![
        ("route".to_owned(), "/a".to_owned()),
        ("status".to_owned(), "200".to_owned()),
    ];
    let pc_handle = pc.get_or_create_owned(&pc_labels);
    let map: Mutex<HashMap<(String, String), u64>> = Mutex::default();

    let mut group = c.benchmark_group("record/counter");
    for threads in [1, 2] {
        group.bench_function(format!("tailguard/threads_{threads}"), |b| {
            b.iter_custom(|iters| on_threads(threads, iters, &|| black_box(&ours).inc()))
        });
        group.bench_function(format!("atomic_u64/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|| {
                    black_box(&atomic).fetch_add(1, Ordering::Relaxed);
                })
            })
        });
        group.bench_function(format!("prometheus_client_handle/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|| {
                    black_box(&pc_handle).inc();
                })
            })
        });
        group.bench_function(format!("prometheus_client_lookup/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|| {
                    pc.get_or_create(black_box(&pc_labels)).inc();
                })
            })
        });
        group.bench_function(format!("mutex_hashmap_lookup/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|| {
                    let mut map = map.lock().unwrap();
                    let key = (black_box("/a").to_owned(), black_box("200").to_owned());
                    *map.entry(key).or_default() += 1;
                })
            })
        });
    }
    group.finish();
}

fn bench_histogram(c: &mut Criterion) {
    let registry = Registry::new();
    let ours = registry
        .histogram("latency", "Latency.", &["route"], &LATENCY_BUCKETS)
        .unwrap()
        .get_or_create(&["/a"])
        .unwrap();
    let pc = PcHistogram::new(LATENCY_BUCKETS);
    let mut group = c.benchmark_group("record/histogram");
    for threads in [1, 2] {
        group.bench_function(format!("tailguard/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|| {
                    black_box(&ours).observe(black_box(0.042))
                })
            })
        });
        group.bench_function(format!("prometheus_client/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|| black_box(&pc).observe(black_box(0.042)))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_counter, bench_histogram);
criterion_main!(benches);
