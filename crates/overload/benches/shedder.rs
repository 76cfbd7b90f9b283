//! Request-path cost of the shedder: admit + complete when cold, a rejection when hot,
//! against a bare in-flight atomic (no shedder), a breaker allow + success, and an
//! upstream concurrency limit's acquire + record + release and its rejection.

use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tailguard_overload::{
    Breaker, BreakerConfig, Class, Clock, Controller, LimitConfig, MonotonicClock, Outcome,
    ShedderConfig, UpstreamLimit,
};

/// A controller with C = 5 at 100 % CPU (L = 0.5, floored at 1 core).
fn hot(cfg: ShedderConfig) -> Controller {
    let ctl = Controller::new("bench", cfg).expect("default configs are valid");
    let ms = Duration::from_millis;
    ctl.tick(ms(0), 0);
    for _ in 0..50 {
        ctl.admit(ms(0), Class::Normal)
            .expect("cold: admitted")
            .complete(ms(10), Outcome::Served);
    }
    ctl.tick(ms(100), 1000);
    ctl
}

fn bench(c: &mut Criterion) {
    let clock = MonotonicClock;
    let mut g = c.benchmark_group("shedder");

    let inflight = AtomicI64::new(0);
    g.bench_function("baseline_atomic_inflight", |b| {
        b.iter(|| {
            inflight.fetch_add(1, Ordering::Relaxed);
            black_box(clock.now());
            inflight.fetch_sub(1, Ordering::Relaxed);
        })
    });

    for (name, cfg) in [
        ("adaptive", ShedderConfig::adaptive()),
        ("gozero", ShedderConfig::gozero()),
    ] {
        let ctl = Controller::new("bench", cfg.clone()).expect("default configs are valid");
        ctl.tick(Duration::ZERO, 0);
        g.bench_function(format!("admit_complete/{name}"), |b| {
            b.iter(|| {
                let p = ctl
                    .admit(clock.now(), Class::Normal)
                    .expect("cold: admitted");
                p.complete(clock.now(), Outcome::Served);
            })
        });

        let ctl = hot(cfg);
        // In flight above any limit: every normal request is rejected.
        let held: Vec<_> = (0..64)
            .map(|_| {
                ctl.admit(clock.now(), Class::Critical)
                    .expect("critical bypasses")
            })
            .collect();
        g.bench_function(format!("reject/{name}"), |b| {
            b.iter(|| black_box(ctl.admit(clock.now(), Class::Normal).is_err()))
        });
        drop(held);
    }

    let breaker = Breaker::new("bench", BreakerConfig::adaptive()).expect("valid");
    g.bench_function("breaker_allow_success", |b| {
        b.iter(|| {
            let now = clock.now();
            if let Ok(p) = breaker.allow(now) {
                p.success(now);
            }
        })
    });

    let limit = UpstreamLimit::new("bench", LimitConfig::default()).expect("valid");
    g.bench_function("upstream_limit_acquire_record_release", |b| {
        b.iter(|| {
            let mut p = limit
                .acquire(clock.now(), Class::Normal)
                .expect("under the limit");
            p.record(clock.now());
        })
    });
    let full: Vec<_> = (0..80)
        .map(|_| {
            limit
                .acquire(clock.now(), Class::Normal)
                .expect("cold: 4 x 20")
        })
        .collect();
    g.bench_function("upstream_limit_reject", |b| {
        b.iter(|| black_box(limit.acquire(clock.now(), Class::Normal).is_err()))
    });
    drop(full);
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
