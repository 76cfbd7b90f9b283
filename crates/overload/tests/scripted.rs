//! Scripted fake-clock tests of the adaptive controller: triggers, cool-off, minRt expiry,
//! the CPU factor and floor, priority classes, outcomes.

use std::time::Duration;

use tailguard_overload::{Class, Controller, Outcome, Permit, ShedderConfig};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A controller whose first bucket (0-100 ms) served `passes` requests of `rt` each, ticked
/// at 100 ms with `cpu`.
fn warmed(passes: u32, rt: Duration, cpu: u32) -> Controller {
    let c = Controller::new("g", ShedderConfig::adaptive()).unwrap();
    c.tick(ms(0), 0);
    for _ in 0..passes {
        c.admit(ms(0), Class::Normal)
            .unwrap()
            .complete(rt, Outcome::Served);
    }
    c.tick(ms(100), cpu);
    c
}

fn hold(c: &Controller, now: Duration, n: usize) -> Vec<Permit<'_>> {
    (0..n)
        .map(|_| c.admit(now, Class::Critical).unwrap())
        .collect()
}

#[test]
fn cold_controller_admits_everything() {
    let c = warmed(50, ms(10), 500);
    let held = hold(&c, ms(100), 40); // far above C = 5, under the cap, CPU 50 %
    assert!(c.admit(ms(100), Class::Normal).is_ok());
    assert_eq!(c.snapshot(ms(100)).shed, [0; 4]);
    drop(held);
}

#[test]
fn cpu_factor_scales_the_limit_down_to_a_tenth_plus_the_cores() {
    // C = 50 passes x 10/s x 0.1 s = 50; 1 core
    let c = warmed(50, ms(100), 0);
    assert_eq!(c.snapshot(ms(100)).capacity, 50.0);
    for (cpu, limit) in [
        (899, 51.0),
        (900, 51.0),
        (950, 26.0),
        (990, 6.0),
        (1000, 6.0),
    ] {
        c.tick(ms(150), cpu);
        assert_eq!(c.snapshot(ms(150)).limit, limit, "cpu {cpu}");
    }
}

#[test]
fn limit_keeps_the_core_count_on_top_of_the_capacity() {
    let c = warmed(50, ms(1), 1000); // C = 0.5
    c.set_cores(2.0);
    c.tick(ms(150), 1000);
    assert_eq!(c.snapshot(ms(150)).limit, 0.5 * 0.1 + 2.0);
}

#[test]
fn cool_off_lasts_one_second_after_the_last_hot_tick_if_something_was_shed() {
    let c = warmed(50, ms(10), 950); // L = 2.5 + 1, hot; at 50 % CPU L = C + 1 = 6
    let held = hold(&c, ms(100), 7);
    assert!(c.admit(ms(100), Class::Normal).is_err());
    c.tick(ms(200), 950); // last overloaded moment
    c.tick(ms(300), 500); // CPU back under the threshold
    assert!(c.admit(ms(1199), Class::Normal).is_err(), "still hot");
    assert!(c.admit(ms(1200), Class::Normal).is_ok(), "cooled off");
    drop(held);
}

#[test]
fn without_a_drop_there_is_no_cool_off() {
    let c = warmed(50, ms(10), 950);
    c.tick(ms(200), 500);
    let held = hold(&c, ms(250), 10);
    assert!(c.admit(ms(250), Class::Normal).is_ok());
    drop(held);
}

#[test]
fn in_flight_cap_rejects_at_once_and_turns_hot_when_pinned_for_25_ms() {
    // C = 5, cores 1: the cap is 10 x 5 + 1 = 51 in flight; CPU at 0 %.
    let c = warmed(50, ms(10), 0);
    let mut held = hold(&c, ms(100), 51);
    assert!(
        c.admit(ms(100), Class::Normal).is_ok(),
        "51 is not above 51"
    );
    held.push(c.admit(ms(100), Class::Critical).unwrap());
    let capped = c.admit(ms(100), Class::Normal).unwrap_err();
    assert!(capped.severe);
    assert!(
        c.admit(ms(100), Class::High).is_ok(),
        "high's cap is 1.5 x 51"
    );
    assert!(!c.snapshot(ms(100)).hot, "a cap, not yet hot");
    assert!(c.admit(ms(124), Class::Normal).is_err());
    assert!(!c.snapshot(ms(124)).hot, "pinned for 24 ms");
    assert!(c.admit(ms(125), Class::Normal).is_err());
    let s = c.snapshot(ms(125));
    assert!(s.hot, "pinned at the cap for 25 ms: overloaded");
    assert_eq!(s.limit, 6.0, "no CPU factor at 0 % CPU: C + 1 core");
    drop(held);
    // Drained: the next tick releases the trigger; the cool-off keeps the gate for 1 s
    // after the moment it turned hot (125 ms).
    c.tick(ms(200), 0);
    let held = hold(&c, ms(200), 7);
    assert!(
        c.admit(ms(200), Class::Normal).is_err(),
        "7 > L = 6 during cool-off"
    );
    assert!(c.admit(ms(1124), Class::Normal).is_err());
    assert!(c.admit(ms(1125), Class::Normal).is_ok());
    drop(held);
}

