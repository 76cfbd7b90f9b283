//! P2C over peak EWMA: lower cost wins, in-flight counts, starved endpoints get a forced
//! pick, unhealthy endpoints are avoided, fast failures do not attract; and the retry budget.

use std::time::Duration;

use tailguard_overload::{P2c, P2cConfig, RetryBudget};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn lower_cost_wins_in_flight_counts_and_slow_samples_peak() {
    let p = P2c::new(vec!["a", "b"], P2cConfig::default());
    // Both start at the 30 ms default; a tie goes to the first. a answers in 10 ms.
    let first = p.pick(ms(0)).unwrap();
    assert_eq!(first.endpoint(), &"a");
    first.finish(ms(10), true);
    assert_eq!(p.rtt_estimate(0), ms(10));
    // Cost is latency x (in-flight + 1): a costs 10, 20, 30 (tie: a), 40 > b's 30.
    let held: Vec<_> = (0..4).map(|_| p.pick(ms(20)).unwrap()).collect();
    let names: Vec<&str> = held.iter().map(|p| *p.endpoint()).collect();
    assert_eq!(names, ["a", "a", "a", "b"]);
    assert_eq!((p.inflight(0), p.inflight(1)), (3, 1));
    drop(held);
    assert_eq!(
        (p.inflight(0), p.inflight(1)),
        (0, 0),
        "drop releases in-flight"
    );
    assert_eq!(p.picks(0) + p.picks(1), 5);

    // Peak: one slow answer takes over at once...
    let slow = p.pick(ms(100)).unwrap();
    assert_eq!(slow.endpoint(), &"a");
    slow.finish(ms(200), true);
    assert_eq!(p.rtt_estimate(0), ms(100));
    assert_eq!(p.pick(ms(200)).unwrap().endpoint(), &"b");
    // ...and fast answers decay it with tau = 10 s: 10 s later, one 10 ms sample gives
    // 100 e^-1 + 10 (1 - e^-1) = 43.1 ms.
    let p2 = P2c::new(vec!["x"], P2cConfig::default());
    p2.pick(ms(0)).unwrap().finish(ms(100), true);
    p2.pick(ms(10_090)).unwrap().finish(ms(10_100), true);
    let e = (-1f64).exp();
    let want = 100.0 * e + 10.0 * (1.0 - e);
    assert!((p2.rtt_estimate(0).as_secs_f64() * 1e3 - want).abs() < 1e-6);
}

#[test]
fn a_starved_endpoint_is_picked_once_a_second() {
    let p = P2c::new(vec!["fast", "slow"], P2cConfig::default());
    let a = p.pick(ms(0)).unwrap();
    let b = p.pick(ms(0)).unwrap(); // a holds one: b is cheaper
    assert_eq!((*a.endpoint(), *b.endpoint()), ("fast", "slow"));
    a.finish(ms(1), true);
    b.finish(ms(500), true);
    let picks: Vec<&str> = (0..30)
        .map(|i| {
            let at = ms(520 + 50 * i);
            let pick = p.pick(at).unwrap();
            let name = *pick.endpoint();
            pick.finish(at + ms(1), true);
            name
        })
        .collect();
    // "slow" was last picked at 0 ms: forced once its second has passed (1020 ms), then
    // not again before 2020 ms.
    let slow_at: Vec<usize> = (0..30).filter(|&i| picks[i] == "slow").collect();
    assert_eq!(slow_at, [10]);
}

#[test]
fn unhealthy_endpoints_are_avoided_and_fast_failures_do_not_attract() {
    let cfg = P2cConfig::default();
    let p = P2c::new(vec!["a", "b", "c"], cfg.clone());
    // b fails fast: its latency counts as at least the failure RTT (1 s) and it turns
    // unhealthy (success EWMA 0 < 500).
    let mut seq = [1usize, 0, 0, 0].into_iter().cycle();
    let pick = p.pick_with(ms(0), |_| seq.next().unwrap()).unwrap();
    assert_eq!(pick.endpoint(), &"b");
    pick.finish(ms(1), false);
    assert!(!p.healthy(1));
    assert_eq!(p.rtt_estimate(1), cfg.failure_rtt);
    // Pairs drawn: (b, a) first (unhealthy b), then (a, b)... the healthy one wins.
    for t in 0..20 {
        let pick = p.pick(ms(10 + t)).unwrap();
        assert_ne!(pick.endpoint(), &"b");
        pick.finish(ms(12 + t), true);
    }
}

