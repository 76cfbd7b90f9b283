//! The adaptive breaker: go-zero's own `core/breaker/googlebreaker_test.go` values ported
//! sleep-free (go-zero mode, coins from a seeded RNG), then research §9.4's changes.

use std::time::Duration;

use tailguard_overload::{Breaker, BreakerConfig, BreakerState, History, failure_status};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// go-zero's test breaker: k = 5.
fn gozero() -> Breaker {
    Breaker::new(
        "up/route",
        BreakerConfig {
            k: 5.0,
            ..BreakerConfig::gozero()
        },
    )
    .unwrap()
}

/// go-zero's `markSuccess`: allow, then Accept; stops at the first rejection.
fn mark_success(b: &Breaker, rng: &mut fastrand::Rng, now: Duration, n: usize) {
    for _ in 0..n {
        match b.allow_with(now, rng.f64()) {
            Ok(p) => p.success(now),
            Err(_) => break,
        }
    }
}

/// go-zero's `markFailed`: allow, then Reject when allowed.
fn mark_failed(b: &Breaker, rng: &mut fastrand::Rng, now: Duration, n: usize) {
    for _ in 0..n {
        if let Ok(p) = b.allow_with(now, rng.f64()) {
            p.failure(now);
        }
    }
}

/// Rejections out of 100 attempts.
fn rejections(b: &Breaker, rng: &mut fastrand::Rng, now: Duration) -> usize {
    (0..100)
        .filter(|_| match b.allow_with(now, rng.f64()) {
            Ok(p) => {
                drop(p);
                false
            }
            Err(_) => true,
        })
        .count()
}

#[test]
fn gozero_close_stays_closed_on_successes() {
    let (b, mut rng) = (gozero(), fastrand::Rng::with_seed(1));
    mark_success(&b, &mut rng, ms(0), 80);
    assert!(b.allow_with(ms(0), 0.0).is_ok());
    mark_success(&b, &mut rng, ms(0), 120);
    assert!(b.allow_with(ms(0), 0.0).is_ok());
    assert_eq!(b.history(ms(0)).accepts, 200);
}

#[test]
fn gozero_open_after_a_flood_of_failures() {
    let (b, mut rng) = (gozero(), fastrand::Rng::with_seed(2));
    mark_success(&b, &mut rng, ms(0), 10);
    assert!(b.allow_with(ms(0), 0.999).is_ok());
    mark_failed(&b, &mut rng, ms(0), 100_000);
    // (100 010 - 5 - 5 x 10) / 100 011: nearly every request is rejected
    assert!(rejections(&b, &mut rng, ms(20)) >= 99);
}

#[test]
fn gozero_self_protection_below_five_requests() {
    let (b, mut rng) = (gozero(), fastrand::Rng::with_seed(3));
    mark_failed(&b, &mut rng, ms(0), 4);
    assert_eq!(b.reject_ratio(ms(10)), 0.0);
    assert!(b.allow_with(ms(10), 0.0).is_ok());
}

#[test]
fn gozero_accepts_enough_successes_to_stay_closed() {
    // "total request > 100, total < 2 * success"
    for seed in 0..20 {
        let (b, mut rng) = (gozero(), fastrand::Rng::with_seed(seed));
        let size = rng.usize(1..10_000);
        mark_success(&b, &mut rng, ms(0), size + 1);
        mark_failed(&b, &mut rng, ms(0), 0);
        assert!(b.allow_with(ms(0), 0.0).is_ok());
    }
}

#[test]
fn gozero_more_failing_buckets_reject_more() {
    // Six buckets of nothing but failures (go-zero: 6 x testInterval of doReq errors).
    let (b, mut rng) = (gozero(), fastrand::Rng::with_seed(4));
    for bucket in 0..6 {
        mark_failed(&b, &mut rng, ms(250 * bucket), 50);
    }
    let h = b.history(ms(1500));
    assert_eq!(h.failing_buckets, 6);
    assert!(rejections(&b, &mut rng, ms(1500)) > 90);
}

#[test]
fn gozero_history_counts() {
    let b = gozero();
    for i in 0..10 {
        b.record(ms(5 * i), true);
    }
    let h = b.history(ms(50));
    assert_eq!((h.accepts, h.total), (10, 10), "accepts == total");

    let b = gozero();
    for i in 0..10 {
        b.record(ms(5 * i), false);
    }
    assert_eq!(b.history(ms(50)).accepts, 0, "fail == total");
    assert_eq!(b.history(ms(50)).total, 10);

    let b = gozero();
    for i in 0..5 {
        b.record(ms(5 * i), false);
    }
    for i in 5..10 {
        b.record(ms(5 * i), true);
    }
    assert_eq!(
        b.history(ms(50)),
        History {
            accepts: 5,
            total: 10,
            failing_buckets: 0,
            working_buckets: 0, // one 250 ms bucket with both
        }
    );
    // auto reset after a whole window
    assert_eq!(b.history(ms(10_050)), History::default());
}