#[test]
fn in_flight_trigger_turns_hot_after_ten_ticks_without_cpu() {
    // Trigger level 8 x 5 + 1 = 41, under the cap of 51.
    let c = warmed(50, ms(10), 0);
    let held = hold(&c, ms(100), 45);
    assert!(c.admit(ms(100), Class::Normal).is_ok());
    for t in (200..=1000).step_by(100) {
        c.tick(ms(t), 0);
    }
    assert!(!c.snapshot(ms(1000)).hot, "nine ticks are not enough");
    assert!(c.admit(ms(1000), Class::Normal).is_ok());
    c.tick(ms(1100), 0);
    assert!(c.snapshot(ms(1100)).hot, "ten ticks (1 s) above the level");
    assert!(c.admit(ms(1100), Class::Normal).is_err());
    drop(held);
}

#[test]
fn a_slow_rise_to_the_cap_is_admitted_up_to_twice_the_cap() {
    // C = 5, 1 core: calm at C + 1 = 6, cap 51, minRt 10 ms: a rise from 6 to 51 faster than
    // (10 − 1) x 10 ms / 2.5 = 36 ms is an onset; a slower one is a burst.
    let c = warmed(50, ms(10), 0);
    let mut held = hold(&c, ms(100), 6);
    held.push(c.admit(ms(100), Class::Normal).unwrap()); // the last calm admission (6 <= 6)
    held.extend(hold(&c, ms(136), 45)); // 52 in flight, 36 ms later
    assert!(c.admit(ms(136), Class::Normal).is_ok(), "36 ms: a burst");
    held.extend(hold(&c, ms(136), 51)); // 103 in flight (the permit above was dropped)
    let capped = c.admit(ms(136), Class::Normal).unwrap_err();
    assert!(capped.severe, "above twice the cap");
    assert!(
        c.admit(ms(137), Class::Normal).is_err(),
        "the episode at the cap has begun: rejected above the cap"
    );
    drop(held);

    let c = warmed(50, ms(10), 0);
    let mut held = hold(&c, ms(100), 6);
    held.push(c.admit(ms(100), Class::Normal).unwrap());
    held.extend(hold(&c, ms(135), 45));
    assert!(c.admit(ms(135), Class::Normal).is_err(), "35 ms: an onset");
    drop(held);
}

#[test]
fn cpu_alone_does_not_turn_hot_while_the_group_drains() {
    // CPU at 95 %, but an admission found in-flight at or under C + 1 = 6 within the bucket.
    let c = warmed(50, ms(10), 0);
    drop(c.admit(ms(150), Class::Normal).unwrap());
    let held = hold(&c, ms(160), 8);
    c.tick(ms(200), 950);
    assert!(!c.snapshot(ms(200)).hot, "drained 50 ms ago: a burst");
    assert!(c.admit(ms(200), Class::Normal).is_ok());
    // A whole bucket without a calm admission: queued, and the CPU is hot.
    c.tick(ms(300), 950);
    assert!(c.snapshot(ms(300)).hot);
    assert!(c.admit(ms(300), Class::Normal).is_err(), "8 > L = 3.5");
    drop(held);
}