#[test]
fn one_endpoint_and_none() {
    let one = P2c::new(vec!["only"], P2cConfig::default());
    assert_eq!(one.pick(ms(0)).unwrap().endpoint(), &"only");
    assert_eq!(one.picks(0), 1);
    let none: P2c<&str> = P2c::new(vec![], P2cConfig::default());
    assert!(none.pick(ms(0)).is_none());
}

#[test]
fn retry_budget_is_ten_percent_plus_a_floor() {
    let b = RetryBudget::new(0.1, 3);
    for _ in 0..100 {
        b.deposit(ms(0));
    }
    // 10 % of 100 + 3/s over the 10 s window = 40
    let granted = (0..100).filter(|_| b.try_withdraw(ms(500))).count();
    assert_eq!(granted, 40);
    // Eleven seconds later the window holds nothing: only the floor.
    let granted = (0..100).filter(|_| b.try_withdraw(ms(11_500))).count();
    assert_eq!(granted, 30);
}

#[test]
fn deposit_many_counts_like_single_deposits() {
    let b = RetryBudget::new(0.1, 0);
    b.deposit_many(ms(0), 200);
    b.deposit_many(ms(0), 0);
    let granted = (0..100).filter(|_| b.try_withdraw(ms(100))).count();
    assert_eq!(granted, 20, "10 % of 200, no floor");
}

#[test]
fn pick_index_where_never_returns_an_unavailable_endpoint() {
    for n in 1..=5 {
        let p = P2c::new(vec![(); n], P2cConfig::default());
        for down in 0..n {
            for _ in 0..200 {
                let i = p
                    .pick_index_where(ms(0), |i| i != down)
                    .inspect(|&i| p.release_index(i));
                match i {
                    Some(i) => assert_ne!(i, down, "n = {n}"),
                    None => assert_eq!(n, 1, "only a lone endpoint leaves none"),
                }
            }
        }
        assert_eq!(p.pick_index_where(ms(0), |_| false), None);
        assert!(
            (0..n).all(|i| p.inflight(i) == 0),
            "a refused pick counts nothing"
        );
        // With only endpoint n-1 available it takes every pick.
        for _ in 0..50 {
            let i = p.pick_index_where(ms(0), |i| i == n - 1).unwrap();
            p.release_index(i);
            assert_eq!(i, n - 1);
        }
    }
}

#[test]
fn pick_index_where_still_compares_two_available_endpoints() {
    // Five endpoints, 0 and 1 down; 2 is slow: the cheaper of the others wins nearly
    // always, because an unavailable candidate is replaced, not picked alone.
    let p = P2c::new(vec![(); 5], P2cConfig::default());
    for i in 2..5 {
        // Give each endpoint one sample: 2 answers in 300 ms, 3 and 4 in 5 ms.
        while p.rtt_estimate(i) == P2cConfig::default().default_rtt {
            let got = p.pick_index_where(ms(10), |j| j == i).unwrap();
            let rtt = if i == 2 { ms(300) } else { ms(5) };
            p.complete_index(got, ms(10), rtt, true);
        }
    }
    let to_slow = (0..300)
        .filter(|_| {
            let i = p.pick_index_where(ms(20), |i| i >= 2).unwrap();
            p.release_index(i);
            assert!(i >= 2);
            i == 2
        })
        .count();
    // Forced picks of a starved endpoint happen at most once a second of the clock, which
    // stands still here.
    assert!(to_slow <= 1, "{to_slow} picks of the slow endpoint");
}