#[test]
fn gozero_ratio_formula_with_failing_and_working_buckets() {
    // 40 buckets x 250 ms, k 1.5 -> min_k 1.1 over failing buckets, recovery scaling.
    let b = Breaker::new("x", BreakerConfig::gozero()).unwrap();
    for bucket in 0..10u64 {
        for _ in 0..100 {
            b.record(ms(250 * bucket), true);
        }
    }
    for bucket in 10..20u64 {
        for _ in 0..100 {
            b.record(ms(250 * bucket), false);
        }
    }
    let h = b.history(ms(250 * 19));
    assert_eq!(
        (h.accepts, h.total, h.failing_buckets, h.working_buckets),
        (1000, 2000, 10, 0)
    );
    let w = 1.5 - 0.4 * 10.0 / 40.0;
    let expect = (2000.0 - 5.0 - w * 1000.0) / 2001.0;
    assert!((b.reject_ratio(ms(250 * 19)) - expect).abs() < 1e-12);
    // Two working buckets after the failures scale it by 38/40.
    b.record(ms(250 * 20), true);
    b.record(ms(250 * 21), true);
    let h = b.history(ms(250 * 21));
    assert_eq!((h.failing_buckets, h.working_buckets), (0, 2));
    let expect = (2002.0 - 5.0 - 1.5 * 1002.0) / 2003.0 * 38.0 / 40.0;
    assert!((b.reject_ratio(ms(250 * 21)) - expect).abs() < 1e-12);
}

#[test]
fn rejection_probability_is_capped_at_0_8() {
    let b = Breaker::new("x", BreakerConfig::adaptive()).unwrap();
    for _ in 0..1000 {
        b.allow_with(ms(0), 0.99).unwrap().failure(ms(0));
    }
    assert_eq!(b.reject_ratio(ms(10)), 0.8);
    assert!(b.allow_with(ms(10), 0.79).is_err());
    assert!(b.allow_with(ms(10), 0.81).is_ok());
    assert_eq!(b.state(), BreakerState::Open);
    assert_eq!(b.rejected(), 1);
}

#[test]
fn requests_count_at_dispatch_in_flight_ones_are_not_failures_and_cancellations_are_forgotten() {
    let b = Breaker::new("x", BreakerConfig::adaptive()).unwrap();
    // A burst of slow requests, none finished: no outcome yet, nothing to reject on.
    let held: Vec<_> = (0..100)
        .map(|_| b.allow_with(ms(0), 0.99).unwrap())
        .collect();
    assert_eq!(b.history(ms(0)).total, 0);
    assert_eq!(b.reject_ratio(ms(0)), 0.0);
    // They finish after the window moved on: counted in their dispatch bucket.
    let mut held = held.into_iter();
    for p in held.by_ref().take(60) {
        p.failure(ms(900));
    }
    let h = b.history(ms(900));
    assert_eq!((h.accepts, h.total), (0, 60));
    drop(held); // the other 40: client cancellations / layer-1 rejections
    assert_eq!(b.history(ms(900)).total, 60, "forgotten, not failed");
    let p = b.allow_with(ms(900), 0.99).unwrap();
    p.status(ms(901), 500);
    let h = b.history(ms(901));
    assert_eq!((h.accepts, h.total), (1, 61), "500 is an answer");
}

#[test]
fn failure_statuses_are_upstream_trouble_only() {
    let failing: Vec<u16> = (100..600).filter(|&s| failure_status(s)).collect();
    assert_eq!(failing, vec![429, 502, 503, 504]);
}

#[test]
fn one_probe_per_second_while_open() {
    let b = Breaker::new("x", BreakerConfig::adaptive()).unwrap();
    for _ in 0..100 {
        b.allow_with(ms(0), 0.99).unwrap().failure(ms(0));
    }
    // coin 0.0: every non-probe request is rejected
    let passed = |from: u64, to: u64| {
        (from..to)
            .step_by(10)
            .filter(|&t| match b.allow_with(ms(t), 0.0) {
                Ok(p) => {
                    p.failure(ms(t));
                    true
                }
                Err(_) => false,
            })
            .count()
    };
    assert_eq!(passed(10, 1000), 0, "the last pass was at 0 ms");
    assert_eq!(
        passed(1010, 3020),
        2,
        "one probe per second: at 1010 and 2020 ms"
    );
}