#[test]
fn a_shedding_controller_stays_hot_on_the_cpu_alone() {
    let c = warmed(50, ms(10), 950); // hot, L = 5 x 0.5 + 1 = 3.5
    let held = hold(&c, ms(100), 7);
    assert!(c.admit(ms(100), Class::Normal).is_err(), "shed");
    drop(held);
    // In-flight drains (the gate keeps it low), the CPU stays at 92 %: still hot.
    let mut t = 200;
    for _ in 0..20 {
        drop(c.admit(ms(t - 50), Class::Normal).unwrap()); // a calm admission each bucket
        c.tick(ms(t), 920);
        t += 100;
    }
    assert!(
        c.snapshot(ms(t)).hot,
        "2 s at 92 % while shedding: still hot"
    );
    let held = hold(&c, ms(t), 7); // above L = 5 x 0.8 + 1 = 5 (92 %) and 6 (88 %)
    assert!(c.admit(ms(t), Class::Normal).is_err());
    drop(held);
    c.tick(ms(t), 880);
    let cooled = ms(t - 100) + ms(1000);
    let held = hold(&c, ms(t), 7); // above L = 5 x 0.8 + 1 = 5 (92 %) and 6 (88 %)
    assert!(c.admit(cooled - ms(1), Class::Normal).is_err(), "cool-off");
    assert!(c.admit(cooled, Class::Normal).is_ok(), "88 %: cooled off");
    drop(held);
}

#[test]
fn min_rt_ignores_thin_buckets_and_expires_after_30_s() {
    let c = Controller::new("g", ShedderConfig::adaptive()).unwrap();
    c.tick(ms(0), 0);
    let serve = |n: u32, rt: Duration, at: Duration| {
        for _ in 0..n {
            c.admit(at, Class::Normal)
                .unwrap()
                .complete_with_rt(Outcome::Served, rt);
        }
    };
    serve(10, ms(1), ms(0)); // bucket ending at 0.1 s: 1 ms
    c.tick(ms(100), 0);
    serve(4, Duration::from_micros(100), ms(100)); // only 4 samples: ignored
    c.tick(ms(200), 0);
    serve(10, ms(10), ms(1000)); // bucket ending at 1.1 s: 10 ms
    let mut t = 300;
    while t <= 30_000 {
        c.tick(ms(t), 0);
        t += 100;
    }
    assert_eq!(
        c.snapshot(ms(30_000)).min_rt,
        1000.0,
        "1 ms still in the window"
    );
    c.tick(ms(30_100), 0);
    assert_eq!(
        c.snapshot(ms(30_100)).min_rt,
        10_000.0,
        "expired after 30 s"
    );
}

#[test]
fn a_late_tick_does_not_inflate_max_pass() {
    let c = Controller::new("g", ShedderConfig::adaptive()).unwrap();
    c.tick(ms(0), 0);
    for _ in 0..150 {
        c.admit(ms(0), Class::Normal)
            .unwrap()
            .complete(ms(1), Outcome::Served);
    }
    c.tick(ms(300), 0); // the sampler thread was starved for 200 ms
    assert!((c.snapshot(ms(300)).max_pass - 50.0).abs() < 1e-9);
}

#[test]
fn only_served_requests_feed_the_window() {
    let c = Controller::new("g", ShedderConfig::adaptive()).unwrap();
    c.tick(ms(0), 0);
    for _ in 0..10 {
        c.admit(ms(0), Class::Normal)
            .unwrap()
            .complete(ms(1), Outcome::Failed);
        c.admit(ms(0), Class::Normal)
            .unwrap()
            .complete(ms(1), Outcome::Cancelled);
        drop(c.admit(ms(0), Class::Normal).unwrap());
    }
    c.tick(ms(100), 0);
    let s = c.snapshot(ms(100));
    assert_eq!(
        (s.max_pass, s.served, s.admitted, s.inflight),
        (1.0, 0, 30, 0)
    );
    assert_eq!(s.min_rt, 1_000_000.0, "default 1 s");
}

#[test]
fn priority_classes_are_monotone_and_critical_bypasses() {
    let c = warmed(50, ms(10), 950); // L = 2.5 + 1: low 1.75, normal 3.5, high 5.25
    let mut held = Vec::new();
    let mut seen = Vec::new();
    for flying in 0..8 {
        let admitted = |class| c.admit(ms(100), class).is_ok();
        let row = [
            admitted(Class::Low),
            admitted(Class::Normal),
            admitted(Class::High),
            admitted(Class::Critical),
        ];
        seen.push((flying, row));
        held.push(c.admit(ms(100), Class::Critical).unwrap());
    }
    assert_eq!(
        seen,
        vec![
            (0, [true, true, true, true]),
            (1, [true, true, true, true]),
            (2, [false, true, true, true]),
            (3, [false, true, true, true]),
            (4, [false, false, true, true]),
            (5, [false, false, true, true]),
            (6, [false, false, false, true]),
            (7, [false, false, false, true]),
        ]
    );
    let shed = c.snapshot(ms(100)).shed;
    assert_eq!(shed, [6, 4, 2, 0], "shed counted per class");
}

