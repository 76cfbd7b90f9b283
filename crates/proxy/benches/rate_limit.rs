//! The cost of a rate-limit check on the request path: `Limiter::check` with one bucket
//! for the route, a client address already in the key table (alone, and with another
//! thread on the same key or on its own key), and addresses spread over a full 100k-key
//! table; against a bare shared `AtomicU64` add and a `Mutex<HashMap>` of buckets (the
//! shape of a locked keyed limiter), and the key's hash alone.
//!
//! With 2 threads, each thread does `iters` checks at once; the time reported is per check
//! while another thread checks too. Time is each thread's own CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`, the slowest thread's), as in the metrics benches: on a shared
//! machine a descheduled thread would otherwise add other processes' time.
//!
//! The limit is 10^9/s with a burst of 10^6 and each thread's clock advances 4 ns per check
//! (and on from one sample to the next), so checks are admitted (the compare-exchange path, the one that writes), as a request's
//! would be until its limit is reached.

// A benchmark has no one to report an error to: failing loudly is the right answer.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use tailguard_policy::rate_limit::table::Gcra;
use tailguard_policy::rate_limit::{Limiter, RateLimitConfig, Scope};
use tailguard_proxy::GatewayMetrics;

fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The benches' clock, in ticks: never goes back from one sample to the next, so buckets
/// charged by an earlier sample do not refuse the next one's checks.
static TICKS: AtomicU64 = AtomicU64::new(0);

/// Runs `op(thread, tick)` `iters` times on each of `threads` threads at once, with ticks
/// that go on from the previous sample's; returns the largest CPU time a thread spent.
fn on_threads(threads: usize, iters: u64, op: &(impl Fn(usize, u64) + Sync)) -> Duration {
    let first = TICKS.fetch_add(iters, Ordering::Relaxed);
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = thread_cpu_time();
                    for i in first..first + iters {
                        op(t, i);
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

fn limiter(key: &str, scope: Scope) -> Limiter {
    let config: RateLimitConfig = toml::from_str(&format!(
        "rate = 1000000000\nburst = 1000000\nkey = \"{key}\"\nmax_keys = 100000"
    ))
    .unwrap();
    let metrics = GatewayMetrics::register(&tailguard_metrics::Registry::new()).unwrap();
    Limiter::build(&config, scope, "bench", metrics.rate_limit()).unwrap()
}

fn ip(n: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from((0x0a00_0000 + n) as u32))
}

fn bench_check(c: &mut Criterion) {
    let route = limiter("route", Scope::Route);
    let by_ip = limiter("client_ip", Scope::Route);
    let headers = HeaderMap::new();
    let base = Instant::now() + Duration::from_secs(1);
    let at = |i: u64| base + Duration::from_nanos(i * 4);
    // Fill the table: 100k distinct addresses, as many as `max_keys`.
    for n in 0..100_000 {
        let _ = by_ip.check(base, ip(n), &headers);
    }
    let atomic = AtomicU64::new(0);
    let map: Mutex<HashMap<IpAddr, u64>> = Mutex::default();
    let gcra = Gcra::new(1_000_000_000, 1_000_000_000, 1_000_000);
    let table = tailguard_policy::rate_limit::table::KeyTable::new(100_000);

    let mut group = c.benchmark_group("rate_limit/check");
    for threads in [1, 2] {
        group.bench_function(format!("route_key/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|_, i| {
                    let _ = black_box(route.check(at(i), ip(1), &headers));
                })
            })
        });
        group.bench_function(format!("client_ip_same_key/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|_, i| {
                    let _ = black_box(by_ip.check(at(i), ip(1), &headers));
                })
            })
        });
        group.bench_function(format!("client_ip_own_key/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|t, i| {
                    let _ = black_box(by_ip.check(at(i), ip(t as u64 + 7), &headers));
                })
            })
        });
        group.bench_function(format!("client_ip_100k_keys/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|t, i| {
                    // A stride through the 100k addresses: mostly cache misses, as real
                    // clients would be.
                    let n = (i * 7919 + t as u64 * 50_000) % 100_000;
                    let _ = black_box(by_ip.check(at(i), ip(n), &headers));
                })
            })
        });
        // The harness's own share of each case above: making each check's `Instant`.
        group.bench_function(format!("baseline_clock_only/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|_, i| {
                    black_box(at(i));
                })
            })
        });
        // The table and GCRA alone, on a nanosecond clock: what a check costs beyond
        // turning the request's `Instant` into nanoseconds.
        group.bench_function(format!("table_own_key/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|t, i| {
                    let now = 1_000_000_000 + i * 4;
                    let bucket = table.bucket(table.hash(ip(t as u64 + 7)), now);
                    let _ = black_box(gcra.acquire(bucket.tat, now));
                })
            })
        });
        group.bench_function(format!("baseline_atomic_add/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|_, _| {
                    black_box(&atomic).fetch_add(1, Ordering::Relaxed);
                })
            })
        });
        group.bench_function(format!("baseline_mutex_hashmap/threads_{threads}"), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, &|t, i| {
                    let mut map = map.lock().unwrap();
                    let tat = map.entry(black_box(ip(t as u64 + 7))).or_default();
                    let bucket = AtomicU64::new(*tat);
                    let _ = gcra.acquire(&bucket, 1_000_000_000 + i * 4);
                    *tat = bucket.into_inner();
                })
            })
        });
    }
    group.finish();

    c.bench_function("rate_limit/hash/ipv4", |b| {
        b.iter(|| table.hash(black_box(ip(1))))
    });
}

criterion_group!(benches, bench_check);
criterion_main!(benches);
