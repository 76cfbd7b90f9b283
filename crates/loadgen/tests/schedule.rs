//! The open-loop schedule holds the requested rate, measured at a real sink.

use std::time::Duration;

use tailguard_loadgen::load::{LoadConfig, run};
use tailguard_loadgen::schedule::{Phase, Schedule};

use crate::support;

/// The rate a sink saw, from the arrival times of its 10th and 90th percentile requests: a
/// scheduling hiccup of this shared machine moves the estimate only if it hits one of those
/// two instants, not wherever it happens during the run.
fn sink_rate(arrivals: &mut [u64]) -> f64 {
    arrivals.sort_unstable();
    let (lo, hi) = (arrivals.len() / 10, arrivals.len() * 9 / 10);
    (hi - lo) as f64 / ((arrivals[hi] - arrivals[lo]) as f64 / 1e9)
}

#[test]
fn constant_rate_reaches_the_sink_within_one_percent() {
    let rate = 1000.0;
    // Up to three runs: on a machine shared by several builds, the sink's own thread can be
    // descheduled for tens of milliseconds, which is the machine, not the schedule. A
    // generator that cannot hold the rate fails all three.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (sink, arrivals) = support::sink();
        let report = run(&LoadConfig::new(
            &sink.url("/"),
            rate,
            Duration::from_secs(3),
            8,
        ))
        .unwrap();
        let mut arrivals = arrivals.lock().unwrap().clone();
        // Every scheduled request reaches the sink, exactly.
        assert_eq!(report.sent, 3000);
        assert_eq!(arrivals.len(), 3000, "sink saw {} requests", arrivals.len());
        assert_eq!(report.status.get(&200).copied(), Some(3000));
        assert_eq!(report.error_count(), 0, "{:?}", report.errors);
        let measured = sink_rate(&mut arrivals);
        if (measured - rate).abs() <= rate * 0.01 {
            return;
        }
        seen.push(measured);
    }
    panic!("the sink measured {seen:?} req/s for a requested {rate}, never within 1%");
}

#[test]
fn two_threads_interleave_into_one_rate() {
    let (sink, arrivals) = support::sink();
    let mut config = LoadConfig::new(&sink.url("/"), 2000.0, Duration::from_secs(1), 8);
    config.threads = 2;
    let report = run(&config).unwrap();
    assert_eq!(report.threads, 2);
    let n = arrivals.lock().unwrap().len() as f64;
    assert!((n - 2000.0).abs() <= 20.0, "sink saw {n}");
}

#[test]
fn constant_schedule_lanes_partition_the_global_schedule() {
    let mut all: Vec<u64> = Vec::new();
    for lane in 0..3 {
        let mut s = Schedule::constant(1000.0, lane, 3);
        all.extend((0..100).map(|_| s.next_offset()));
    }
    all.sort_unstable();
    let expected: Vec<u64> = (0..300).map(|n| n * 1_000_000).collect();
    assert_eq!(all, expected);
}

#[test]
fn poisson_schedule_has_the_requested_mean_and_is_seeded() {
    let mut a = Schedule::poisson(1000.0, 0, 1, 7);
    let offsets: Vec<u64> = (0..100_000).map(|_| a.next_offset()).collect();
    let mean_gap_ns = offsets[offsets.len() - 1] as f64 / (offsets.len() - 1) as f64;
    assert!(
        (mean_gap_ns - 1e6).abs() < 1e6 * 0.02,
        "mean gap {mean_gap_ns}"
    );
    // Exponential gaps: about 1/e of them are longer than the mean.
    let longer = offsets
        .windows(2)
        .filter(|w| w[1] - w[0] > 1_000_000)
        .count() as f64;
    assert!((longer / 99_999.0 - (-1.0f64).exp()).abs() < 0.01);
    let mut b = Schedule::poisson(1000.0, 0, 1, 7);
    assert_eq!(
        offsets[..100],
        (0..100).map(|_| b.next_offset()).collect::<Vec<_>>()[..]
    );
}

fn phases(list: &[(f64, u64)]) -> Vec<Phase> {
    list.iter()
        .map(|&(rate, ms)| Phase {
            rate,
            duration: Duration::from_millis(ms),
        })
        .collect()
}

#[test]
fn stepped_schedule_changes_rate_at_each_phase_end() {
    // 10/s for 1 s, 100/s for 0.5 s, then 20/s on.
    let mut s = Schedule::stepped(&phases(&[(10.0, 1000), (100.0, 500), (20.0, 0)]), 0, 1);
    let offsets: Vec<u64> = (0..65).map(|_| s.next_offset()).collect();
    let ms = |ns: u64| ns / 1_000_000;
    assert_eq!(ms(offsets[0]), 0);
    assert_eq!(ms(offsets[9]), 900);
    // The step: the 11th request opens the second phase exactly at its start.
    assert_eq!(ms(offsets[10]), 1000);
    assert_eq!(ms(offsets[11]), 1010);
    assert_eq!(ms(offsets[59]), 1490);
    assert_eq!(ms(offsets[60]), 1500);
    assert_eq!(ms(offsets[61]), 1550);
    assert!(offsets.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn stepped_lanes_partition_the_global_stepped_schedule() {
    let list = phases(&[(1000.0, 100), (5000.0, 100), (500.0, 100)]);
    let mut global = Schedule::stepped(&list, 0, 1);
    let expected: Vec<u64> = (0..700).map(|_| global.next_offset()).collect();
    let mut all: Vec<u64> = Vec::new();
    for lane in 0..3 {
        let mut s = Schedule::stepped(&list, lane, 3);
        all.extend(
            std::iter::from_fn(|| Some(s.next_offset())).take_while(|&t| t <= expected[699]),
        );
    }
    all.sort_unstable();
    assert_eq!(all, expected);
    // 100 + 500 requests in the first two phases, then 500/s.
    assert_eq!(expected.iter().filter(|&&t| t < 200_000_000).count(), 600);
}

#[test]
fn a_zero_rate_phase_sends_nothing_and_a_zero_rate_end_stops_the_schedule() {
    let mut s = Schedule::stepped(&phases(&[(100.0, 100), (0.0, 1000), (0.0, 0)]), 0, 1);
    let offsets: Vec<u64> = (0..12).map(|_| s.next_offset()).collect();
    assert_eq!(offsets[9], 90_000_000);
    assert!(
        offsets[10..]
            .iter()
            .all(|&t| t == tailguard_loadgen::schedule::NEVER)
    );
    let mut s = Schedule::stepped(&phases(&[(0.0, 500), (10.0, 0)]), 0, 1);
    assert_eq!(s.next_offset(), 500_000_000);
    assert_eq!(s.next_offset(), 600_000_000);
}

#[test]
fn stepped_poisson_has_each_phases_mean_rate() {
    // 1000/s for 20 s, then 10000/s for 20 s, then 0: two lanes add up to each rate.
    let list = phases(&[(1000.0, 20_000), (10_000.0, 20_000), (0.0, 0)]);
    let mut counts = [0u64; 2];
    for lane in 0..2 {
        let mut s = Schedule::stepped_poisson(&list, lane, 2, 9);
        loop {
            let t = s.next_offset();
            if t == tailguard_loadgen::schedule::NEVER {
                break;
            }
            counts[usize::from(t >= 20_000_000_000)] += 1;
        }
    }
    assert!(
        (counts[0] as f64 - 20_000.0).abs() < 20_000.0 * 0.02,
        "{counts:?}"
    );
    assert!(
        (counts[1] as f64 - 200_000.0).abs() < 200_000.0 * 0.02,
        "{counts:?}"
    );
}