#[test]
fn gozero_mode_high_priority_uses_the_950_threshold() {
    let c = Controller::new("g", ShedderConfig::gozero()).unwrap();
    c.tick(ms(0), 0);
    c.tick(ms(100), 920); // overloaded for normal (900), not for high (950)
    let mut held = hold(&c, ms(100), 50); // far above maxFlight 10...
    assert!(
        c.admit(ms(100), Class::Normal).is_ok(),
        "...but avgFlying is still 0: go-zero needs both above the limit"
    );
    // 20 completions with ~40 in flight lift avgFlying to ~33.
    for p in held.drain(..20) {
        p.complete(ms(105), Outcome::Served);
    }
    assert!(
        c.admit(ms(110), Class::Normal).is_err(),
        "normal sheds at 900"
    );
    assert!(c.admit(ms(110), Class::High).is_ok(), "high waits for 950");
    drop(held);
}

#[test]
fn the_gate_widens_while_it_sheds_under_the_cpu_threshold_and_narrows_when_saturated() {
    // C = 5, 1 core; hot at 95 %: L = 5 x 0.5 + 1 = 3.5.
    let c = warmed(50, ms(10), 950);
    let held = hold(&c, ms(100), 7);
    let shed = |t: u64| assert!(c.admit(ms(t), Class::Normal).is_err(), "shed at {t}");
    shed(150);
    c.tick(ms(200), 850); // shed, CPU under the threshold, hot 100 ms ago: + a quarter core
    assert_eq!(c.snapshot(ms(200)).limit, 5.0 + 1.0 + 0.25);
    shed(250);
    c.tick(ms(300), 850);
    assert_eq!(c.snapshot(ms(300)).limit, 5.0 + 1.0 + 0.5);
    c.tick(ms(400), 850); // nothing shed: the allowance decays
    assert!((c.snapshot(ms(400)).limit - (6.0 + 0.45)).abs() < 1e-9);
    c.tick(ms(500), 980); // saturated: halved, and the CPU factor is 0.2
    assert!((c.snapshot(ms(500)).limit - (1.0 + 1.0 + 0.225)).abs() < 1e-9);
    drop(held);

    // No CPU reading at the threshold within the cool-off (an onset caught by the cap,
    // the CPU lagging): shedding does not widen the gate.
    let c = warmed(50, ms(10), 0);
    let mut held = hold(&c, ms(100), 6);
    held.push(c.admit(ms(100), Class::Normal).unwrap());
    held.extend(hold(&c, ms(110), 45));
    assert!(
        c.admit(ms(110), Class::Normal).is_err(),
        "a fast rise: capped"
    );
    c.tick(ms(200), 500);
    assert_eq!(c.snapshot(ms(200)).limit, 6.0, "C + 1, no allowance");
    drop(held);
}

#[test]
fn within_5_s_of_an_overload_any_rise_to_the_cap_is_capped() {
    // C = 5, 1 core, cap 51. Hot (CPU 95 %) at 100 ms, cooled off by 1.2 s.
    let c = warmed(50, ms(10), 950);
    c.tick(ms(200), 500);
    let mut held = hold(&c, ms(1200), 6);
    held.push(c.admit(ms(1200), Class::Normal).unwrap()); // calm at 1.2 s
    held.extend(hold(&c, ms(1400), 45)); // 52 in flight, 200 ms later: a slow rise
    assert!(
        c.admit(ms(1400), Class::Normal).is_err(),
        "1.3 s after an overload: capped"
    );
    drop(held);
    let mut held = hold(&c, ms(5200), 6);
    held.push(c.admit(ms(5200), Class::Normal).unwrap());
    held.extend(hold(&c, ms(5400), 45));
    assert!(
        c.admit(ms(5400), Class::Normal).is_ok(),
        "5.3 s after: a slow rise is a burst again"
    );
    drop(held);
}
